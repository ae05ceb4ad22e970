"""A byte-stream writer that queues synchronously and sends in batches.

Throughput comes from batching: everything written while the previous `send_all`
was in flight goes out together in the next one — one syscall per batch instead of
per message. Framing is the caller's: `write` takes already-encoded chunks.
"""

from __future__ import annotations

import trio

from raftmq.streams import stages

__all__ = ["BatchWriter"]


class BatchWriter:
    """Queues bytes synchronously; `run()` sends everything queued in one `send_all`.

    `write` never blocks, so a state machine or a processor can hand out messages
    without awaiting. The owner runs `run()` in a nursery. Ending it:

    - `close()` refuses further writes; `run()` sends what is queued, then returns;
    - `abort()` refuses further writes and drops what is queued; `run()` returns;
    - `await aclose()` is `close()`, waits for a running `run()` to flush, then closes
      the stream;
    - cancelling `run()`, or a stream error in it, marks the writer closed and drops
      the queue (the error propagates).

    After any of these, `write` raises trio.ClosedResourceError. The queue is
    unbounded; `pending_bytes` lets the owner apply its own limit.
    """

    def __init__(self, stream: trio.abc.SendStream, stage: str = "written") -> None:
        self._stream = stream
        self._stage = stage  # the `stages.mark` of each batch sent
        self._pending = bytearray()
        self._wake = trio.Event()
        self._done = trio.Event()
        self._closed = False
        self._running = False

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, *chunks) -> None:
        """Queue `chunks` (bytes-like) back to back; they leave in the same batch."""
        if self._closed:
            raise trio.ClosedResourceError("writer is closed")
        pending = self._pending
        for chunk in chunks:
            pending += chunk
        self._wake.set()

    def close(self) -> None:
        """Refuse further writes; a running `run()` flushes the queue and returns."""
        self._closed = True
        self._wake.set()

    def abort(self) -> None:
        """Refuse further writes and drop the queue; `run()` returns without sending it."""
        self._closed = True
        self._pending = bytearray()
        self._wake.set()

    async def aclose(self) -> None:
        """`close()`, wait for a running `run()` to flush, then close the stream."""
        self.close()
        if self._running:
            await self._done.wait()
        await self._stream.aclose()

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
                    await stream.send_all(batch)
                    if stages.ON:
                        stages.mark(self._stage)
                elif self._closed:
                    return
                else:
                    await self._wake.wait()
                    self._wake = trio.Event()
        except BaseException:
            self.abort()
            raise
        finally:
            self._done.set()
