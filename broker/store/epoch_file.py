"""The epoch file of controller-mode replication (RocketMQ 5's `EpochFileCache` over
its `CheckpointFile`), and the rule that says where a slave's log stops agreeing with
its master's (`find_consistent_point`).

Each time a broker becomes master it starts a new epoch (the controller's
`masterEpoch`) at its current max physical offset; the file lists them, oldest first,
so every byte of the CommitLog belongs to the epoch whose range holds it. Two replicas
hold the same bytes up to an offset exactly when an epoch with the same start offset
is in both files and the offset is within that epoch on both: one master writes an
epoch's bytes, and everyone else copies them.

The format is Java's, byte for byte (`<storePathRootDir>/epochFileCheckpoint`):

    2            the number of entries
    773307083    CRC32 of the entry lines, separators included, & 0x7FFFFFFF (0: unchecked)
    7-7000       epoch-startOffset, one a line
    8-8000

A file whose count or CRC does not match its lines, or that holds no entry, is
passed over for `<file>.bak`, which holds the content before the last write.
RocketMQ writes both in place without fsync; here each is replaced atomically and
durably (`atomic_write`: temp file, fsync, rename, fsync of the directory), `.bak`
first, so a crash leaves either the old or the new list readable. RocketMQ never
writes an empty list (truncating every entry leaves the old file, and the entries
come back at the next start); here an empty list empties both files.
"""

from __future__ import annotations

import itertools
import logging
import zlib
from collections.abc import Iterable
from pathlib import Path

import attrs

from raftmq.disk.filesystem import FileSystem, OsFileSystem

log = logging.getLogger(__name__)

EPOCH_FILE = "epochFileCheckpoint"  # storePathEpochFile's default name in storePathRootDir
NOT_CHECKED_CRC = 0  # CheckpointFile.NOT_CHECK_CRC_MAGIC_CODE
NO_CONSISTENT_POINT = -1  # findConsistentPoint: the logs share no epoch


@attrs.frozen
class EpochEntry:
    """One epoch: its number and the physical offset of its first byte."""

    epoch: int
    start_offset: int

    def line(self) -> str:
        return f"{self.epoch}-{self.start_offset}"


class EpochFileCorrupt(ValueError):
    """An epoch file whose count or CRC does not match its entries."""


class EpochOrderError(ValueError):
    """An entry that does not raise both the epoch and the start offset."""


def entries_crc(lines_text: str) -> int:
    """Java's `UtilAll.crc32` of the UTF-8 entry lines (each with its "\\n")."""
    return zlib.crc32(lines_text.encode("utf-8")) & 0x7FFFFFFF


def encode(entries: Iterable[EpochEntry]) -> bytes:
    """The file's bytes for `entries`, as Java's `CheckpointFile.write` makes them
    (on Linux, where `System.lineSeparator()` is "\\n")."""
    entries = list(entries)
    body = "".join(entry.line() + "\n" for entry in entries)
    return f"{len(entries)}\n{entries_crc(body)}\n{body}".encode()


def decode(text: str) -> list[EpochEntry]:
    """The entries of a file's text; EpochFileCorrupt when the count or a checked CRC
    does not match. Lines that are not `int-int` are skipped as Java skips them (the
    count then tells)."""
    lines = text.splitlines()
    if len(lines) < 2:
        raise EpochFileCorrupt(f"{len(lines)} lines: no count and CRC")
    try:
        count, crc = int(lines[0]), int(lines[1])
    except ValueError as exc:
        raise EpochFileCorrupt(f"count or CRC line is not a number: {exc}") from None
    entries = []
    for text in lines[2:]:
        parts = text.split("-")
        if len(parts) != 2:
            continue
        try:
            entries.append(EpochEntry(int(parts[0]), int(parts[1])))
        except ValueError as exc:
            raise EpochFileCorrupt(f"entry line {text!r}: {exc}") from None
    if len(entries) != count:
        raise EpochFileCorrupt(f"expected {count} entries, found {len(entries)}")
    actual = entries_crc("".join(text + "\n" for text in lines[2:]))
    if crc != NOT_CHECKED_CRC and crc != actual:
        raise EpochFileCorrupt(f"entries CRC {actual}, the file says {crc}")
    check_order(entries)
    return entries


def check_order(entries: list[EpochEntry]) -> None:
    for before, after in itertools.pairwise(entries):
        if after.epoch <= before.epoch or after.start_offset <= before.start_offset:
            raise EpochOrderError(f"epoch entry {after} does not follow {before}")


def end_offsets(entries: list[EpochEntry], max_offset: int) -> list[int]:
    """Each entry's end: the next one's start, the last one's `max_offset` (the end of
    the log it describes)."""
    return [after.start_offset for after in entries[1:]] + [max_offset] if entries else []


def check_history(entries: list[EpochEntry], max_offset: int) -> None:
    """EpochOrderError unless `entries` raise epoch and start offset one after another
    and the log's end `max_offset` is not before the last epoch's start."""
    check_order(entries)
    if entries and max_offset < entries[-1].start_offset:
        raise EpochOrderError(f"the log ends at {max_offset}, before epoch {entries[-1]}")


def find_consistent_point(
    local: list[EpochEntry], local_max: int, master: list[EpochEntry], master_max: int
) -> int:
    """Where a slave's log (`local`, ending at `local_max`) stops agreeing with its
    master's (RocketMQ's `findConsistentPoint`): walking the slave's epochs newest
    first, the first one the master also has with the same start offset gives the
    lesser of its two ends. NO_CONSISTENT_POINT when no epoch is shared: nothing
    of the slave's log is vouched for by the master's."""
    check_history(local, local_max)
    check_history(master, master_max)
    by_epoch = dict(zip(master, end_offsets(master, master_max), strict=True))
    pairs = list(zip(local, end_offsets(local, local_max), strict=True))
    for entry, end in reversed(pairs):
        master_end = by_epoch.get(entry)
        if master_end is not None:
            point = min(end, master_end)
            assert entry.start_offset <= point <= min(local_max, master_max), (entry, point)
            return point
    return NO_CONSISTENT_POINT


class Unreplicable(ValueError):
    """A slave's log that its master's epochs do not vouch for: replicating on top of it
    would serve bytes no master wrote. The operator has to act (wipe the slave's
    store); retrying changes nothing."""


def truncation_point(
    local: list[EpochEntry], local_max: int, master: list[EpochEntry], master_max: int
) -> int:
    """Where a slave cuts its log before it copies its master's (AutoSwitchHAClient's
    doTruncate): the consistent point. A slave without epochs keeps its log only if
    it is empty or ends exactly where the master's first epoch begins (a classic
    slave that was in step when its group moved to controller mode). RocketMQ keeps
    any such log and copies on after it, unrelated bytes and all.

    Two histories that share no epoch but begin at the same offset share nothing
    after it: the slave cuts its log there. Those that begin at different offsets
    cannot be compared (Unreplicable).

    A last epoch that holds no byte (the slave was elected and wrote nothing) says
    nothing about the log and is left out; RocketMQ drops it before connecting."""
    check_history(local, local_max)
    local = [entry for entry in local if entry.start_offset < local_max]
    if not local:
        check_history(master, master_max)
        if local_max == 0 or (master and local_max == master[0].start_offset):
            return local_max
        first = master[0].start_offset if master else master_max
        raise Unreplicable(
            f"this store has no epochs but {local_max} bytes of log; the master's first epoch"
            f" begins at {first}: nothing vouches for those bytes (wipe this store)"
        )
    point = find_consistent_point(local, local_max, master, master_max)
    if point == NO_CONSISTENT_POINT and master and master[0].start_offset == local[0].start_offset:
        # both histories reach back to the same first byte and differ from there (a
        # master elected without this store's bytes): nothing is shared, and it is
        # known that nothing is; RocketMQ retries every 2 s forever
        point = local[0].start_offset
    if point == NO_CONSISTENT_POINT:
        raise Unreplicable(
            f"no epoch in common: this store's {[e.line() for e in local]} (log end {local_max})"
            f" against the master's {[e.line() for e in master]} (log end {master_max})"
            " (wipe this store)"
        )
    return point


class EpochFile:
    """The epoch list of one store, kept in `path` (and `path.bak`); see the module
    docstring. Every change is written before the method returns."""

    def __init__(self, path: Path, fs: FileSystem | None = None) -> None:
        self.path = path
        self.backup_path = path.with_name(path.name + ".bak")
        self.fs = fs or OsFileSystem()
        self.entries: list[EpochEntry] = self._load()

    def _read(self, path: Path) -> list[EpochEntry]:
        try:
            text = self.fs.read_text(path)
        except FileNotFoundError:
            return []
        return decode(text)

    def _load(self) -> list[EpochEntry]:
        """The file's entries, or the backup's when the file is unreadable or empty
        (CheckpointFile.read)."""
        try:
            entries = self._read(self.path)
        except (EpochFileCorrupt, EpochOrderError, UnicodeDecodeError) as exc:
            log.warning("%s unreadable (%s): reading %s", self.path, exc, self.backup_path.name)
            entries = []
        if entries:
            return entries
        return self._read(self.backup_path)

    def _write(self) -> None:
        content = encode(self.entries)
        self.fs.makedirs(self.path.parent)
        if not self.entries:
            previous = content  # nothing may come back from the backup
        else:
            try:
                previous = self.fs.read_text(self.path).encode()
            except (FileNotFoundError, UnicodeDecodeError):
                previous = None
        if previous is not None:
            self.fs.atomic_write(self.backup_path, previous)
        self.fs.atomic_write(self.path, content)

    # ------------------------------------------------------------------ reads
    @property
    def last_epoch(self) -> int:
        """The newest epoch, -1 if none (EpochFileCache.lastEpoch)."""
        return self.entries[-1].epoch if self.entries else -1

    @property
    def last(self) -> EpochEntry | None:
        return self.entries[-1] if self.entries else None

    def entry_at(self, offset: int, max_offset: int) -> EpochEntry | None:
        """The epoch whose range [start, end) holds `offset` in a log ending at `max_offset`."""
        for entry, end in zip(self.entries, end_offsets(self.entries, max_offset), strict=True):
            if entry.start_offset <= offset < end:
                return entry
        return None

    def next_after(self, epoch: int) -> EpochEntry | None:
        """The entry after `epoch` (EpochFileCache.nextEntry): where its bytes end."""
        return next((entry for entry in self.entries if entry.epoch > epoch), None)

    # ------------------------------------------------------------------ changes
    def append(self, entry: EpochEntry) -> None:
        """A new epoch; it must raise both the epoch and the start offset (RocketMQ logs
        an error and goes on without it, which leaves the epoch's bytes attributed to
        the one before)."""
        last = self.last
        if last is not None and (
            entry.epoch <= last.epoch or entry.start_offset <= last.start_offset
        ):
            raise EpochOrderError(f"epoch entry {entry} does not follow {last}")
        self.entries.append(entry)
        self._write()

    def truncate_from(self, offset: int) -> None:
        """Drop the epochs starting at or after `offset` (truncateSuffixByOffset): the
        log was cut there."""
        kept = [entry for entry in self.entries if entry.start_offset < offset]
        if kept != self.entries:
            self.entries = kept
            self._write()

    def begin_epoch(self, epoch: int, max_offset: int) -> EpochEntry:
        """Become master in `epoch` with the log ending at `max_offset` (changeToMaster):
        epochs `epoch` and later, and epochs that hold no byte (starting at
        `max_offset`), give way to the new one."""
        if epoch < self.last_epoch:
            raise EpochOrderError(f"epoch {epoch} is older than this store's {self.last_epoch}")
        self.entries = [
            entry
            for entry in self.entries
            if entry.epoch < epoch and entry.start_offset < max_offset
        ]
        self.append(EpochEntry(epoch, max_offset))
        return self.entries[-1]

    def retain_from(self, min_offset: int) -> None:
        """Drop the epochs that end at or before the log's new first byte `min_offset`
        (truncatePrefixByOffset, after old CommitLog files were deleted); the last one
        holds the log's end and stays."""
        ends = end_offsets(self.entries, max_offset=min_offset + 1)
        kept = [entry for entry, end in zip(self.entries, ends, strict=True) if end > min_offset]
        if kept != self.entries:
            self.entries = kept
            self._write()
