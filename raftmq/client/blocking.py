"""Blocking facades for scripts: `with BlockingProducer(namesrv) as p: p.send("T", b"x")`.

The async client runs in a trio loop on a background thread, opened by `with` and
closed when the block ends; each method call is handed to that loop with
`trio.from_thread.run` and blocks the caller until it returns (or raises). One facade
can be used from several threads at once: their calls run concurrently in the loop.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import outcome
import trio

from raftmq.client.consumer import PullConsumer
from raftmq.client.producer import Producer

__all__ = ["BlockingProducer", "BlockingPullConsumer"]


class _Blocking:
    """Runs `make()`'s async context manager in a trio thread and proxies its async
    methods as blocking ones."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def __exit__(self, *exc_info) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the loop already ended
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def alive(self) -> bool:
        """Opened, and its loop still runs."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with self._make() as client, trio.open_nursery() as nursery:
            self._client = client
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()  # iterations the callers left open

    def iterate(
        self, function: Callable[..., AsyncIterator], *args, ahead: int = 2, **kwargs
    ) -> Iterator:
        """The items of the async generator `function(client, *args, **kwargs)`, which
        runs in the loop up to `ahead` items before the caller takes them: one thread
        hop per item. What it raises is raised here; leaving the loop early cancels it."""
        if self._token is None:
            raise RuntimeError(f"{type(self).__name__} is not open: use it in a with block")
        items = function(self._client, *args, **kwargs)
        receive, scope = trio.from_thread.run(self._forward, items, ahead, trio_token=self._token)
        try:
            while True:
                try:
                    got = trio.from_thread.run(receive.receive, trio_token=self._token)
                except trio.EndOfChannel:
                    return
                yield got.unwrap()
        finally:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(scope.cancel, trio_token=self._token)

    async def _forward(self, items: AsyncIterator, ahead: int):
        send, receive = trio.open_memory_channel(ahead)
        scope = trio.CancelScope()

        async def forward() -> None:
            with scope:
                async with send, contextlib.aclosing(items):
                    try:
                        async for item in items:
                            await send.send(outcome.Value(item))
                    except Exception as exc:  # noqa: BLE001 - the caller's to see
                        await send.send(outcome.Error(exc))

        self._nursery.start_soon(forward)
        return receive, scope

    def _call(self, name: str, *args, **kwargs):
        if self._token is None:
            raise RuntimeError(f"{type(self).__name__} is not open: use it in a with block")
        method = functools.partial(getattr(self._client, name), *args, **kwargs)
        return trio.from_thread.run(method, trio_token=self._token)


def _blocking(name: str):
    """A method that runs the async client's method `name` and waits for its result."""

    def method(self: _Blocking, *args, **kwargs):
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    return method


class BlockingProducer(_Blocking):
    """Producer's arguments; `send` and `send_batch` block and return the SendResult."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(lambda: Producer(*args, **kwargs))

    send = _blocking("send")
    send_batch = _blocking("send_batch")


class BlockingPullConsumer(_Blocking):
    """PullConsumer's arguments and methods, blocking."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(lambda: PullConsumer(*args, **kwargs))

    fetch_queues = _blocking("fetch_queues")
    pull = _blocking("pull")
    min_offset = _blocking("min_offset")
    max_offset = _blocking("max_offset")
    search_offset = _blocking("search_offset")
    query_offset = _blocking("query_offset")
    update_offset = _blocking("update_offset")
