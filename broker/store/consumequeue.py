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

Entries are written to the files and fsynced only by the dispatch checkpoint
(`ConsumeQueueTable.sync_plan`, a bounded batch of the queues dispatched to since the
last checkpoint at a time, in a worker thread): everything dispatched before the
checkpoint's log position is then durable in every queue. Reads never need the files
(the live entries are mirrored in memory, 20 bytes each, which keeps pulls free of
file reads; trimming the head frees them), and recovery cuts every queue back to the
checkpoint position and dispatches again from there anyway, so writing sooner would
buy nothing. A power cut may take any part of a queue after that, the tail of any of
its files, and one queue's tail but not another's, so loading keeps the files that
continue each other from the first one (`truncate_physical` cuts the files and fsyncs
at once, keeping that promise). Writes are positional (an entry's place in its file
follows from its queue offset), so writing the same entries twice, as a retry after
a full disk does, writes the same bytes; and no file descriptor stays open between
them, so 10,000 queues need no 10,000 descriptors.
"""

from __future__ import annotations

import bisect
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from raftmq.disk.durable import DiskFailure
from raftmq.disk.filesystem import fsync_dir

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20, ConsumeQueue.CQ_STORE_UNIT_SIZE
DEFAULT_FILE_ENTRIES = 300_000  # RocketMQ's mappedFileSizeConsumeQueue / 20
# A dropped topic's directory on its way out: no topic name has a dot (topic_problem)
DROPPED_SUFFIX = ".dropped"


def entries_ending_by(entries: bytes | bytearray, physical_end: int) -> int:
    """How many of `entries` (a queue's 20-byte entries, in log order) point at messages
    that end at or before `physical_end`: a prefix, what recovery keeps of the queue."""
    keep = len(entries) // ENTRY_SIZE
    while keep and sum(ENTRY.unpack_from(entries, (keep - 1) * ENTRY_SIZE)[:2]) > physical_end:
        keep -= 1
    return keep


def _file_name(first_offset: int) -> str:
    return f"{first_offset * ENTRY_SIZE:020d}"


def _write_at(fd: int, position: int, data: bytes) -> None:
    """All of `data` at `position` (a write short of room writes part: the rest follows
    or raises ENOSPC)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view, position = view[written:], position + written


class QueueSync:
    """What makes one queue's entries so far durable, captured on the event loop
    (`ConsumeQueue.sync_work`): the entries not yet in its files, with where each run
    of them goes, and the files (by first offset) and directories to fsync. `run`
    carries it out in a worker thread, opening one file at a time; `done`, back on
    the loop, records it."""

    def __init__(
        self,
        queue: ConsumeQueue,
        files: dict[int, str],
        writes: list[tuple[int, int, bytes]],
        dirs: list[Path],
    ) -> None:
        self.queue = queue
        self.end = queue.max_offset
        self.files_made = queue.files_made
        self.files = files
        self.writes = writes
        self.dirs = dirs

    def run(self) -> None:
        """Write and fsync each file. A file gone meanwhile was trimmed or dropped (its
        entries point below the log's beginning): nothing of it is needed. OSError
        from a write (no room) leaves the queue as it was, to be tried again; a failed
        fsync is a DiskFailure."""
        for first, path in self.files.items():
            try:
                fd = os.open(path, os.O_WRONLY)
            except FileNotFoundError:
                continue
            try:
                for target, position, data in self.writes:
                    if target == first:
                        _write_at(fd, position, data)
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise DiskFailure(f"fsync failed ({exc}) on {path}; stopping") from exc
            finally:
                os.close(fd)

    def done(self) -> None:
        self.queue.mark_synced(self.end, self.files_made)


def _filled_bytes(data: bytes, whole: int) -> int:
    """How many of a file's first `whole` bytes are entries. Apache RocketMQ's broker
    creates each file at its full size, zero-filled, so the entries of a file it
    wrote end at the first zero-size one (as its ConsumeQueue.recover reads them);
    raftmq's files hold entries only. Appends land after them, over the zeros."""
    if whole == 0 or any(data[whole - ENTRY_SIZE : whole]):
        return whole
    filled = bisect.bisect_left(
        range(whole // ENTRY_SIZE),
        True,
        key=lambda k: ENTRY.unpack_from(data, k * ENTRY_SIZE)[1] <= 0,
    )
    return filled * ENTRY_SIZE


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
        self._dir = os.fspath(directory)
        self.file_entries = file_entries
        self.min_offset = 0
        self.dispatched_bytes = 0  # of the messages appended since start (broker.metrics)
        self.files_made = 0  # files this queue created: each one's directory entry is fsynced
        self._entries = bytearray()  # offsets min_offset .. max_offset - 1
        self._files: list[int] = []  # first queue offset of each file; the last is filled
        self._load()
        # Entries below _written_end are in the files, below _synced_end durable, and
        # the directory entries of the first _files_synced files made are durable. A
        # loaded file counts as made: one made just before a kill may have a directory
        # entry no fsync covered, and the entries dispatched into it again need it.
        self._written_end = self._synced_end = self.max_offset
        self.files_made = len(self._files)
        self._files_synced = 0

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
            whole = _filled_bytes(data, whole)
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
        self.append_run(queue_offset, ENTRY.pack(physical_offset, size, tags_code), size)

    def append_run(self, queue_offset: int, entries: bytes | bytearray, size: int) -> None:
        """`entries` (ENTRY each) at queue offsets from `queue_offset` on, for messages
        of `size` bytes in all; a file is started at each `file_entries` boundary."""
        max_offset = self.min_offset + len(self._entries) // ENTRY_SIZE
        if queue_offset != max_offset:
            if self._entries:
                raise ValueError(
                    f"{self.topic}/{self.queue_id}: offset {queue_offset} does not follow "
                    f"{max_offset - 1}"
                )
            self._drop_files()  # the first message the log still holds
            self.min_offset = max_offset = queue_offset
            self._written_end = self._synced_end = queue_offset
        assert len(entries) % ENTRY_SIZE == 0, len(entries)
        view = memoryview(entries)
        while view:
            if not self._files or max_offset - self._files[-1] >= self.file_entries:
                self._roll()
            room = self.file_entries - (max_offset - self._files[-1])
            self._entries += view[: room * ENTRY_SIZE]
            max_offset += min(room, len(view) // ENTRY_SIZE)
            view = view[room * ENTRY_SIZE :]
        self.dispatched_bytes += size

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
        if self._written_end < self.min_offset + dead:  # not the checkpoint's (a reset)
            self.write()  # dropped entries must reach the file: positions must hold
        del self._entries[: dead * ENTRY_SIZE]
        self.min_offset += dead
        while len(self._files) > 1 and self._files[1] <= self.min_offset:
            os.unlink(self._path(self._files.pop(0)))

    def truncate_physical(self, physical_end: int) -> None:
        """Drop entries for messages that end beyond `physical_end`, durably."""
        keep = entries_ending_by(self._entries, physical_end)
        if keep == len(self):
            return
        self.write()  # the file is cut at the entries kept: none may be missing below
        del self._entries[keep * ENTRY_SIZE :]
        end = self.max_offset
        dropped = False
        while len(self._files) > 1 and self._files[-1] >= end:
            os.unlink(self._path(self._files.pop()))
            dropped = True
        fd = os.open(self._path(self._files[-1]), os.O_WRONLY)
        try:
            os.ftruncate(fd, (end - self._files[-1]) * ENTRY_SIZE)
            os.fsync(fd)
        finally:
            os.close(fd)
        if dropped:
            fsync_dir(self.directory)
        self._written_end = min(self._written_end, end)
        self._synced_end = min(self._synced_end, end)

    def write(self) -> None:
        """Write the entries not in the files yet, here and now (no fsync: the log can
        rebuild them), for what must find them there: a trimmed head, a cut.
        OSError (ENOSPC) leaves them to be written again, whole, by the next call."""
        for first, position, data in self._unwritten():
            fd = os.open(self._path(first), os.O_WRONLY)
            try:
                _write_at(fd, position, data)
            finally:
                os.close(fd)
        self._written_end = self.max_offset

    def _path(self, first: int) -> str:
        """The file that begins at queue offset `first`, as a string: a checkpoint
        names thousands, and building a Path took most of its time on the loop."""
        return os.path.join(self._dir, _file_name(first))

    def _runs(self, start: int, end: int) -> Iterator[tuple[int, int, int]]:
        """(first offset of the file, lo, hi) for each file holding queue offsets in
        [start, end), lo..hi the part of them in that file."""
        k = max(bisect.bisect_right(self._files, start) - 1, 0)
        for i in range(k, len(self._files)):
            lo = max(start, self._files[i])
            hi = end if i + 1 == len(self._files) else min(end, self._files[i + 1])
            if lo >= hi:
                break
            yield self._files[i], lo, hi

    def _unwritten(self) -> list[tuple[int, int, bytes]]:
        """(first offset of the file, byte position in it, bytes) of each run of entries
        not in the files."""
        start, base = self._written_end, self.min_offset
        assert base <= start <= self.max_offset, (self.topic, self.queue_id, base, start)
        return [
            (
                first,
                (lo - first) * ENTRY_SIZE,
                bytes(self._entries[(lo - base) * ENTRY_SIZE : (hi - base) * ENTRY_SIZE]),
            )
            for first, lo, hi in self._runs(start, self.max_offset)
        ]

    @property
    def durable(self) -> bool:
        """Every entry and file of this queue is durable."""
        return self._synced_end >= self.max_offset and self.files_made == self._files_synced

    def sync_work(self) -> QueueSync | None:
        """What makes this queue's entries so far durable (None when they are): the
        entries to write, the files holding any entry not yet fsynced, and the
        directories of files made since the last sync. Entries appended meanwhile are
        for the next one."""
        if self.durable:
            return None
        new_files = self.files_made > self._files_synced
        files = {
            first: self._path(first)
            for first, _lo, _hi in self._runs(self._synced_end, self.max_offset)
        }
        dirs = [self.directory, self.directory.parent] if new_files else []
        return QueueSync(self, files, self._unwritten(), dirs)

    def mark_synced(self, end: int, files_made: int) -> None:
        """A `QueueSync` taken at max offset `end`, with `files_made` files made, ran."""
        self._written_end = max(self._written_end, end)
        self._synced_end = max(self._synced_end, end)
        self._files_synced = max(self._files_synced, files_made)

    def _roll(self) -> None:
        """Start the next file at `max_offset`, empty: the entries are written into it
        by the next sync, which fsyncs its directory entry too. Made here, on the event
        loop, so that a sync never creates a file (one it wrote into after a trim
        deleted it would come back)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(self.max_offset)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        self._files.append(self.max_offset)
        self.files_made += 1

    def _drop_files(self) -> None:
        """Delete every file, durably, last first: a crash leaves a run that still
        continues from the first file, never a newer file beside older ones."""
        for first in reversed(self._files):
            os.unlink(self._path(first))
        if self._files:
            fsync_dir(self.directory)
        self._files.clear()


class ConsumeQueueTable:
    """Every ConsumeQueue of the store, created on first use."""

    def __init__(self, root: Path, file_entries: int = DEFAULT_FILE_ENTRIES) -> None:
        self.root = root
        self.file_entries = file_entries
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        # The queues that may hold entries or files not yet durable: the store adds the
        # ones dispatch touched, a sync takes out the ones it left durable.
        self.unsynced: set[tuple[str, int]] = set()
        if root.is_dir():
            for topic_dir in root.iterdir():
                if topic_dir.name.endswith(DROPPED_SUFFIX):  # a drop a crash cut short
                    shutil.rmtree(topic_dir)
                    continue
                for queue_dir in topic_dir.iterdir():
                    if queue_dir.name.isdigit():
                        self.find_or_create(topic_dir.name, int(queue_dir.name))

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def topics(self) -> set[str]:
        return {topic for topic, _queue_id in self.queues}

    def drop_topic(self, topic: str) -> dict[int, int]:
        """Forget every queue of `topic` and delete its files (a deleted topic, RocketMQ's
        ConsumeQueue.destroy); returns each dropped queue's max offset.

        The topic's directory is first renamed to a name no topic can have, durably,
        then removed: a checkpoint's worker hop captured before names files and
        directories under the old name, which then no longer exist (it skips them),
        never a file of the same name that a message dispatched to the topic later
        makes; and a crash between the two leaves a directory that loading removes."""
        dropped = {
            queue_id: self.queues.pop((name, queue_id)).max_offset
            for name, queue_id in list(self.queues)
            if name == topic
        }
        self.unsynced -= {(topic, queue_id) for queue_id in dropped}
        directory = self.root / topic
        if directory.is_dir():
            doomed = self.root / (topic + DROPPED_SUFFIX)
            if doomed.exists():  # an earlier removal failed half way
                shutil.rmtree(doomed)
            os.replace(directory, doomed)
            fsync_dir(self.root)
            shutil.rmtree(doomed)
        return dropped

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

    def sync_plan(self, keys: Iterable[tuple[str, int]]) -> Callable[[], Callable[[], None]]:
        """A blocking function (for a worker thread) that writes and fsyncs the entries
        the queues `keys` names hold now (a key of none, or of a queue with nothing new,
        costs nothing), with the directory entries of their new files; it returns what
        records that in the queues (and takes the ones now durable out of `unsynced`),
        to be called on the event loop. The dispatch checkpoint runs it over `unsynced`,
        a bounded batch at a time, so its cost is that of the queues dispatched to since
        the last one, not of all of them."""
        keys = list(keys)
        queues = (self.queues.get(key) for key in keys)
        work = [sync for queue in queues if queue is not None and (sync := queue.sync_work())]

        def run() -> Callable[[], None]:
            dirs: set[Path] = set()
            for sync in work:
                sync.run()
                dirs.update(sync.dirs)
            try:
                for directory in sorted(dirs) + ([self.root] if dirs else []):
                    try:
                        fsync_dir(directory)
                    except FileNotFoundError:  # its topic was dropped meanwhile
                        continue
            except OSError as exc:
                raise DiskFailure(f"fsync failed ({exc}) on a queue directory; stopping") from exc

            def done() -> None:
                for sync in work:
                    sync.done()
                for key in keys:  # appended to since its capture: for the next sync
                    queue = self.queues.get(key)
                    if queue is None or queue.durable:
                        self.unsynced.discard(key)

            return done

        return run

    def write(self) -> None:
        """Write every queue's entries not in the files yet (no fsync): what the page
        cache may hold at a crash, for simulations and tests of one; a broker leaves
        the files to its checkpoints."""
        for queue in self.queues.values():
            queue.write()
