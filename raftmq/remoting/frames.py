"""Streams of remoting frames: a sans-IO decoder, and a trio reader and writer.

`FrameDecoder` is the protocol with no I/O (h11's shape): bytes in, commands out. It
is what Netty's `LengthFieldBasedFrameDecoder` + `NettyDecoder` do in RocketMQ, and
the tests drive it directly with frames split at every possible boundary.
`FrameReader` feeds it from a trio stream; `FrameWriter` is `NettyEncoder` plus
batching. Reading in batches, buffering partial frames, writing in batches and
closing are `raftmq.transport.frames`', shared with the DLedger peer protocol; here
is the remoting frame: a 4-byte big-endian length, then the header and body.
"""

from __future__ import annotations

import struct

import trio

from raftmq.hotpath import compiled_or
from raftmq.remoting.codec import (
    MAX_FRAME_BYTES,
    check_frame_length,
    decode_payload,
    encode_prefix,
    plain_request,
)
from raftmq.remoting.command import RemotingCommand
from raftmq.remoting.errors import RemotingError
from raftmq.transport import frames as framing
from raftmq.transport.frames import RECEIVE_CHUNK
from raftmq.transport.writer import BatchWriter

__all__ = [
    "FrameDecoder",
    "FrameReader",
    "FrameWriter",
    "split_frames",
    "split_requests",
]

_LENGTH = struct.Struct(">I")


def split_frames(src, max_frame_bytes: int) -> tuple[list[tuple[int, int]], int]:
    """The complete frames at the start of `src`: ([(payload start, payload end)], the
    bytes they take). Each length is checked (`check_frame_length`) as soon as it is
    read, so a hostile one raises RemotingError before anything waits for its bytes.
    Compiled in `raftmq.hotpath`; SPLIT_FRAMES is whichever of the two runs."""
    size = len(src)
    unpack_from = _LENGTH.unpack_from
    frames = []
    pos = 0
    while size - pos >= 4:
        (length,) = unpack_from(src, pos)
        check_frame_length(length, max_frame_bytes)
        end = pos + 4 + length
        if end > size:
            break
        frames.append((pos + 4, end))
        pos = end
    return frames, pos


SPLIT_FRAMES = compiled_or("split_frames", split_frames)


def split_requests(src, max_frame_bytes: int, codes, names: tuple[str, ...]) -> tuple[list, int]:
    """`split_frames`, with each frame that `plain_request` takes (a request of one of
    `codes` with a plain JSON header) as its raw request instead of its span: one call
    per chunk that leaves the common requests of a server's hot path undecoded.
    Compiled in `raftmq.hotpath`; SPLIT_REQUESTS is whichever of the two runs."""
    frames, pos = split_frames(src, max_frame_bytes)
    items = []
    for start, end in frames:
        raw = plain_request(src, start, end, codes, names)
        items.append((start, end) if raw is None else raw)
    return items, pos


SPLIT_REQUESTS = compiled_or("split_requests", split_requests)


class FrameDecoder(framing.FrameSplitter):
    """Split a byte stream into commands: `feed(data)` returns those completed by `data`.

    A frame's length is checked against `max_frame_bytes` as soon as its 4-byte length
    field arrives, before any of it is buffered, so a hostile length costs nothing.
    Any malformed frame raises RemotingError and leaves the decoder unusable: the
    stream's framing can no longer be trusted and the connection must close (Java's
    NettyDecoder closes the channel too). Commands decoded from the same `feed` before
    the bad frame are dropped with it. Buffering is `transport.frames.FrameSplitter`'s.

    With `raw` = (codes, names), a request of one of `codes` whose JSON header is plain
    comes back undecoded, as the raw request `codec.plain_request` describes (its ext
    fields `names` read straight from the header bytes), for a server's hot path: the
    rest are decoded as always, and everything comes back in the order received. A
    buffer a raw request points into is never changed afterwards.
    """

    def __init__(
        self,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        raw: tuple[frozenset[int], tuple[str, ...]] | None = None,
    ) -> None:
        super().__init__(self._decode, RemotingError)
        self._max = max_frame_bytes
        self._raw = raw  # (codes, ext field names) of the requests left raw

    def _decode(self, src) -> tuple[list, int]:
        if self._raw is None:
            frames, pos = SPLIT_FRAMES(src, self._max)
            commands = [decode_payload(src, start, end) for start, end in frames]
        else:
            items, pos = SPLIT_REQUESTS(src, self._max, *self._raw)
            # a frame's span (start, end), or its raw request
            commands = [
                decode_payload(src, *item) if type(item) is tuple else item for item in items
            ]
        return commands, pos


class FrameReader(framing.FrameReader):
    """Async iterator of the commands read from `stream` (or a batch per chunk,
    `receive_batch`, raw requests among them if the reader was given `raw`; see
    FrameDecoder).

    Stops at a clean end of stream; raises RemotingError for a malformed frame or a
    stream that ends inside one. Stream errors (trio.BrokenResourceError, ...) pass
    through.
    """

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        *,
        receive_size: int = RECEIVE_CHUNK,
        raw: tuple[frozenset[int], tuple[str, ...]] | None = None,
    ) -> None:
        super().__init__(stream, FrameDecoder(max_frame_bytes, raw), "remoting read", receive_size)


class FrameWriter(BatchWriter):
    """Queues commands synchronously; `run()` sends everything queued in one `send_all`.

    `transport.writer.BatchWriter` with the remoting encoding: `close()` lets `run()`
    flush first, `abort()` drops the queue; the stream is the owner's. Once closed, a
    write raises trio.ClosedResourceError before anything is encoded.
    """

    def __init__(self, stream: trio.abc.SendStream, max_frame_bytes: int = MAX_FRAME_BYTES):
        super().__init__(stream, "remoting written")
        self._max = max_frame_bytes

    # Frames encoded elsewhere (`hotpath.send_responses`) are queued as they are.
    write_encoded = BatchWriter.queue

    def write(self, command: RemotingCommand) -> None:
        """Queue one command; RemotingError if it cannot be encoded or is too large."""
        if self.closed:
            raise trio.ClosedResourceError("frame writer is closed")
        prefix = encode_prefix(command, self._max)
        if command.body:
            self.queue(prefix, command.body)
        else:
            self.queue(prefix)
