"""What the message store needs of the log under it: the replicated-log protocol.

The CommitLog here is a DLedger log (`DLedgerServer`); the simulator's `SimServer`
(jepsen/sim_broker.py) is another implementation. The store appends records,
reads them back by byte position (a message's physical offset) or as encoded
entries by index (the dispatcher), follows the commit index, and holds retention
back to its dispatch checkpoint; nothing else. Entries are read in DLedger's entry
encoding (`dledger.store.entry`) by `commitlog.DLedgerCommitLog`.

The classic master/slave log (`classic_log.ClassicLog`) presents the read side
(`store`, `replica`, the handlers) and brings its own `CommitLog`
(`classic_commitlog`) for the rest: the message store uses either through the
`CommitLog` protocol below.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from raftmq.dledger.codes import Code

# (index, position) of each appended entry on success, None on failure
AppendCallback = Callable[[Code, list[tuple[int, int]] | None], None]


class LogEntries(Protocol):
    """The log's entries as this replica holds them (a `dledger.store.base.LogStore`)."""

    begin_index: int  # the first entry held (retention, or a reset, moves it up)
    segment_size: int  # how entries are placed (`dledger.store.entry.places`)
    end_pos: int  # the byte position after the last entry held (where the next goes)

    @property
    def end_index(self) -> int:
        """The last entry held (begin_index - 1 when none is)."""

    @property
    def empty(self) -> bool: ...

    def pos_at(self, index: int) -> int:
        """The byte position of the entry at `index`."""

    def read_at(self, pos: int, size: int) -> bytes:
        """`size` bytes from byte position `pos`, within one entry (IndexError if absent)."""

    def read_encoded(self, index: int, max_bytes: int) -> tuple[bytes, int]:
        """Encoded entries from `index` on: (bytes, how many); at least one."""

    def mapped_data(self) -> tuple[dict[int, mmap.mmap], int, int, int]:
        """What `read_at` reads, for reads in bulk: (segment start -> its buffer, the
        segment size, the first position and the end of what may be read there)."""


class CommitPosition(Protocol):
    committed_index: int  # the last entry a quorum holds; never decreases


@runtime_checkable
class ReplicatedLog(Protocol):
    store: LogEntries
    replica: CommitPosition

    def add_commit_handler(self, handler: Callable[[int], None]) -> None:
        """Call `handler(committed index)` whenever the commit index moves."""

    def add_retention_limit(self, limit: Callable[[], int]) -> None:
        """Retention keeps every entry from `limit()` on."""

    def append_nowait(
        self,
        bodies: list[bytes],
        callback: AppendCallback,
        *,
        placed: tuple[int, int] | None = None,
    ) -> None:
        """Append `bodies` as consecutive entries; `callback(code, positions)` once they
        are committed (Code.SUCCESS) or refused or lost (another code, None). With
        `placed` (where the first goes, where the last ends), they were made for those
        positions: written there or refused whole, with a code of
        `dledger.codes.NOT_APPENDED`."""


class CommitLog(Protocol):
    """What the message store and the send path use of a CommitLog: the DLedger one
    (`commitlog.DLedgerCommitLog`) or the classic one (`classic_commitlog`)."""

    next_offsets: dict[tuple[str, int], int]  # the master's next queue offset per queue
    old_log: object  # the classic files an upgraded DLedger log continues, or None

    def reset_offsets(self, table: dict[tuple[str, int], int]) -> None: ...

    async def put(self, records: list[bytes]) -> list[tuple[int, int]]:
        """(physical offset, queue offset) of each record once stored."""

    def put_nowait(self, records: list[bytes], done: Callable) -> None:
        """`put` with a callback: `done(code, [(physical offset, queue offset)] or None)`."""

    def read(self, physical_offset: int, size: int) -> bytes: ...

    def read_message(self, physical_offset: int) -> bytes: ...

    def scan(self, first: int, last: int) -> Iterator[tuple[int, object]]:
        """(index, DispatchRequest or None) for the log's entries first..last."""

    def scan_rows(self, first: int, last: int) -> Iterator[list[tuple[int, tuple | None]]]:
        """`scan` with each DispatchRequest's fields as a tuple, in lists of rows (what
        the dispatcher reads: no object built per message, and a batch at a time)."""
