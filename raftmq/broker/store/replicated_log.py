"""What the message store needs of the log under it: the replicated-log protocol.

The CommitLog here is a DLedger log (`DLedgerServer`); the simulator's `SimServer`
(jepsen/sim_broker.py) is another implementation, and a classic master/slave
CommitLog is meant to be a third. The store appends records, reads them back by
byte position (a message's physical offset) or as encoded entries by index (the
dispatcher), follows the commit index, and holds retention back to its dispatch
checkpoint; nothing else. Entries are read in DLedger's entry encoding
(`dledger.store.entry`): every implementation presents its log that way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from raftmq.dledger.codes import Code

# (index, position) of each appended entry on success, None on failure
AppendCallback = Callable[[Code, list[tuple[int, int]] | None], None]


class LogEntries(Protocol):
    """The log's entries as this replica holds them (a `dledger.store.base.LogStore`)."""

    begin_index: int  # the first entry held (retention, or a reset, moves it up)
    # Called as hook(body_pos, body) -> body of the same length for every entry a
    # leader places, before its bytes are written: the CommitLog writes the message's
    # physical and queue offsets into the record there.
    append_hook: Callable[[int, bytes], bytes] | None

    @property
    def end_index(self) -> int:
        """The last entry held (begin_index - 1 when none is)."""

    @property
    def end_pos(self) -> int:
        """The byte position after the last entry held (the next entry's, roughly)."""

    @property
    def empty(self) -> bool: ...

    def pos_at(self, index: int) -> int:
        """The byte position of the entry at `index`."""

    def read_at(self, pos: int, size: int) -> bytes:
        """`size` bytes from byte position `pos`, within one entry (IndexError if absent)."""

    def read_encoded(self, index: int, max_bytes: int) -> tuple[bytes, int]:
        """Encoded entries from `index` on: (bytes, how many); at least one."""


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

    def append_nowait(self, bodies: list[bytes], callback: AppendCallback) -> None:
        """Append `bodies` as consecutive entries; `callback(code, positions)` once they
        are committed (Code.SUCCESS) or refused or lost (another code, None)."""
