"""Length-prefixed frames over a trio byte stream, read and written in batches: what the
remoting protocol (raftmq.remoting.frames) and the DLedger peer protocol
(raftmq.dledger.net.frames) share. Each keeps only its own header and payload decoding.

Throughput comes from batching in both directions: the reader pulls `RECEIVE_CHUNK`
bytes at a time and splits out every complete frame in the chunk, and the writer
(`transport.writer.BatchWriter`) sends everything written while its previous
`send_all` was in flight in one `send_all` — one syscall per batch instead of per
frame, which is what lets one Python process move tens of thousands of small
messages a second.

- `FrameSplitter` is the sans-IO part (h11's shape): bytes in, frames out. A protocol
  gives it `split(src) -> (frames, bytes they take)`, which checks each declared
  length as soon as it reads it, so a hostile one costs nothing.
- `FrameReader` feeds a splitter from a stream, a chunk at a time.
- A protocol's `FrameWriter` is a BatchWriter: its `write` checks the writer is open,
  encodes one frame and queues the chunks (`BatchWriter.queue`), with nothing between
  the protocol and the batching.

Closing is synchronous, and the stream is its owner's: `close()` stops taking frames
and lets `run()` send what is queued, then return; `abort()` drops the queue; whoever
opened the stream closes it once, after `run()` has returned. Writes are synchronous
(a replica's step, a request processor, the peer that stopped reading found by a
write), so ending the writer must be too: it is called from the same places, with no
task to await in; and one owner closing the stream means it is closed once, on every
way out, with `trio.aclose_forcefully` where the owner was cancelled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from raftmq.process import stages

__all__ = ["RECEIVE_CHUNK", "FrameReader", "FrameSplitter"]

RECEIVE_CHUNK = 256 * 1024


class FrameSplitter:
    """Split a byte stream into frames: `feed(data)` returns those completed by `data`.

    `split(src)` is the protocol's: the complete frames at the start of `src` (bytes or
    a bytearray) and how many bytes they take, raising `error` for a malformed one.
    After such an error the splitter is unusable (the stream's framing can no longer be
    trusted; the connection must close) and the frames split from the same `feed` are
    dropped with it.

    Parsing is linear in the bytes fed: a chunk that arrives while nothing is buffered
    is split in place and only its incomplete tail is kept; a frame spanning chunks is
    accumulated in one bytearray whose incomplete tail moves to a new one once per
    feed, so a frame may keep pointing into the buffer it was split from.
    """

    def __init__(
        self, split: Callable[[bytes | bytearray], tuple[list, int]], error: type[Exception]
    ) -> None:
        self._split = split
        self._error = error
        self._buf = bytearray()
        self._broken: Exception | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buf)

    def feed(self, data) -> list:
        if self._broken is not None:
            raise self._error(f"stopped by an earlier error: {self._broken}")
        buf = self._buf
        if buf:
            buf += data
            src = buf
        elif type(data) is bytes:
            src = data
        else:
            src = bytes(data)
        try:
            frames, pos = self._split(src)
        except self._error as exc:
            self._broken = exc
            self._buf = bytearray()
            raise
        if src is buf:
            if pos:  # a new buffer: frames split from this one may point into it
                self._buf = buf[pos:]
        elif pos < len(src):
            self._buf = bytearray(src[pos:] if pos else src)
        return frames

    def end_of_stream(self) -> None:
        """The peer closed the stream: `error` if it stopped inside a frame."""
        if self._buf:
            raise self._error(f"stream ended inside a frame ({len(self._buf)} bytes buffered)")


class FrameReader:
    """The frames read from `stream` through `splitter`: a batch per chunk received
    (`receive_batch`), or one at a time (`async for`).

    Stops at a clean end of stream; raises the splitter's error for a malformed frame or
    a stream that ends inside one. Stream errors (trio.BrokenResourceError, ...) pass
    through. `frame_began_s` is when the partial frame it holds began (trio's clock;
    None when it holds none), for a deadline on completing it
    (`transport.idle.close_when_stalled`): one clock read per chunk that leaves a new
    partial frame behind.
    """

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        splitter: FrameSplitter,
        stage: str,
        receive_size: int = RECEIVE_CHUNK,
    ) -> None:
        self._stream = stream
        self._splitter = splitter
        self._stage = stage  # the `stages.mark` of each chunk read
        self._receive_size = receive_size
        self._ready: deque = deque()
        self.frame_began_s: float | None = None

    def __aiter__(self) -> FrameReader:
        return self

    async def __anext__(self):
        ready = self._ready
        while not ready:
            frames = await self.receive_batch()
            if frames is None:
                raise StopAsyncIteration
            ready.extend(frames)
        return ready.popleft()

    async def receive_batch(self) -> list | None:
        """Every frame completed by the next chunk received (maybe none); None at the end.

        Lets a connection dispatch a whole chunk's frames in one go. Do not mix with
        iteration, which may hold frames already split."""
        data = await self._stream.receive_some(self._receive_size)
        if stages.ON:
            stages.mark(self._stage)
        splitter = self._splitter
        if not data:
            splitter.end_of_stream()
            return None
        frames = splitter.feed(data)
        if not splitter.buffered_bytes:
            self.frame_began_s = None
        elif frames or self.frame_began_s is None:  # what remains is a frame begun now
            self.frame_began_s = trio.current_time()
        return frames
