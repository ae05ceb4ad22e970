"""Segment files: DLedger's data and index files, preallocated and mapped in full.

Layout under the store's base directory:

    data/<20-digit start offset>    `segment_size` bytes each; entries at their leader-chosen pos
    index/<20-digit start offset>   `index_segment_size` bytes each; entry i at byte 32*i

A file is named by the absolute offset of its first byte, so positions and index
offsets stay absolute when retention deletes the files at the front. An entry never
spans data segments: when the next one does not fit, a BLANK filler
`[-1][bytes to the segment end]` marks the rest of the old segment as unused.
"""

from __future__ import annotations

import bisect
import logging
from pathlib import Path

from raftmq.dledger.codes import EntryType
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.filesystem import RANDOM, FileSystem, SegmentFile

log = logging.getLogger(__name__)

FILE_NAME_DIGITS = 20
BLANK = int(EntryType.BLANK)
ENTRY_TYPES = (int(EntryType.NORMAL), int(EntryType.NOOP))
INDEX = codec.INDEX_ENTRY
INDEX_SIZE = codec.INDEX_ENTRY_SIZE
CHUNK_BYTES = 1 << 20  # unit of zeroing, and of index entries rewritten in one batch
_ZERO_CHUNK = bytes(CHUNK_BYTES)


class StoreCorruption(Exception):
    """The store cannot be opened without losing data it must not lose; a person has to look."""

    def __init__(self, path: str | Path, offset: int, reason: str) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}")
        self.path = str(path)
        self.offset = offset
        self.reason = reason


class SyncFailed(Exception):
    """An fsync failed while the store was being opened (recovery makes its repairs
    durable before anything is served): the disk, not the data, is at fault."""


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


def first_index_at(pos: int, low: int, high: int, read_entry) -> int:
    """The first index in [low, high) whose index entry's pos is at or after `pos`, else high.

    Positions grow with the index, so this is a binary search over the index file;
    `read_entry(i)` returns index entry i as (magic, pos, size, index, term).
    """
    return low + bisect.bisect_left(range(low, high), pos, key=lambda i: read_entry(i)[1])
