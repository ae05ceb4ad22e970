"""The classic CommitLog: RocketMQ's own file layout, on one broker.

    commitlog/<20-digit start offset>   `mappedFileSizeCommitLog` bytes each

Records sit back to back from each file's start; a message's physical offset is
its byte position in the log (file start + offset in the file). When the next
record does not fit with 8 bytes to spare, the rest of the file gets RocketMQ's
8-byte BLANK record (`int32 bytes to the file end`, `int32 BLANK_MAGIC_CODE`)
and the record goes to the next file, so a record never spans two files and
every file, bytes after the blank included, is identical on a master and the
slaves that copy it (HA ships raw file bytes, `read_file_data`/`append_data`).

Opening the log recovers it. The `abort` file, created at open and removed by
a clean `close`, says whether the last run ended cleanly: after a crash the body
CRC of every record from the last checkpoint on is checked (RocketMQ's abnormal
recovery starts from its StoreCheckpoint likewise; ours records the offset the
files were fsynced up to, at most once a second, not a timestamp, which a clock
step could move), after a clean stop only the record headers. Either way the log
ends at the last whole record: a torn or zeroed tail is cut off (zeroed) and files
after it are deleted, as RocketMQ's `truncateDirtyFiles` does.

Files expire by age (`delete_expired`, `fileReservedTime`), but never past what
the message store has made durable in its ConsumeQueues.

Unlike RocketMQ, opening walks every record header of every file (not only the last
three files) to build the table of message starts that the dispatcher reads by index
(`pos_at`); the store thereby presents the same read side as the DLedger log
(`replicated_log.LogEntries`/`CommitPosition`), and the message store does not care
which log it stands on. The table costs 8 bytes per message in memory.

Durability is group commit: every file written since the last plan is fdatasynced
by one plan (`flush_plan`), run in a worker thread by the owner's flush loop
(`classic_commitlog`).
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import mmap
import struct
import time
from array import array
from collections.abc import Callable
from pathlib import Path

import trio

from raftmq.disk.filesystem import FileSystem, OsFileSystem
from raftmq.disk.segments import (
    Segment,
    StoreCorruption,
    list_segments,
    open_segment,
    segment_path,
    zero,
)
from raftmq.protocol import message as codec

log = logging.getLogger(__name__)

BLANK_MAGIC_CODE = codec.BLANK_MAGIC_CODE
END_FILE_MIN_BLANK_LENGTH = 8  # CommitLog.END_FILE_MIN_BLANK_LENGTH
MESSAGE_MAGIC_CODES = (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2)
ABORT_FILE = "abort"
# JSON: "flushed", the offset below which the files are durable, and in controller mode
# "confirmed", the confirmOffset then (at most "flushed"): RocketMQ's StoreCheckpoint
# keeps it too, so a restarted broker serves what it knew confirmed before any master
# speaks to it.
CHECKPOINT_FILE = "commitlog_checkpoint"
CHECKPOINT_INTERVAL_S = 1.0
_HEAD = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE
_MIN_RECORD_BYTES = 20  # TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG at the least


class RecordTooLarge(ValueError):
    """A record bigger than a CommitLog file can take."""


class ClassicLog:
    """The CommitLog files under `directory`; see the module docstring.

    It is also its own `store` and `replica` in the sense of `replicated_log`: entry
    `i` is the `i`-th message held (from `begin_index`), at physical offset `pos_at(i)`,
    and `committed_index` is the last whole message written (a classic master
    dispatches what it wrote, as RocketMQ's ReputMessageService does; a slave what it
    received), or in controller mode the last one below the confirmOffset that
    `confirmed()` gives (`readUnCommitted=false`: consumers see only what every
    SyncStateSet member holds); `confirm_moved()` says it went up.
    """

    def __init__(
        self,
        directory: Path,
        file_size_bytes: int,
        abort_path: Path,
        fs: FileSystem | None = None,
    ) -> None:
        assert file_size_bytes > END_FILE_MIN_BLANK_LENGTH, file_size_bytes
        self.directory = directory
        self.file_size = file_size_bytes
        self.abort_path = abort_path
        self.fs = fs or OsFileSystem()
        self.store = self
        self.replica = self
        self.begin_index = 0
        self.closed = False
        self._segments: list[Segment] = []
        self._positions = array("q")  # physical offset of each message held
        self.write_pos = 0  # the next byte to write: RocketMQ's getMaxPhyOffset
        self.parsed_pos = 0  # after the last whole record (or blank) read into _positions
        self.flushed_pos = 0  # durable up to here
        self._dirty: set[int] = set()  # start offsets of the files written since the last plan
        self._dirs_dirty = False
        self._commit_handlers: list[Callable[[int], None]] = []
        self._retention_limits: list[Callable[[], int]] = []
        self._deletion_handlers: list[Callable[[int], None]] = []
        self._cut_handlers: list[Callable[[int], None]] = []
        self.confirmed: Callable[[], int] | None = None  # controller mode's confirmOffset
        self._confirmed_index = -1  # decreases only when `truncate` cuts the log
        self.written = trio.Event()  # set (and replaced) at every write: HA senders wait on it
        self.aborted = False  # the last run did not close cleanly
        self.checkpoint_path = abort_path.with_name(CHECKPOINT_FILE)
        self._checkpointed_at = 0.0  # time.monotonic() of the last checkpoint planned
        self._open()

    # ------------------------------------------------------------------ recovery
    def _open(self) -> None:
        self.fs.makedirs(self.directory)
        self.aborted = self.abort_path.exists()
        starts = list_segments(self.fs, self.directory, self.file_size)
        for before, after in itertools.pairwise(starts):
            if after != before + self.file_size:
                missing = segment_path(self.directory, before + self.file_size)
                raise StoreCorruption(missing, 0, "missing: the commitlog files have a gap")
        self._segments = [
            open_segment(self.fs, self.directory, s, self.file_size, create=False) for s in starts
        ]
        durable = self._durable_offset()
        if self._segments:
            first = self._segments[0].start
            self.write_pos = self.parsed_pos = first
            end = self._segments[-1].start + self.file_size
            stop, why = self._scan(first, end, check_crc_from=durable if self.aborted else end)
            self._cut_at(stop, why)
        if durable > self.write_pos:  # the log was cut below it: what comes next is not durable
            self._write_checkpoint(0)
        self.flushed_pos = self.write_pos
        self.abort_path.parent.mkdir(parents=True, exist_ok=True)
        self.abort_path.touch()
        log.info(
            "commitlog recovered (%s shutdown): %d messages, offsets %d..%d",
            "abnormal" if self.aborted else "normal",
            len(self._positions),
            self.min_offset,
            self.write_pos,
        )

    def _durable_offset(self) -> int:
        """Where the last checkpoint says the files were durable up to (0 if unknown):
        after a crash, the records from there on have their body CRCs checked."""
        return self._checkpointed("flushed")

    def checkpointed_confirm(self) -> int:
        """The confirmOffset the last checkpoint kept (0 if none), within the log: where a
        controller-mode store may dispatch to before a master confirms anything."""
        return min(self._checkpointed("confirmed"), self.write_pos)

    def _checkpointed(self, name: str) -> int:
        try:
            return int(json.loads(self.checkpoint_path.read_bytes()).get(name, 0))
        except FileNotFoundError:
            return 0
        except (ValueError, AttributeError, TypeError) as exc:
            log.warning("%s unreadable (%s): taken as 0", self.checkpoint_path, exc)
            return 0

    def _checkpoint(self, flushed: int, confirmed: int | None) -> bytes:
        """The checkpoint's bytes; "confirmed" only in controller mode (`confirmed` set)."""
        fields = {"flushed": flushed}
        if self.confirmed is not None and confirmed is not None:
            fields["confirmed"] = min(confirmed, flushed)
        return json.dumps(fields).encode()

    def _write_checkpoint(self, flushed: int) -> None:
        """Say (durably) that the files are durable up to `flushed` only, and keep the
        confirmOffset within it."""
        self.fs.atomic_write(
            self.checkpoint_path, self._checkpoint(flushed, self._checkpointed("confirmed"))
        )

    def _cut_at(self, stop: int, why: str | None) -> None:
        """End the log at `stop`: zero what follows in its file, delete later files."""
        keep = [seg for seg in self._segments if seg.start <= stop]
        for seg in self._segments[len(keep) :]:
            log.warning("deleting %s: it follows the end of the log at offset %d", seg.path, stop)
            seg.close()
            self.fs.unlink(seg.path)
            self._dirs_dirty = True
        self._segments = keep
        if keep and keep[-1].start <= stop < keep[-1].start + self.file_size:
            seg = keep[-1]
            offset = stop - seg.start
            tail = seg.file.nonzero_end(offset, self.file_size)
            if tail > offset:
                log.warning(
                    "%s: truncating %d bytes after offset %d (%s)",
                    seg.path,
                    tail - offset,
                    offset,
                    why or "a torn record",
                )
                zero(seg.map, offset, tail)
                seg.file.handle.sync()
        if self._dirs_dirty:
            self.fs.sync_dir(self.directory)
            self._dirs_dirty = False
        self.write_pos = self.parsed_pos = stop

    def _scan(
        self, pos: int, end: int, check_crc_from: int | None = None
    ) -> tuple[int, str | None]:
        """Read the records in [pos, end) into the message table, checking the body CRC
        of those from `check_crc_from` on; returns where the whole records end and, if
        they end on something other than zeros or `end`, what."""
        if check_crc_from is None:
            check_crc_from = end
        size = self.file_size
        positions = self._positions
        while pos < end:
            seg = self._segment_at(pos)
            if seg is None:
                return pos, None
            offset = pos - seg.start
            if end - pos < _HEAD.size:
                return pos, None
            total, magic = _HEAD.unpack_from(seg.map, offset)
            if magic == BLANK_MAGIC_CODE:
                if total != size - offset:
                    return pos, f"a BLANK record of {total} bytes, {size - offset} left in the file"
                pos = seg.start + size
                continue
            if total == 0 and magic == 0:
                return pos, None
            if magic not in MESSAGE_MAGIC_CODES:
                return pos, f"magic {magic:#x} is neither a message's nor BLANK's"
            if total < _MIN_RECORD_BYTES or offset + total + END_FILE_MIN_BLANK_LENGTH > size:
                return pos, f"a record of {total} bytes does not fit"
            if pos + total > end:
                return pos, None  # not all here yet
            if pos >= check_crc_from:
                try:
                    codec.decode(seg.map, offset, check_crc=True)
                except codec.MessageFormatError as exc:
                    return pos, str(exc)
            positions.append(pos)
            pos += total
        return pos, None

    # ------------------------------------------------------------------ the read side
    @property
    def end_index(self) -> int:
        return self.begin_index + len(self._positions) - 1

    @property
    def committed_index(self) -> int:
        if self.confirmed is None:
            return self.end_index
        index = self.first_index_at(self.confirmed()) - 1  # the last starting below it
        while index >= self.begin_index and self._end_of(index) > self.confirmed():
            index -= 1
        self._confirmed_index = max(self._confirmed_index, index)
        return self._confirmed_index

    def confirm_moved(self) -> None:
        """The confirmOffset went up: dispatch may go further."""
        for handler in self._commit_handlers:
            handler(self.committed_index)

    @property
    def end_pos(self) -> int:
        return self.parsed_pos

    @property
    def empty(self) -> bool:
        return not self._positions

    @property
    def min_offset(self) -> int:
        return self._segments[0].start if self._segments else self.write_pos

    def pos_at(self, index: int) -> int:
        return self._positions[index - self.begin_index]

    def first_index_at(self, pos: int) -> int:
        """The first message at or after physical offset `pos` (end_index + 1 if none)."""
        return self.begin_index + bisect.bisect_left(self._positions, pos)

    def _segment_at(self, pos: int) -> Segment | None:
        if not self._segments:
            return None
        i = (pos - self._segments[0].start) // self.file_size
        if 0 <= i < len(self._segments):
            return self._segments[i]
        return None

    def locate(self, pos: int):
        """(file map, offset in it) of a written physical offset, for parsing in place."""
        seg = self._segment_at(pos)
        if seg is None or pos >= self.write_pos:
            raise IndexError(f"offset {pos} is not in the commitlog")
        return seg.map, pos - seg.start

    def read_at(self, pos: int, size: int) -> bytes:
        """`size` bytes from physical offset `pos`, within one file and written."""
        seg = self._segment_at(pos)
        if seg is None or size < 0 or pos + size > self.write_pos:
            raise IndexError(f"offset {pos} (+{size}) is not in the commitlog")
        offset = pos - seg.start
        if offset + size > self.file_size:
            raise IndexError(f"offset {pos} (+{size}) crosses a commitlog file end")
        return seg.map[offset : offset + size]

    def mapped_data(self) -> tuple[dict[int, mmap.mmap], int, int, int]:
        """`read_at`'s files, for reads in bulk (`LogEntries.mapped_data`)."""
        return {seg.start: seg.map for seg in self._segments}, self.file_size, 0, self.write_pos

    def read_file_data(self, pos: int, max_bytes: int) -> bytes | None:
        """RocketMQ's `CommitLog.getData` for HA: the written bytes from `pos` to the end
        of its file's written part, at most `max_bytes`; None when `pos` is not held."""
        seg = self._segment_at(pos)
        if seg is None or pos >= self.write_pos:
            return None
        offset = pos - seg.start
        end = min(self.file_size, self.write_pos - seg.start, offset + max_bytes)
        return seg.map[offset:end]

    def add_commit_handler(self, handler: Callable[[int], None]) -> None:
        self._commit_handlers.append(handler)

    def add_retention_limit(self, limit: Callable[[], int]) -> None:
        """Retention keeps every message from index `limit()` on (`delete_expired`)."""
        self._retention_limits.append(limit)

    def add_cut_handler(self, handler: Callable[[int], None]) -> None:
        """`handler(pos)` after `truncate` cut the log at `pos`: what was dispatched from
        the bytes cut goes with them."""
        self._cut_handlers.append(handler)

    def add_deletion_handler(self, handler: Callable[[int], None]) -> None:
        """`handler(new first offset)` after `delete_expired` deleted files."""
        self._deletion_handlers.append(handler)

    def delete_expired(self, older_than_s: float, now_s: float | None = None) -> int:
        """Delete the files at the front of the log last written more than `older_than_s`
        seconds ago (RocketMQ's `deleteExpiredFile` by `fileReservedTime`) whose messages
        are all below every retention limit (the message store's dispatch checkpoint:
        a restart dispatches again from there), never the file the log ends in; the
        log then begins at the first message of the first file kept. Returns how many."""
        now_s = time.time() if now_s is None else now_s
        keep_from = min((limit() for limit in self._retention_limits), default=self.end_index + 1)
        keep_pos = self.pos_at(keep_from) if keep_from <= self.end_index else self.parsed_pos
        keep_pos = min(keep_pos, self.write_pos - self.write_pos % self.file_size)
        doomed = []
        for seg in self._segments:
            if seg.start + self.file_size > keep_pos:
                break
            if now_s - self.fs.mtime(seg.path) < older_than_s:
                break
            doomed.append(seg)
        if not doomed:
            return 0
        new_start = doomed[-1].start + self.file_size
        new_begin = self.first_index_at(new_start)
        del self._positions[: new_begin - self.begin_index]
        self.begin_index = new_begin
        self._segments = self._segments[len(doomed) :]
        for seg in doomed:
            seg.close()
            self.fs.unlink(seg.path)
        self.fs.sync_dir(self.directory)
        log.info("deleted %d expired commitlog files: the log begins at %d", len(doomed), new_start)
        for handler in self._deletion_handlers:
            handler(new_start)
        return len(doomed)

    # ------------------------------------------------------------------ writes
    def _segment_for_write(self, pos: int) -> Segment:
        seg = self._segment_at(pos)
        if seg is not None:
            return seg
        start = pos - pos % self.file_size
        assert not self._segments or start == self._segments[-1].start + self.file_size, pos
        if segment_path(self.directory, start).exists():
            raise StoreCorruption(segment_path(self.directory, start), 0, "exists out of order")
        seg = open_segment(self.fs, self.directory, start, self.file_size, create=True)
        self._segments.append(seg)
        self._dirs_dirty = True
        return seg

    def fits(self, record_bytes: int) -> bool:
        """Whether a record of this size fits a file (with room for a BLANK after it)."""
        return record_bytes + END_FILE_MIN_BLANK_LENGTH <= self.file_size

    def append(self, bodies: list[bytes], place: Callable[[bytes, int], bytes]) -> list[int]:
        """Append records, each as `place(body, physical offset)` returns it (the same
        length); returns their physical offsets. A record that does not fit in the
        current file goes to the next one, after a BLANK record."""
        size = self.file_size
        placed = []
        for body in bodies:
            total = len(body)
            if not self.fits(total):
                raise RecordTooLarge(f"a {total}-byte record does not fit a {size}-byte file")
            pos = self.write_pos
            seg = self._segment_for_write(pos)
            offset = pos - seg.start
            if offset + total + END_FILE_MIN_BLANK_LENGTH > size:
                _HEAD.pack_into(seg.map, offset, size - offset, BLANK_MAGIC_CODE)
                self._dirty.add(seg.start)
                pos = seg.start + size
                seg = self._segment_for_write(pos)
                offset = 0
            record = place(body, pos)
            assert len(record) == total, (len(record), total)
            seg.map[offset : offset + total] = record
            self._dirty.add(seg.start)
            self._positions.append(pos)
            placed.append(pos)
            self.write_pos = self.parsed_pos = pos + total
        self._wrote()
        return placed

    def append_data(self, pos: int, data: bytes) -> None:
        """A slave's append of the master's bytes (`CommitLog.appendData`): `pos` must be
        where this log ends (or anywhere in a file when the log is empty), and `data`
        lies within one file. Whole records among them become readable messages."""
        if not data:
            return
        if not self._segments:
            self.write_pos = self.parsed_pos = pos
        if pos != self.write_pos:
            raise ValueError(f"replicated bytes at offset {pos}: this log ends at {self.write_pos}")
        seg = self._segment_for_write(pos)
        offset = pos - seg.start
        if offset + len(data) > self.file_size:
            raise ValueError(f"{len(data)} bytes at offset {pos} cross a commitlog file end")
        seg.map[offset : offset + len(data)] = data
        self._dirty.add(seg.start)
        self.write_pos = pos + len(data)
        stop, why = self._scan(self.parsed_pos, self.write_pos)
        self.parsed_pos = stop
        if why is not None:
            # not a copy of a CommitLog: keep the whole records before it, drop the rest
            zero(seg.map, stop - seg.start, self.write_pos - seg.start)
            self.write_pos = stop
            self._wrote()
            raise ValueError(f"replicated bytes at offset {stop} are not a record: {why}")
        self._wrote()

    def truncate(self, pos: int, confirmed_too: bool = False) -> None:
        """End the log at `pos`, where a slave's log stops agreeing with its master's
        (controller mode's `truncateFiles`): the bytes after it are zeroed, later files
        deleted, durably. `pos` is the start of a record held, or at or after the end
        of the whole records (a batch may end inside a record), or where a record ends
        (a BLANK may start there). Below what was confirmed only with `confirmed_too`
        (`allAckInSyncStateSet=false`, where a master confirms what it wrote alone);
        otherwise confirmed messages were on every member the controller may elect,
        and ValueError says so rather than cut them."""
        if pos >= self.write_pos:
            return
        if pos < self.min_offset:
            raise ValueError(f"cannot cut the log at {pos}, before its start {self.min_offset}")
        confirmed_end = (
            self._end_of(self._confirmed_index) if self._confirmed_index >= self.begin_index else 0
        )
        if pos < confirmed_end and not confirmed_too:
            raise ValueError(
                f"cannot cut the log at {pos}: the messages up to {confirmed_end} were"
                " confirmed (every SyncStateSet member held them) and dispatched"
            )
        index = self.first_index_at(pos)
        if pos < self.parsed_pos and self.pos_at(index) != pos and self._end_of(index - 1) != pos:
            raise ValueError(f"cannot cut the log at {pos}: not where a record starts")
        del self._positions[index - self.begin_index :]
        self._dirs_dirty = True  # _cut_at syncs the directory, deleting files or not
        self._cut_at(pos, "the rest is not in the master's log")
        if self._durable_offset() > pos:
            self._write_checkpoint(pos)
        self.flushed_pos = min(self.flushed_pos, pos)
        self._confirmed_index = min(self._confirmed_index, index - 1)
        for handler in self._cut_handlers:
            handler(pos)

    def _end_of(self, index: int) -> int:
        """Where message `index` ends (a BLANK may follow it)."""
        buffer, offset = self.locate(self.pos_at(index))
        return self.pos_at(index) + _HEAD.unpack_from(buffer, offset)[0]

    def _wrote(self) -> None:
        index = self.committed_index
        for handler in self._commit_handlers:
            handler(index)
        self.written.set()
        self.written = trio.Event()

    def seal(self) -> int:
        """End the log at its last file's end, as RocketMQ's DLedgerCommitLog does when
        it first starts over classic files: a BLANK record over the rest of that file
        (unless the log ends on a file boundary already). Returns the end, where a
        DLedger log continuing this one begins (dividedCommitlogOffset)."""
        offset = self.write_pos % self.file_size
        seg = self._segment_at(self.write_pos)
        if offset and seg is not None:
            _HEAD.pack_into(seg.map, offset, self.file_size - offset, BLANK_MAGIC_CODE)
            self._dirty.add(seg.start)
            self.write_pos = self.parsed_pos = seg.start + self.file_size
        return self.write_pos

    # ------------------------------------------------------------------ durability
    def flush_plan(self) -> tuple[int, Callable[[], None]]:
        """(offset, work): running `work` (blocking, in a worker thread) makes the log
        durable up to `offset`, what was written when the plan was made."""
        target = self.write_pos
        checkpoint = None
        now_s = time.monotonic()
        if now_s - self._checkpointed_at >= CHECKPOINT_INTERVAL_S:
            self._checkpointed_at = now_s
            confirmed = self.confirmed() if self.confirmed is not None else None
            checkpoint = self._checkpoint(target, confirmed)
        files = (self._segment_at(start) for start in sorted(self._dirty))
        handles = [seg.file.handle.dup() for seg in files if seg is not None]
        dirs = self._dirs_dirty
        self._dirty.clear()
        self._dirs_dirty = False
        directory, fs, checkpoint_path = self.directory, self.fs, self.checkpoint_path

        def work() -> None:
            try:
                for handle in handles:
                    handle.sync()
                if dirs:
                    fs.sync_dir(directory)
                if checkpoint is not None:  # after the data it vouches for
                    fs.atomic_write(checkpoint_path, checkpoint)
            finally:
                for handle in handles:
                    handle.close()

        return target, work

    def close(self) -> None:
        """Flush everything, unmap, and remove the abort file: the next open trusts the
        record headers (a normal recovery)."""
        if self.closed:
            return
        _target, work = self.flush_plan()
        work()
        for seg in self._segments:
            seg.close()
        self.closed = True
        self.abort_path.unlink(missing_ok=True)
