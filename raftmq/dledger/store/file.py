"""DLedger's file store (`DLedgerMmapFileStore`): data and index segments, mmapped.

Layout under `base_dir`:

    data/<20-digit start offset>    `segment_size` bytes each; entries at their leader-chosen pos
    index/<20-digit start offset>   `index_segment_size` bytes each; entry i at byte 32*i
    begin                           where the log starts (properties; absent for a log from 0)

Files are preallocated to their full size and mapped shared, so an append is a
copy into the page cache and durability is a separate step (`sync_plan`). An
entry never spans data segments: when the next one does not fit, a BLANK filler
`[-1][bytes to the segment end]` marks the rest of the old segment as unused.

The data is the truth; the index is a cache of it. Recovery walks the data from
a trusted starting point (below), checks every entry from there (bodyCrc,
chainCrc, index, term, pos), cuts the log at the first entry that fails (a torn
write), and rewrites index entries that disagree with the data. Two cases stop
the node instead of cutting:
a file of the wrong size, and a cut that would lose an entry at or before the
`committed_index` the caller says this node had made durable, because a node
that silently drops committed entries can break the quorum that committed them.
Damage past that hint is cut like a torn tail; the leader sends those entries
again (the report records whether valid-looking entries followed the damage).

The starting point is the start of the data segment holding entry
min(`committed_index`, the last entry the index finds): those entries were
durable before the crash, so a torn write can only come after them. Without a
usable `committed_index` it is the start of the third-to-last data segment, as
in DLedger's recover() (which assumes that older segments reached the disk).
The entries before it are trusted: their term runs come from binary searches
over the index file's term field (one per distinct term) and each skipped
segment's length from its last entry and BLANK filler, so the cost grows with
the number of segments and terms, not entries. What is checked of the prefix:
the entry just before the starting point (index entry against data header, and
its bodyCrc), which seeds the scan's expected index, term and chainCrc; each
skipped segment's last entry header against its index entry, and the filler
after it; every index slot the binary searches touch. Whenever something does
not check out (an index entry missing or disagreeing with the data, a missing
segment or filler, a first entry that does not chain onto the seed), the scan
starts at the log's beginning as before. `recovery` reports how many entries
were checked and trusted, and why a full scan was made.

The price: damage inside the trusted prefix (bit rot, a file edited by hand) is
no longer found at startup, and the index entries of that prefix are believed.
Reads do not find it either: `get` decodes without checking bodyCrc and
`read_encoded` hands out the stored bytes, so a damaged entry reaches the state
machine as stored. A follower that receives it checks bodyCrc and chainCrc of
everything it appends (`validate_continuation`) and refuses it there.

A log that does not start at index 0 and position 0 (after `reset()` or
retention) records its start in the `begin` file, written atomically before
any entry depends on it; positions and index offsets stay absolute, so the
first data segment may have an unused prefix (DLedger's resetOffset).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
import time
import weakref
from pathlib import Path

import attrs

from raftmq.dledger.codes import EntryType
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.base import (
    InconsistentAppend,
    LogStore,
    StoreClosed,
    SyncPlan,
    validate_continuation,
)
from raftmq.dledger.store.meta import atomic_write, format_properties, fsync_dir, parse_properties

log = logging.getLogger(__name__)

FILE_NAME_DIGITS = 20
BEGIN_FILE = "begin"
_BLANK = int(EntryType.BLANK)
_BLANK_HEADER = codec.BLANK_HEADER
_INDEX = codec.INDEX_ENTRY
_INDEX_SIZE = codec.INDEX_ENTRY_SIZE
_HEADER_SIZE = codec.HEADER_SIZE
_ENTRY_TYPES = (int(EntryType.NORMAL), int(EntryType.NOOP))
_CHAIN = struct.Struct(">I")
_POS = struct.Struct(">q")
_CHUNK_BYTES = 1 << 20  # unit of zeroing and scanning for leftovers
_ZERO_CHUNK = bytes(_CHUNK_BYTES)
_INDEX_BATCH = 256  # index entries unpacked per slice when walking the index
_DEFAULT_INDEX_SEGMENT_BYTES = _INDEX_SIZE * 5 * 1024 * 1024


class StoreCorruption(Exception):
    """The store cannot be opened without losing data it must not lose; a person has to look."""

    def __init__(self, path: str | Path, offset: int, reason: str) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}")
        self.path = str(path)
        self.offset = offset
        self.reason = reason


@attrs.define
class RecoveryReport:
    """What recovery found and changed, for logs and tests."""

    cut_pos: int | None = None  # absolute data position where the log was cut, if it was
    reason: str | None = None  # why the scan stopped there
    truncated_bytes: int = 0  # per file, bytes from the new end to the last non-zero one
    valid_data_after_cut: bool = False  # a valid entry followed the failed one: damage, not a tear
    dropped_files: list[str] = attrs.Factory(list)
    index_entries_rewritten: int = 0
    derived_begin: bool = False  # the `begin` file did not match the data; begin taken from it
    verified_entries: int = 0  # entries the scan checked (bodyCrc, chainCrc, index, term, pos)
    trusted_entries: int = 0  # entries before the scan's starting point, taken unchecked
    full_scan_reason: str | None = None  # why the scan started at the log's beginning


class _Segment:
    __slots__ = ("fd", "map", "path", "start", "written_bytes")

    def __init__(self, start: int, path: Path, fd: int, mapped: mmap.mmap) -> None:
        self.start = start
        self.path = str(path)
        self.fd = fd
        self.map = mapped
        self.written_bytes = 0  # high-water mark of bytes we wrote, from the segment start

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)

    def advise(self, advice: int | None) -> None:
        if advice is not None:
            with contextlib.suppress(OSError):  # advice is only a hint
                self.map.madvise(advice)


# Page-cache hints for the maps. The segment being appended to is RANDOM: a write
# fault with readahead would pull the zero pages after the end into the page cache,
# where SEEK_DATA then reports them as data and recovery has to read them. Full
# segments are NORMAL so that a lagging follower's reads get readahead, and
# recovery's scan is SEQUENTIAL.
_RANDOM = getattr(mmap, "MADV_RANDOM", None)
_NORMAL = getattr(mmap, "MADV_NORMAL", None)
_SEQUENTIAL = getattr(mmap, "MADV_SEQUENTIAL", None)


def _first_index_at(pos: int, low: int, high: int, read_entry) -> int:
    """The first index in [low, high) whose index entry's pos is at or after `pos`, else high.

    Positions grow with the index, so this is a binary search over the index file;
    `read_entry(i)` returns index entry i as (magic, pos, size, index, term).
    """
    return low + bisect.bisect_left(range(low, high), pos, key=lambda i: read_entry(i)[1])


def _segment_path(directory: Path, start: int) -> Path:
    return directory / f"{start:0{FILE_NAME_DIGITS}d}"


def _open_segment(directory: Path, start: int, size_bytes: int, create: bool) -> _Segment:
    path = _segment_path(directory, start)
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0), 0o644)
    try:
        if create:
            try:
                os.posix_fallocate(fd, 0, size_bytes)
            except OSError:  # filesystems without fallocate: a sparse file of the right size
                os.ftruncate(fd, size_bytes)
        mapped = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    seg = _Segment(start, path, fd, mapped)
    seg.advise(_RANDOM)
    return seg


def _zero(mapped: mmap.mmap, start: int, end: int) -> None:
    while start < end:
        n = min(end - start, _CHUNK_BYTES)
        mapped[start : start + n] = _ZERO_CHUNK[:n] if n < _CHUNK_BYTES else _ZERO_CHUNK
        start += n


def _nonzero_end(fd: int, start: int, end: int) -> int:
    """One past the last non-zero byte in [start, end) of the file, or `start` if all zero.

    Recovery asks this of the rest of the last segment on every start, so it skips
    what the filesystem reports as holes (preallocated, never-written extents on
    ext4 and xfs) and reads the rest with pread, a memcmp per chunk, instead of
    faulting the whole segment into the map.
    """
    # Readahead would pull the zero pages after each data range into the page cache,
    # where they count as data for the next SEEK_DATA; turn it off while we look.
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    try:
        return _nonzero_end_by_ranges(fd, start, end)
    finally:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)


def _nonzero_end_by_ranges(fd: int, start: int, end: int) -> int:
    last = start
    off = start
    while off < end:
        try:
            data = os.lseek(fd, off, os.SEEK_DATA)
            hole = os.lseek(fd, data, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but holes up to the end of the file
                break
            data, hole = off, end  # no hole reporting here: read it all
        if data >= end:
            break
        last = max(last, _read_nonzero_end(fd, data, min(hole, end)))
        off = hole
    return last


def _read_nonzero_end(fd: int, start: int, end: int) -> int:
    """Like _nonzero_end for one range it reads in full; -1 if the range is all zero."""
    last = -1
    while start < end:
        n = min(end - start, _CHUNK_BYTES)
        chunk = os.pread(fd, n, start)
        if chunk != (_ZERO_CHUNK if n == _CHUNK_BYTES else bytes(n)):
            last = start + len(chunk.rstrip(b"\0"))
        start += n
    return last


class _PlanRecord:
    """Per-data-file lengths a sync plan will vouch for once its fsyncs complete.

    Truncations clamp these while the plan is in flight, so a plan that started
    before a truncation never vouches for bytes written after it.
    """

    __slots__ = ("__weakref__", "lengths")

    def __init__(self, lengths: dict[str, int]) -> None:
        self.lengths = lengths


class _SyncWork:
    """The blocking half of a sync plan; touches only its own fds and the locked bookkeeping."""

    def __init__(self, store, record, fds, dir_fds, dirty) -> None:
        self._store = store
        self._record = record
        self._fds = fds
        self._dir_fds = dir_fds
        self._dirty = dirty  # handed back if we never complete, so the next plan covers it
        self._done = False

    def __call__(self) -> None:
        if self._done:
            return
        try:
            for fd in self._fds:
                os.fdatasync(fd)
            for fd in self._dir_fds:
                os.fsync(fd)
        except BaseException:
            self._give_back()
            raise
        finally:
            self._close_fds()
        self._done = True
        self._store._plan_completed(self._record)

    def _close_fds(self) -> None:
        fds, self._fds, dir_fds, self._dir_fds = self._fds, [], self._dir_fds, []
        for fd in fds + dir_fds:
            os.close(fd)

    def _give_back(self) -> None:
        if not self._done:
            self._done = True
            self._store._returned_dirty.append(self._dirty)  # list.append is atomic

    def __del__(self) -> None:
        # A plan dropped without running: release its fds and let the next plan redo its work.
        self._give_back()
        self._close_fds()


class FileLogStore(LogStore):
    """A DLedger log in preallocated, mmapped data and index segments; see the module docstring.

    Not thread-safe except for `SyncPlan.run()`, which may run in a worker thread
    while the owner keeps appending. Plans should run one at a time, in order.

    `committed_index` is the highest index this node knows it had durably
    committed before (-1: no claim); opening refuses with StoreCorruption rather
    than end the log below it. `synced_lengths` maps each data file to the bytes
    from its start that a completed plan made durable and that still hold the
    current log: a fault injector that zeroes everything after them (keeping the
    file size) reproduces a power cut. `recovery` says what opening changed.

    Costs: opening checks every entry from the start of the data segment holding
    `committed_index` (or of the third-to-last segment; about 6 us an entry in
    CPython), trusts the entries before it unchecked (see the module docstring:
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
    ) -> None:
        if segment_size < _HEADER_SIZE + codec.MIN_BLANK_SIZE:
            raise ValueError(f"segment_size {segment_size} cannot hold an entry")
        if index_segment_size <= 0 or index_segment_size % _INDEX_SIZE:
            raise ValueError(f"index_segment_size {index_segment_size} is not a multiple of 32")
        self.segment_size = segment_size
        self.index_segment_size = index_segment_size
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.index_dir = self.base_dir / "index"
        self._begin_path = self.base_dir / BEGIN_FILE
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.index_dir.mkdir(parents=True, exist_ok=True)

        self._data: dict[int, _Segment] = {}
        self._index: dict[int, _Segment] = {}
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

        self.synced_lengths: dict[str, int] = {}  # data file path -> bytes known durable
        self._lock = threading.Lock()  # guards synced_lengths and in-flight plan records
        self._in_flight: weakref.WeakSet[_PlanRecord] = weakref.WeakSet()
        self._dirty_data: set[int] = set()
        self._dirty_index: set[int] = set()
        self._dirs_dirty = False
        self._returned_dirty: list[tuple[list[int], list[int], bool]] = []
        self._dir_fds: list[int] = []
        self.recovery = RecoveryReport()
        try:
            for directory in (self.data_dir, self.index_dir):
                self._dir_fds.append(os.open(directory, os.O_RDONLY | os.O_DIRECTORY))
            self._recover(committed_index)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------- reads
    @property
    def recovered_truncated_bytes(self) -> int:
        return self.recovery.truncated_bytes

    def _check_open(self) -> None:
        if self.closed:
            raise StoreClosed(f"{self.base_dir} is closed")

    def _check_range(self, index: int) -> None:
        self._check_open()
        if not self.begin_index <= index <= self.end_index:
            raise IndexError(f"index {index} outside [{self.begin_index}, {self.end_index}]")

    def _index_entry(self, index: int) -> tuple[int, int, int, int, int]:
        """(magic, pos, size, index, term) from the index file."""
        byte = _INDEX_SIZE * index
        seg = self._index[byte - byte % self.index_segment_size]
        return _INDEX.unpack_from(seg.map, byte - seg.start)

    def _index_entries(self, first: int, last: int):
        """Index entries first..last, unpacked a slice at a time."""
        isz = self.index_segment_size
        i = first
        while i <= last:
            byte = _INDEX_SIZE * i
            seg = self._index[byte - byte % isz]
            off = byte - seg.start
            n = min(last - i + 1, _INDEX_BATCH, (isz - off) // _INDEX_SIZE)
            yield from _INDEX.iter_unpack(seg.map[off : off + n * _INDEX_SIZE])
            i += n

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

    def _chain_at(self, index: int) -> int:
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

    def read_encoded(self, index: int, max_bytes: int) -> tuple[bytes, int]:
        self._check_range(index)
        _m, pos, size, _i, _t = self._index_entry(index)
        total, count, next_pos = size, 1, pos + size
        if index < self.end_index:
            for _m, e_pos, e_size, _i, _t in self._index_entries(index + 1, self.end_index):
                # a different pos means the next entry rolled to the next segment
                if e_pos != next_pos or total + e_size > max_bytes:
                    break
                total += e_size
                next_pos += e_size
                count += 1
        seg = self._data[pos - pos % self.segment_size]
        off = pos - seg.start
        return seg.map[off : off + total], count

    # ---------------------------------------------------------------------------- writes
    def _data_segment(self, start: int) -> _Segment:
        seg = self._data.get(start)
        if seg is None:
            seg = _open_segment(self.data_dir, start, self.segment_size, create=True)
            self._data[start] = seg
            self._dirs_dirty = True
            previous = self._data.get(start - self.segment_size)
            if previous is not None:
                previous.advise(_NORMAL)
        return seg

    def _index_segment(self, start: int) -> _Segment:
        seg = self._index.get(start)
        if seg is None:
            seg = _open_segment(self.index_dir, start, self.index_segment_size, create=True)
            self._index[start] = seg
            self._dirs_dirty = True
        return seg

    def _write_data(self, pos: int, data) -> None:
        """Copy `data` (which lies within one segment) to `pos`."""
        seg = self._data_segment(pos - pos % self.segment_size)
        off = pos - seg.start
        end = off + len(data)
        seg.map[off:end] = data
        if end > seg.written_bytes:
            seg.written_bytes = end
        self._dirty_data.add(seg.start)

    def _write_blank(self, pos: int) -> None:
        """Mark the rest of pos's segment unused; fewer than 8 bytes left need no marker."""
        remaining = self.segment_size - pos % self.segment_size
        if remaining >= codec.MIN_BLANK_SIZE:
            self._write_data(pos, _BLANK_HEADER.pack(_BLANK, remaining))

    def _write_index(self, first_index: int, packed) -> None:
        view = memoryview(packed)
        byte = _INDEX_SIZE * first_index
        isz = self.index_segment_size
        while view:
            seg = self._index_segment(byte - byte % isz)
            off = byte - seg.start
            n = min(len(view), isz - off)
            seg.map[off : off + n] = view[:n]
            self._dirty_index.add(seg.start)
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
        seg_size = self.segment_size
        hook = self.append_hook
        first = index = self.end_index + 1
        end_pos, chain = self.end_pos, self.end_chain
        placed = []
        groups = []  # (pos, parts): one contiguous write per segment touched
        group_pos, parts = end_pos, []
        index_parts = []
        for entry_type, body in items:
            size = _HEADER_SIZE + len(body)
            pos = codec.place(end_pos, size, seg_size)
            if pos != end_pos:
                remaining = seg_size - end_pos % seg_size
                if remaining >= codec.MIN_BLANK_SIZE:
                    parts.append(_BLANK_HEADER.pack(_BLANK, remaining))
                groups.append((group_pos, parts))
                group_pos, parts = pos, []
            if hook is not None and entry_type == EntryType.NORMAL:
                body = hook(pos + _HEADER_SIZE, body)
            blob, chain = codec.encode(entry_type, index, term, pos, body, chain)
            parts.append(blob)
            index_parts.append(_INDEX.pack(entry_type, pos, size, index, term))
            placed.append((index, pos))
            index += 1
            end_pos = pos + size
        groups.append((group_pos, parts))
        for pos, group in groups:
            if group:
                self._write_data(pos, b"".join(group))
        self._write_index(first, b"".join(index_parts))
        self._add_runs(first, (term,))
        self._set_end(index - 1, term, end_pos, chain)
        return placed

    def append_encoded(self, blob: bytes) -> int:
        self._check_open()
        chain = self.end_chain if not self.empty or self._before_chain is not None else None
        staged = validate_continuation(
            blob, self.end_index + 1, self.end_pos, self.end_term, chain, self.segment_size
        )
        if not staged:
            return 0
        view = memoryview(blob)
        group_start = staged[0][0]
        group_pos = staged[0][5]
        prev_end = self.end_pos
        if group_pos != prev_end:
            self._write_blank(prev_end)
        index_parts = []
        for offset, e_type, size, e_index, e_term, e_pos, _c in staged:
            if e_pos != prev_end and offset != group_start:
                self._write_data(group_pos, view[group_start:offset])
                self._write_blank(prev_end)
                group_start, group_pos = offset, e_pos
            index_parts.append(_INDEX.pack(e_type, e_pos, size, e_index, e_term))
            prev_end = e_pos + size
        last_offset, _t, last_size, last_index, last_term, last_pos, last_chain = staged[-1]
        self._write_data(group_pos, view[group_start : last_offset + last_size])
        self._write_index(staged[0][3], b"".join(index_parts))
        self._add_runs(staged[0][3], (s[4] for s in staged))
        self._set_end(last_index, last_term, last_pos + last_size, last_chain)
        return len(staged)

    # ---------------------------------------------------------------------------- removal
    def _delete_segment(self, table: dict[int, _Segment], start: int) -> None:
        seg = table.pop(start)
        seg.close()
        os.unlink(seg.path)
        self._dirs_dirty = True
        if table is self._data:
            self._dirty_data.discard(start)
            with self._lock:
                self.synced_lengths.pop(seg.path, None)
                for record in self._in_flight:
                    record.lengths.pop(seg.path, None)
        else:
            self._dirty_index.discard(start)

    def _cut_data(self, end_pos: int) -> None:
        """Zero what follows end_pos in its segment and delete the segments after it."""
        for start in sorted(self._data):
            if start > end_pos:
                self._delete_segment(self._data, start)
        tail = self._data.get(end_pos - end_pos % self.segment_size)
        if tail is None:
            return
        tail.advise(_RANDOM)
        off = end_pos - tail.start
        if tail.written_bytes > off:
            _zero(tail.map, off, tail.written_bytes)
            tail.written_bytes = off
            self._dirty_data.add(tail.start)
        with self._lock:  # bytes past the cut are no longer ours to vouch for
            if self.synced_lengths.get(tail.path, 0) > off:
                self.synced_lengths[tail.path] = off
            for record in self._in_flight:
                if record.lengths.get(tail.path, 0) > off:
                    record.lengths[tail.path] = off

    def _cut_index(self, from_index: int, old_end_index: int) -> None:
        cut = _INDEX_SIZE * from_index
        for start in sorted(self._index):
            if start >= cut:
                self._delete_segment(self._index, start)
        seg = self._index.get(cut - cut % self.index_segment_size)
        if seg is not None:
            end = min(_INDEX_SIZE * (old_end_index + 1) - seg.start, self.index_segment_size)
            if end > cut - seg.start:
                _zero(seg.map, cut - seg.start, end)
                self._dirty_index.add(seg.start)

    def truncate(self, from_index: int) -> None:
        self._check_open()
        if from_index < self.begin_index:
            raise IndexError(f"cannot truncate at {from_index} before begin {self.begin_index}")
        self.generation += 1
        if from_index > self.end_index:
            return
        if from_index == self.begin_index:
            end_pos, end_term = self._before_pos, self._before_term
            end_chain = self._before_chain or 0
        else:
            _m, pos, size, _i, end_term = self._index_entry(from_index - 1)
            end_pos, end_chain = pos + size, self._chain_at(from_index - 1)
        self._cut_data(end_pos)
        self._cut_index(from_index, self.end_index)
        k = bisect.bisect_left(self._run_first, from_index)
        del self._run_first[k:], self._run_term[k:]
        self._set_end(from_index - 1, end_term, end_pos, end_chain)

    def reset(self, begin_index: int, begin_pos: int, before_term: int) -> None:
        for table in (self._data, self._index):
            for start in sorted(table):
                self._delete_segment(table, start)
        # The deletions must be durable before the new beginning is: old segments
        # read from a new begin_pos would look like a torn log.
        for directory in (self.data_dir, self.index_dir):
            fsync_dir(directory)
        self._set_begin(begin_index, begin_pos, before_term, None)
        self._save_begin()
        self._run_first.clear()
        self._run_term.clear()
        self._set_end(begin_index - 1, before_term, begin_pos, 0)
        self.generation += 1

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

    def _save_begin(self) -> None:
        """Persist where the log starts (fsync + rename, so it runs on the caller's thread)."""
        text = format_properties(
            {
                "beginIndex": str(self.begin_index),
                "beginPos": str(self._before_pos),
                "beforeTerm": str(self._before_term),
                "beforeChainCrc": "" if self._before_chain is None else str(self._before_chain),
            }
        )
        atomic_write(self._begin_path, text.encode())

    def _load_begin(self) -> tuple[int, int, int, int | None]:
        try:
            text = self._begin_path.read_text()
        except FileNotFoundError:
            return 0, 0, -1, 0
        try:
            props = parse_properties(text)
            chain = props.get("beforeChainCrc", "")
            return (
                int(props["beginIndex"]),
                int(props["beginPos"]),
                int(props["beforeTerm"]),
                int(chain) if chain else None,
            )
        except (KeyError, ValueError) as exc:
            raise StoreCorruption(self._begin_path, 0, f"unreadable begin file: {exc!r}") from None

    def _first_index_from(self, pos: int) -> int:
        """The first index whose entry starts at or after `pos` (end_index + 1 if none)."""
        return _first_index_at(pos, self.begin_index, self.end_index + 1, self._index_entry)

    def delete_expired(
        self, keep_from_index: int, older_than_s: float, now: float | None = None
    ) -> int:
        """Delete whole data segments holding only entries below `keep_from_index` whose
        files were last written more than `older_than_s` seconds ago; returns how many.

        Only a prefix of segments goes, never the one the log ends in. The new
        beginning is saved before any file is deleted, so a crash in between leaves
        files that the next recovery finishes deleting. Unlike DLedger's
        CleanSpaceService this honours `keep_from_index` (the caller's
        min(committed, slowest follower's match)): no follower is cut off by it.
        """
        now = time.time() if now is None else now
        seg_size = self.segment_size
        tail_start = self.end_pos - self.end_pos % seg_size
        doomed = []
        for start in sorted(self._data):
            if start >= tail_start:
                break
            if self._first_index_from(start + seg_size) - 1 >= keep_from_index:
                break
            if now - os.stat(self._data[start].path).st_mtime < older_than_s:
                break
            doomed.append(start)
        if not doomed:
            return 0
        new_pos = doomed[-1] + seg_size
        new_begin = self._first_index_from(new_pos)
        if new_begin != self.begin_index:
            before_term, before_chain = self.term_at(new_begin - 1), self._chain_at(new_begin - 1)
            self._set_begin(new_begin, new_pos, before_term, before_chain)
        else:
            self._before_pos = new_pos
        self._save_begin()
        for start in doomed:
            self._delete_segment(self._data, start)
        first_index_byte = _INDEX_SIZE * self.begin_index
        for start in sorted(self._index):
            if start + self.index_segment_size <= first_index_byte:
                self._delete_segment(self._index, start)
        k = bisect.bisect_right(self._run_first, self.begin_index) - 1
        if k > 0:
            del self._run_first[:k], self._run_term[:k]
        log.info(
            "retention deleted %d data segments; the log now begins at %d",
            len(doomed),
            self.begin_index,
        )
        return len(doomed)

    # ---------------------------------------------------------------------------- durability
    def sync_plan(self) -> SyncPlan:
        while self._returned_dirty:
            data, index, dirs = self._returned_dirty.pop()
            self._dirty_data.update(data)
            self._dirty_index.update(index)
            self._dirs_dirty |= dirs
        data = sorted(s for s in self._dirty_data if s in self._data)
        index = sorted(s for s in self._dirty_index if s in self._index)
        dirs = self._dirs_dirty
        if not data and not index and not dirs:
            return SyncPlan(self.end_index, self.generation, None)
        fds: list[int] = []
        dir_fds: list[int] = []
        try:
            fds.extend(os.dup(self._data[s].fd) for s in data)
            fds.extend(os.dup(self._index[s].fd) for s in index)
            if dirs:
                dir_fds.extend(os.dup(fd) for fd in self._dir_fds)
        except BaseException:
            for fd in fds + dir_fds:
                os.close(fd)
            raise
        record = _PlanRecord({self._data[s].path: self._data[s].written_bytes for s in data})
        with self._lock:
            self._in_flight.add(record)
        self._dirty_data.clear()
        self._dirty_index.clear()
        self._dirs_dirty = False
        work = _SyncWork(self, record, fds, dir_fds, (data, index, dirs))
        return SyncPlan(self.end_index, self.generation, work)

    def synced_lengths_now(self) -> dict[str, int]:
        """A copy of `synced_lengths`, safe while a plan completes on another thread."""
        with self._lock:
            return dict(self.synced_lengths)

    def _plan_completed(self, record: _PlanRecord) -> None:
        """Runs on the plan's thread; only locked bookkeeping, never the maps or tables."""
        with self._lock:
            for path, length in record.lengths.items():
                if length > self.synced_lengths.get(path, -1):
                    self.synced_lengths[path] = length
            self._in_flight.discard(record)

    def close(self) -> None:
        """Unmap and close; unsynced writes stay in the page cache (no fsync here)."""
        if self.closed:
            return
        self.closed = True
        for table in (self._data, self._index):
            for seg in table.values():
                seg.close()
            table.clear()
        for fd in self._dir_fds:
            os.close(fd)
        self._dir_fds = []

    # ---------------------------------------------------------------------------- recovery
    def _list_segments(self, directory: Path, size_bytes: int) -> dict[int, Path]:
        found = {}
        for path in directory.iterdir():
            name = path.name
            if len(name) != FILE_NAME_DIGITS or not name.isdigit():
                log.warning("ignoring %s: not a segment file name", path)
                continue
            start = int(name)
            if start % size_bytes:
                raise StoreCorruption(path, 0, f"start offset is not a multiple of {size_bytes}")
            actual = path.stat().st_size
            if actual != size_bytes:
                raise StoreCorruption(path, actual, f"{actual} bytes, expected {size_bytes}")
            found[start] = path
        return dict(sorted(found.items()))

    def _recover(self, committed_index: int) -> None:
        seg_size = self.segment_size
        data_files = self._list_segments(self.data_dir, seg_size)
        index_files = self._list_segments(self.index_dir, self.index_segment_size)
        for start in data_files:
            self._data[start] = _open_segment(self.data_dir, start, seg_size, create=False)
        for start in index_files:
            isz = self.index_segment_size
            self._index[start] = _open_segment(self.index_dir, start, isz, create=False)
        begin_index, begin_pos, before_term, before_chain = self._load_begin()
        report = self.recovery
        first_seg = begin_pos - begin_pos % seg_size
        later = [s for s in self._data if s >= first_seg]
        derive = bool(later) and later[0] != first_seg
        if derive:
            # The segment the begin file points into is gone but later ones exist
            # (deleted by hand): start at the first entry found, with an unknown past.
            log.warning(
                "%s: no data segment holds begin pos %d; taking the first entry found",
                self.data_dir,
                begin_pos,
            )
            scan = _Scan(self, later[0], None, -1, None)
            report.full_scan_reason = "no data segment holds the begin pos"
        else:
            scan = self._fast_start(committed_index, begin_index, begin_pos, before_term)
            if scan is None:
                scan = _Scan(self, begin_pos, begin_index, before_term, before_chain)
        for seg in self._data.values():
            seg.advise(_SEQUENTIAL)
        scan.run()
        if scan.trusted and not scan.count:
            # The first entry after the trusted prefix does not continue it (or is not
            # there): the damage may be in the prefix's last entry, so look at all of it.
            report.full_scan_reason = f"the fast start's first entry failed: {scan.reason}"
            log.warning("%s: %s; scanning from the beginning", self.data_dir, scan.reason)
            scan = _Scan(self, begin_pos, begin_index, before_term, before_chain)
            scan.run()
        for seg in self._data.values():
            seg.advise(_NORMAL)
        if derive and scan.count:
            begin_index, begin_pos = scan.first_index, scan.start_pos
            before_term, before_chain = -1, None
        elif derive:  # nothing found there either: an empty log where the begin file says
            derive = False
            scan.end_pos = begin_pos
        end_index = begin_index - 1 + scan.trusted + scan.count
        report.verified_entries = scan.count
        report.trusted_entries = scan.trusted
        if end_index < committed_index:
            path, offset = scan.stop_location()
            raise StoreCorruption(
                path,
                offset,
                f"{scan.reason}; the log would end at {end_index}"
                f" but {committed_index} is committed",
            )
        report.reason = scan.reason
        report.derived_begin = derive
        report.valid_data_after_cut = scan.valid_after
        if scan.failed:
            report.cut_pos = scan.stop_pos
            log.warning(
                "%s: cutting the log at pos %d after index %d: %s",
                self.data_dir,
                scan.stop_pos,
                end_index,
                scan.reason,
            )
            if scan.valid_after:
                log.error(
                    "%s: valid entries follow the damaged one at pos %d; "
                    "this is damage, not a torn write",
                    self.data_dir,
                    scan.stop_pos,
                )

        # Apply: from here on we change files.
        self._set_begin(begin_index, begin_pos, before_term, before_chain)
        if scan.count:
            self._set_end(end_index, scan.last_term, scan.end_pos, scan.last_chain)
        else:
            self._set_end(end_index, before_term, scan.end_pos, before_chain or 0)
        self._run_first, self._run_term = scan.run_first, scan.run_term
        tail_start = self.end_pos - self.end_pos % seg_size
        for start in list(self._data):
            if start < first_seg or start > tail_start:
                seg = self._data[start]
                if start > tail_start:
                    report.truncated_bytes += _nonzero_end(seg.fd, 0, seg_size)
                report.dropped_files.append(seg.path)
                self._delete_segment(self._data, start)
            else:
                self._data[start].written_bytes = scan.written.get(start, 0)
        tail = self._data.get(tail_start)
        if tail is not None:
            tail.advise(_RANDOM)
            off = self.end_pos - tail_start
            tail.written_bytes = off
            leftover_end = _nonzero_end(tail.fd, off, seg_size)
            if leftover_end > off:
                report.truncated_bytes += leftover_end - off
                _zero(tail.map, off, leftover_end)
                if report.cut_pos is None:
                    report.cut_pos = self.end_pos
        if report.truncated_bytes:
            log.warning(
                "%s: discarded %d bytes past the recovered end (index %d, pos %d)",
                self.data_dir,
                report.truncated_bytes,
                self.end_index,
                self.end_pos,
            )
        self._recover_index(scan)
        if derive:
            self._save_begin()
        self._sync_all()

    # A fast start: where the scan may begin without checking the entries before it.
    def _fast_start(
        self, committed_index: int, begin_index: int, begin_pos: int, before_term: int
    ) -> _Scan | None:
        """A scan seeded to start late (see the module docstring), or None for a full scan."""
        try:
            scan = self._plan_fast_start(committed_index, begin_index, begin_pos, before_term)
        except _NoFastStart as exc:
            self.recovery.full_scan_reason = exc.reason
            if exc.suspicious:
                log.warning("%s: no fast start: %s", self.data_dir, exc.reason)
            else:
                log.debug("%s: no fast start: %s", self.data_dir, exc.reason)
            return None
        log.info(
            "%s: trusting entries %d..%d, checking from %d at pos %d",
            self.data_dir,
            begin_index,
            scan.expected_index - 1,
            scan.expected_index,
            scan.start_pos,
        )
        return scan

    def _plan_fast_start(
        self, committed_index: int, begin_index: int, begin_pos: int, before_term: int
    ) -> _Scan:
        seg_size = self.segment_size
        first_seg = begin_pos - begin_pos % seg_size
        last = self._last_indexed(begin_index)
        if last < begin_index:
            raise _NoFastStart("no index entries", suspicious=False)
        if committed_index >= begin_index:
            anchor = min(committed_index, last)
            _m, pos, _s, _i, _t = self._probe_index(anchor)
            self._check_header(anchor)
            start = pos - pos % seg_size
        else:
            segments = [s for s in self._data if s >= first_seg]
            if len(segments) < 3:
                raise _NoFastStart("no checkpoint and fewer than 3 data segments", False)
            start = segments[-3]
        if start <= first_seg:
            raise _NoFastStart("the starting point is in the first data segment", False)
        for seg_start in range(first_seg, start + seg_size, seg_size):
            if seg_start not in self._data:
                raise _NoFastStart(f"data segment at {seg_start} is missing")
        first = _first_index_at(start, begin_index, last + 1, self._probe_index)
        if first > last:
            raise _NoFastStart(f"no index entry points into the data segment at {start}")
        prev = first - 1
        if prev < begin_index:
            raise _NoFastStart("no entry before the starting point", suspicious=False)
        if self._probe_index(first)[1] != start:
            raise _NoFastStart(f"entry {first} is not at the start of its segment {start}")
        self._check_header(first)
        p_type, p_pos, p_size, _i, p_term = self._probe_index(prev)
        p_end = p_pos + p_size
        if not start - seg_size <= p_pos < p_end <= start:
            raise _NoFastStart(f"entry {prev} at {p_pos} is not in the segment before {start}")
        seg = self._data[start - seg_size]
        try:
            e_type, e_size, e_index, e_term, e_chain = codec.check(seg.map, p_pos - seg.start, None)
        except codec.CorruptEntry as exc:
            raise _NoFastStart(f"entry {prev} before the starting point: {exc}") from None
        e_pos = _POS.unpack_from(seg.map, p_pos - seg.start + codec.POS_OFFSET)[0]
        if (e_type, e_size, e_index, e_term, e_pos) != (p_type, p_size, prev, p_term, p_pos):
            raise _NoFastStart(f"index entry {prev} does not match its data header")
        run_first, run_term = self._term_runs(begin_index, prev)
        if run_term[0] < before_term or run_term[-1] != p_term:
            raise _NoFastStart(f"terms of entries {begin_index}..{prev} do not add up")
        written = {}
        for seg_start in range(first_seg, start, seg_size):
            written[seg_start] = self._filled_length(seg_start, begin_index, begin_pos, first)
        scan = _Scan(self, start, first, p_term, e_chain)
        scan.prev_end = p_end
        scan.trusted = first - begin_index
        scan.run_first, scan.run_term = run_first, run_term
        scan.written = written
        return scan

    def _probe_index(self, index: int) -> tuple[int, int, int, int, int]:
        """The index entry of `index`, which must be there and name it."""
        byte = _INDEX_SIZE * index
        seg = self._index.get(byte - byte % self.index_segment_size)
        if seg is None:
            raise _NoFastStart(f"no index file holds entry {index}")
        entry = _INDEX.unpack_from(seg.map, byte - seg.start)
        if entry[3] != index or entry[0] not in _ENTRY_TYPES or entry[2] < _HEADER_SIZE:
            raise _NoFastStart(f"index slot {index} holds {entry}")
        return entry

    def _check_header(self, index: int) -> None:
        """The data header at index's indexed pos names it (bodyCrc left to the scan)."""
        magic, pos, size, _i, term = self._probe_index(index)
        off = pos % self.segment_size
        seg = self._data.get(pos - off)
        if seg is None or off + _HEADER_SIZE > self.segment_size:
            raise _NoFastStart(f"no data where index entry {index} points ({pos})")
        header = codec.HEADER.unpack_from(seg.map, off)[:5]
        if header != (magic, size, index, term, pos):
            raise _NoFastStart(f"index entry {index} does not match the data header at {pos}")

    def _last_indexed(self, begin_index: int) -> int:
        """The last index entry found in the last index file holding any; begin_index - 1 if none.

        A binary search for the end of the filled slots: what it finds is checked
        against the data before anything relies on it.
        """
        isz = self.index_segment_size
        for start in sorted(self._index, reverse=True):
            seg = self._index[start]
            first_slot = start // _INDEX_SIZE

            def present(i: int, seg=seg, first_slot=first_slot) -> bool:
                magic, _p, _s, index, _t = _INDEX.unpack_from(
                    seg.map, _INDEX_SIZE * (i - first_slot)
                )
                return index == i and magic in _ENTRY_TYPES

            low, high = max(first_slot, begin_index), first_slot + isz // _INDEX_SIZE
            if low >= high:
                break
            if not present(low):
                continue
            while high - low > 1:  # present(low), and not present(high) or high is past the file
                mid = (low + high) // 2
                if present(mid):
                    low = mid
                else:
                    high = mid
            return low
        return begin_index - 1

    def _term_runs(self, first: int, last: int) -> tuple[list[int], list[int]]:
        """Term runs of entries first..last from the index: one binary search per term."""
        run_first: list[int] = []
        run_term: list[int] = []
        index = first
        while index <= last:
            term = self._probe_index(index)[4]
            if run_term and term <= run_term[-1]:
                raise _NoFastStart(f"index entry {index}: term {term} after {run_term[-1]}")
            run_first.append(index)
            run_term.append(term)
            low, high = index + 1, last + 1  # the first index with a higher term
            while low < high:
                mid = (low + high) // 2
                if self._probe_index(mid)[4] <= term:
                    low = mid + 1
                else:
                    high = mid
            index = low
        return run_first, run_term

    def _filled_length(self, seg_start: int, begin_index: int, begin_pos: int, first: int) -> int:
        """Bytes in use in a trusted segment: to its last entry's end and BLANK filler."""
        seg_size = self.segment_size
        last = _first_index_at(seg_start + seg_size, begin_index, first, self._probe_index) - 1
        if last >= begin_index and self._probe_index(last)[1] >= seg_start:
            self._check_header(last)  # index and data agree where each trusted segment ends
            _m, pos, size, _i, _t = self._probe_index(last)
            end = pos + size - seg_start
        elif seg_start <= begin_pos:  # the first segment may hold no entry, only a filler
            end = begin_pos - seg_start
            if seg_size - end < codec.MIN_BLANK_SIZE:
                return 0
        else:
            raise _NoFastStart(f"no index entry points into the data segment at {seg_start}")
        remaining = seg_size - end
        if remaining < codec.MIN_BLANK_SIZE:
            return end
        filler = _BLANK_HEADER.unpack_from(self._data[seg_start].map, end)
        if filler != (_BLANK, remaining):
            raise _NoFastStart(f"no BLANK filler at {seg_start + end} after the last entry")
        return end + _BLANK_HEADER.size

    def _recover_index(self, scan: _Scan) -> None:
        isz = self.index_segment_size
        first_byte = _INDEX_SIZE * self.begin_index
        end_byte = _INDEX_SIZE * (self.end_index + 1)
        for start in list(self._index):
            if start + isz <= first_byte or start >= end_byte:
                self.recovery.dropped_files.append(self._index[start].path)
                self._delete_segment(self._index, start)
        if scan.index_mismatch is not None:
            first, pos = scan.index_mismatch
            self.recovery.index_entries_rewritten = self.end_index - first + 1
            log.warning(
                "%s: rewriting index entries %d..%d from the data",
                self.index_dir,
                first,
                self.end_index,
            )
            self._rewrite_index(first, pos)
        seg = self._index.get(end_byte - end_byte % isz)
        if seg is not None:
            off = end_byte - seg.start
            leftover_end = _nonzero_end(seg.fd, off, isz)
            if leftover_end > off:
                _zero(seg.map, off, leftover_end)

    def _rewrite_index(self, index: int, pos: int) -> None:
        """Rewrite index entries index..end_index from the (already verified) data at pos."""
        seg_size = self.segment_size
        batch_start, batch = index, bytearray()
        while index <= self.end_index:
            seg = self._data[pos - pos % seg_size]
            off = pos - seg.start
            if seg_size - off < codec.MIN_BLANK_SIZE:
                pos = seg.start + seg_size
                continue
            magic, size = _BLANK_HEADER.unpack_from(seg.map, off)
            if magic == _BLANK:
                pos = seg.start + seg_size
                continue
            _m, _s, e_index, e_term = codec.HEADER.unpack_from(seg.map, off)[:4]
            batch += _INDEX.pack(magic, pos, size, e_index, e_term)
            index += 1
            pos += size
            if len(batch) >= _CHUNK_BYTES:
                self._write_index(batch_start, batch)
                batch_start, batch = index, bytearray()
        if batch:
            self._write_index(batch_start, batch)

    def _sync_all(self) -> None:
        """Make recovery's repairs durable and start synced_lengths from what is on disk."""
        for seg in (*self._data.values(), *self._index.values()):
            os.fdatasync(seg.fd)
        for fd in self._dir_fds:
            os.fsync(fd)
        self._dirty_data.clear()
        self._dirty_index.clear()
        self._dirs_dirty = False
        self.synced_lengths = {seg.path: seg.written_bytes for seg in self._data.values()}

    def __repr__(self) -> str:
        return (
            f"FileLogStore({str(self.base_dir)!r}, begin={self.begin_index}, end={self.end_index}, "
            f"end_pos={self.end_pos}, generation={self.generation})"
        )


class _NoFastStart(Exception):
    """Something about a fast start does not check out: scan from the log's beginning."""

    def __init__(self, reason: str, suspicious: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.suspicious = suspicious  # a sign of damage, not just a log with nothing to skip


class _Scan:
    """One forward pass over the data, read-only, from the log's beginning or a fast start.

    A fast start sets `trusted` (entries before `start_pos`, not checked),
    `prev_end` (where the entry before it ended) and seeds the term runs and the
    per-segment lengths of the trusted prefix.

    It stops at the end of the data (a zero header or a missing segment) or at the
    first entry that fails a check, and records enough for recovery to decide
    whether to cut there or refuse to start.
    """

    def __init__(
        self,
        store: FileLogStore,
        pos: int,
        expected_index: int | None,
        before_term: int,
        before_chain: int | None,
    ) -> None:
        self.store = store
        self.start_pos = pos
        self.expected_index = expected_index  # None: take the first entry's index
        self.before_term = before_term
        self.before_chain = before_chain
        self.count = 0
        self.first_index = -1
        self.last_term = before_term
        self.last_chain = before_chain or 0
        self.end_pos = pos
        self.stop_pos = pos
        self.reason = "end of data"
        self.failed = False
        self.valid_after = False
        self.written: dict[int, int] = {}  # data segment start -> bytes in use (filler included)
        self.run_first: list[int] = []
        self.run_term: list[int] = []
        self.index_mismatch: tuple[int, int] | None = None  # (index, pos): first bad index entry
        self.trusted = 0  # entries before start_pos taken unchecked (a fast start)
        self.prev_end = None if expected_index is None else pos  # the previous entry's end

    def stop_location(self) -> tuple[str, int]:
        seg_size = self.store.segment_size
        start = self.stop_pos - self.stop_pos % seg_size
        return str(_segment_path(self.store.data_dir, start)), self.stop_pos - start

    def _fail(self, pos: int, reason: str) -> None:
        self.stop_pos, self.reason, self.failed = pos, reason, True

    def run(self) -> None:
        store = self.store
        seg_size = store.segment_size
        data = store._data
        index_table = store._index
        isz = store.index_segment_size
        pos = self.start_pos
        prev_end = self.prev_end
        expected = self.expected_index
        term = self.before_term
        chain = self.before_chain
        index_seg = None
        run_first, run_term = self.run_first, self.run_term
        while True:
            seg_start = pos - pos % seg_size
            seg = data.get(seg_start)
            if seg is None:
                self.stop_pos = pos
                self.reason = "end of data: no segment file" if pos != self.start_pos else "no data"
                break
            off = pos - seg_start
            mapped = seg.map
            if seg_size - off < codec.MIN_BLANK_SIZE:
                pos = seg_start + seg_size  # too little room even for a filler
                continue
            magic, size = _BLANK_HEADER.unpack_from(mapped, off)
            if magic == _BLANK:
                if size != seg_size - off:
                    self._fail(pos, f"blank filler of {size} bytes where {seg_size - off} remain")
                    break
                self.written[seg_start] = off + _BLANK_HEADER.size
                pos = seg_start + seg_size
                continue
            if size == 0:
                self.stop_pos = pos
                break
            try:
                e_type, size, e_index, e_term, e_chain = codec.check(mapped, off, chain)
            except codec.CorruptEntry as exc:
                self._fail(pos, str(exc))
                self._probe_after(mapped, off)
                break
            e_pos = _POS.unpack_from(mapped, off + codec.POS_OFFSET)[0]
            if expected is not None and e_index != expected:
                self._fail(pos, f"index {e_index} where {expected} was expected")
                break
            if e_term < term:
                self._fail(pos, f"index {e_index}: term {e_term} below {term}")
                break
            if e_pos != pos:
                self._fail(pos, f"index {e_index}: pos field {e_pos} at position {pos}")
                break
            try:
                placed = prev_end is None or codec.place(prev_end, size, seg_size) == pos
            except ValueError:
                placed = False
            if not placed:
                where = f"pos {pos} is not where an entry after {prev_end} belongs"
                self._fail(pos, f"index {e_index}: {where}")
                break
            if self.count == 0:
                self.first_index = e_index
            if not run_term or run_term[-1] != e_term:
                run_first.append(e_index)
                run_term.append(e_term)
            if self.index_mismatch is None:
                byte = _INDEX_SIZE * e_index
                ibase = byte - byte % isz
                if index_seg is None or index_seg.start != ibase:
                    index_seg = index_table.get(ibase)
                if index_seg is None or _INDEX.unpack_from(index_seg.map, byte - ibase) != (
                    e_type,
                    pos,
                    size,
                    e_index,
                    e_term,
                ):
                    self.index_mismatch = (e_index, pos)
            self.count += 1
            expected = e_index + 1
            term, chain = e_term, e_chain
            prev_end = pos = pos + size
            self.written[seg_start] = pos - seg_start
        if self.count:
            self.last_term, self.last_chain = term, chain
            self.end_pos = prev_end
        # else end_pos stays at the start: an empty log ends where it begins

    def _probe_after(self, mapped, off: int) -> None:
        """Whether a valid entry follows the failed one (bit rot) rather than nothing (a tear)."""
        _magic, size = _BLANK_HEADER.unpack_from(mapped, off)
        nxt = off + size
        if size < _HEADER_SIZE or nxt + _HEADER_SIZE > len(mapped):
            return
        try:
            codec.check(mapped, nxt, None)
        except codec.CorruptEntry:
            return
        self.valid_after = True
