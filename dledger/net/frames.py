"""Length-prefixed frames over a trio byte stream, read and written in batches.

A frame is a 4-byte big-endian payload length, a 1-byte channel and the payload:

    +----------------+---------+-----------------+
    | length (u32 BE)| channel | payload (length) |
    +----------------+---------+-----------------+

`length` counts the payload only. Channel `PEER` (0) carries a peer message,
`RPC` (1) a client RPC; both share one port, as DLedger's peers and clients do.

Throughput comes from batching in both directions: the reader pulls 256 KiB at a
time and splits out every complete frame in the chunk, and the writer coalesces all
frames written while its previous `send_all` was in flight into one `send_all` —
one syscall per batch instead of per message, which is what lets a single Python
process move tens of thousands of small messages a second over loopback.
"""

from __future__ import annotations

import struct
from collections import deque

import trio
from raftmq.dledger.net.codec import FrameError

from raftmq.process import stages
from raftmq.transport.idle import FrameStart
from raftmq.transport.writer import BatchWriter

__all__ = [
    "HEADER_SIZE",
    "MAX_FRAME_BYTES",
    "PEER",
    "RECEIVE_CHUNK",
    "RPC",
    "FrameError",
    "FrameReader",
    "FrameSplitter",
    "FrameWriter",
    "pack_frame",
]

PEER = 0
RPC = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024
RECEIVE_CHUNK = 256 * 1024

_HEADER = struct.Struct(">IB")  # length, channel
HEADER_SIZE = _HEADER.size


def pack_frame(channel: int, payload) -> bytes:
    """One whole frame as bytes (tests and one-off writers; FrameWriter avoids this copy)."""
    return _HEADER.pack(len(payload), channel) + bytes(payload)


class FrameSplitter:
    """Frames out of bytes, without I/O: `feed` each chunk as it arrives and take the
    complete `(channel, payload: bytes)` frames from `ready` (FrameReader reads a trio
    stream with it; a blocking client, such as the benchmark's, uses it alone).

    Raises FrameError for a frame longer than `max_frame_bytes`, checked from the
    header before buffering it. Parsing is linear in the bytes received: a chunk that
    arrives while nothing is buffered is parsed in place, and only its incomplete tail
    is kept in a bytearray; bytes are appended to that buffer and removed from its
    front once per chunk, never per frame.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()
        self.ready: deque[tuple[int, bytes]] = deque()

    def feed(self, data) -> None:
        buf = self._buf
        if buf:
            buf += data
            src = buf
        else:
            src = data
        end_of_data = len(src)
        max_frame = self._max
        unpack_from = _HEADER.unpack_from
        append = self.ready.append
        pos = 0
        with memoryview(src) as view:
            while end_of_data - pos >= HEADER_SIZE:
                length, channel = unpack_from(src, pos)
                if length > max_frame:
                    raise FrameError(f"frame of {length} bytes exceeds the {max_frame}-byte limit")
                start = pos + HEADER_SIZE
                end = start + length
                if end > end_of_data:
                    break
                append((channel, view[start:end].tobytes()))
                pos = end
            if src is not buf:
                self._buf = bytearray(view[pos:])
        if src is buf and pos:
            del buf[:pos]


class FrameReader(FrameSplitter):
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
        super().__init__(max_frame_bytes)
        self._stream = stream
        self._receive_size = receive_size
        self.frame_start = FrameStart()  # for a deadline on completing a frame

    def __aiter__(self) -> FrameReader:
        return self

    async def __anext__(self) -> tuple[int, bytes]:
        ready = self.ready
        while not ready:
            data = await self._stream.receive_some(self._receive_size)
            if stages.ON:
                stages.mark("peer read")
            if not data:
                if self._buf:
                    raise FrameError(f"stream ended inside a frame ({len(self._buf)} bytes)")
                raise StopAsyncIteration
            self.feed(data)
            self.frame_start.note(bool(self._buf), bool(ready))
        return ready.popleft()


class FrameWriter:
    """Queues frames synchronously; `run()` sends everything queued in one `send_all`.

    A `transport.writer.BatchWriter` that adds this module's frame header. `write` never
    blocks, so the replica's driver can hand out a step's messages without awaiting,
    and frames written while a send is in flight go out together in the next one. The
    owner runs `run()` in a nursery; it returns after `close()` once the queue is
    flushed, and on a stream error it raises after marking the writer closed, so
    later `write`s fail fast with trio.ClosedResourceError.

    The queue is unbounded here; `pending_bytes` lets the owner apply its own limit
    (the peer transport drops messages to a peer that cannot keep up).
    """

    def __init__(self, stream: trio.abc.SendStream, max_frame_bytes: int = MAX_FRAME_BYTES):
        self._out = BatchWriter(stream, "peer written")
        self._max = max_frame_bytes
        self.run = self._out.run

    @property
    def pending_bytes(self) -> int:
        return self._out.pending_bytes

    @property
    def closed(self) -> bool:
        return self._out.closed

    def write(self, channel: int, payload) -> None:
        """Queue one frame; FrameError if it is too large for the peer to accept."""
        length = len(payload)
        if length > self._max:
            raise FrameError(f"frame of {length} bytes exceeds the {self._max}-byte limit")
        self._out.write(_HEADER.pack(length, channel), payload)

    async def close(self) -> None:
        """Stop accepting frames, let a running `run()` flush the queue, close the stream."""
        await self._out.aclose()
