"""Recovery: what the file store finds on disk when it opens, and how it repairs it.

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

These functions work on a `FileLogStore` being opened, through the surface it keeps
for recovery and retention: they read its segment tables, repair files, and hand
the store the log they found (`restore`); the store changes its own state.
"""

from __future__ import annotations

import functools
import logging
import struct

import attrs
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.scan import NoFastStart, Scan
from raftmq.dledger.store.segments import (
    BLANK,
    ENTRY_TYPES,
    INDEX,
    INDEX_SIZE,
    SyncFailed,
    first_index_at,
)

from raftmq.disk.filesystem import NORMAL, RANDOM, SEQUENTIAL
from raftmq.disk.segments import CHUNK_BYTES, StoreCorruption, zero

log = logging.getLogger(__name__)

_BLANK_HEADER = codec.BLANK_HEADER
_HEADER_SIZE = codec.HEADER_SIZE
_POS = struct.Struct(">q")


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


def recover(store, committed_index: int) -> None:
    """Bring the files of a store whose segments were just opened, and its state, to the
    recovered log, filling `store.recovery`; StoreCorruption when that would end the
    log below `committed_index`. The constructor calls this, once."""
    seg_size = store.segment_size
    data = store.data_segments
    begin_index, begin_pos, before_term, before_chain = store.read_begin()
    report = store.recovery
    first_seg = begin_pos - begin_pos % seg_size
    later = [s for s in data if s >= first_seg]
    derive = bool(later) and later[0] != first_seg
    if derive:
        # The segment the begin file points into is gone but later ones exist
        # (deleted by hand): start at the first entry found, with an unknown past.
        log.warning(
            "%s: no data segment holds begin pos %d; taking the first entry found",
            store.data_dir,
            begin_pos,
        )
        scan = Scan(store, later[0], None, -1, None)
        report.full_scan_reason = "no data segment holds the begin pos"
    else:
        scan = _fast_start(store, committed_index, begin_index, begin_pos, before_term)
        if scan is None:
            scan = Scan(store, begin_pos, begin_index, before_term, before_chain)
    for seg in data.values():
        seg.advise(SEQUENTIAL)
    scan.run()
    if scan.trusted and not scan.count:
        # The first entry after the trusted prefix does not continue it (or is not
        # there): the damage may be in the prefix's last entry, so look at all of it.
        report.full_scan_reason = f"the fast start's first entry failed: {scan.reason}"
        log.warning("%s: %s; scanning from the beginning", store.data_dir, scan.reason)
        scan = Scan(store, begin_pos, begin_index, before_term, before_chain)
        scan.run()
    for seg in data.values():
        seg.advise(NORMAL)
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
            f"{scan.reason}; the log would end at {end_index} but {committed_index} is committed",
        )
    report.reason = scan.reason
    report.derived_begin = derive
    report.valid_data_after_cut = scan.valid_after
    if scan.failed:
        report.cut_pos = scan.stop_pos
        log.warning(
            "%s: cutting the log at pos %d after index %d: %s",
            store.data_dir,
            scan.stop_pos,
            end_index,
            scan.reason,
        )
        if scan.valid_after:
            log.error(
                "%s: valid entries follow the damaged one at pos %d; "
                "this is damage, not a torn write",
                store.data_dir,
                scan.stop_pos,
            )

    # Apply: from here on we change files.
    if scan.count:
        end = (end_index, scan.last_term, scan.end_pos, scan.last_chain)
    else:
        end = (end_index, before_term, scan.end_pos, before_chain or 0)
    runs = (scan.run_first, scan.run_term)
    store.restore((begin_index, begin_pos, before_term, before_chain), end, runs)
    tail_start = store.end_pos - store.end_pos % seg_size
    for start in list(data):
        if start < first_seg or start > tail_start:
            seg = data[start]
            if start > tail_start:
                report.truncated_bytes += seg.file.nonzero_end(0, seg_size)
            report.dropped_files.append(seg.path)
            store.delete_data_segment(start)
        else:
            data[start].written_bytes = scan.written.get(start, 0)
    tail = data.get(tail_start)
    if tail is not None:
        tail.advise(RANDOM)
        off = store.end_pos - tail_start
        tail.written_bytes = off
        leftover_end = tail.file.nonzero_end(off, seg_size)
        if leftover_end > off:
            report.truncated_bytes += leftover_end - off
            zero(tail.map, off, leftover_end)
            if report.cut_pos is None:
                report.cut_pos = store.end_pos
    if report.truncated_bytes:
        log.warning(
            "%s: discarded %d bytes past the recovered end (index %d, pos %d)",
            store.data_dir,
            report.truncated_bytes,
            store.end_index,
            store.end_pos,
        )
    _recover_index(store, scan)
    if derive:
        store.save_begin()
    try:
        store.sync_all()
    except OSError as exc:
        raise SyncFailed(f"fsync failed while opening {store.data_dir}: {exc}") from exc


# A fast start: where the scan may begin without checking the entries before it.
def _fast_start(
    store, committed_index: int, begin_index: int, begin_pos: int, before_term: int
) -> Scan | None:
    """A scan seeded to start late (see the module docstring), or None for a full scan."""
    try:
        scan = plan_fast_start(store, committed_index, begin_index, begin_pos, before_term)
    except NoFastStart as exc:
        store.recovery.full_scan_reason = exc.reason
        if exc.suspicious:
            log.warning("%s: no fast start: %s", store.data_dir, exc.reason)
        else:
            log.debug("%s: no fast start: %s", store.data_dir, exc.reason)
        return None
    log.info(
        "%s: trusting entries %d..%d, checking from %d at pos %d",
        store.data_dir,
        begin_index,
        scan.expected_index - 1,
        scan.expected_index,
        scan.start_pos,
    )
    return scan


def plan_fast_start(
    store, committed_index: int, begin_index: int, begin_pos: int, before_term: int
) -> Scan:
    seg_size = store.segment_size
    first_seg = begin_pos - begin_pos % seg_size
    last = _last_indexed(store, begin_index)
    if last < begin_index:
        raise NoFastStart("no index entries", suspicious=False)
    if committed_index >= begin_index:
        anchor = min(committed_index, last)
        _m, pos, _s, _i, _t = _probe_index(store, anchor)
        _check_header(store, anchor)
        start = pos - pos % seg_size
    else:
        segments = [s for s in store.data_segments if s >= first_seg]
        if len(segments) < 3:
            raise NoFastStart("no checkpoint and fewer than 3 data segments", False)
        start = segments[-3]
    if start <= first_seg:
        raise NoFastStart("the starting point is in the first data segment", False)
    for seg_start in range(first_seg, start + seg_size, seg_size):
        if seg_start not in store.data_segments:
            raise NoFastStart(f"data segment at {seg_start} is missing")
    first = first_index_at(start, begin_index, last + 1, functools.partial(_probe_index, store))
    if first > last:
        raise NoFastStart(f"no index entry points into the data segment at {start}")
    prev = first - 1
    if prev < begin_index:
        raise NoFastStart("no entry before the starting point", suspicious=False)
    if _probe_index(store, first)[1] != start:
        raise NoFastStart(f"entry {first} is not at the start of its segment {start}")
    _check_header(store, first)
    p_type, p_pos, p_size, _i, p_term = _probe_index(store, prev)
    p_end = p_pos + p_size
    if not start - seg_size <= p_pos < p_end <= start:
        raise NoFastStart(f"entry {prev} at {p_pos} is not in the segment before {start}")
    seg = store.data_segments[start - seg_size]
    try:
        e_type, e_size, e_index, e_term, e_chain = codec.check(seg.map, p_pos - seg.start, None)
    except codec.CorruptEntry as exc:
        raise NoFastStart(f"entry {prev} before the starting point: {exc}") from None
    e_pos = _POS.unpack_from(seg.map, p_pos - seg.start + codec.POS_OFFSET)[0]
    if (e_type, e_size, e_index, e_term, e_pos) != (p_type, p_size, prev, p_term, p_pos):
        raise NoFastStart(f"index entry {prev} does not match its data header")
    run_first, run_term = _term_runs(store, begin_index, prev)
    if run_term[0] < before_term or run_term[-1] != p_term:
        raise NoFastStart(f"terms of entries {begin_index}..{prev} do not add up")
    written = {}
    for seg_start in range(first_seg, start, seg_size):
        written[seg_start] = _filled_length(store, seg_start, begin_index, begin_pos, first)
    scan = Scan(store, start, first, p_term, e_chain)
    scan.prev_end = p_end
    scan.trusted = first - begin_index
    scan.run_first, scan.run_term = run_first, run_term
    scan.written = written
    return scan


def _probe_index(store, index: int) -> tuple[int, int, int, int, int]:
    """The index entry of `index`, which must be there and name it."""
    byte = INDEX_SIZE * index
    seg = store.index_segments.get(byte - byte % store.index_segment_size)
    if seg is None:
        raise NoFastStart(f"no index file holds entry {index}")
    entry = INDEX.unpack_from(seg.map, byte - seg.start)
    if entry[3] != index or entry[0] not in ENTRY_TYPES or entry[2] < _HEADER_SIZE:
        raise NoFastStart(f"index slot {index} holds {entry}")
    return entry


def _check_header(store, index: int) -> None:
    """The data header at index's indexed pos names it (bodyCrc left to the scan)."""
    magic, pos, size, _i, term = _probe_index(store, index)
    off = pos % store.segment_size
    seg = store.data_segments.get(pos - off)
    if seg is None or off + _HEADER_SIZE > store.segment_size:
        raise NoFastStart(f"no data where index entry {index} points ({pos})")
    header = codec.HEADER.unpack_from(seg.map, off)[:5]
    if header != (magic, size, index, term, pos):
        raise NoFastStart(f"index entry {index} does not match the data header at {pos}")


def _last_indexed(store, begin_index: int) -> int:
    """The last index entry found in the last index file holding any; begin_index - 1 if none.

    A binary search for the end of the filled slots: what it finds is checked
    against the data before anything relies on it.
    """
    isz = store.index_segment_size
    for start in sorted(store.index_segments, reverse=True):
        seg = store.index_segments[start]
        first_slot = start // INDEX_SIZE

        def present(i: int, seg=seg, first_slot=first_slot) -> bool:
            magic, _p, _s, index, _t = INDEX.unpack_from(seg.map, INDEX_SIZE * (i - first_slot))
            return index == i and magic in ENTRY_TYPES

        low, high = max(first_slot, begin_index), first_slot + isz // INDEX_SIZE
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


def _term_runs(store, first: int, last: int) -> tuple[list[int], list[int]]:
    """Term runs of entries first..last from the index: one binary search per term."""
    run_first: list[int] = []
    run_term: list[int] = []
    index = first
    while index <= last:
        term = _probe_index(store, index)[4]
        if run_term and term <= run_term[-1]:
            raise NoFastStart(f"index entry {index}: term {term} after {run_term[-1]}")
        run_first.append(index)
        run_term.append(term)
        low, high = index + 1, last + 1  # the first index with a higher term
        while low < high:
            mid = (low + high) // 2
            if _probe_index(store, mid)[4] <= term:
                low = mid + 1
            else:
                high = mid
        index = low
    return run_first, run_term


def _filled_length(store, seg_start: int, begin_index: int, begin_pos: int, first: int) -> int:
    """Bytes in use in a trusted segment: to its last entry's end and BLANK filler."""
    seg_size = store.segment_size
    last = (
        first_index_at(
            seg_start + seg_size, begin_index, first, functools.partial(_probe_index, store)
        )
        - 1
    )
    if last >= begin_index and _probe_index(store, last)[1] >= seg_start:
        _check_header(store, last)  # index and data agree where each trusted segment ends
        _m, pos, size, _i, _t = _probe_index(store, last)
        end = pos + size - seg_start
    elif seg_start <= begin_pos:  # the first segment may hold no entry, only a filler
        end = begin_pos - seg_start
        if seg_size - end < codec.MIN_BLANK_SIZE:
            return 0
    else:
        raise NoFastStart(f"no index entry points into the data segment at {seg_start}")
    remaining = seg_size - end
    if remaining < codec.MIN_BLANK_SIZE:
        return end
    filler = _BLANK_HEADER.unpack_from(store.data_segments[seg_start].map, end)
    if filler != (BLANK, remaining):
        raise NoFastStart(f"no BLANK filler at {seg_start + end} after the last entry")
    return end + _BLANK_HEADER.size


def _recover_index(store, scan: Scan) -> None:
    isz = store.index_segment_size
    first_byte = INDEX_SIZE * store.begin_index
    end_byte = INDEX_SIZE * (store.end_index + 1)
    for start in list(store.index_segments):
        if start + isz <= first_byte or start >= end_byte:
            store.recovery.dropped_files.append(store.index_segments[start].path)
            store.delete_index_segment(start)
    if scan.index_mismatch is not None:
        first, pos = scan.index_mismatch
        store.recovery.index_entries_rewritten = store.end_index - first + 1
        log.warning(
            "%s: rewriting index entries %d..%d from the data",
            store.index_dir,
            first,
            store.end_index,
        )
        _rewrite_index(store, first, pos)
    seg = store.index_segments.get(end_byte - end_byte % isz)
    if seg is not None:
        off = end_byte - seg.start
        leftover_end = seg.file.nonzero_end(off, isz)
        if leftover_end > off:
            zero(seg.map, off, leftover_end)


def _rewrite_index(store, index: int, pos: int) -> None:
    """Rewrite index entries index..end_index from the (already verified) data at pos."""
    seg_size = store.segment_size
    batch_start, batch = index, bytearray()
    while index <= store.end_index:
        seg = store.data_segments[pos - pos % seg_size]
        off = pos - seg.start
        if seg_size - off < codec.MIN_BLANK_SIZE:
            pos = seg.start + seg_size
            continue
        magic, size = _BLANK_HEADER.unpack_from(seg.map, off)
        if magic == BLANK:
            pos = seg.start + seg_size
            continue
        _m, _s, e_index, e_term = codec.HEADER.unpack_from(seg.map, off)[:4]
        batch += INDEX.pack(magic, pos, size, e_index, e_term)
        index += 1
        pos += size
        if len(batch) >= CHUNK_BYTES:
            store.rewrite_index(batch_start, batch)
            batch_start, batch = index, bytearray()
    if batch:
        store.rewrite_index(batch_start, batch)
