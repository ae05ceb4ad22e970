"""DLedger's file store (`DLedgerMmapFileStore`): the log in data and index segments.

Layout under `base_dir` (`segments` says more):

    data/<20-digit start offset>    `segment_size` bytes each; entries at their leader-chosen pos
    index/<20-digit start offset>   `index_segment_size` bytes each; entry i at byte 32*i
    begin                           where the log starts (properties; absent for a log from 0)

Files are preallocated to their full size and mapped shared, so an append is a
copy into the page cache and durability is a separate step (`sync_plan`, whose
bookkeeping is in `sync`). Opening the store recovers it (`recovery`); deleting
old segments is `retention`. Every call to the operating system goes through a
file layer (`filesystem`), so the simulator runs this same store over a disk that
loses what was not fsynced.

A log that does not start at index 0 and position 0 (after `reset()` or
retention) records its start in the `begin` file, written atomically before
any entry depends on it; positions and index offsets stay absolute, so the
first data segment may have an unused prefix (DLedger's resetOffset).

A log that continues a classic CommitLog (an in-place upgrade) begins at index 0
at the old log's end (`meta.begin_after`), with the first entry's chain seeded by a
digest of the old log rather than 0. A follower whose log begins there takes no
first entry from a leader whose log begins elsewhere or over another digest: after
a few refusals in a row it raises `ForeignLog` instead of looping on refused
appends (the old bytes below the divide differ, and nothing replicated above them
would mean the same).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path

from raftmq.dledger.codes import EntryType
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.base import (
    VALIDATE_CONTINUATION,
    ForeignLog,
    InconsistentAppend,
    LogStore,
    StoreClosed,
    SyncPlan,
    foreign_beginning,
)
from raftmq.dledger.store.meta import BEGIN_FILE, begin_text, parse_begin
from raftmq.dledger.store.recovery import RecoveryReport, recover
from raftmq.dledger.store.retention import delete_expired
from raftmq.dledger.store.segments import BLANK, INDEX, INDEX_SIZE, SyncFailed, first_index_at
from raftmq.dledger.store.sync import GroupCommit

from raftmq.disk.filesystem import NORMAL, RANDOM, FileSystem, OsFileSystem, SyncHandle
from raftmq.disk.segments import Segment, StoreCorruption, list_segments, open_segment, zero

__all__ = [
    "FileLogStore",
    "ForeignLog",
    "RecoveryReport",
    "StoreCorruption",
    "SyncFailed",
]

log = logging.getLogger(__name__)

FOREIGN_STRIKES = 3  # refusals of a foreign entry 0 in a row before ForeignLog
_BLANK_HEADER = codec.BLANK_HEADER
_HEADER_SIZE = codec.HEADER_SIZE
_CHAIN = struct.Struct(">I")
_DEFAULT_INDEX_SEGMENT_BYTES = INDEX_SIZE * 5 * 1024 * 1024


class FileLogStore(LogStore):
    """A DLedger log in preallocated, mapped data and index segments; see the module docstring.

    Not thread-safe except for `SyncPlan.run()`, which may run in a worker thread
    while the owner keeps appending. Plans should run one at a time, in order.

    `committed_index` is the highest index this node knows it had durably
    committed before (-1: no claim); opening refuses with StoreCorruption rather
    than end the log below it. `synced_lengths` maps each data file to the bytes
    from its start that a completed plan made durable and that still hold the
    current log: a fault injector that zeroes everything after them (keeping the
    file size) reproduces a power cut. `recovery` says what opening changed.
    `fs` is the file layer: the operating system's, unless a simulator brings its own.

    Costs: opening checks every entry from the start of the data segment holding
    `committed_index` (or of the third-to-last segment; about 6 us an entry in
    CPython), trusts the entries before it unchecked (see `recovery`:
    damage there is not found at startup), and reads the rest of the last data
    segment to clear leftovers; `reset` and `delete_expired` fsync small
    metadata on the caller's thread.
    """

    def __init__(
        self,
        base_dir: str | Path,
        segment_size: int = 1 << 30,
        index_segment_size: int = _DEFAULT_INDEX_SEGMENT_BYTES,
        committed_index: int = -1,
        fs: FileSystem | None = None,
    ) -> None:
        if segment_size < _HEADER_SIZE + codec.MIN_BLANK_SIZE:
            raise ValueError(f"segment_size {segment_size} cannot hold an entry")
        if index_segment_size <= 0 or index_segment_size % INDEX_SIZE:
            raise ValueError(f"index_segment_size {index_segment_size} is not a multiple of 32")
        self.segment_size = segment_size
        self.index_segment_size = index_segment_size
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.index_dir = self.base_dir / "index"
        self._begin_path = self.base_dir / BEGIN_FILE
        self.fs = fs or OsFileSystem()
        self.fs.makedirs(self.data_dir)
        self.fs.makedirs(self.index_dir)

        self._data: dict[int, Segment] = {}
        self._index: dict[int, Segment] = {}
        # Term runs: run k covers [_run_first[k], _run_first[k+1]) with _run_term[k].
        self._run_first: list[int] = []
        self._run_term: list[int] = []
        self.begin_index = 0
        self._before_pos = 0  # where the first entry goes when the log is empty
        self._before_term = -1
        self._before_chain: int | None = 0  # None: unknown, the next first entry is trusted
        self.end_index = -1
        self.end_term = -1
        self.end_pos = 0
        self.end_chain = 0
        self.generation = 0
        self._foreign_strikes = 0  # entry 0 refused in a row for a foreign beginning

        # The highest index the caller vouched for as committed: never truncated.
        self.committed_floor = committed_index
        self._commit = GroupCommit()
        self._dir_handles: list[SyncHandle] = []
        self.recovery = RecoveryReport()
        try:
            for directory in (self.data_dir, self.index_dir):
                self._dir_handles.append(self.fs.dir_handle(directory))
            for table, directory, size in (
                (self._data, self.data_dir, segment_size),
                (self._index, self.index_dir, index_segment_size),
            ):
                for start in list_segments(self.fs, directory, size):
                    table[start] = open_segment(self.fs, directory, start, size, create=False)
            recover(self, committed_index)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------- reads
    @property
    def synced_lengths(self) -> dict[str, int]:
        """Data file path -> bytes a completed sync plan made durable (see `sync`)."""
        return self._commit.synced_lengths

    def _check_open(self) -> None:
        if self.closed:
            raise StoreClosed(f"{self.base_dir} is closed")

    def _check_range(self, index: int) -> None:
        self._check_open()
        if not self.begin_index <= index <= self.end_index:
            raise IndexError(f"index {index} outside [{self.begin_index}, {self.end_index}]")

    def _index_entry(self, index: int) -> tuple[int, int, int, int, int]:
        """(magic, pos, size, index, term) from the index file."""
        byte = INDEX_SIZE * index
        seg = self._index[byte - byte % self.index_segment_size]
        return INDEX.unpack_from(seg.map, byte - seg.start)

    def term_at(self, index: int) -> int:
        if index == self.begin_index - 1:
            return self._before_term
        self._check_range(index)
        return self._run_term[bisect.bisect_right(self._run_first, index) - 1]

    def first_index_of_term(self, index: int) -> int:
        self._check_range(index)
        k = bisect.bisect_right(self._run_first, index) - 1
        return max(self._run_first[k], self.begin_index)

    def pos_at(self, index: int) -> int:
        self._check_range(index)
        return self._index_entry(index)[1]

    def chain_at(self, index: int) -> int:
        self._check_range(index)
        pos = self._index_entry(index)[1]
        seg = self._data[pos - pos % self.segment_size]
        return _CHAIN.unpack_from(seg.map, pos - seg.start + codec.CHAIN_OFFSET)[0]

    def get(self, index: int) -> codec.Entry:
        self._check_range(index)
        pos = self._index_entry(index)[1]
        seg = self._data[pos - pos % self.segment_size]
        return codec.decode(seg.map, pos - seg.start)

    def read_at(self, pos: int, size: int) -> bytes:
        self._check_open()
        seg = self._data.get(pos - pos % self.segment_size)
        if seg is None or pos < self._before_pos or pos + size > self.end_pos or size < 0:
            raise IndexError(f"bytes [{pos}, {pos + size}) are not in the log")
        off = pos - seg.start
        return seg.map[off : off + size]

    def mapped_data(self) -> tuple[dict[int, mmap.mmap], int, int, int]:
        self._check_open()
        maps = {start: seg.map for start, seg in self._data.items()}
        return maps, self.segment_size, self._before_pos, self.end_pos

    def read_encoded(self, index: int, max_bytes: int) -> tuple[bytes, int]:
        self._check_range(index)
        _m, pos, _size, _i, _t = self._index_entry(index)
        seg = self._data[pos - pos % self.segment_size]
        # Entries lie back to back within a segment, so the span is the entries up to
        # the last that ends by `limit`: a binary search over the index, not a walk.
        limit = min(pos + max_bytes, seg.start + self.segment_size)

        def past(i: int) -> bool:
            _m, e_pos, e_size, _i, _t = self._index_entry(i)
            return e_pos + e_size > limit

        last = index + bisect.bisect_left(range(index + 1, self.end_index + 1), True, key=past)
        _m, last_pos, last_size, _i, _t = self._index_entry(last)
        off = pos - seg.start
        return seg.map[off : off + last_pos + last_size - pos], last - index + 1

    # ---------------------------------------------------------------------------- writes
    def _data_segment(self, start: int) -> Segment:
        seg = self._data.get(start)
        if seg is None:
            seg = open_segment(self.fs, self.data_dir, start, self.segment_size, create=True)
            self._data[start] = seg
            self._commit.dirs_dirty = True
            previous = self._data.get(start - self.segment_size)
            if previous is not None:
                previous.advise(NORMAL)
        return seg

    def _index_segment(self, start: int) -> Segment:
        seg = self._index.get(start)
        if seg is None:
            seg = open_segment(self.fs, self.index_dir, start, self.index_segment_size, create=True)
            self._index[start] = seg
            self._commit.dirs_dirty = True
        return seg

    def _reserve(self, first_index: int, count: int, last_pos: int) -> None:
        """Open every data and index segment an append of `count` entries from
        `first_index`, the last at `last_pos`, writes to, before it writes a byte: a
        disk too full for a new segment (DiskFull) then leaves the log as it was."""
        seg_size, index_size = self.segment_size, self.index_segment_size
        start = self.end_pos - self.end_pos % seg_size
        while start <= last_pos:
            self._data_segment(start)
            start += seg_size
        byte = INDEX_SIZE * first_index
        start, last_byte = byte - byte % index_size, INDEX_SIZE * (first_index + count) - 1
        while start <= last_byte:
            self._index_segment(start)
            start += index_size

    def _write_data(self, pos: int, data) -> None:
        """Copy `data` (which lies within one segment) to `pos`."""
        seg = self._data_segment(pos - pos % self.segment_size)
        off = pos - seg.start
        end = off + len(data)
        seg.file.write(off, data)
        if end > seg.written_bytes:
            seg.written_bytes = end
        self._commit.dirty_data.add(seg.start)

    def _write_blank(self, pos: int) -> None:
        """Mark the rest of pos's segment unused; fewer than 8 bytes left need no marker."""
        remaining = self.segment_size - pos % self.segment_size
        if remaining >= codec.MIN_BLANK_SIZE:
            self._write_data(pos, _BLANK_HEADER.pack(BLANK, remaining))

    def _write_index(self, first_index: int, packed) -> None:
        view = memoryview(packed)
        byte = INDEX_SIZE * first_index
        isz = self.index_segment_size
        while view:
            seg = self._index_segment(byte - byte % isz)
            off = byte - seg.start
            n = min(len(view), isz - off)
            seg.file.write(off, view[:n])
            self._commit.dirty_index.add(seg.start)
            view = view[n:]
            byte += n

    def _add_runs(self, first_index: int, terms) -> None:
        for i, term in enumerate(terms, first_index):
            if not self._run_term or self._run_term[-1] != term:
                self._run_first.append(i)
                self._run_term.append(term)

    def append_leader(
        self, term: int, items: list[tuple[EntryType, bytes]]
    ) -> list[tuple[int, int]]:
        self._check_open()
        if not items:
            return []
        if term < self.end_term:
            raise InconsistentAppend(f"term {term} below the log's end term {self.end_term}")
        first = self.end_index + 1
        sizes = [_HEADER_SIZE + len(body) for _type, body in items]
        positions = codec.places(self.end_pos, sizes, self.segment_size)
        self._reserve(first, len(items), positions[-1])
        bodies = [body for _type, body in items]
        chain, write_pos = self.end_chain, self.end_pos
        index_parts = []
        for lo, hi in self._runs(items, positions):
            pos = positions[lo]
            if pos != write_pos:
                self._write_blank(write_pos)
            blob, index_bytes, chain = codec.ENCODE_ENTRIES(
                items[lo][0], bodies[lo:hi], first + lo, term, pos, chain
            )
            self._write_data(pos, blob)
            index_parts.append(index_bytes)
            write_pos = pos + len(blob)
        self._write_index(first, b"".join(index_parts))
        self._add_runs(first, (term,))
        self._extend(first, first + len(items) - 1, term, write_pos, chain)
        return list(zip(range(first, first + len(items)), positions, strict=True))

    def _runs(self, items: list[tuple[EntryType, bytes]], positions: list[int]):
        """[lo, hi) ranges of `items` that are encoded and written as one: entries of one
        type, back to back in one segment. Ordinarily the whole batch is one run."""
        seg_size = self.segment_size
        types = [entry_type for entry_type, _body in items]
        first_pos, last_pos = positions[0], positions[-1]
        if (
            types.count(types[0]) == len(types)
            and first_pos - first_pos % seg_size == last_pos - last_pos % seg_size
        ):
            return [(0, len(items))]
        runs = []
        lo = 0
        for k in range(1, len(items)):
            if types[k] != types[lo] or positions[k] - positions[k] % seg_size != (
                positions[lo] - positions[lo] % seg_size
            ):
                runs.append((lo, k))
                lo = k
        runs.append((lo, len(items)))
        return runs

    def append_encoded(self, blob: bytes) -> int:
        self._check_open()
        chain = self.end_chain if not self.empty or self._before_chain is not None else None
        try:
            staged = VALIDATE_CONTINUATION(
                blob, self.end_index + 1, self.end_pos, self.end_term, chain, self.segment_size
            )
        except (InconsistentAppend, codec.CorruptEntry):
            if self.end_index == -1:  # the first entry ever: do both logs begin alike?
                self._note_foreign_beginning(blob, chain)
            raise
        if not staged:
            return 0
        first_offset, _t, _s, first_index, first_term, first_pos, _c = staged[0]
        last_offset, _t, last_size, last_index, last_term, last_pos, last_chain = staged[-1]
        self._reserve(first_index, len(staged), last_pos)
        view = memoryview(blob)
        prev_end = self.end_pos
        if first_pos != prev_end:
            self._write_blank(prev_end)
        if last_pos - first_pos == last_offset - first_offset:  # one segment: one write
            self._write_data(first_pos, view[first_offset : last_offset + last_size])
        else:
            self._write_spans(view, staged)
        self._write_index(first_index, codec.INDEX_ENTRIES(blob))
        self._add_runs(
            first_index, (first_term,) if first_term == last_term else (s[4] for s in staged)
        )
        self._extend(first_index, last_index, last_term, last_pos + last_size, last_chain)
        return len(staged)

    def _write_spans(self, view: memoryview, staged: list[tuple]) -> None:
        """Write validated entries that roll over to a new segment: one write per segment,
        and a BLANK marker after the entries of each segment but the last."""
        group_start, group_pos = staged[0][0], staged[0][5]
        prev_end = group_pos
        for offset, _t, size, _i, _term, e_pos, _c in staged:
            if e_pos != prev_end:
                self._write_data(group_pos, view[group_start:offset])
                self._write_blank(prev_end)
                group_start, group_pos = offset, e_pos
            prev_end = e_pos + size
        last_offset, _t, last_size, _i, _term, _p, _c = staged[-1]
        self._write_data(group_pos, view[group_start : last_offset + last_size])

    def _note_foreign_beginning(self, blob, chain: int | None) -> None:
        """Raise ForeignLog once the leader's entry 0 has been refused for a foreign
        beginning FOREIGN_STRIKES times in a row: a leader retries at once, while one
        damaged or forged push must not stop a node."""
        why = foreign_beginning(blob, self.end_pos, chain, self.segment_size)
        self._foreign_strikes = self._foreign_strikes + 1 if why else 0
        if why and self._foreign_strikes >= FOREIGN_STRIKES:
            raise ForeignLog(why)

    # ---------------------------------------------------------------------------- removal
    def _delete_segment(self, table: dict[int, Segment], start: int) -> None:
        seg = table.pop(start)
        seg.close()
        self.fs.unlink(seg.path)
        self._commit.dirs_dirty = True
        if table is self._data:
            self._commit.dirty_data.discard(start)
            self._commit.forget_data_file(seg.path)
        else:
            self._commit.dirty_index.discard(start)

    def _cut_data(self, end_pos: int) -> None:
        """Zero what follows end_pos in its segment and delete the segments after it."""
        for start in sorted(self._data):
            if start > end_pos:
                self._delete_segment(self._data, start)
        tail = self._data.get(end_pos - end_pos % self.segment_size)
        if tail is None:
            return
        tail.advise(RANDOM)
        off = end_pos - tail.start
        if tail.written_bytes > off:
            zero(tail.map, off, tail.written_bytes)
            tail.written_bytes = off
            self._commit.dirty_data.add(tail.start)
        self._commit.clamp(tail.path, off)

    def _cut_index(self, from_index: int, old_end_index: int) -> None:
        cut = INDEX_SIZE * from_index
        for start in sorted(self._index):
            if start >= cut:
                self._delete_segment(self._index, start)
        seg = self._index.get(cut - cut % self.index_segment_size)
        if seg is not None:
            end = min(INDEX_SIZE * (old_end_index + 1) - seg.start, self.index_segment_size)
            if end > cut - seg.start:
                zero(seg.map, cut - seg.start, end)
                self._commit.dirty_index.add(seg.start)

    def truncate(self, from_index: int) -> None:
        self._check_open()
        if from_index < self.begin_index:
            raise IndexError(f"cannot truncate at {from_index} before begin {self.begin_index}")
        assert from_index > self.committed_floor, (
            f"truncating at {from_index} would drop committed index {self.committed_floor}"
        )
        self.generation += 1
        if from_index > self.end_index:
            return
        if from_index == self.begin_index:
            end_pos, end_term = self._before_pos, self._before_term
            end_chain = self._before_chain or 0
        else:
            _m, pos, size, _i, end_term = self._index_entry(from_index - 1)
            end_pos, end_chain = pos + size, self.chain_at(from_index - 1)
        self._cut_data(end_pos)
        self._cut_index(from_index, self.end_index)
        k = bisect.bisect_left(self._run_first, from_index)
        del self._run_first[k:], self._run_term[k:]
        self._set_end(from_index - 1, end_term, end_pos, end_chain)

    def reset(self, begin_index: int, begin_pos: int, before_term: int) -> None:
        self._check_open()
        for table in (self._data, self._index):
            for start in sorted(table):
                self._delete_segment(table, start)
        # The deletions must be durable before the new beginning is: old segments
        # read from a new begin_pos would look like a torn log.
        for directory in (self.data_dir, self.index_dir):
            self.fs.sync_dir(directory)
        self._set_begin(begin_index, begin_pos, before_term, None)
        self.save_begin()
        self._run_first.clear()
        self._run_term.clear()
        self._set_end(begin_index - 1, before_term, begin_pos, 0)
        self.generation += 1

    def _extend(
        self, first_index: int, end_index: int, end_term: int, end_pos: int, end_chain: int
    ) -> None:
        """The end after appending entries first_index..end_index: indexes follow on,
        positions and terms never go back."""
        assert first_index == self.end_index + 1 <= end_index + 1, (first_index, self.end_index)
        assert end_pos > self.end_pos or first_index > end_index, (end_pos, self.end_pos)
        assert end_term >= self.end_term, (end_term, self.end_term)
        self._set_end(end_index, end_term, end_pos, end_chain)

    def _set_end(self, end_index: int, end_term: int, end_pos: int, end_chain: int) -> None:
        self.end_index, self.end_term, self.end_pos, self.end_chain = (
            end_index,
            end_term,
            end_pos,
            end_chain,
        )

    def _set_begin(self, begin_index: int, begin_pos: int, before_term: int, before_chain) -> None:
        self.begin_index = begin_index
        self._before_pos = begin_pos
        self._before_term = before_term
        self._before_chain = before_chain

    # ------------------------------------------------------------------ recovery and retention
    # What `recovery` and `retention` change of the store, and nothing else: they read
    # the segment tables and decide; the store changes its own state.
    @property
    def data_segments(self) -> Mapping[int, Segment]:
        """Data segment start -> its segment, in the order they were opened or made."""
        return self._data

    @property
    def index_segments(self) -> Mapping[int, Segment]:
        return self._index

    def delete_data_segment(self, start: int) -> None:
        self._delete_segment(self._data, start)

    def delete_index_segment(self, start: int) -> None:
        self._delete_segment(self._index, start)

    def restore(
        self,
        begin: tuple[int, int, int, int | None],
        end: tuple[int, int, int, int],
        runs: tuple[list[int], list[int]],
    ) -> None:
        """Recovery's result: the log's beginning (index, pos, the term and chainCrc
        before it), its end (index, term, pos, chainCrc) and its term runs."""
        run_first, run_term = runs
        assert len(run_first) == len(run_term), (len(run_first), len(run_term))
        assert all(a < b for a, b in itertools.pairwise(run_term)), run_term
        self._set_begin(*begin)
        self._set_end(*end)
        assert self.begin_index - 1 <= self.end_index, (self.begin_index, self.end_index)
        self._run_first, self._run_term = run_first, run_term

    def move_begin(self, new_pos: int) -> None:
        """Retention: the log begins with the first entry at or after `new_pos` (which
        must not be past the end), saved before the caller deletes what lies before."""
        new_begin = self.first_index_from(new_pos)
        assert self.begin_index <= new_begin <= self.end_index + 1, (new_begin, self.begin_index)
        assert self._before_pos <= new_pos <= self.end_pos, (new_pos, self._before_pos)
        if new_begin != self.begin_index:
            before_term, before_chain = self.term_at(new_begin - 1), self.chain_at(new_begin - 1)
            self._set_begin(new_begin, new_pos, before_term, before_chain)
        else:
            self._before_pos = new_pos
        self.save_begin()
        k = bisect.bisect_right(self._run_first, self.begin_index) - 1
        if k > 0:
            del self._run_first[:k], self._run_term[:k]

    def rewrite_index(self, first_index: int, packed) -> None:
        """Recovery's repair: index entries from `first_index`, rebuilt from the data."""
        assert first_index + len(packed) // INDEX_SIZE <= self.end_index + 1, first_index
        self._write_index(first_index, packed)

    def sync_all(self) -> None:
        """Make every file and directory durable on the caller's thread (after recovery's
        repairs), and count what is on disk as synced."""
        self._commit.sync_all(self._data, self._index, self._dir_handles)

    def save_begin(self) -> None:
        """Persist where the log starts (fsync + rename, so it runs on the caller's thread)."""
        begin = (self.begin_index, self._before_pos, self._before_term, self._before_chain)
        self.fs.atomic_write(self._begin_path, begin_text(begin))

    def read_begin(self) -> tuple[int, int, int, int | None]:
        """The saved beginning: (index, pos, the term and chainCrc before it)."""
        try:
            text = self.fs.read_text(self._begin_path)
        except FileNotFoundError:
            return 0, 0, -1, 0
        try:
            return parse_begin(text)
        except ValueError as exc:
            raise StoreCorruption(self._begin_path, 0, f"unreadable begin file: {exc!r}") from None

    def first_index_from(self, pos: int) -> int:
        """The first index whose entry starts at or after `pos` (end_index + 1 if none)."""
        return first_index_at(pos, self.begin_index, self.end_index + 1, self._index_entry)

    def delete_expired(
        self, keep_from_index: int, older_than_s: float, now_s: float | None = None
    ) -> int:
        """Retention: see `retention.delete_expired`."""
        return delete_expired(self, keep_from_index, older_than_s, now_s)

    # ---------------------------------------------------------------------------- durability
    def sync_plan(self) -> SyncPlan:
        tail = self._data.get(self.end_pos - self.end_pos % self.segment_size)
        if tail is not None:  # nothing is durable past the end: truncations clamp it
            durable = self._commit.synced_lengths.get(tail.path, 0)
            assert durable <= tail.written_bytes == self.end_pos - tail.start, (
                f"{tail.path}: {durable} bytes synced, {tail.written_bytes} written,"
                f" the log ends at {self.end_pos - tail.start}"
            )
        return self._commit.plan(
            self.end_index, self.generation, self._data, self._index, self._dir_handles
        )

    def index_sync_plan(self) -> SyncPlan:
        """A plan making the index durable up to the current end (group commits leave it
        out; see `sync.GroupCommit.plan`): a checkpoint may vouch for index entries up
        to the plan's `end_index` once it has run."""
        return self._commit.plan(
            self.end_index,
            self.generation,
            self._data,
            self._index,
            self._dir_handles,
            index_only=True,
        )

    def synced_lengths_now(self) -> dict[str, int]:
        """A copy of `synced_lengths`, safe while a plan completes on another thread."""
        return self._commit.synced_lengths_now()

    def close(self) -> None:
        """Unmap and close; unsynced writes stay in the page cache (no fsync here)."""
        if self.closed:
            return
        self.closed = True
        for table in (self._data, self._index):
            for seg in table.values():
                seg.close()
            table.clear()
        for handle in self._dir_handles:
            handle.close()
        self._dir_handles = []

    def __repr__(self) -> str:
        return (
            f"FileLogStore({str(self.base_dir)!r}, begin={self.begin_index}, end={self.end_index}, "
            f"end_pos={self.end_pos}, generation={self.generation})"
        )
