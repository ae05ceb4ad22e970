"""The interface the replication core uses to read and write its log.

Writes land in memory or the page cache at once and are made durable later:
`sync_plan()` (on the event loop) captures what to fsync, `SyncPlan.run()` (in a
worker thread) does it, and the core is told "persisted up to index N of
generation G". Any truncation bumps `generation`, so an fsync that started
before a truncation can never vouch for entries written after it.
"""

from __future__ import annotations

import abc
import mmap

import attrs
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.entry import Entry

from raftmq.hotpath import compiled_or

NORMAL = EntryType.NORMAL


class InconsistentAppend(ValueError):
    """A follower was asked to append entries that do not continue its log."""


class StoreClosed(ValueError):
    """The store was closed (its owner stopped, perhaps on a disk failure): nothing can
    be read from or written to it any more. A ValueError, as I/O on a closed file is."""


class ForeignLog(Exception):
    """A leader's first entry does not continue this log's beginning: the two logs
    continue different classic CommitLogs (an upgrade in place; see `file`)."""


def foreign_beginning(blob, end_pos: int, chain: int | None, segment_size: int) -> str | None:
    """Why the leader's entry 0 (at the head of `blob`) does not begin an empty log
    that begins at `end_pos` with chain seed `chain`, if it does not: it sits at
    another position or is chained to another seed, so the leader's log continues
    another CommitLog than this one. None for any other refusal."""
    _o, _t, size, e_index, _term, e_pos, _c = next(codec.iter_entries(blob))
    if e_index != 0 or size + codec.MIN_BLANK_SIZE > segment_size:
        return None
    if e_pos != codec.place(end_pos, size, segment_size):
        return (
            f"the leader's log begins at offset {e_pos}, this node's at {end_pos}: "
            "its old commitlog files differ from the leader's (copy the leader's store here)"
        )
    try:
        codec.check(memoryview(blob), 0, chain)
    except codec.CorruptEntry as exc:
        if "chainCrc" in str(exc):
            return (
                f"the leader's log begins at offset {e_pos} as this node's does, but after "
                "another last message: its old commitlog files differ from the leader's "
                "(copy the leader's store here)"
            )
    return None


def validate_continuation(
    blob, next_index: int, end_pos: int, end_term: int, prev_chain: int | None, segment_size: int
) -> list[tuple[int, int, int, int, int, int, int]]:
    """Check that a leader's encoded entries continue a log; returns what they hold.

    The log ends before `next_index` at `end_pos` in `end_term`, with `prev_chain` its
    last chainCrc (None when unknown, after a reset: the first entry's chain is then
    taken on trust). Each entry must carry the next index, sit where `entry.place`
    puts it, not lower the term, and pass `entry.check` against the chain so far.

    Returns (offset, type, size, index, term, pos, chain) per entry, as
    `entry.iter_entries` does, with each chain verified. Raises InconsistentAppend or
    CorruptEntry before the caller writes anything, so a rejected blob leaves no trace.
    """
    rows = []
    index, term, chain = next_index, end_term, prev_chain
    view = memoryview(blob)
    for offset, e_type, size, e_index, e_term, e_pos, _c in codec.iter_entries(blob):
        if e_index != index:
            raise InconsistentAppend(f"expected index {index}, got {e_index}")
        try:
            expected_pos = codec.place(end_pos, size, segment_size)
        except ValueError:  # a damaged size field; the bodyCrc check would come too late
            raise codec.CorruptEntry(f"index {e_index}: size {size} too large") from None
        if e_pos != expected_pos:
            raise InconsistentAppend(f"index {e_index}: pos {e_pos} does not follow {end_pos}")
        if e_term < term:
            raise InconsistentAppend(f"index {e_index}: term {e_term} below {term}")
        _t, _s, _i, _tt, chain = codec.check(view, offset, chain)
        rows.append((offset, e_type, size, e_index, e_term, e_pos, chain))
        index, end_pos, term = index + 1, e_pos + size, e_term
    return rows


# `validate_continuation`, compiled where the build allows (raftmq.hotpath): what a
# follower runs on every batch it receives.
VALIDATE_CONTINUATION = compiled_or("validate_continuation", validate_continuation)


@attrs.define(slots=True)
class SyncPlan:
    """What one fsync covers. `run` blocks; call it from a worker thread."""

    end_index: int
    generation: int
    _work: object = None  # a callable doing the blocking part, or None

    @property
    def syncs(self) -> bool:
        """Whether `run` has anything to fsync (nothing was dirty otherwise)."""
        return self._work is not None

    def run(self) -> None:
        if self._work is not None:
            self._work()

    def os_targets(self) -> list[tuple[int, bool]] | None:
        """(fd, data_only) of each file `run` would fsync, when every one is the OS's
        and an `FsyncThread` may sync them instead of `run` (then `finish` completes
        the plan); None when only `run` can (nothing to sync, a memory or simulated
        store, a test's disk)."""
        targets = getattr(self._work, "os_targets", None)
        return None if targets is None else targets()

    def finish(self, error_number: int) -> OSError | None:
        """Complete the plan once an `FsyncThread` has synced its `os_targets`, given
        the first error number it met (0: none): the error `run` would have raised."""
        return self._work.finish(error_number)


class LogStore(abc.ABC):
    """A DLedger log: entries at consecutive indexes, each at a leader-chosen byte position.

    Invariants: `begin_index - 1 <= end_index`; an entry's `pos` is
    `place(previous end, size, segment_size)`, so positions agree on every replica.
    """

    segment_size: int
    begin_index: int
    end_index: int
    end_term: int
    end_pos: int
    end_chain: int
    generation: int
    # Set by `close()`. The log's owner closes it on the way out, also after a disk
    # failure, while other tasks may still be unwinding: they check this rather than
    # read from a store whose files are gone.
    closed: bool = False

    @property
    def empty(self) -> bool:
        return self.end_index < self.begin_index

    @abc.abstractmethod
    def term_at(self, index: int) -> int:
        """Term of the entry at `index`; at `begin_index - 1`, the term before the log (or -1)."""

    @abc.abstractmethod
    def get(self, index: int) -> Entry:
        """The entry at `index`; IndexError outside [begin_index, end_index]."""

    @abc.abstractmethod
    def read_at(self, pos: int, size: int) -> bytes:
        """`size` bytes of the log from byte position `pos` (within one entry).

        How RocketMQ reads a message by physical offset; IndexError when `pos` is
        not inside the log.
        """

    def mapped_data(self) -> tuple[dict[int, mmap.mmap], int, int, int]:
        """What `read_at` reads, for reads in bulk: (segment start -> its buffer, the
        segment size, the first position and the end of what may be read there). A
        store without segments has none: every read goes through `read_at`."""
        return {}, 1, 0, 0

    @abc.abstractmethod
    def read_encoded(self, index: int, max_bytes: int) -> tuple[bytes, int]:
        """Encoded entries from `index` on, concatenated: (bytes, count).

        Returns at least one entry, then more while the total stays within
        `max_bytes` (and, for a file store, within one segment).
        """

    @abc.abstractmethod
    def append_leader(
        self, term: int, items: list[tuple[EntryType, bytes]]
    ) -> list[tuple[int, int]]:
        """Append entries of `term` at the end, their bodies as given; returns their
        (index, pos). The positions are `entry.places(end_pos, sizes, segment_size)`,
        which is how a writer that puts positions into its bodies (the broker's
        CommitLog: a message's physical offset) places them before handing them over."""

    @abc.abstractmethod
    def append_encoded(self, blob: bytes) -> int:
        """Append a leader's encoded entries verbatim; returns how many.

        Raises InconsistentAppend when the first does not continue this log (index,
        pos or chain) and CorruptEntry when the bytes are damaged; nothing is
        written in either case.
        """

    @abc.abstractmethod
    def truncate(self, from_index: int) -> None:
        """Drop entries `from_index`..end (`begin_index <= from_index`)."""

    @abc.abstractmethod
    def reset(self, begin_index: int, begin_pos: int, before_term: int) -> None:
        """Drop everything; the next entry appended is `begin_index` at `begin_pos`.

        Used when a follower is so far behind that the leader no longer holds the
        entries it needs (retention deleted them): it restarts at the leader's beginning.
        """

    @abc.abstractmethod
    def sync_plan(self) -> SyncPlan:
        """Capture what an fsync now must cover (cheap, on the event loop)."""

    def first_index_of_term(self, index: int) -> int:
        """The first index holding the same term as `index` (Raft's fast-backup xIndex)."""
        term = self.term_at(index)
        i = index
        while i > self.begin_index and self.term_at(i - 1) == term:
            i -= 1
        return i

    def close(self) -> None:  # noqa: B027 - optional for stores without resources
        """Release files and maps."""
