"""Length-prefixed frames over a trio byte stream, read and written in batches.

A frame is a 4-byte big-endian payload length, a 1-byte channel and the payload:

    +----------------+---------+-----------------+
    | length (u32 BE)| channel | payload (length) |
    +----------------+---------+-----------------+

`length` counts the payload only. Channel `PEER` (0) carries a peer message,
`RPC` (1) a client RPC; both share one port, as DLedger's peers and clients do.

Reading in batches, buffering partial frames, writing in batches and closing are
`raftmq.transport.frames`', shared with the remoting protocol; here is the peer frame.
"""

from __future__ import annotations

import functools
import struct

import trio
from raftmq.dledger.net.codec import FrameError

from raftmq.transport import frames as framing
from raftmq.transport.frames import RECEIVE_CHUNK
from raftmq.transport.writer import BatchWriter

__all__ = [
    "HEADER_SIZE",
    "MAX_FRAME_BYTES",
    "PEER",
    "RPC",
    "SNIFF_BYTES",
    "FrameError",
    "FrameReader",
    "FrameSplitter",
    "FrameWriter",
    "opens_peer_frame",
    "pack_frame",
]

PEER = 0
RPC = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024

_HEADER = struct.Struct(">IB")  # length, channel
HEADER_SIZE = _HEADER.size


# A peer frame's payload is a msgpack array or map, whose first byte is never 0; the
# frame of another protocol sharing the port (RocketMQ remoting: length, serialize-type
# byte, 24-bit header length) has 0 there for any header under 64 KiB.
SNIFF_BYTES = HEADER_SIZE + 1


def opens_peer_frame(prefix: bytes) -> bool:
    """Whether a connection's first `SNIFF_BYTES` bytes open a peer frame."""
    return len(prefix) >= SNIFF_BYTES and prefix[4] in (PEER, RPC) and prefix[5] != 0


def pack_frame(channel: int, payload) -> bytes:
    """One whole frame as bytes (tests and one-off writers; FrameWriter avoids this copy)."""
    return _HEADER.pack(len(payload), channel) + bytes(payload)


def split_frames(src, max_frame_bytes: int) -> tuple[list[tuple[int, bytes]], int]:
    """The complete `(channel, payload: bytes)` frames at the start of `src` and the
    bytes they take; FrameError for a frame longer than `max_frame_bytes`, checked from
    its header before anything waits for its bytes."""
    end_of_data = len(src)
    unpack_from = _HEADER.unpack_from
    frames = []
    append = frames.append
    pos = 0
    with memoryview(src) as view:
        while end_of_data - pos >= HEADER_SIZE:
            length, channel = unpack_from(src, pos)
            if length > max_frame_bytes:
                raise FrameError(
                    f"frame of {length} bytes exceeds the {max_frame_bytes}-byte limit"
                )
            start = pos + HEADER_SIZE
            end = start + length
            if end > end_of_data:
                break
            append((channel, view[start:end].tobytes()))
            pos = end
    return frames, pos


class FrameSplitter(framing.FrameSplitter):
    """Peer frames out of bytes, without I/O: `feed` each chunk as it arrives and take
    the complete `(channel, payload: bytes)` frames it returns (FrameReader reads a
    trio stream with it; a blocking client, such as the benchmark's, uses it alone).
    Buffering is `transport.frames.FrameSplitter`'s."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        super().__init__(
            functools.partial(split_frames, max_frame_bytes=max_frame_bytes), FrameError
        )


class FrameReader(framing.FrameReader):
    """Async iterator of `(channel, payload: bytes)` frames read from `stream`.

    Stops at a clean end of stream; raises FrameError for a frame longer than
    `max_frame_bytes` or for a stream that ends mid-frame. Stream errors
    (trio.BrokenResourceError, ...) pass through.
    """

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        *,
        receive_size: int = RECEIVE_CHUNK,
    ) -> None:
        super().__init__(stream, FrameSplitter(max_frame_bytes), "peer read", receive_size)


class FrameWriter(BatchWriter):
    """Queues frames synchronously; `run()` sends everything queued in one `send_all`.

    `transport.writer.BatchWriter` with this module's frame header: `close()` lets
    `run()` flush first, `abort()` drops the queue; the stream is the owner's. Once
    closed, a write raises trio.ClosedResourceError before anything is encoded. The
    peer transport drops messages to a peer whose `pending_bytes` grow past its limit.
    """

    def __init__(self, stream: trio.abc.SendStream, max_frame_bytes: int = MAX_FRAME_BYTES):
        super().__init__(stream, "peer written")
        self._max = max_frame_bytes

    def write(self, channel: int, payload) -> None:
        """Queue one frame; FrameError if it is too large for the peer to accept."""
        if self.closed:
            raise trio.ClosedResourceError("frame writer is closed")
        length = len(payload)
        if length > self._max:
            raise FrameError(f"frame of {length} bytes exceeds the {self._max}-byte limit")
        self.queue(_HEADER.pack(length, channel), payload)
