"""ConsumeQueues: per (topic, queueId), 20-byte entries pointing into the CommitLog.

An entry is RocketMQ's: physical offset (8), message size (4), tags code (8), big
endian; entry k of a queue is the message with queue offset `min_offset + k`.
Entries are only ever added for committed messages (the dispatcher stops at the
commit index), so a queue never shows data a failover could take back.

Each queue is one file, `consumequeue/<topic>/<queueId>/<20-digit first byte>`
(RocketMQ's naming: the file's first entry's queue offset x 20), written at every
dispatch and fsynced only by `ConsumeQueueTable.sync_plan`, which the message store
runs for its dispatch checkpoint: everything dispatched before the checkpoint's log
position is durable in every queue. A power cut may take any part of a queue file
after that, and one queue's tail but not another's, so recovery cuts every queue
back to the checkpoint position and dispatches again from there (`truncate_physical`
rewrites a file and fsyncs it at once, keeping that promise). Entries are mirrored
in memory (20 bytes each), which keeps pulls free of file reads.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from dledger.store.meta import fsync_dir

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20, ConsumeQueue.CQ_STORE_UNIT_SIZE


def entries_ending_by(entries: bytes | bytearray, physical_end: int) -> int:
    """How many of `entries` (a queue's 20-byte entries, in log order) point at messages
    that end at or before `physical_end`: a prefix, what recovery keeps of the queue."""
    keep = len(entries) // ENTRY_SIZE
    while keep and sum(ENTRY.unpack_from(entries, (keep - 1) * ENTRY_SIZE)[:2]) > physical_end:
        keep -= 1
    return keep


class ConsumeQueue:
    def __init__(self, directory: Path, topic: str, queue_id: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.min_offset = 0
        self._entries = bytearray()
        self._file: Path | None = None
        self._fd: int | None = None
        self._unwritten = 0  # bytes at the end of _entries not yet written to the file
        self._new_file = False  # created since the last sync: its directory entry too
        self._written = False  # written since the last sync: the file needs an fsync
        self._load()

    def _load(self) -> None:
        files = sorted(self.directory.glob("[0-9]" * 20)) if self.directory.is_dir() else []
        if not files:
            return
        self._file = files[-1]
        for stale in files[:-1]:  # an older generation left by a reset
            stale.unlink()
        self.min_offset = int(self._file.name) // ENTRY_SIZE
        data = self._file.read_bytes()
        self._entries = bytearray(data[: len(data) - len(data) % ENTRY_SIZE])

    # --------------------------------------------------------------------- reads
    @property
    def max_offset(self) -> int:
        """The next queue offset to be written (RocketMQ's maxOffsetInQueue)."""
        return self.min_offset + len(self._entries) // ENTRY_SIZE

    def __len__(self) -> int:
        return len(self._entries) // ENTRY_SIZE

    def get(self, queue_offset: int) -> tuple[int, int, int]:
        """(physical offset, size, tags code) of the entry at `queue_offset`."""
        k = queue_offset - self.min_offset
        if not 0 <= k < len(self):
            raise IndexError(f"{self.topic}/{self.queue_id}: no offset {queue_offset}")
        return ENTRY.unpack_from(self._entries, k * ENTRY_SIZE)

    def entries(self, queue_offset: int, count: int) -> Iterator[tuple[int, int, int]]:
        k = queue_offset - self.min_offset
        end = min(len(self), k + count)
        if k < 0 or k >= end:
            return iter(())
        return ENTRY.iter_unpack(self._entries[k * ENTRY_SIZE : end * ENTRY_SIZE])

    def last_physical_end(self) -> int:
        """The end (offset + size) of the last message this queue points at, or -1."""
        if not self._entries:
            return -1
        phys, size, _tags = ENTRY.unpack_from(self._entries, len(self._entries) - ENTRY_SIZE)
        return phys + size

    # --------------------------------------------------------------------- writes
    def append(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> None:
        if not self._entries:
            self.min_offset = queue_offset  # the first message the log still holds
            self._reopen()
        elif queue_offset != self.max_offset:
            raise ValueError(
                f"{self.topic}/{self.queue_id}: offset {queue_offset} does not follow "
                f"{self.max_offset - 1}"
            )
        self._entries += ENTRY.pack(physical_offset, size, tags_code)
        self._unwritten += ENTRY_SIZE

    def truncate_physical(self, physical_end: int) -> None:
        """Drop entries for messages that end beyond `physical_end`, durably."""
        keep = entries_ending_by(self._entries, physical_end)
        if keep < len(self):
            del self._entries[keep * ENTRY_SIZE :]
            self._rewrite()

    def flush(self) -> None:
        """Write appended entries to the file (no fsync: the log can rebuild them)."""
        if not self._unwritten:
            return
        if self._fd is None:
            self._reopen()
        os.write(self._fd, self._entries[len(self._entries) - self._unwritten :])
        self._unwritten = 0
        self._written = True

    def _reopen(self) -> None:
        self.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.min_offset * ENTRY_SIZE:020d}"
        if self._file is not None and self._file != path and self._file.exists():
            self._file.unlink()
        self._file = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._new_file = True

    def _rewrite(self) -> None:
        if self._fd is None:
            self._reopen()
        os.ftruncate(self._fd, 0)
        os.write(self._fd, self._entries)
        os.fsync(self._fd)
        self._unwritten = 0

    def sync_work(self) -> tuple[int | None, list[Path]]:
        """What makes this queue's entries so far durable, taken on the event loop and
        carried out in a worker thread: a duplicate of the file descriptor to fsync (the
        queue may reopen its own meanwhile; None when nothing was written since the last
        sync, so a checkpoint costs one fsync per busy queue, not one per queue) and the
        directories whose entries to fsync."""
        self.flush()
        dirs = [self.directory, self.directory.parent] if self._new_file else []
        fd = os.dup(self._fd) if self._written and self._fd is not None else None
        self._new_file = self._written = False
        return fd, dirs

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ConsumeQueueTable:
    """Every ConsumeQueue of the store, created on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        if root.is_dir():
            for topic_dir in root.iterdir():
                for queue_dir in topic_dir.iterdir():
                    if queue_dir.name.isdigit():
                        self.find_or_create(topic_dir.name, int(queue_dir.name))

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            queue = ConsumeQueue(self.root / topic / str(queue_id), topic, queue_id)
            self.queues[(topic, queue_id)] = queue
        return queue

    def max_offsets(self) -> dict[tuple[str, int], int]:
        """The next offset of every queue: the master's table after a failover."""
        return {key: q.max_offset for key, q in self.queues.items()}

    def physical_end(self) -> int:
        """The highest message end any queue points at (-1 when all are empty)."""
        return max((q.last_physical_end() for q in self.queues.values()), default=-1)

    def flush(self) -> None:
        for queue in self.queues.values():
            queue.flush()

    def sync_plan(self) -> Callable[[], None]:
        """A blocking function (for a worker thread) that makes every entry written so
        far durable, with the directory entries of files created since the last one."""
        work = [queue.sync_work() for queue in self.queues.values()]

        def run() -> None:
            dirs: set[Path] = set()
            try:
                for fd, queue_dirs in work:
                    if fd is not None:
                        os.fsync(fd)
                    dirs.update(queue_dirs)
            finally:
                for fd, _dirs in work:
                    if fd is not None:
                        os.close(fd)
            for directory in sorted(dirs) + ([self.root] if dirs else []):
                fsync_dir(directory)

        return run

    def close(self) -> None:
        for queue in self.queues.values():
            queue.flush()
            queue.close()
