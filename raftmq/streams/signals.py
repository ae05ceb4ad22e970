"""How a server command stops: on SIGTERM or SIGINT it cancels what it runs."""

from __future__ import annotations

import signal

import trio


async def cancel_on_stop_signal(scope: trio.CancelScope) -> None:
    """Wait for SIGTERM or SIGINT, then cancel `scope`: the servers' nurseries shut down
    in order (checkpoints written, connections closed) instead of dying mid-write."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return
