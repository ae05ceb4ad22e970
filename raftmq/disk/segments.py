"""Segment files, preallocated and mapped in full, each named by the absolute offset of
its first byte (20 digits), so positions stay absolute when retention deletes the files
at the front. The DLedger log's data and index files (raftmq.dledger.store.segments)
and the classic CommitLog's files (raftmq.broker.store.classic_log) are such files.
"""

from __future__ import annotations

import logging
from pathlib import Path

from raftmq.disk.filesystem import RANDOM, FileSystem, SegmentFile

log = logging.getLogger(__name__)

FILE_NAME_DIGITS = 20
CHUNK_BYTES = 1 << 20  # unit of zeroing, and of index entries rewritten in one batch
_ZERO_CHUNK = bytes(CHUNK_BYTES)


class StoreCorruption(Exception):
    """The store cannot be opened without losing data it must not lose; a person has to look."""

    def __init__(self, path: str | Path, offset: int, reason: str) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}")
        self.path = str(path)
        self.offset = offset
        self.reason = reason


class Segment:
    """One mapped segment file and how much of it this process has written."""

    __slots__ = ("file", "map", "path", "start", "written_bytes")

    def __init__(self, start: int, file: SegmentFile) -> None:
        self.start = start
        self.file = file
        self.path = file.path
        self.map = file.map
        self.written_bytes = 0  # high-water mark of bytes we wrote, from the segment start

    def close(self) -> None:
        self.file.close()

    def advise(self, advice: int | None) -> None:
        self.file.advise(advice)


def segment_path(directory: Path, start: int) -> Path:
    return directory / f"{start:0{FILE_NAME_DIGITS}d}"


def open_segment(
    fs: FileSystem, directory: Path, start: int, size_bytes: int, create: bool
) -> Segment:
    seg = Segment(start, fs.open_segment(segment_path(directory, start), size_bytes, create))
    seg.advise(RANDOM)
    return seg


def list_segments(fs: FileSystem, directory: Path, size_bytes: int) -> list[int]:
    """Start offsets of the segment files in `directory`, ascending; StoreCorruption for
    a file whose start or size does not fit `size_bytes`."""
    found = []
    for name in fs.names(directory):
        path = directory / name
        if len(name) != FILE_NAME_DIGITS or not name.isdigit():
            log.warning("ignoring %s: not a segment file name", path)
            continue
        start = int(name)
        if start % size_bytes:
            raise StoreCorruption(path, 0, f"start offset is not a multiple of {size_bytes}")
        actual = fs.size(path)
        if actual != size_bytes:
            raise StoreCorruption(path, actual, f"{actual} bytes, expected {size_bytes}")
        found.append(start)
    return sorted(found)


def zero(mapped, start: int, end: int) -> None:
    while start < end:
        n = min(end - start, CHUNK_BYTES)
        mapped[start : start + n] = _ZERO_CHUNK[:n] if n < CHUNK_BYTES else _ZERO_CHUNK
        start += n
