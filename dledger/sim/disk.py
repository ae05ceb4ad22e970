"""What each simulated replica keeps its log in, and what a crash leaves of it.

`MemoryStores` keeps every log in a `MemoryLogStore` whose `crashed()` copy holds
what the last completed sync covered. `FileStores` runs the real `FileLogStore`
over `SimFileSystem`, a file layer in memory that keeps each file's durable bytes
apart from what was written since, as a page cache does. At a crash it keeps the
names its directories had at their last fsync and, of each file, the durable bytes
plus a random prefix of the bytes that differ from them: a torn write. The store
then recovers from that as it would after a power cut, so recovery meets the same
generated crashes the core does; a recovered log that lacks an entry its replica
had been told was fsynced fails the run.

Every random choice comes from the cluster's `random.Random`, so a seed replays.
"""

from __future__ import annotations

import mmap
import random
import threading
from pathlib import Path

from raftmq.dledger.sim.checks import InvariantViolation
from raftmq.dledger.store.file import FileLogStore, StoreCorruption
from raftmq.dledger.store.memory import MemoryLogStore

from raftmq.disk.filesystem import DiskFull

SIM_INDEX_SEGMENT_BYTES = 32 * 64  # small index files, so runs cross and tear many of them


class _SimHandle:
    """A handle's sync makes its file's bytes, or its directory's names, durable."""

    __slots__ = ("_sync",)

    def __init__(self, sync) -> None:
        self._sync = sync

    def sync(self) -> None:
        self._sync()

    def dup(self) -> _SimHandle:
        return _SimHandle(self._sync)

    def close(self) -> None:
        """Nothing to release."""


class _SimFile:
    """One preallocated file: `map` is what a reader sees now, `durable` what survives."""

    __slots__ = ("durable", "handle", "map", "mtime", "path")

    def __init__(self, path: str, content: bytes, mtime: float) -> None:
        self.path = path
        self.map = mmap.mmap(-1, len(content))  # anonymous: slices are bytes, as in a file map
        self.map[:] = content
        self.durable = content
        self.mtime = mtime
        self.handle = _SimHandle(self.sync)

    def sync(self) -> None:
        self.durable = self.map[:]

    def torn(self, rng: random.Random) -> bytes:
        """What a crash leaves: the durable bytes, then a random prefix of the changes.

        The changed span runs from the first to the last byte that differs from the
        durable copy; a third of crashes keep none of it, a third all of it, the rest
        a prefix cut at a random byte.
        """
        now = self.map[:]
        if now == self.durable:
            return now
        changed = [i for i, (a, b) in enumerate(zip(now, self.durable, strict=True)) if a != b]
        low, high = changed[0], changed[-1] + 1
        choice = rng.random()
        if choice < 1 / 3:
            cut = low
        elif choice < 2 / 3:
            cut = high
        else:
            cut = rng.randint(low, high)
        return now[:cut] + self.durable[cut:]

    def write(self, offset: int, data) -> None:
        self.map[offset : offset + len(data)] = data

    def nonzero_end(self, start: int, end: int) -> int:
        stripped = len(self.map[start:end].rstrip(b"\0"))
        return start + stripped

    def advise(self, advice: int | None) -> None:
        """Memory has no readahead to steer."""

    def close(self) -> None:
        """The map belongs to the file, which outlives one store's use of it."""


class SimFileSystem:
    """The file layer (`raftmq.disk.filesystem.FileSystem`) in memory.

    Segment files are created preallocated with zeros that are durable at once (the
    allocation), but the file's name is durable only once its directory is synced,
    and its data once the file is. The small files written whole (`atomic_write`)
    are durable when the call returns, as the real one fsyncs before returning.
    """

    def __init__(self, clock=lambda: 0.0) -> None:
        self._clock = clock
        self.full = False  # no room for a new segment: creating one raises DiskFull
        self._files: dict[str, _SimFile] = {}  # the names a reader sees now
        self._durable_names: dict[str, _SimFile] = {}  # the names a crash keeps
        self._small: dict[str, bytes] = {}  # files written whole and atomically
        # A plan fsyncs its directories at once from several threads (store.sync); the
        # names they update are shared, as a file system's are.
        self._names_lock = threading.Lock()

    def crash(self, rng: random.Random) -> None:
        """A power cut: keep the durable names, each file torn (see `_SimFile.torn`)."""
        survivors = {}
        for path, file in sorted(self._durable_names.items()):
            survivors[path] = _SimFile(path, file.torn(rng), file.mtime)
        self._files = dict(survivors)
        self._durable_names = dict(survivors)

    # ------------------------------------------------------------------ the file layer
    def makedirs(self, directory: Path) -> None:
        """Directories are implied by the paths under them."""

    def names(self, directory: Path) -> list[str]:
        return [Path(path).name for path in self._files if Path(path).parent == directory]

    def size(self, path: Path) -> int:
        return len(self._file(str(path)).map)

    def mtime(self, path: str) -> float:
        return self._file(path).mtime

    def open_segment(self, path: Path, size_bytes: int, create: bool) -> _SimFile:
        key = str(path)
        if create and self.full:
            raise DiskFull(f"no room for a new segment {key}")
        if create:
            self._files[key] = _SimFile(key, bytes(size_bytes), self._clock())
        file = self._file(key)
        if len(file.map) != size_bytes:
            raise ValueError(f"{key} holds {len(file.map)} bytes, not {size_bytes}")
        return file

    def unlink(self, path: str) -> None:
        self._file(path)
        del self._files[path]

    def dir_handle(self, directory: Path) -> _SimHandle:
        return _SimHandle(lambda: self.sync_dir(directory))

    def sync_dir(self, directory: Path) -> None:
        with self._names_lock:
            for path in [p for p in self._durable_names if Path(p).parent == directory]:
                if path not in self._files:
                    del self._durable_names[path]
            for path, file in self._files.items():
                if Path(path).parent == directory:
                    self._durable_names[path] = file

    def read_text(self, path: Path) -> str:
        try:
            return self._small[str(path)].decode()
        except KeyError:
            raise FileNotFoundError(str(path)) from None

    def atomic_write(self, path: Path, data: bytes) -> None:
        self._small[str(path)] = bytes(data)

    def _file(self, path: str) -> _SimFile:
        try:
            return self._files[path]
        except KeyError:
            raise FileNotFoundError(path) from None


class MemoryStores:
    """Each replica's log in memory; a crash keeps what its last completed sync covered,
    plus the first `keep_unsynced` entries written since."""

    def __init__(self, rng: random.Random, segment_size: int) -> None:
        self.segment_size = segment_size

    def fresh(self, node_id: str) -> MemoryLogStore:
        return MemoryLogStore(self.segment_size)

    def crashed(self, node, keep_unsynced: int) -> MemoryLogStore:
        return node.store.crashed(keep_unsynced)


class FileStores:
    """Each replica's log in a FileLogStore over its own SimFileSystem.

    A crash tears the files (`keep_unsynced` plays no part: the tear is drawn from the
    rng) and reopens the store, which recovers. It opens with the committed index a
    real node's checkpoint would hold at its freshest, min(committed, persisted), so
    recovery refuses (StoreCorruption) rather than end the log below it; and every
    entry the replica had been told was persisted must be there, unchanged, after.
    Either failure is an InvariantViolation of the run.
    """

    def __init__(self, rng: random.Random, segment_size: int) -> None:
        self.rng = rng
        self.segment_size = segment_size
        self.disks: dict[str, SimFileSystem] = {}

    def _open(self, node_id: str, committed_index: int) -> FileLogStore:
        return FileLogStore(
            Path("/sim") / node_id,
            self.segment_size,
            SIM_INDEX_SEGMENT_BYTES,
            committed_index=committed_index,
            fs=self.disks[node_id],
        )

    def fresh(self, node_id: str) -> FileLogStore:
        self.disks[node_id] = SimFileSystem()
        return self._open(node_id, -1)

    def crashed(self, node, keep_unsynced: int) -> FileLogStore:
        store, replica = node.store, node.replica
        persisted = replica.persisted_index if replica.config.ack_after_fsync else -1
        durable = {i: store.chain_at(i) for i in range(store.begin_index, persisted + 1)}
        checkpoint = min(replica.committed_index, persisted)
        self.disks[node.id].crash(self.rng)
        try:
            survivor = self._open(node.id, checkpoint)
        except StoreCorruption as exc:  # a real node stops here, but it lost fsynced data
            raise InvariantViolation(f"{node.id}: recovery lost fsynced index: {exc}") from exc
        for index, chain in durable.items():
            if not survivor.begin_index <= index <= survivor.end_index:
                raise InvariantViolation(
                    f"{node.id}: recovery lost fsynced index {index}"
                    f" (the log now holds {survivor.begin_index}..{survivor.end_index})"
                )
            if survivor.chain_at(index) != chain:
                raise InvariantViolation(f"{node.id}: recovery changed fsynced index {index}")
        return survivor
