"""Streams of remoting frames: a sans-IO decoder, and a trio reader and writer.

`FrameDecoder` is the protocol with no I/O (h11's shape): bytes in, commands out. It
is what Netty's `LengthFieldBasedFrameDecoder` + `NettyDecoder` do in RocketMQ, and
the tests drive it directly with frames split at every possible boundary.
`FrameReader` feeds it from a trio stream; `FrameWriter` is `NettyEncoder` plus
batching.

Throughput comes from batching in both directions, as in `dledger.net.frames`: the
reader pulls 256 KiB at a time and decodes every complete frame in the chunk, and the
writer sends everything queued while its previous `send_all` was in flight in one
`send_all` — one syscall per batch instead of per command.
"""

from __future__ import annotations

import struct
from collections import deque

import trio

from raftmq.hotpath import compiled_or
from raftmq.process import stages
from raftmq.remoting.codec import (
    MAX_FRAME_BYTES,
    check_frame_length,
    decode_payload,
    encode_prefix,
    plain_request,
)
from raftmq.remoting.command import RemotingCommand
from raftmq.remoting.errors import RemotingError
from raftmq.transport.idle import FrameStart
from raftmq.transport.writer import BatchWriter

__all__ = [
    "RECEIVE_CHUNK",
    "FrameDecoder",
    "FrameReader",
    "FrameWriter",
    "split_frames",
    "split_requests",
]

RECEIVE_CHUNK = 256 * 1024

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


class FrameDecoder:
    """Split a byte stream into commands: `feed(data)` returns those completed by `data`.

    A frame's length is checked against `max_frame_bytes` as soon as its 4-byte length
    field arrives, before any of it is buffered, so a hostile length costs nothing.
    Any malformed frame raises RemotingError and leaves the decoder unusable: the
    stream's framing can no longer be trusted and the connection must close (Java's
    NettyDecoder closes the channel too). Commands decoded from the same `feed` before
    the bad frame are dropped with it.

    Parsing is linear in the bytes fed: a chunk that arrives while nothing is buffered
    is decoded in place and only its incomplete tail is kept; a frame spanning chunks
    is accumulated in one bytearray whose incomplete tail moves to a new one once per
    feed.

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
        self._max = max_frame_bytes
        self._raw = raw  # (codes, ext field names) of the requests left raw
        self._buf = bytearray()
        self._broken: RemotingError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buf)

    def feed(self, data) -> list:
        if self._broken is not None:
            raise RemotingError(f"decoder stopped by an earlier error: {self._broken}")
        try:
            return self._feed(data)
        except RemotingError as exc:
            self._broken = exc
            self._buf = bytearray()
            raise

    def _feed(self, data) -> list:
        buf = self._buf
        if buf:
            buf += data
            src = buf
        elif type(data) is bytes:
            src = data
        else:
            src = bytes(data)
        if self._raw is None:
            frames, pos = SPLIT_FRAMES(src, self._max)
            commands = [decode_payload(src, start, end) for start, end in frames]
        else:
            items, pos = SPLIT_REQUESTS(src, self._max, *self._raw)
            # a frame's span (start, end), or its raw request
            commands = [
                decode_payload(src, *item) if type(item) is tuple else item for item in items
            ]
        if src is buf:
            if pos:  # a new buffer: the raw requests returned point into this one
                self._buf = buf[pos:]
        elif pos < len(src):
            self._buf = bytearray(src[pos:] if pos else src)
        return commands

    def end_of_stream(self) -> None:
        """The peer closed the stream: RemotingError if it stopped inside a frame."""
        if self._buf:
            raise RemotingError(f"stream ended inside a frame ({len(self._buf)} bytes buffered)")


class FrameReader:
    """Async iterator of the commands read from `stream`.

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
        self._stream = stream
        self._decoder = FrameDecoder(max_frame_bytes, raw)
        self._receive_size = receive_size
        self._ready: deque[RemotingCommand] = deque()
        self.frame_start = FrameStart()  # for a deadline on completing a frame

    def _feed(self, data) -> list:
        commands = self._decoder.feed(data)
        self.frame_start.note(self._decoder.buffered_bytes > 0, bool(commands))
        return commands

    def __aiter__(self) -> FrameReader:
        return self

    async def __anext__(self) -> RemotingCommand:
        ready = self._ready
        while not ready:
            data = await self._stream.receive_some(self._receive_size)
            if not data:
                self._decoder.end_of_stream()
                raise StopAsyncIteration
            ready.extend(self._feed(data))
        return ready.popleft()

    async def receive_batch(self) -> list | None:
        """Every command completed by the next chunk received (maybe none), raw requests
        among them if the reader was given `raw` (see FrameDecoder); None at the end.

        Lets a connection dispatch a whole chunk's commands in one go. Do not mix
        with iteration, which may hold commands already decoded.
        """
        data = await self._stream.receive_some(self._receive_size)
        if stages.ON:
            stages.mark("remoting read")
        if not data:
            self._decoder.end_of_stream()
            return None
        return self._feed(data)


class FrameWriter:
    """Queues commands synchronously; `run()` sends everything queued in one `send_all`.

    A `transport.writer.BatchWriter` that encodes commands. `write` never blocks, so a
    processor or the broker can send without awaiting, and frames written while a send
    is in flight leave together in the next one. The owner runs `run()` in a nursery;
    `abort()` drops the queue and stops it (the stream is the owner's), `close()` lets
    it flush first. On a stream error it raises after marking the writer closed, so
    later `write`s fail fast with trio.ClosedResourceError. `pending_bytes` lets the
    owner bound the queue.
    """

    def __init__(self, stream: trio.abc.SendStream, max_frame_bytes: int = MAX_FRAME_BYTES):
        self._out = out = BatchWriter(stream, "remoting written")
        self._max = max_frame_bytes
        self.run = out.run
        self.close = out.close
        self.abort = out.abort

    @property
    def pending_bytes(self) -> int:
        return self._out.pending_bytes

    @property
    def closed(self) -> bool:
        return self._out.closed

    def write_encoded(self, frames: bytes) -> None:
        """Queue frames encoded elsewhere (`hotpath.send_responses`), sent as they are."""
        out = self._out
        if out.closed:
            raise trio.ClosedResourceError("frame writer is closed")
        out.write(frames)

    def write(self, command: RemotingCommand) -> None:
        """Queue one command; RemotingError if it cannot be encoded or is too large."""
        out = self._out
        if out.closed:
            raise trio.ClosedResourceError("frame writer is closed")
        prefix = encode_prefix(command, self._max)
        if command.body:
            out.write(prefix, command.body)
        else:
            out.write(prefix)
