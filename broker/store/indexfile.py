"""The key index: RocketMQ's IndexFiles, which answer QUERY_MESSAGE (by KEYS or UNIQ_KEY).

One file (`IndexFile`) is a fixed-size hash table on disk, byte for byte RocketMQ's:
a 40-byte header (begin/end store timestamp, begin/end physical offset, slots in
use, next entry number), `slot_num` 4-byte slots each holding the newest entry of
its chain, then `index_num` 20-byte entries (key hash, physical offset, seconds
since the header's begin timestamp, previous entry of the chain). Entry 0 is never
used. A full file is followed by a new one named by its creation time
(`yyyyMMddHHmmssSSS`), its header seeded with the old file's end values.

The index is derived state of the committed log, like the ConsumeQueues: the
dispatcher feeds it every committed message (`IndexService.dispatch`) on every
replica, so a new master answers the same queries as the old one. Its durability
follows the dispatch checkpoint: the checkpoint flushes the files and records how
many entries the last file then held (`sync_plan`), and recovery (`recover`) keeps
only entries that were flushed and point before the checkpoint's log position,
then rebuilds the last file's slots if one points past them; the dispatcher
dispatches again from there and re-adds the rest, so after a crash nothing is
missed or counted twice.
Retention (`trim`) deletes leading files whose messages the log no longer holds.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import sys
import time
from array import array
from collections.abc import Iterable
from pathlib import Path

from raftmq.disk.filesystem import atomic_write
from raftmq.hotpath import compiled_or
from raftmq.protocol.message import JAVA_STRING_HASH

log = logging.getLogger(__name__)

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
MAX_HASH_SLOT_NUM = 5_000_000  # MessageStoreConfig.maxHashSlotNum
MAX_INDEX_NUM = 20_000_000  # MessageStoreConfig.maxIndexNum
MAX_QUERY_HITS = 64  # MessageStoreConfig.maxMsgsNumBatch
CHECKPOINT = "checkpoint"  # entries of the last file durable at the last dispatch checkpoint
INT_MAX = 2**31 - 1

_HEADER = struct.Struct(">qqqqii")
_HEADER_FIELDS = (
    "begin_timestamp",
    "end_timestamp",
    "begin_phy_offset",
    "end_phy_offset",
    "hash_slot_count",
    "index_count",
)
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
# IndexFile blocks are reserved this far ahead of the last entry (`IndexFile._reserve`).
RESERVE_STEP_BYTES = 4 << 20


def key_hash(key: str) -> int:
    """`IndexFile.indexKeyHashMethod`: abs(String.hashCode()), 0 for Integer.MIN_VALUE."""
    hashed = JAVA_STRING_HASH(key)
    return 0 if hashed == -(2**31) else abs(hashed)


def build_key(topic: str, key: str) -> str:
    """`IndexService.buildKey`: what is hashed for a key of a topic's message."""
    return f"{topic}#{key}"


def file_name(now_ms: int) -> str:
    """`UtilAll.timeMillisToHumanString`: the local time `yyyyMMddHHmmssSSS`."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(now_ms / 1000)) + f"{now_ms % 1000:03d}"


def recover_slots(buf, slot_num: int, count: int) -> int:
    """Make the slots of the IndexFile mapped in `buf` right for its entries 1..count-1
    (each the newest entry of its chain, 0 for none), and return how many are in use.

    They are kept when every slot is empty or names an entry below `count` (after a
    clean stop, all of them), else rebuilt in one pass over the entries: a slot on
    disk holds either what the checkpoint's flush wrote, right for every entry it
    kept, or a later entry's number, past them all. Compiled where the build allows
    (RECOVER_SLOTS): a full file holds twenty million entries."""
    slots_end = HEADER_SIZE + slot_num * SLOT_SIZE
    slots = array("i", buf[HEADER_SIZE:slots_end])
    if sys.byteorder == "little":
        slots.byteswap()
    if not slots or (min(slots) >= 0 and max(slots) < count):
        return len(slots) - slots.count(0)
    buf[HEADER_SIZE:slots_end] = bytes(slots_end - HEADER_SIZE)
    used = 0
    for number in range(1, count):
        (hashed,) = _SLOT.unpack_from(buf, slots_end + number * ENTRY_SIZE)
        slot_pos = HEADER_SIZE + (hashed % slot_num) * SLOT_SIZE
        if _SLOT.unpack_from(buf, slot_pos)[0] == 0:
            used += 1
        _SLOT.pack_into(buf, slot_pos, number)
    return used


RECOVER_SLOTS = compiled_or("recover_slots", recover_slots)


class IndexFile:
    """One IndexFile, memory-mapped. The header fields are kept in attributes and
    written through to the map on each put."""

    def __init__(self, path: Path, slot_num: int, index_num: int) -> None:
        self.path = path
        self.slot_num = slot_num
        self.index_num = index_num
        size_bytes = HEADER_SIZE + slot_num * SLOT_SIZE + index_num * ENTRY_SIZE
        self._size_bytes = size_bytes
        with open(path, "a+b") as f:
            found_bytes = os.fstat(f.fileno()).st_size
            if found_bytes != size_bytes:
                f.truncate(size_bytes)  # a new file, or one of another size: this one's
            self._map = mmap.mmap(f.fileno(), size_bytes)
            self._fd = os.dup(f.fileno())  # kept to reserve blocks as entries are added
        for name, value in zip(_HEADER_FIELDS, _HEADER.unpack_from(self._map, 0), strict=True):
            setattr(self, name, value)
        self.index_count = max(self.index_count, 1)
        # The header, the slots and the entries so far reserved now, the rest a step at a
        # time as entries are added (`put`): on a full disk a write into a hole of the
        # map would be a SIGBUS, a reservation that fails is an OSError (ENOSPC) the
        # dispatcher retries. Reserving the whole file at once would take ~420 MB per
        # file at RocketMQ's default sizes before the first message.
        self._reserved_bytes = 0
        try:
            self._reserve(self._entry_pos(self.index_count))
        except OSError:
            self.close()
            if not found_bytes:
                path.unlink()
            raise

    def _reserve(self, needed_bytes: int) -> None:
        """Blocks allocated for the file's first `needed_bytes` and a step beyond."""
        if needed_bytes <= self._reserved_bytes:
            return
        reserve_bytes = min(needed_bytes + RESERVE_STEP_BYTES, self._size_bytes)
        os.posix_fallocate(self._fd, 0, reserve_bytes)
        self._reserved_bytes = reserve_bytes

    def _write_header(self) -> None:
        """The header fields into the map (on every put: spelt out, as a loop over
        `_HEADER_FIELDS` costs a fifth of a put)."""
        _HEADER.pack_into(
            self._map,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    def seed(self, end_phy_offset: int, end_timestamp: int) -> None:
        """A rolled file's header starts at its predecessor's end (RocketMQ's quirk:
        its first time difference is measured from there)."""
        self.begin_phy_offset = self.end_phy_offset = end_phy_offset
        self.begin_timestamp = self.end_timestamp = end_timestamp
        self._write_header()

    @property
    def full(self) -> bool:
        return self.index_count >= self.index_num

    def _slot_pos(self, slot: int) -> int:
        return HEADER_SIZE + slot * SLOT_SIZE

    def _entry_pos(self, number: int) -> int:
        return HEADER_SIZE + self.slot_num * SLOT_SIZE + number * ENTRY_SIZE

    def entry(self, number: int) -> tuple[int, int, int, int]:
        """(key hash, physical offset, time difference s, previous entry) of entry `number`."""
        return _ENTRY.unpack_from(self._map, self._entry_pos(number))

    def put(self, key: str, physical_offset: int, store_timestamp: int) -> bool:
        """`IndexFile.putKey`; False when the file is full."""
        if self.full:
            return False
        hashed = key_hash(key)
        slot_pos = self._slot_pos(hashed % self.slot_num)
        (head,) = _SLOT.unpack_from(self._map, slot_pos)
        if head <= 0 or head > self.index_count:
            head = 0
        if self.begin_timestamp <= 0:
            diff_s = 0
        else:
            diff_s = min(max((store_timestamp - self.begin_timestamp) // 1000, 0), INT_MAX)
        number = self.index_count
        self._reserve(self._entry_pos(number) + ENTRY_SIZE)
        _ENTRY.pack_into(self._map, self._entry_pos(number), hashed, physical_offset, diff_s, head)
        _SLOT.pack_into(self._map, slot_pos, number)
        if number <= 1:
            self.begin_phy_offset = physical_offset
            self.begin_timestamp = store_timestamp
        if head == 0:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_phy_offset = physical_offset
        self.end_timestamp = store_timestamp
        self._write_header()
        return True

    def select(self, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """`IndexFile.selectPhyOffset`: physical offsets of entries with the key's hash
        stored in [begin_ms, end_ms], newest first. Collisions are the caller's."""
        hits: list[int] = []
        if self.index_count <= 1:
            return hits
        hashed = key_hash(key)
        (number,) = _SLOT.unpack_from(self._map, self._slot_pos(hashed % self.slot_num))
        if number <= 0 or number >= self.index_count:
            return hits
        while len(hits) < max_num:
            entry_hash, phys, diff_s, prev = self.entry(number)
            if diff_s < 0:
                break
            time_read = self.begin_timestamp + diff_s * 1000
            if entry_hash == hashed and begin_ms <= time_read <= end_ms:
                hits.append(phys)
            if prev <= 0 or prev >= self.index_count or prev == number or time_read < begin_ms:
                break
            number = prev
        return hits

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        """`isTimeMatched`: the file's time range meets the query's."""
        return self.begin_timestamp <= end_ms and self.end_timestamp >= begin_ms - 1000

    def cut(self, count: int, below_phy: int) -> None:
        """Keep the first entries of 1..count-1 whose physical offset is below
        `below_phy` (entries are in log order), with slots right for them
        (`recover_slots`): what lies beyond `count` was never flushed and may be torn."""
        count = max(1, min(count, self.index_count if count > 0 else 1, self.index_num))
        low, high = 1, count  # the first entry at or past below_phy: offsets only grow
        while low < high:
            mid = (low + high) // 2
            if self.entry(mid)[1] < below_phy:
                low = mid + 1
            else:
                high = mid
        self.hash_slot_count = RECOVER_SLOTS(self._map, self.slot_num, low)
        self.index_count = low
        if low > 1:
            _hash, self.end_phy_offset, diff_s, _prev = self.entry(low - 1)
            self.end_timestamp = self.begin_timestamp + diff_s * 1000
        self._write_header()

    def flush(self) -> None:
        """Flush to disk; nothing for a file retention deleted meanwhile (the dispatch
        checkpoint flushes on a worker thread while dispatch goes on)."""
        try:
            self._map.flush()
        except (ValueError, OSError):
            if not self._map.closed:
                raise

    def close(self) -> None:
        self._map.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class IndexService:
    """The index directory: its files oldest first, the last one written."""

    def __init__(
        self, root: Path, slot_num: int = MAX_HASH_SLOT_NUM, index_num: int = MAX_INDEX_NUM
    ) -> None:
        assert slot_num > 0 and index_num > 1, (slot_num, index_num)
        self.root = root
        self.slot_num = slot_num
        self.index_num = index_num
        root.mkdir(parents=True, exist_ok=True)
        self.files = [
            IndexFile(path, slot_num, index_num)
            for path in sorted(root.iterdir())
            if path.name.isdigit()
        ]

    # ------------------------------------------------------------------ durability
    def recover(self, resume_phy: int) -> None:
        """Keep what the last dispatch checkpoint vouches for: entries flushed by it
        and pointing before `resume_phy`, the log position dispatch resumes from."""
        try:
            mark = json.loads((self.root / CHECKPOINT).read_bytes())
            mark_file, mark_count = str(mark.get("file", "")), int(mark.get("count", 1))
        except FileNotFoundError:
            mark_file, mark_count = "", 1
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("index checkpoint unreadable (%s): rebuilding the index", exc)
            mark_file, mark_count = "", 1
        kept = []
        for file in self.files:
            if file.path.name > mark_file or file.begin_phy_offset >= resume_phy > 0:
                file.destroy()  # created after the checkpoint, or wholly after resume
            else:
                kept.append(file)
        self.files = kept
        if self.files:
            last = self.files[-1]
            last.cut(mark_count if last.path.name == mark_file else last.index_count, resume_phy)
            if last.index_count <= 1 and len(self.files) > 1:
                self.files.pop().destroy()

    def cut(self, below_phy: int) -> None:
        """Drop the entries for messages at or after `below_phy` (the log was cut there)."""
        while self.files and self.files[-1].begin_phy_offset >= below_phy > 0:
            self.files.pop().destroy()
        if self.files:
            self.files[-1].cut(self.files[-1].index_count, below_phy)

    def sync_plan(self):
        """Blocking work for the dispatch checkpoint: flush the files, then record how
        many entries of the last one that flush covers (captured now)."""
        files = list(self.files)
        mark = json.dumps(
            {"file": files[-1].path.name, "count": files[-1].index_count} if files else {}
        ).encode()

        def run() -> None:
            for file in files:
                file.flush()
            atomic_write(self.root / CHECKPOINT, mark)

        return run

    # ------------------------------------------------------------------ writes
    def _last_file(self) -> IndexFile:
        if self.files and not self.files[-1].full:
            return self.files[-1]
        now_ms = int(time.time() * 1000)
        name = file_name(now_ms)
        while self.files and name <= self.files[-1].path.name:
            now_ms += 1  # names sort in creation order even within a millisecond
            name = file_name(now_ms)
        file = IndexFile(self.root / name, self.slot_num, self.index_num)
        if self.files:
            previous = self.files[-1]
            file.seed(previous.end_phy_offset, previous.end_timestamp)
            previous.flush()  # a full file never changes again
        self.files.append(file)
        return file

    def dispatch(
        self, topic: str, physical_offset: int, store_timestamp: int, keys: Iterable[str]
    ) -> None:
        """Index a committed message under each of `keys` (its UNIQ_KEY, then the words
        of its KEYS), unless it is indexed already (a replay after a restart)."""
        last = self.files[-1] if self.files else None
        if last is not None and last.index_count > 1 and physical_offset <= last.end_phy_offset:
            return
        for key in keys:
            if not key:
                continue
            file = self._last_file()
            if not file.put(build_key(topic, key), physical_offset, store_timestamp):
                raise AssertionError(f"a new index file {file.path} is full")

    def trim(self, min_phy: int) -> None:
        """`deleteExpiredFile`: drop leading files whose messages all precede `min_phy`
        (retention deleted them), never the last."""
        while len(self.files) > 1 and self.files[0].end_phy_offset < min_phy:
            self.files.pop(0).destroy()

    # ------------------------------------------------------------------ reads
    def query(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> tuple[list[int], int, int]:
        """`IndexService.queryOffset`: (physical offsets, newest file's end timestamp,
        its end physical offset). Files are searched newest first."""
        max_num = min(max_num, MAX_QUERY_HITS)
        hits: list[int] = []
        if not self.files:
            return hits, 0, 0
        newest = self.files[-1]
        full_key = build_key(topic, key)
        for file in reversed(self.files):
            if file.overlaps(begin_ms, end_ms):
                hits.extend(file.select(full_key, max_num - len(hits), begin_ms, end_ms))
            if file.begin_timestamp < begin_ms or len(hits) >= max_num:
                break
        return hits, newest.end_timestamp, newest.end_phy_offset

    def close(self) -> None:
        for file in self.files:
            file.close()


__all__ = ["IndexFile", "IndexService", "build_key", "file_name", "key_hash"]
