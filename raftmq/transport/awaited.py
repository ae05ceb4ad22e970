"""`Awaited`: a completion callback that a task can wait for.

The data path answers without a task per request: DLedger's `append_nowait` and the
CommitLogs' `put_nowait` call back when an append is done. A caller that has a task
anyway (a send that explains its errors, a metadata write, an RPC) hands them an
`Awaited` and waits for the arguments of the call, here rather than each layer
pairing an event with a list of its own.
"""

from __future__ import annotations

import trio

__all__ = ["Awaited"]


class Awaited:
    """A callback; `await awaited.result()` returns the arguments it was called with.

    awaited = Awaited()
    server.append_nowait(bodies, awaited)
    code, positions = await awaited.result()
    """

    __slots__ = ("_args", "_event")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._args: tuple = ()

    def __call__(self, *args) -> None:
        assert not self._event.is_set(), "a completion is called once"
        self._args = args
        self._event.set()

    async def result(self) -> tuple:
        """The arguments of the call, once it has come."""
        await self._event.wait()
        return self._args
