"""How a command stops on a signal.

Servers (`mqbroker`, `mqnamesrv`, `dledger server`, `mqconsole`) stop on SIGTERM, SIGINT
or SIGHUP by cancelling what they run, as RocketMQ's JVM runs its shutdown hooks on all
three. The tools that start servers of their own (the local clusters, the demos) stop
on SIGTERM and SIGHUP exactly as on Ctrl-C: the signal becomes a KeyboardInterrupt, the
`async with` blocks that own the child processes stop and reap them on the way out, and
the exit status is the shell's 128 + the signal's number (130, 143, 129).

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
    """SIGTERM and SIGHUP raise KeyboardInterrupt where SIGINT would, from `install()` on.

    The handler re-raises the signal as SIGINT, so inside `trio.run` trio's own SIGINT
    handling delivers the KeyboardInterrupt at a safe point, and outside it Python's
    default handler raises it. `exit_status` is 128 + the last stop signal received.
    """

    def __init__(self) -> None:
        self.received = signal.SIGINT

    def install(self) -> InterruptOnStopSignals:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # A command started in the background by a shell ignores SIGINT, and the
            # re-raised signal would be lost with it.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in stop_signals():
            if sig != signal.SIGINT:
                signal.signal(sig, self._interrupt)
        return self

    def _interrupt(self, signum: int, _frame) -> None:
        self.received = signal.Signals(signum)
        signal.raise_signal(signal.SIGINT)

    @property
    def exit_status(self) -> int:
        return 128 + self.received

    def run(self, async_fn: Callable[..., Awaitable[T]], *args) -> T | None:
        """`trio.run(async_fn, *args)`, or None if a stop signal interrupted it.

        The interrupt can land between a coroutine's creation and its first await
        (trio's connection attempts make several), and that coroutine, which will
        never run, printed "coroutine ... was never awaited" when collected at exit: a
        second message after the one line that says the command was stopped. What an
        interrupted run left behind is collected here, with that warning ignored."""
        with warnings.catch_warnings():
            try:
                return trio.run(async_fn, *args)
            except* KeyboardInterrupt:  # bare, or inside a nursery's group
                warnings.filterwarnings(
                    "ignore", message="coroutine .* was never awaited", category=RuntimeWarning
                )
            gc.collect()
        return None
