"""A log kept in memory, with positions laid out as the file store lays them out.

Fast tests use it, and the simulator uses `crashed()` to model a power cut: the
copy it returns holds only what the last completed fsync covered.
"""

from __future__ import annotations

import bisect

from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.base import VALIDATE_CONTINUATION, LogStore, SyncPlan


class MemoryLogStore(LogStore):
    def __init__(self, segment_size: int = 1 << 30) -> None:
        self.segment_size = segment_size
        self._encoded: list[bytes] = []  # entry i is at _encoded[i - begin_index]
        self._meta: list[tuple[int, int, int]] = []  # (term, pos, chain) per entry
        self.begin_index = 0
        self._before_term = -1
        self._before_pos = 0
        self._before_chain: int | None = 0
        self.generation = 0
        self._durable: tuple | None = None  # state captured by the last completed sync

    # -- reads ---------------------------------------------------------------------------
    @property
    def end_index(self) -> int:
        return self.begin_index + len(self._encoded) - 1

    @property
    def end_term(self) -> int:
        return self._meta[-1][0] if self._meta else self._before_term

    @property
    def end_pos(self) -> int:
        if not self._meta:
            return self._before_pos
        return self._meta[-1][1] + len(self._encoded[-1])

    @property
    def end_chain(self) -> int:
        return self._meta[-1][2] if self._meta else (self._before_chain or 0)

    def _slot(self, index: int) -> int:
        if not self.begin_index <= index <= self.end_index:
            raise IndexError(f"index {index} outside [{self.begin_index}, {self.end_index}]")
        return index - self.begin_index

    def term_at(self, index: int) -> int:
        if index == self.begin_index - 1:
            return self._before_term
        return self._meta[self._slot(index)][0]

    def pos_at(self, index: int) -> int:
        return self._meta[self._slot(index)][1]

    def chain_at(self, index: int) -> int:
        return self._meta[self._slot(index)][2]

    def get(self, index: int) -> codec.Entry:
        return codec.decode(self._encoded[self._slot(index)])

    def read_at(self, pos: int, size: int) -> bytes:
        slot = bisect.bisect_right(self._meta, pos, key=lambda m: m[1]) - 1
        if slot < 0 or size < 0:
            raise IndexError(f"bytes [{pos}, {pos + size}) are not in the log")
        off = pos - self._meta[slot][1]
        blob = self._encoded[slot]
        if off + size > len(blob):
            raise IndexError(f"bytes [{pos}, {pos + size}) are not in the log")
        return blob[off : off + size]

    def read_encoded(self, index: int, max_bytes: int) -> tuple[bytes, int]:
        slot = self._slot(index)
        parts = [self._encoded[slot]]
        total = len(parts[0])
        for blob in self._encoded[slot + 1 :]:
            if total + len(blob) > max_bytes:
                break
            parts.append(blob)
            total += len(blob)
        return b"".join(parts), len(parts)

    # -- writes --------------------------------------------------------------------------
    def append_leader(self, term, items):
        if not items:
            return []
        first = index = self.end_index + 1
        chain = self.end_chain
        sizes = [codec.HEADER_SIZE + len(body) for _type, body in items]
        positions = codec.places(self.end_pos, sizes, self.segment_size)
        for (entry_type, body), pos in zip(items, positions, strict=True):
            blob, chain = codec.ENCODE(entry_type, index, term, pos, body, chain)
            self._encoded.append(blob)
            self._meta.append((term, pos, chain))
            index += 1
        return list(zip(range(first, index), positions, strict=True))

    def append_encoded(self, blob: bytes) -> int:
        chain = self.end_chain if self._meta or self._before_chain is not None else None
        staged = VALIDATE_CONTINUATION(
            blob, self.end_index + 1, self.end_pos, self.end_term, chain, self.segment_size
        )
        for offset, _t, size, _i, e_term, e_pos, e_chain in staged:
            self._encoded.append(bytes(blob[offset : offset + size]))
            self._meta.append((e_term, e_pos, e_chain))
        return len(staged)

    def truncate(self, from_index: int) -> None:
        if from_index < self.begin_index:
            raise IndexError(f"cannot truncate at {from_index} before begin {self.begin_index}")
        keep = from_index - self.begin_index
        del self._encoded[keep:]
        del self._meta[keep:]
        self.generation += 1

    def reset(self, begin_index: int, begin_pos: int, before_term: int) -> None:
        self._encoded.clear()
        self._meta.clear()
        self.begin_index = begin_index
        self._before_term = before_term
        self._before_pos = begin_pos
        self._before_chain = None  # the first entry's chain is taken on trust
        self.generation += 1

    # -- durability ------------------------------------------------------------------------
    def _capture(self) -> tuple:
        return (
            list(self._encoded),
            list(self._meta),
            self.begin_index,
            self._before_term,
            self._before_pos,
            self._before_chain,
        )

    def sync_plan(self) -> SyncPlan:
        captured = self._capture()

        def work() -> None:
            self._durable = captured

        return SyncPlan(self.end_index, self.generation, work)

    def crashed(self, keep_unsynced: int = 0) -> MemoryLogStore:
        """A fresh store holding what survives a power cut now.

        Everything the last completed sync covered survives; of the entries written
        since (when no truncation intervened), the first `keep_unsynced` survive too,
        as a page cache that flushed part of its dirty data would leave them.
        """
        survivor = MemoryLogStore(self.segment_size)
        durable = self._durable or ([], [], 0, -1, 0, 0)
        encoded, meta, begin, before_term, before_pos, before_chain = durable
        survivor._encoded, survivor._meta = list(encoded), list(meta)
        survivor.begin_index, survivor._before_term = begin, before_term
        survivor._before_pos, survivor._before_chain = before_pos, before_chain
        if keep_unsynced and begin == self.begin_index:
            n = len(encoded)
            if self._meta[:n] == meta:
                survivor._encoded += self._encoded[n : n + keep_unsynced]
                survivor._meta += self._meta[n : n + keep_unsynced]
        survivor._durable = survivor._capture()
        return survivor
