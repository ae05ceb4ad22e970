"""The replica's own writes to disk, and what a failure of each means.

A failed fsync is fatal (`DiskFailure`): the kernel may have dropped the pages it was
to write, so nothing written since can be vouched for, and the process stops. A write
the disk had no room for (ENOSPC, or a quota) is not in doubt that way: nothing it
wrote is relied on, so it is tried again, and what waits for it waits meanwhile.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import TypeVar

import trio

log = logging.getLogger(__name__)
T = TypeVar("T")

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
NO_ROOM_RETRY_S = 0.5  # how often a write the disk had no room for is tried again


class DiskFailure(Exception):
    """An fsync failed. The replica stops: after a failed fsync the kernel may have
    dropped the dirty pages, so nothing written since can be vouched for."""


async def durably(write_and_sync, *args) -> None:
    """Run a blocking write-and-fsync in a worker thread. Any OSError from it (EIO, or
    no room to write the segments' dirty pages back) becomes DiskFailure, which stops
    the process with a clear message: after a failed fsync nothing written since can
    be vouched for."""
    try:
        await trio.to_thread.run_sync(write_and_sync, *args)
    except OSError as exc:
        raise DiskFailure(f"fsync failed ({exc}); stopping before anything depends on it") from exc


async def until_room(capture: Callable[[], Callable[[], T]], what: str) -> T:
    """Run a blocking write in a worker thread, and again every NO_ROOM_RETRY_S while
    the disk has no room for it: whole small files (each written to a new file,
    fsynced and renamed into place: the term and vote, a checkpoint record), which a
    failed attempt leaves untouched, or a ConsumeQueue batch's positional writes,
    which an attempt writes again in full (the same bytes at the same places).
    `capture()`, on the event loop, gives each attempt's write, so a retry writes what
    is current. Whatever waits for the write waits too: a vote is not sent, an entry
    not acknowledged, a checkpoint not recorded, until it is written. Other OSErrors
    are a DiskFailure, as in `durably`. Returns what the write that succeeded
    returned."""
    warned = False
    while True:
        try:
            return await trio.to_thread.run_sync(capture())
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise DiskFailure(f"fsync failed ({exc}) {what}; stopping") from exc
            if not warned:
                log.warning(
                    "no room %s (%s); trying again every %.1f s", what, exc, NO_ROOM_RETRY_S
                )
                warned = True
        await trio.sleep(NO_ROOM_RETRY_S)
