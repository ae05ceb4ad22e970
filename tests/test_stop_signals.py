"""How the tools that start servers of their own stop on a signal (process/signals.py)."""

from __future__ import annotations

import os
import signal
from contextlib import AsyncExitStack

import pytest
import trio

from raftmq.process.signals import InterruptOnStopSignals


@pytest.fixture
def restored_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_between_entering_a_nursery_and_keeping_it_stops_the_run_cleanly(
    restored_handlers, sig
):
    """A client enters its nursery through an AsyncExitStack and keeps the stack a few
    bytecodes later. A stop signal that arrived in between was a KeyboardInterrupt
    raised right there: the nursery was never closed and trio ended the demo with
    "Nursery stack corrupted" and status 1. Now the signal cancels the run: the stack is
    kept, closed on the way out, and the run returns None with 128 + the signal."""
    stop = InterruptOnStopSignals().install()
    closed = []

    async def client() -> str:
        stack = AsyncExitStack()
        await stack.enter_async_context(trio.open_nursery())
        os.kill(os.getpid(), sig)  # delivered before the next bytecode completes
        kept = stack
        try:
            await trio.sleep_forever()
        finally:
            await kept.aclose()
            closed.append(True)
        return "not stopped"

    assert stop.run(client) is None
    assert closed == [True]
    assert stop.exit_status == 128 + sig


def test_a_run_that_ends_by_itself_returns_its_result(restored_handlers):
    stop = InterruptOnStopSignals().install()

    async def work(n: int) -> int:
        await trio.sleep(0)
        return n * 2

    assert stop.run(work, 21) == 42
