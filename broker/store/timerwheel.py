"""The timer wheel: pending timer messages in files by due time, a heap for what is due soon.

A timer message (broker.timer) is stored in the CommitLog under `TIMER_TOPIC` with its
due time (`TIMER_OUT_MS`, a multiple of the precision). The log is the only durable
truth; this is derived state, as RocketMQ's TimerLog and TimerWheel are, rebuilt from
the log when it is missing or behind a truncated log (RocketMQ's #7480 and #10668).

Every replica's dispatcher adds each committed timer message to the bucket file of its
due time: `timerwheel/<bucket start ms>`, one 20-byte record (due ms, physical offset,
size) per message, appended; a bucket spans BUCKET_MS. RocketMQ's wheel instead keeps a
fixed ring of 2 x 7 days of one-second slots (10 MiB mapped) and a linked list per slot
through its TimerLog; buckets by due time keep the same property — what is pending
costs disk, not memory — with files that are plain appends and that go once fired.

Only the master fires (`start_firing`): it loads into a heap the buckets whose span
begins before `now + BUCKET_MS` and the next one as time reaches it, so memory holds
what is due within about two buckets however many are pending further out (measured
in docs/timers.md). Firing progress is (fired_ms, position): every timer message before
log position `position` that is due at or before `fired_ms` has been delivered. The
master writes it as replicated metadata; a new master loads the buckets again, leaving
out what the progress covers, so it resumes where the last progress record stopped. A
bucket whose every record the replicated progress covers is deleted, on every replica.

A record may be in a bucket twice (dispatched again after a crash before the wheel's
checkpoint); loading keeps one per physical offset.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

from raftmq.disk.durable import DiskFailure
from raftmq.disk.filesystem import atomic_write, fsync_dir

log = logging.getLogger(__name__)

TIMER_TOPIC = "rmq_sys_wheel_timer"  # TimerMessageStore.TIMER_TOPIC
BUCKET_MS = 60_000
RECORD = struct.Struct(">qqi")  # due ms, physical offset, size
CHECKPOINT = "checkpoint"  # {"position": the log position every record before is synced}
NO_PROGRESS = (-1, 0)  # (fired_ms, position): nothing fired yet

Entry = tuple[int, int, int]  # (due ms, physical offset, size): what the heap orders


def bucket_of(due_ms: int) -> int:
    """The start of the bucket holding a record due at `due_ms`."""
    return due_ms - due_ms % BUCKET_MS


def fired(entry: Entry, progress: tuple[int, int]) -> bool:
    """Whether the firing progress (fired_ms, position) covers `entry`."""
    fired_ms, position = progress
    return entry[0] <= fired_ms and entry[1] < position


class TimerWheel:
    """The buckets under `directory` and, on the master, the heap of what is due soon."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        # bucket start -> records in its file and buffer (duplicates included)
        self.counts: dict[int, int] = {}
        for path in directory.iterdir():
            if path.name.isdigit():
                self.counts[int(path.name)] = path.stat().st_size // RECORD.size
        self._buffers: dict[int, bytearray] = {}  # records not yet written, by bucket
        self._unsynced: set[int] = set()  # buckets written since the last checkpoint
        self.position = 0  # the log position up to which committed records are added
        self.heap: list[Entry] | None = None  # on the master only
        self.loaded_until_ms = 0  # every bucket starting before it is in the heap

    # ------------------------------------------------------------------ every replica
    def add(self, due_ms: int, physical_offset: int, size: int) -> None:
        """A committed timer message, in dispatch order (the log's)."""
        bucket = bucket_of(due_ms)
        buffer = self._buffers.get(bucket)
        if buffer is None:
            buffer = self._buffers[bucket] = bytearray()
        buffer += RECORD.pack(due_ms, physical_offset, size)
        self.counts[bucket] = self.counts.get(bucket, 0) + 1
        self.position = physical_offset + size
        if self.heap is not None and due_ms < self.loaded_until_ms:
            heapq.heappush(self.heap, (due_ms, physical_offset, size))

    def flush(self) -> None:
        """Append the buffered records to their bucket files (no fsync: the checkpoint's)."""
        for bucket, buffer in self._buffers.items():
            with open(self.directory / str(bucket), "ab") as file:
                file.write(buffer)
            self._unsynced.add(bucket)
        self._buffers.clear()

    def sync_plan(self) -> Callable[[], None]:
        """Blocking work that makes every record added so far durable and records the
        position they reach, for the store's dispatch checkpoint (a worker thread)."""
        self.flush()
        buckets, self._unsynced = self._unsynced, set()
        record = json.dumps({"position": self.position}).encode()
        directory = self.directory

        def run() -> None:
            for bucket in buckets:
                path = directory / str(bucket)
                try:
                    with open(path, "rb") as file:
                        os.fsync(file.fileno())
                except FileNotFoundError:
                    continue  # fired and deleted since
                except OSError as exc:
                    raise DiskFailure(f"fsync failed ({exc}) on {path}; stopping") from exc
            if buckets:
                fsync_dir(directory)
            atomic_write(directory / CHECKPOINT, record)

        return run

    def checkpoint_position(self) -> int | None:
        """The position of the last checkpoint; None when there is none to trust."""
        try:
            return int(json.loads((self.directory / CHECKPOINT).read_bytes())["position"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("timer wheel checkpoint unreadable (%s): rebuilding it", exc)
            return None

    def clear(self) -> None:
        """Drop every bucket: before a rebuild from the log."""
        for bucket in self.counts:
            (self.directory / str(bucket)).unlink(missing_ok=True)
        (self.directory / CHECKPOINT).unlink(missing_ok=True)
        self.counts.clear()
        self._buffers.clear()
        self._unsynced.clear()
        self.position = 0

    def forget_fired(self, progress: tuple[int, int]) -> int:
        """Delete the buckets the replicated progress covers whole; how many."""
        fired_ms, position = progress
        self.flush()
        gone = 0
        for bucket in sorted(self.counts):
            if bucket + BUCKET_MS - 1 > fired_ms:
                break
            records = self._read(bucket)
            if any(physical_offset >= position for _due, physical_offset, _size in records):
                continue  # a record committed after the progress was taken
            (self.directory / str(bucket)).unlink(missing_ok=True)
            del self.counts[bucket]
            self._unsynced.discard(bucket)
            gone += 1
        return gone

    def pending(self, progress: tuple[int, int]) -> int:
        """Records the replicated progress does not cover: the backlog (recall
        tombstones count, and a record dispatched twice after a crash counts twice).
        Buckets wholly after the progress are counted, the few it reaches are read."""
        fired_ms = progress[0]
        return sum(
            count
            if bucket > fired_ms
            else sum(not fired(entry, progress) for entry in self._read(bucket))
            for bucket, count in self.counts.items()
        )

    def _read(self, bucket: int) -> list[Entry]:
        try:
            data = (self.directory / str(bucket)).read_bytes()
        except FileNotFoundError:
            data = b""
        data += self._buffers.get(bucket, b"")
        usable = len(data) - len(data) % RECORD.size  # a torn last record after a crash
        return list(RECORD.iter_unpack(memoryview(data)[:usable]))

    # ------------------------------------------------------------------ the master
    def start_firing(self, now_ms: int, progress: tuple[int, int]) -> None:
        """Become the one that fires: the heap from every bucket up to the window, less
        what the replicated `progress` says was fired."""
        self.flush()
        self.heap = []
        self.loaded_until_ms = bucket_of(now_ms) + 2 * BUCKET_MS
        self._load([b for b in self.counts if b < self.loaded_until_ms], progress)

    def stop_firing(self) -> None:
        self.heap = None
        self.loaded_until_ms = 0

    def advance(self, now_ms: int, progress: tuple[int, int]) -> None:
        """Load the buckets the window reaches by `now_ms`."""
        assert self.heap is not None, "only the master loads buckets"
        end = bucket_of(now_ms) + 2 * BUCKET_MS
        if end > self.loaded_until_ms:
            buckets = [b for b in self.counts if self.loaded_until_ms <= b < end]
            self.loaded_until_ms = end
            self._load(buckets, progress)

    def _load(self, buckets: Iterable[int], progress: tuple[int, int]) -> None:
        heap = self.heap
        assert heap is not None
        seen = {entry[1] for entry in heap}
        for bucket in buckets:
            for entry in self._read(bucket):
                if entry[1] not in seen and not fired(entry, progress):
                    seen.add(entry[1])
                    heap.append(entry)
        heapq.heapify(heap)

    def due(self, by_ms: int, limit: int) -> tuple[list[Entry], int]:
        """Up to `limit` of the heap's entries due at or before `by_ms`, taken out of it,
        earliest first, and the time every entry due by which is now taken (-1: none)."""
        heap = self.heap
        assert heap is not None
        taken = []
        while heap and heap[0][0] <= by_ms and len(taken) < limit:
            taken.append(heapq.heappop(heap))
        if not taken:
            return taken, -1
        last_ms = taken[-1][0]
        return taken, last_ms if not heap or heap[0][0] > last_ms else last_ms - 1

    def put_back(self, entries: list[Entry]) -> None:
        """Entries `due` took that could not be delivered: they are tried again."""
        assert self.heap is not None
        for entry in entries:
            heapq.heappush(self.heap, entry)

    def next_due_ms(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    @property
    def in_memory(self) -> int:
        """Entries held in memory: the heap's."""
        return 0 if self.heap is None else len(self.heap)
