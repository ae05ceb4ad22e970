"""The bridge between grpcio's asyncio server and the proxy's trio side.

grpcio's `grpc.aio` server (unary, server-streaming and bidi calls, TLS) runs on an
asyncio loop of its own thread (`AsyncioThread`); everything that talks to brokers is
trio. `TrioPortal.call`, awaited on the asyncio side, starts the call's coroutine in a
trio nursery (`TrioToken.run_sync_soon`, which wakes trio at once) and awaits an
asyncio future that the trio task settles with `loop.call_soon_threadsafe` when it ends:
one hop each way, no polling. A gRPC call cancelled on the asyncio side (its deadline,
a client gone) cancels the trio task's scope. `Outbox` carries server-initiated
messages (a Telemetry stream's commands) from trio into an asyncio queue the same way.

The cost of the two hops is measured by `tests/test_proxy_bridge.py`'s round trip and
written down in docs/proxy.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import outcome
import trio

__all__ = ["AsyncioThread", "Outbox", "TrioPortal"]


class _Call:
    """One call's trio side: its scope once started, and whether asyncio gave up on it."""

    __slots__ = ("abandoned", "scope")

    def __init__(self) -> None:
        self.scope: trio.CancelScope | None = None
        self.abandoned = False

    def cancel(self) -> None:  # on the trio thread
        self.abandoned = True
        if self.scope is not None:
            self.scope.cancel()


class TrioPortal:
    """Runs coroutine functions in `nursery` (of the trio run `token` belongs to) for
    callers on asyncio loops of other threads."""

    def __init__(self, token: trio.lowlevel.TrioToken, nursery: trio.Nursery) -> None:
        self._token = token
        self._nursery = nursery

    async def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """`await fn(*args)` in trio, from asyncio; its result or its exception.
        trio.RunFinishedError when the trio side has stopped."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        call = _Call()

        def settle(result: outcome.Outcome) -> None:  # on the asyncio thread
            if not future.done():
                future.set_result(result)

        async def run() -> None:  # on the trio thread
            if call.abandoned:
                return
            with trio.CancelScope() as call.scope:
                result = await outcome.acapture(fn, *args)
            if call.scope.cancelled_caught:
                return  # asyncio cancelled it and waits for nothing
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                loop.call_soon_threadsafe(settle, result)

        self._token.run_sync_soon(self._nursery.start_soon, run)
        try:
            result = await future
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(call.cancel)
            raise
        return result.unwrap()


class Outbox:
    """An asyncio queue that trio code fills: `put` from the trio thread, `get` on the
    loop. `close` ends the reader's iteration."""

    _CLOSED = object()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def put(self, item: Any) -> bool:
        """Queue `item` for the reader; False once the outbox or its loop is closed."""
        if self.closed:
            return False
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            return False
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._queue.put_nowait, self._CLOSED)

    def __aiter__(self) -> Outbox:
        return self

    async def __anext__(self) -> Any:
        item = await self._queue.get()
        if item is self._CLOSED:
            raise StopAsyncIteration
        return item


class AsyncioThread:
    """An asyncio loop on a thread of its own, running `main(stop)` until trio asks it to
    stop: `async with AsyncioThread(main) as started:` — `started` is what `main`
    passed to its `ready` callback (a bound port, say). `main(ready, stop)` must call
    `ready(value)` once it serves and return once the asyncio.Event `stop` is set; an
    exception before `ready` is raised here."""

    def __init__(
        self, main: Callable[[Callable[[Any], None], asyncio.Event], Awaitable[None]], name: str
    ) -> None:
        self._main = main
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def __aenter__(self) -> Any:
        token = trio.lowlevel.current_trio_token()
        send, receive = trio.open_memory_channel[outcome.Outcome](1)

        def report(result: outcome.Outcome) -> None:
            with contextlib.suppress(trio.RunFinishedError, trio.WouldBlock):
                token.run_sync_soon(send.send_nowait, result)

        async def body() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self._main(lambda value: report(outcome.Value(value)), self._stop)
            except BaseException as exc:
                report(outcome.Error(exc))
                raise

        def target() -> None:
            with contextlib.suppress(BaseException):  # reported to trio above
                asyncio.run(body())

        self._thread = threading.Thread(target=target, name=self._name, daemon=True)
        self._thread.start()
        result = await receive.receive()
        if isinstance(result, outcome.Error):
            await trio.to_thread.run_sync(self._thread.join)
        return result.unwrap()

    async def __aexit__(self, *exc_info) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._thread.join)
