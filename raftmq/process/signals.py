"""How a command stops on a signal.

Servers (`mqbroker`, `mqnamesrv`, `mqcontroller`, `dledger server`, `mqconsole`) stop on
SIGTERM, SIGINT or SIGHUP by cancelling what they run, as RocketMQ's JVM runs its
shutdown hooks on all three. The tools that start servers of their own (the local
clusters, the demos) stop the same way on all three: the run is cancelled, the `async
with` blocks that own the child processes stop and reap them on the way out, and the
exit status is the shell's 128 + the signal's number (130, 143, 129).

A SIGHUP that was ignored when the process started (`nohup`) stays ignored.
"""

from __future__ import annotations

import gc
import signal
import warnings
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

T = TypeVar("T")


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM and SIGINT, and SIGHUP unless the process was started ignoring it."""
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hangup)


async def cancel_on_stop_signal(
    scope: trio.CancelScope, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """Wait for a stop signal, then cancel `scope`: the servers' nurseries shut down
    in order (checkpoints written, connections closed) instead of dying mid-write.

    `await nursery.start(cancel_on_stop_signal, nursery.cancel_scope)` before the
    server prints that it is ready: a signal sent as soon as the line is read would
    otherwise find the default action still in place and kill the process outright."""
    with trio.open_signal_receiver(*stop_signals()) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
            return


class InterruptOnStopSignals:
    """A tool that starts servers of its own stops on SIGTERM, SIGINT and SIGHUP alike.

    Inside `run` a stop signal cancels the run, so the `async with` blocks that own the
    child processes stop and reap them on the way out, as they do on any cancellation.
    It was a KeyboardInterrupt raised wherever the main thread happened to be: landing
    between an `AsyncExitStack` entering a nursery and the stack being kept, it left
    that nursery open, and trio ended the run with "Nursery stack corrupted" and status
    1 (seen once in ~30 full suites). Outside `run` (before trio starts, after it ends)
    the three signals still raise KeyboardInterrupt, which a command turns into its
    exit status. `exit_status` is 128 + the last stop signal received.
    """

    def __init__(self) -> None:
        self.received = signal.SIGINT

    def install(self) -> InterruptOnStopSignals:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # A command started in the background by a shell ignores SIGINT; the
            # signal would be lost with it.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in stop_signals():
            if sig != signal.SIGINT:
                signal.signal(sig, self._interrupt)
        return self

    def _interrupt(self, signum: int, _frame) -> None:
        """Re-raised as SIGINT: in the moments trio runs before `run` takes the signals
        over, trio's own SIGINT handling raises KeyboardInterrupt at a safe point."""
        self.received = signal.Signals(signum)
        signal.raise_signal(signal.SIGINT)

    @property
    def exit_status(self) -> int:
        return 128 + self.received

    def run(self, async_fn: Callable[..., Awaitable[T]], *args) -> T | None:
        """`trio.run(async_fn, *args)`, or None if a stop signal cancelled it (or
        interrupted the moments before trio took the signals over).

        A coroutine created but never started when the run was stopped (trio's
        connection attempts make several) would print "coroutine ... was never
        awaited" when collected at exit, a second message after the one line that says
        the command was stopped; what a stopped run left behind is collected here,
        with that warning ignored."""
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="coroutine .* was never awaited", category=RuntimeWarning
            )
            try:
                outcome = trio.run(self._until_stopped, async_fn, args)
            except* KeyboardInterrupt:
                outcome = None
            gc.collect()
        return None if outcome is None else outcome[0]

    async def _until_stopped(
        self, async_fn: Callable[..., Awaitable[T]], args: tuple
    ) -> tuple[T] | None:
        """(async_fn's result,), or None when a stop signal cancelled it."""
        with trio.open_signal_receiver(*stop_signals()) as signals:
            async with trio.open_nursery() as nursery:
                stopped = False

                async def cancel_on_signal() -> None:
                    nonlocal stopped
                    async for signum in signals:
                        self.received = signal.Signals(signum)
                        stopped = True
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(cancel_on_signal)
                result = await async_fn(*args)
                nursery.cancel_scope.cancel()
        return None if stopped else (result,)
