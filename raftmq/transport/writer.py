"""A byte-stream writer that queues synchronously and sends in batches.

Throughput comes from batching: everything written while the previous `send_all`
was in flight goes out together in the next one — one syscall per batch instead of
per message. Framing is the caller's: `queue` takes already-encoded chunks, and a
protocol's frame writer is a BatchWriter whose `write` encodes a frame and queues it
(raftmq.remoting.frames, raftmq.dledger.net.frames).

Latency comes from not waiting: a write to an idle writer over a plain socket (its
task not inside a send, nothing queued) goes to the kernel at once, from `write`
itself, as asyncio's and uvloop's transports do, instead of waiting for the writer's
task, which runs only after every other task the loop has ready (on a single send,
the push to a follower, the follower's ack and the answer to the client each waited
50-150 µs for that). What the socket does not take at once is queued for the task,
and so is everything written while the task sends: order and back-pressure are as
before, and under load, with the socket's buffer full, writes batch as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import termios

import trio

from raftmq.process import stages

__all__ = ["BatchWriter", "plain_socket", "unread_bytes"]


class BatchWriter:
    """Queues bytes synchronously; `run()` sends everything queued in one `send_all`.

    `queue` never blocks, so a state machine or a processor can hand out messages
    without awaiting. The owner runs `run()` in a nursery. Ending it:

    - `close()` refuses further writes; `run()` sends what is queued, then returns;
    - `abort()` refuses further writes and drops what is queued; `run()` returns;
    - cancelling `run()`, or a stream error in it, marks the writer closed and drops
      the queue (the error propagates).

    After any of these, `closed` is True and `queue` raises trio.ClosedResourceError.
    The stream is the owner's: it closes it once `run()` has returned (transport.frames
    says why). The queue is unbounded; `pending_bytes` lets the owner apply its own
    limit.
    """

    def __init__(self, stream: trio.abc.SendStream, stage: str = "written") -> None:
        self._stream = stream
        self._stage = stage  # the `stages.mark` of each batch sent
        self._pending = bytearray()
        self._wake = trio.Event()
        self.closed = False
        self._running = False
        self._sending = False  # the task is inside send_all: writes must queue behind it
        self._socket = plain_socket(stream)  # for writing through; None for TLS and others

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def queue(self, *chunks) -> None:
        """Queue `chunks` (bytes-like) back to back; they leave in the same batch."""
        if self.closed:
            raise trio.ClosedResourceError("writer is closed")
        pending = self._pending
        if not (pending or self._sending) and self._running and self._socket is not None:
            chunks = self._write_through(chunks)
            if not chunks:
                return
        for chunk in chunks:
            pending += chunk
        self._wake.set()

    def _write_through(self, chunks: tuple) -> tuple:
        """Hand `chunks` to the kernel now; returns what it did not take (to queue).

        Any error leaves the chunks to the task, whose `send_all` meets the same error
        and ends the writer the usual way."""
        fd = self._socket.fileno()  # -1 once the stream is closed: its number may be reused
        if fd < 0:
            return chunks
        try:
            sent = os.writev(fd, chunks)
        except OSError:  # BlockingIOError (buffer full) or a broken socket
            return chunks
        if stages.ON:
            stages.mark(self._stage)
        left = []
        for chunk in chunks:
            size = len(chunk)
            if sent >= size:
                sent -= size
            else:
                left.append(memoryview(chunk)[sent:])
                sent = 0
        return tuple(left)

    def close(self) -> None:
        """Refuse further writes; a running `run()` flushes the queue and returns."""
        self.closed = True
        self._wake.set()

    def finish(self) -> None:
        """`close()`, and end the stream's sending direction (a FIN) at once when
        everything queued is already in the kernel: the peer then reads the last bytes
        with the end right behind them, not after this task next runs."""
        self.close()
        if self._pending or self._sending or self._socket is None:
            return  # the owner closes the stream once `run()` has flushed
        fd = self._socket.fileno()
        if fd >= 0:
            with contextlib.suppress(OSError):  # a broken socket: the owner closes it
                self._socket.shutdown(socket.SHUT_WR)

    def abort(self) -> None:
        """Refuse further writes and drop the queue; `run()` returns without sending it."""
        self.closed = True
        self._pending = bytearray()
        self._wake.set()

    async def run(self) -> None:
        """Send queued bytes until closed; one `send_all` per batch."""
        if self._running:
            raise RuntimeError("BatchWriter.run() is already running")
        self._running = True
        stream = self._stream
        try:
            while True:
                if self._pending:
                    batch, self._pending = self._pending, bytearray()
                    self._sending = True
                    try:
                        await stream.send_all(batch)
                    finally:
                        self._sending = False
                    if stages.ON:
                        stages.mark(self._stage)
                elif self.closed:
                    return
                else:
                    await self._wake.wait()
                    self._wake = trio.Event()
        except BaseException:
            self.abort()
            raise


def plain_socket(stream):
    """The socket of a plain socket stream (trio.SocketStream, perhaps inside a wrapper
    that only watches what it receives, `wrapped_stream`), else None: a TLS stream's
    bytes must pass through its encryption, so only its task writes them."""
    stream = getattr(stream, "wrapped_stream", stream)
    return stream.socket if type(stream) is trio.SocketStream else None


def unread_bytes(stream) -> int:
    """How many received bytes wait in the kernel for a plain socket stream's reader
    (FIONREAD); 0 for a TLS stream, whose bytes the kernel cannot count as requests."""
    sock = plain_socket(stream)
    if sock is None or sock.fileno() < 0:
        return 0
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:  # a broken socket: its reader meets the error
        return 0
    return int.from_bytes(answer, sys.byteorder, signed=True)
