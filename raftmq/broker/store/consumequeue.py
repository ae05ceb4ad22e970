"""ConsumeQueues: per (topic, queueId), 20-byte entries pointing into the CommitLog.

An entry is RocketMQ's: physical offset (8), message size (4), tags code (8), big
endian; entry k of a queue is the message with queue offset `min_offset + k`.
Entries are only ever added for committed messages (the dispatcher stops at the
commit index), so a queue never shows data a failover could take back.

A queue is a run of files, `consumequeue/<topic>/<queueId>/<20-digit first byte>`,
each named by its first entry's queue offset x 20 and holding `file_entries` entries
(RocketMQ's `mappedFileSizeConsumeQueue`; the last one is being filled). Files, not
one file per queue, because DLedger retention deletes the head of the log: a queue
then drops its whole files that only point below the log's beginning (RocketMQ's
deleteExpiredFile), never rewriting what it keeps, and a file's name keeps telling
the queue offset of every entry in it, so offsets never renumber. The queue's
`min_offset` (RocketMQ's correctMinOffset) is not stored: it is the first entry
pointing at or after the log's beginning, worked out again after every load
(`trim_head`), so a head trimmed before a crash is trimmed the same way after it.

Files are written at every dispatch and fsynced only by `ConsumeQueueTable.sync_plan`,
which the message store runs for its dispatch checkpoint: everything dispatched
before the checkpoint's log position is durable in every queue. A power cut may take
any part of a queue after that, the tail of any of its files, and one queue's tail
but not another's, so loading keeps the files that continue each other from the
first one, and recovery cuts every queue back to the checkpoint position and
dispatches again from there (`truncate_physical` cuts the files and fsyncs at once,
keeping that promise). The live entries are mirrored in memory (20 bytes each),
which keeps pulls free of file reads; trimming the head frees them.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from raftmq.dledger.store.meta import fsync_dir

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20, ConsumeQueue.CQ_STORE_UNIT_SIZE
DEFAULT_FILE_ENTRIES = 300_000  # RocketMQ's mappedFileSizeConsumeQueue / 20


def entries_ending_by(entries: bytes | bytearray, physical_end: int) -> int:
    """How many of `entries` (a queue's 20-byte entries, in log order) point at messages
    that end at or before `physical_end`: a prefix, what recovery keeps of the queue."""
    keep = len(entries) // ENTRY_SIZE
    while keep and sum(ENTRY.unpack_from(entries, (keep - 1) * ENTRY_SIZE)[:2]) > physical_end:
        keep -= 1
    return keep


def _file_name(first_offset: int) -> str:
    return f"{first_offset * ENTRY_SIZE:020d}"


class ConsumeQueue:
    def __init__(
        self,
        directory: Path,
        topic: str,
        queue_id: int,
        file_entries: int = DEFAULT_FILE_ENTRIES,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.file_entries = file_entries
        self.min_offset = 0
        self.dispatched_bytes = 0  # of the messages appended since start (broker.metrics)
        self._entries = bytearray()  # offsets min_offset .. max_offset - 1
        self._files: list[int] = []  # first queue offset of each file; the last is filled
        self._fd: int | None = None  # the last file's
        self._rolled: list[int] = []  # full files written since the last sync, to fsync
        self._unwritten = 0  # bytes at the end of _entries not yet written to the file
        self._new_file = False  # created since the last sync: its directory entry too
        self._written = False  # written since the last sync: the last file needs an fsync
        self._load()

    def _load(self) -> None:
        """Read the files that continue each other from the first one; the rest (after
        a file a power cut shortened) holds only entries recovery dispatches again."""
        paths = sorted(self.directory.glob("[0-9]" * 20)) if self.directory.is_dir() else []
        for k, path in enumerate(paths):
            first = int(path.name) // ENTRY_SIZE
            if self._files and first != self.max_offset:
                for stale in paths[k:]:
                    stale.unlink()
                break
            data = path.read_bytes()
            whole = len(data) - len(data) % ENTRY_SIZE
            if whole < len(data):  # a torn entry: appends must not land behind it
                os.truncate(path, whole)
            if not self._files:
                self.min_offset = first
            self._files.append(first)
            self._entries += data[:whole]

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
        return ENTRY.iter_unpack(self.entry_bytes(queue_offset, count))

    def entry_bytes(self, queue_offset: int, count: int) -> bytearray:
        """The entries from `queue_offset` on, at most `count`, as stored (none outside
        the queue): what a pull scans (`commitlog.pull_body`)."""
        k = queue_offset - self.min_offset
        end = min(len(self), k + count)
        if k < 0 or k >= end:
            return bytearray()
        return self._entries[k * ENTRY_SIZE : end * ENTRY_SIZE]

    def last_physical_end(self) -> int:
        """The end (offset + size) of the last message this queue points at, or -1."""
        if not self._entries:
            return -1
        phys, size, _tags = ENTRY.unpack_from(self._entries, len(self._entries) - ENTRY_SIZE)
        return phys + size

    # --------------------------------------------------------------------- writes
    def append(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> None:
        max_offset = self.min_offset + len(self._entries) // ENTRY_SIZE  # once per message
        if queue_offset != max_offset:
            if self._entries:
                raise ValueError(
                    f"{self.topic}/{self.queue_id}: offset {queue_offset} does not follow "
                    f"{max_offset - 1}"
                )
            self._drop_files()  # the first message the log still holds
            self.min_offset = max_offset = queue_offset
        if not self._files or max_offset - self._files[-1] >= self.file_entries:
            self._roll()
        self._entries += ENTRY.pack(physical_offset, size, tags_code)
        self.dispatched_bytes += size
        self._unwritten += ENTRY_SIZE

    def trim_head(self, physical_begin: int) -> None:
        """Drop the entries pointing before `physical_begin` (the log's beginning, after
        retention deleted what came before): RocketMQ's correctMinOffset, then
        deleteExpiredFile for the files that hold only such entries, except the last,
        whose name keeps `max_offset` when every entry is gone. Not fsynced: a file
        that comes back after a crash is dropped again by the same rule."""
        dead = bisect.bisect_left(
            range(len(self)),
            physical_begin,
            key=lambda k: ENTRY.unpack_from(self._entries, k * ENTRY_SIZE)[0],
        )
        if not dead:
            return
        self.flush()  # dropped entries may not be in the file yet: positions must hold
        del self._entries[: dead * ENTRY_SIZE]
        self.min_offset += dead
        while len(self._files) > 1 and self._files[1] <= self.min_offset:
            (self.directory / _file_name(self._files.pop(0))).unlink()

    def truncate_physical(self, physical_end: int) -> None:
        """Drop entries for messages that end beyond `physical_end`, durably."""
        keep = entries_ending_by(self._entries, physical_end)
        if keep == len(self):
            return
        self.flush()
        del self._entries[keep * ENTRY_SIZE :]
        end = self.max_offset
        dropped = False
        while len(self._files) > 1 and self._files[-1] >= end:
            self._close_last()
            (self.directory / _file_name(self._files.pop())).unlink()
            dropped = True
        self._open_last()
        os.ftruncate(self._fd, (end - self._files[-1]) * ENTRY_SIZE)
        os.fsync(self._fd)
        if dropped:
            fsync_dir(self.directory)

    def flush(self) -> None:
        """Write appended entries to the last file (no fsync: the log can rebuild them).
        OSError (ENOSPC) leaves what was not written to be written by the next call."""
        if not self._unwritten:
            return
        self._open_last()
        view = memoryview(self._entries)
        try:
            while self._unwritten:  # a write short of room writes part: keep the rest
                self._unwritten -= os.write(self._fd, view[len(view) - self._unwritten :])
                self._written = True
        finally:
            view.release()

    def _open_last(self) -> None:
        if self._fd is None:
            path = self.directory / _file_name(self._files[-1])
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def _roll(self) -> None:
        """Start the next file at `max_offset`; the full one is fsynced by the next sync."""
        self.flush()
        if self._written:
            self._rolled.append(self._fd)
            self._fd = None
            self._written = False
        self._close_last()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / _file_name(self.max_offset)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._files.append(self.max_offset)
        self._new_file = True

    def _drop_files(self) -> None:
        """Delete every file, durably, last first: a crash leaves a run that still
        continues from the first file, never a newer file beside older ones."""
        self._close_fds()
        for first in reversed(self._files):
            (self.directory / _file_name(first)).unlink()
        if self._files:
            fsync_dir(self.directory)
        self._files.clear()
        self._unwritten = 0
        self._written = False

    def sync_work(self) -> tuple[list[int], list[Path]]:
        """What makes this queue's entries so far durable, taken on the event loop and
        carried out in a worker thread: file descriptors to fsync (files filled since
        the last sync, and a duplicate of the last file's, as the queue may reopen its
        own meanwhile; none when nothing was written since the last sync, so a
        checkpoint costs one fsync per busy queue, not one per queue) and the
        directories whose entries to fsync. The caller closes the descriptors."""
        self.flush()
        dirs = [self.directory, self.directory.parent] if self._new_file else []
        fds, self._rolled = self._rolled, []
        if self._written and self._fd is not None:
            fds.append(os.dup(self._fd))
        self._new_file = self._written = False
        return fds, dirs

    def _close_last(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _close_fds(self) -> None:
        for fd in self._rolled:
            os.close(fd)
        self._rolled.clear()
        self._close_last()

    def close(self) -> None:
        self.flush()
        self._close_fds()


class ConsumeQueueTable:
    """Every ConsumeQueue of the store, created on first use."""

    def __init__(self, root: Path, file_entries: int = DEFAULT_FILE_ENTRIES) -> None:
        self.root = root
        self.file_entries = file_entries
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
            directory = self.root / topic / str(queue_id)
            queue = ConsumeQueue(directory, topic, queue_id, self.file_entries)
            self.queues[(topic, queue_id)] = queue
        return queue

    def max_offsets(self) -> dict[tuple[str, int], int]:
        """The next offset of every queue: the master's table after a failover."""
        return {key: q.max_offset for key, q in self.queues.items()}

    def physical_end(self) -> int:
        """The highest message end any queue points at (-1 when all are empty)."""
        return max((q.last_physical_end() for q in self.queues.values()), default=-1)

    def trim_head(self, physical_begin: int) -> None:
        for queue in self.queues.values():
            queue.trim_head(physical_begin)

    def flush(self, keys: Iterable[tuple[str, int]] | None = None) -> None:
        """Write the appended entries of the queues `keys` names (every queue without):
        the store's periodic write names the queues touched since the last, so its cost
        does not grow with the queues that are idle."""
        queues = self.queues.values() if keys is None else map(self.queues.get, keys)
        for queue in queues:
            if queue is not None:  # a key of a message that takes no queue offset
                queue.flush()

    def sync_plan(self) -> Callable[[], None]:
        """A blocking function (for a worker thread) that makes every entry written so
        far durable, with the directory entries of files created since the last one."""
        work = [queue.sync_work() for queue in self.queues.values()]

        def run() -> None:
            dirs: set[Path] = set()
            try:
                for fds, queue_dirs in work:
                    for fd in fds:
                        os.fsync(fd)
                    dirs.update(queue_dirs)
            finally:
                for fds, _dirs in work:
                    for fd in fds:
                        os.close(fd)
            for directory in sorted(dirs) + ([self.root] if dirs else []):
                fsync_dir(directory)

        return run

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()
