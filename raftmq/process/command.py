"""What a server's command does around its server: read the config (a bad one is
status 2 with one line naming the key or file), run until a stop signal (status 0),
and turn a port it cannot bind into status 3, with one line each. `mqnamesrv` and
`mqcontroller` are built of these."""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from raftmq.process.errors import first_leaf
from raftmq.process.signals import cancel_on_stop_signal

__all__ = [
    "EXIT_BIND",
    "EXIT_OK",
    "EXIT_USAGE",
    "load_or_none",
    "run_server",
    "serve_until_stopped",
]

EXIT_OK, EXIT_USAGE, EXIT_BIND = 0, 2, 3
T = TypeVar("T")
S = TypeVar("S")


def load_or_none(prog: str, load: Callable[[], tuple[T, list[str]]]) -> T | None:
    """The config `load()` reads, its warnings printed; None (the reason printed) when
    it raises ValueError."""
    try:
        config, warnings = load()
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    for warning in warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    return config


async def serve_until_stopped(make: Callable[[], S], ready: Callable[[S, int], None]) -> None:
    """Make a server (in the run: servers make trio objects) and run its `serve`
    (a nursery task that reports its port) until SIGTERM, SIGINT or SIGHUP;
    `ready(server, port)` once it listens."""
    server = make()
    async with trio.open_nursery() as nursery:
        await nursery.start(cancel_on_stop_signal, nursery.cancel_scope)
        ready(server, await nursery.start(server.serve))


def run_server(
    prog: str,
    log_level: str,
    main: Callable[[], Awaitable[None]],
    where: Callable[[BaseException], str],
) -> int:
    """`trio.run(main)` with logging at `log_level`: EXIT_OK after a stop signal,
    EXIT_BIND with `where(error)` printed when a port could not be bound."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    status = EXIT_OK
    try:
        trio.run(main)
    except* OSError as group:
        print(f"{prog}: {where(first_leaf(group))}", file=sys.stderr)
        status = EXIT_BIND
    except* KeyboardInterrupt:
        pass
    return status
