"""The file layer under the file stores: everything they ask of the operating system.

The DLedger file store and the classic CommitLog read their segments through shared
memory maps, write them with `write` (pwrite: a write fault on each fresh page of a
map costs about four times the CPU of copying the same bytes in with one call; both
land in the same page cache, so the maps see them at once) and make them durable with
fdatasync; they list, size, create and delete segment files, fsync their directories,
and replace small files (DLedger's `begin`) atomically. Those calls, and nothing else,
go through a `FileSystem`, so the same store runs over the real one (`OsFileSystem`,
here) and over the simulator's (`raftmq.dledger.sim.disk`), which keeps durable and
volatile bytes apart and at a crash keeps only what was fsynced plus a torn prefix of
the rest. `atomic_write`, `fsync_dir` and `used_ratio` serve the message store's
metadata, checkpoints and disk checks too.

A segment's `map` is a readable buffer of the file's full size (an mmap: slicing it
gives bytes), so the store's hot paths read it directly, with no call through the
layer per read.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from pathlib import Path
from typing import Protocol

_CHUNK_BYTES = 1 << 20  # unit of scanning for leftovers
_ZERO_CHUNK = bytes(_CHUNK_BYTES)

# Page-cache hints for the maps. The segment being appended to is RANDOM: a read
# fault near its end with readahead would pull the zero pages after the end into the
# page cache, where SEEK_DATA then reports them as data and recovery has to read them
# (writes do not fault: they are pwrites). Full
# segments are NORMAL so that a lagging follower's reads get readahead, and
# recovery's scan is SEQUENTIAL. None where the platform has no such advice.
RANDOM = getattr(mmap, "MADV_RANDOM", None)
NORMAL = getattr(mmap, "MADV_NORMAL", None)
SEQUENTIAL = getattr(mmap, "MADV_SEQUENTIAL", None)


class DiskFull(Exception):
    """The filesystem has no room for a new segment (ENOSPC at its preallocation).

    Raised before anything of the append was written, so the log is as it was: the
    caller refuses the append (DLedger's DISK_FULL) and may try again once there is
    room. Unlike a failed fsync (`DiskFailure`, fatal) nothing written is in doubt.
    Segments are preallocated in full, so writing into one never needs new blocks;
    a full disk shows only when a new segment is created."""


def fsync_dir(path: str | Path) -> None:
    """Make a rename or unlink in `path` durable: without it the new name may vanish in a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` so that after a crash it holds either the old or the new bytes."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class SyncHandle(Protocol):
    """An open file or directory that can be made durable, from any thread."""

    def sync(self) -> None: ...
    def dup(self) -> SyncHandle: ...
    def close(self) -> None: ...


class SegmentFile(Protocol):
    """A preallocated file mapped shared in full."""

    path: str
    map: mmap.mmap
    handle: SyncHandle  # fdatasync of the file

    def write(self, offset: int, data) -> None: ...
    def nonzero_end(self, start: int, end: int) -> int: ...
    def advise(self, advice: int | None) -> None: ...
    def close(self) -> None: ...


class FileSystem(Protocol):
    def makedirs(self, directory: Path) -> None: ...
    def names(self, directory: Path) -> list[str]: ...
    def size(self, path: Path) -> int: ...
    def mtime(self, path: str) -> float: ...
    def open_segment(self, path: Path, size_bytes: int, create: bool) -> SegmentFile: ...
    def unlink(self, path: str) -> None: ...
    def dir_handle(self, directory: Path) -> SyncHandle: ...
    def sync_dir(self, directory: Path) -> None: ...
    def read_text(self, path: Path) -> str: ...
    def atomic_write(self, path: Path, data: bytes) -> None: ...


class _OsHandle:
    __slots__ = ("data_only", "fd")

    def __init__(self, fd: int, data_only: bool) -> None:
        self.fd = fd
        self.data_only = data_only  # a data file needs fdatasync, a directory fsync

    def sync(self) -> None:
        if self.data_only:
            os.fdatasync(self.fd)
        else:
            os.fsync(self.fd)

    def dup(self) -> _OsHandle:
        return _OsHandle(os.dup(self.fd), self.data_only)

    def close(self) -> None:
        os.close(self.fd)


def os_sync_target(handle: SyncHandle) -> tuple[int, bool] | None:
    """(fd, data_only) of an OS file or directory handle, for a thread that fsyncs file
    descriptors itself (`fsync_thread.FsyncThread`); None for any other handle."""
    return (handle.fd, handle.data_only) if type(handle) is _OsHandle else None


class _OsSegment:
    __slots__ = ("handle", "map", "path")

    def __init__(self, path: Path, fd: int, mapped: mmap.mmap) -> None:
        self.path = str(path)
        self.handle = _OsHandle(fd, data_only=True)
        self.map = mapped

    def close(self) -> None:
        self.map.close()
        self.handle.close()

    def write(self, offset: int, data) -> None:
        """Copy `data` to `offset` of the file, through the page cache the map shares.
        The blocks are preallocated, so an OSError here is a failing disk, not a full
        one (which the map would have turned into a SIGBUS)."""
        fd = self.handle.fd
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written

    def advise(self, advice: int | None) -> None:
        if advice is not None:
            with contextlib.suppress(OSError):  # advice is only a hint
                self.map.madvise(advice)

    def nonzero_end(self, start: int, end: int) -> int:
        """One past the last non-zero byte in [start, end) of the file, or `start` if all zero.

        Recovery asks this of the rest of the last segment on every start, so it skips
        what the filesystem reports as holes (preallocated, never-written extents on
        ext4 and xfs) and reads the rest with pread, a memcmp per chunk, instead of
        faulting the whole segment into the map.
        """
        fd = self.handle.fd
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
    """Like nonzero_end for one range it reads in full; -1 if the range is all zero."""
    last = -1
    while start < end:
        n = min(end - start, _CHUNK_BYTES)
        chunk = os.pread(fd, n, start)
        if chunk != (_ZERO_CHUNK if n == _CHUNK_BYTES else bytes(n)):
            last = start + len(chunk.rstrip(b"\0"))
        start += n
    return last


def _preallocate(fd: int, path: Path, size_bytes: int) -> None:
    """Reserve every block of a new segment, so that writing through its map never
    needs one: on a full disk a write into a hole of a mapped file is a SIGBUS, which
    no one can catch. No room is DiskFull, with the new file removed; only a
    filesystem without fallocate gets a sparse file of the right size."""
    st = os.fstatvfs(fd)
    if st.f_bavail * st.f_frsize < size_bytes:  # not a partial allocation to undo
        os.unlink(path)
        raise DiskFull(f"no room for a new segment {path} of {size_bytes} bytes")
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            os.unlink(path)
            raise DiskFull(f"no room for a new segment {path}: {exc.strerror}") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size_bytes)


def used_ratio(path: str | Path) -> float:
    """The share of the filesystem holding `path` in use, as `df` reports it: used
    blocks over used and available (blocks reserved for root count as neither)."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    total = used + st.f_bavail
    return used / total if total else 1.0


class OsFileSystem:
    """The operating system's files: preallocated, mapped shared, fdatasync'd."""

    def makedirs(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)

    def names(self, directory: Path) -> list[str]:
        return [path.name for path in directory.iterdir()]

    def size(self, path: Path) -> int:
        return path.stat().st_size

    def mtime(self, path: str) -> float:
        return os.stat(path).st_mtime

    def open_segment(self, path: Path, size_bytes: int, create: bool) -> _OsSegment:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0), 0o644)
        try:
            if create:
                _preallocate(fd, path, size_bytes)
            mapped = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return _OsSegment(path, fd, mapped)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def dir_handle(self, directory: Path) -> _OsHandle:
        return _OsHandle(os.open(directory, os.O_RDONLY | os.O_DIRECTORY), data_only=False)

    def sync_dir(self, directory: Path) -> None:
        fsync_dir(directory)

    def read_text(self, path: Path) -> str:
        return path.read_text()

    def atomic_write(self, path: Path, data: bytes) -> None:
        atomic_write(path, data)
