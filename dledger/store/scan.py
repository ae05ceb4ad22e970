"""Recovery's forward pass over the data: what is there, where it stops, and why.

The scan is read-only. It checks every entry it meets (bodyCrc, chainCrc, index,
term, pos, placement) and records the term runs, each segment's bytes in use and
the first index entry that disagrees with the data, for recovery to apply.
"""

from __future__ import annotations

import struct

from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.segments import BLANK, INDEX, INDEX_SIZE

from raftmq.disk.segments import segment_path

_BLANK_HEADER = codec.BLANK_HEADER
_HEADER_SIZE = codec.HEADER_SIZE
_POS = struct.Struct(">q")


class NoFastStart(Exception):
    """Something about a fast start does not check out: scan from the log's beginning."""

    def __init__(self, reason: str, suspicious: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.suspicious = suspicious  # a sign of damage, not just a log with nothing to skip


class Scan:
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
        store,
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
        return str(segment_path(self.store.data_dir, start)), self.stop_pos - start

    def _fail(self, pos: int, reason: str) -> None:
        self.stop_pos, self.reason, self.failed = pos, reason, True

    def run(self) -> None:
        store = self.store  # locals: the loop runs once per entry in the log
        seg_size, isz = store.segment_size, store.index_segment_size
        data, index_table = store.data_segments, store.index_segments
        pos, prev_end, expected = self.start_pos, self.prev_end, self.expected_index
        term, chain = self.before_term, self.before_chain
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
            if magic == BLANK:
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
                byte = INDEX_SIZE * e_index
                ibase = byte - byte % isz
                if index_seg is None or index_seg.start != ibase:
                    index_seg = index_table.get(ibase)
                if index_seg is None or INDEX.unpack_from(index_seg.map, byte - ibase) != (
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
