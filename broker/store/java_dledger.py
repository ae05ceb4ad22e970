"""Hand a DLedger-mode store raftmq wrote to Apache RocketMQ's Java broker (4.9, 5.x).

RocketMQ embeds DLedger 0.3.1.2, which knows one entry type: a CommitLog message.
raftmq's log also holds entries that are not messages: the NOOP a new leader appends
(magic 2, no body, 48 bytes; DLedger 0.3.1.2's recovery ends the log at the first,
which is the log's first entry) and the member lists of online membership changes
(NOOPs with a body). So
the way back to Java brokers is: stop the group, run `convert` on every member's store
(`mqbroker -c broker.conf --convertForJava`), start the Java brokers on the same disks.

`convert` rewrites the log in place so that every entry is a message, keeping every
message where it was, so its commit-log offset and offset msgId stay what clients were
told: the bytes of entries that are not messages go to the message before them in the
same data file, whose record grows by a padding property (`RAFTMQ_PAD`) exactly that
long. RocketMQ steps from record to record by each record's TOTALSIZE
(`DLedgerCommitLog.checkMessageAndReturnSize`), so the record must carry the bytes.
Only where no message comes before them in their file (a log raftmq began starts
with its first leader's NOOP) does the message after them move back over them
instead: its commit-log offset and offset msgId change (`Moved` lists them). Queue
offsets and consumer offsets never change. Entries are renumbered without gaps from
the log's first index; the committed index follows; both CRC fields are written as
zero, as DLedger writes them (raftmq reads such entries unchecked, so the converted
store opens in raftmq too). The index files are rewritten at DLedger 0.3.1.2's index
file size, which RocketMQ does not set.

Every member is numbered from an anchor the operator gives them all alike
(`anchor_index`, `--convertAnchorIndex`): the first message at or after old index
`anchor_index` keeps that number, the messages before and after it are numbered
without gaps from there. A log retention trimmed (its first data files deleted, its
beginning in the `begin` file) holds only some of the entries that are not messages,
so a count from index 0 would differ between members that trimmed at different
places; an index every member holds (the largest at which one's log begins; 0 when
none is trimmed) gives them all the same numbers. The anchor is asked of every
member, trimmed or not: a member converted without it could not be numbered again
once the others turn out to need one. A member whose log or checkpoint does not reach
the anchor is refused (its entries past its commit may differ from the others'). A
log that continues a classic CommitLog (an upgrade in place) is refused: RocketMQ's
DLedger CommitLog would have to begin at the old log's end.

Every entry is checked (its CRCs, its place) before anything is written. The rewrite
itself is in place and not atomic: an interrupted one leaves a store neither broker
should open, so keep a copy until the Java brokers serve. What is derived from the
log's positions (ConsumeQueues, the key index, the dispatch checkpoint) is the
caller's to remove: both brokers rebuild it from the log. A converted log that does
not begin at index 0 gets a `begin` file saying where it does, so raftmq opens it
too; the term it records before the log's first entry is the old `begin` file's (the
term of the entry before the old beginning, which may have been a NOOP of a later
term than the message now before it): only a raftmq group started again on converted
stores would compare it.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import attrs
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store.entry import (
    BLANK_HEADER,
    HEADER,
    HEADER_SIZE,
    INDEX_ENTRY,
    POS_OFFSET,
    CorruptEntry,
    check,
)
from raftmq.dledger.store.meta import BEGIN_FILE, Checkpoint, begin_text, parse_begin

from raftmq.disk.filesystem import atomic_write
from raftmq.protocol.message import (
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    PROPERTIES_MAX_BYTES,
    SYSFLAG_POSITION,
    MessageFormatError,
    MessageSysFlag,
    decode,
)
from raftmq.protocol.msgid import create_message_id

# DLedgerConfig's default index file size, which RocketMQ 4.9 and 5.x leave as it is.
JAVA_INDEX_FILE_BYTES = 167_772_160
PAD_PROPERTY = "RAFTMQ_PAD"
_PAD_NAME = PAD_PROPERTY.encode() + b"\x01"
_BLANK_MAGIC = -1  # DLedger's end-of-file filler (MmapFileList.BLANK_MAGIC_CODE)
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_LONG = struct.Struct(">q")


class ConvertError(ValueError):
    """A store this conversion cannot hand to RocketMQ; the message says why."""


@attrs.frozen
class Moved:
    """A message that moved back over entries that were not messages."""

    queue: tuple[str, int]  # topic, queue id
    queue_offset: int
    old_msg_id: str
    new_msg_id: str


@attrs.frozen
class Report:
    messages: int
    absorbed: int  # entries that were not messages, now padding or end-of-file filler
    moved: list[Moved]
    committed_index: int  # DLedger's checkpoint after renumbering (-1: none)
    first_index: int  # the number of the log's first message now


@attrs.define
class _Entry:
    start: int  # where the entry is in its file
    size: int
    index: int
    term: int
    message: bool


def _entries(view, base: int, prev_chain: int | None) -> Iterator[_Entry]:
    """The entries of the data file at `base`, up to its end-of-file filler or its
    unwritten tail, each checked (CRCs against the chain from `prev_chain`, and its
    place); ConvertError at the first that fails."""
    offset = 0
    while offset + HEADER_SIZE <= len(view) and _INT.unpack_from(view, offset)[0] not in (
        0,
        _BLANK_MAGIC,
    ):
        failed = None
        try:
            magic, size, index, term, prev_chain = check(view, offset, prev_chain)
        except CorruptEntry as exc:  # raised outside: its traceback holds a view of the map
            failed = str(exc)
        if failed is not None:
            raise ConvertError(
                f"data file {base:020d}, offset {offset}: {failed} (a torn tail? start this"
                " member's raftmq broker once, whose recovery cuts it, stop it and convert)"
            )
        if _LONG.unpack_from(view, offset + POS_OFFSET)[0] != base + offset:
            raise ConvertError(f"data file {base:020d}, offset {offset}: pos field disagrees")
        # not a message: a new leader's NOOP, or a member list (a NOOP with a body)
        yield _Entry(offset, size, index, term, magic == EntryType.NORMAL)
        offset += size


def _properties_len(record: bytes) -> int:
    """PROPERTIESLEN of a record decode() accepted (the fields before the properties
    fill it up to them)."""
    magic, sysflag = _INT.unpack_from(record, 4)[0], _INT.unpack_from(record, SYSFLAG_POSITION)[0]
    born = 16 if sysflag & MessageSysFlag.BORNHOST_V6_FLAG else 4
    store = 16 if sysflag & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG else 4
    pos = 48 + born + 4 + 8 + store + 4 + 4 + 8  # to BODYLEN
    pos += 4 + _INT.unpack_from(record, pos)[0]
    if magic == MESSAGE_MAGIC_CODE:
        pos += 1 + record[pos]
    else:
        pos += 2 + int.from_bytes(record[pos : pos + 2], "big")
    return _SHORT.unpack_from(record, pos)[0]


def _message(record: bytes):
    try:
        return decode(record, read_body=False)[0]
    except MessageFormatError as exc:
        raise ConvertError(f"an entry's body is not a CommitLog message: {exc}") from None


def _padded(record: bytes, extra: int, physical_offset: int) -> bytes:
    """`record` (a CommitLog message) `extra` (>= 48) bytes longer, by a padding
    property after its properties, at `physical_offset`."""
    msg = _message(record)
    total = len(record)
    props_len = _properties_len(record)
    old = record[total - props_len :]
    separator = b"\x02" if old and not old.endswith(b"\x02") else b""
    filler = extra - len(separator) - len(_PAD_NAME) - 1
    assert filler >= 0, extra  # the smallest entry, a NOOP, is 48 bytes
    if props_len + extra > PROPERTIES_MAX_BYTES:
        raise ConvertError(
            f"the message at queue offset {msg.queue_offset} of {msg.topic} cannot take"
            f" {extra} bytes of padding in its properties ({props_len} bytes)"
        )
    head = bytearray(record[: total - props_len - 2])
    _INT.pack_into(head, 0, total + extra)
    _LONG.pack_into(head, PHYSICAL_OFFSET_POSITION, physical_offset)
    pad = separator + _PAD_NAME + b"." * filler + b"\x02"
    return bytes(head) + _SHORT.pack(props_len + extra) + old + pad


@attrs.define
class _FileResult:
    kept: list[_Entry] = attrs.Factory(list)  # its messages, numbered anew
    absorbed: int = 0  # entries that were not messages
    moved: list[Moved] = attrs.Factory(list)
    last_committed: int | None = None  # the new number of the last committed one kept
    before_anchor: int = 0  # its messages whose old index is below the anchor
    last_old_index: int = -1


def _convert_file(view, base: int, next_index: int, committed: int, anchor: int, write: bool):
    """One data file rewritten (or, with `write` false, only planned: everything is
    checked, nothing written), its messages numbered from `next_index`; `committed` is
    the old committed index, `anchor` the old index whose messages below are counted."""
    result = _FileResult()
    kept, moved = result.kept, result.moved
    pending = 0  # bytes of entries that are not messages, before this file's first message
    records: dict[int, bytes] = {}  # a kept message's record, as it is now
    # lazily: a write never reaches past the entry being handled, which was read already
    for entry in _entries(view, base, None):
        result.last_old_index = entry.index
        if not entry.message:
            result.absorbed += 1
            if not kept:
                pending += entry.size
                continue
            last = kept[-1]
            if last.start + last.size != entry.start:
                raise ConvertError(f"data file {base:020d}: a gap before offset {entry.start}")
            physical = base + last.start + HEADER_SIZE
            records[last.index] = _padded(records[last.index], entry.size, physical)
            _put(view, last, records[last.index], base, write)
            if entry.index <= committed:
                result.last_committed = last.index
            continue
        record = bytes(view[entry.start + HEADER_SIZE : entry.start + entry.size])
        new = _Entry(entry.start - pending, entry.size, next_index, entry.term, True)
        if pending:
            msg = _message(record)
            old_id = create_message_id(msg.store_host, base + entry.start + HEADER_SIZE)
            record = _padded(record, pending, base + new.start + HEADER_SIZE)
            new_id = create_message_id(msg.store_host, base + new.start + HEADER_SIZE)
            moved.append(Moved((msg.topic, msg.queue_id), msg.queue_offset, old_id, new_id))
            pending = 0
        else:
            _message(record)  # RocketMQ reads it as one
        records = {next_index: record}  # only the last kept one can still grow
        _put(view, new, record, base, write)
        kept.append(new)
        next_index += 1
        result.before_anchor += entry.index < anchor
        if entry.index <= committed:
            result.last_committed = new.index
    if pending and write:  # a file of entries that are not messages: an end-of-file filler
        view[:HEADER_SIZE] = bytes(HEADER_SIZE)
        BLANK_HEADER.pack_into(view, 0, _BLANK_MAGIC, len(view))
    return result


def _put(view, entry: _Entry, record: bytes, base: int, write: bool) -> None:
    """`entry` (a message, `record` its body) at its place, numbered anew, with both
    CRCs zero as DLedger writes them (and its size set)."""
    entry.size = HEADER_SIZE + len(record)
    if write:
        header = HEADER.pack(
            int(EntryType.NORMAL), entry.size, entry.index, entry.term, base + entry.start,
            0, 0, 0, len(record),
        )  # fmt: skip
        view[entry.start : entry.start + entry.size] = header + record


class _IndexWriter:
    """DLedger's index files, written anew row by row at `file_bytes` each."""

    def __init__(self, index_dir: Path, file_bytes: int) -> None:
        for old in index_dir.glob("*") if index_dir.is_dir() else []:
            old.unlink()
        index_dir.mkdir(parents=True, exist_ok=True)
        self.dir, self.file_bytes, self.files = index_dir, file_bytes, {}

    def add(self, entries: list[_Entry], base: int) -> None:
        magic = int(EntryType.NORMAL)
        for e in entries:
            offset = e.index * INDEX_ENTRY.size
            start = offset - offset % self.file_bytes
            fd = self.files.get(start)
            if fd is None:
                fd = os.open(self.dir / f"{start:020d}", os.O_RDWR | os.O_CREAT, 0o644)
                self.files[start] = fd
                os.ftruncate(fd, self.file_bytes)
            row = INDEX_ENTRY.pack(magic, base + e.start, e.size, e.index, e.term)
            os.pwrite(fd, row, offset - start)

    def close(self) -> None:
        """fsync every file and the directory, and close them."""
        try:
            for fd in self.files.values():
                os.fsync(fd)
            dir_fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        finally:
            for fd in self.files.values():
                os.close(fd)


def convert(
    dledger_dir: Path, anchor_index: int, index_file_bytes: int = JAVA_INDEX_FILE_BYTES
) -> Report:
    """Rewrite the stopped member's log under `dledger_dir` (`dledger-<selfId>`, whose
    `data` and `index` hold it) for RocketMQ's DLedger 0.3.1.2, numbered from
    `anchor_index`, which must be the same on every member; see the module doc. Checks
    the whole log before writing anything (ConvertError: why not)."""
    data_dir = dledger_dir / "data"
    files = sorted(
        (p for p in data_dir.iterdir() if p.name.isdigit() and p.stat().st_size > 0),
        key=lambda p: int(p.name),
    ) if data_dir.is_dir() else []  # fmt: skip
    if not files:
        raise ConvertError(f"{data_dir}: no data files")
    begin_index, begin_pos, before_term = _begin(dledger_dir)
    if begin_index == 0 and begin_pos:
        raise ConvertError(
            f"{dledger_dir}: the log continues a classic CommitLog (upgraded in place),"
            " which RocketMQ's DLedger CommitLog cannot take below it"
        )
    if int(files[0].name) < begin_pos:
        raise ConvertError(
            f"{dledger_dir}: data files below the log's beginning (pos {begin_pos}) remain:"
            " start this member's raftmq broker once, whose recovery deletes them, stop it"
            " and convert"
        )
    if int(files[0].name) != begin_pos:
        raise ConvertError(
            f"{dledger_dir}: the log begins at pos {begin_pos}, but its first data file at"
            f" {int(files[0].name)}: the store is damaged"
        )
    if anchor_index < begin_index:
        raise ConvertError(
            f"{dledger_dir}: the anchor index {anchor_index} is below this log's beginning"
            f" ({begin_index}): give every member the same anchor, the largest index at"
            " which a member's log begins"
        )
    try:
        old_committed = Checkpoint(dledger_dir / "checkpoint").load()
    except ValueError as exc:
        raise ConvertError(str(exc)) from None
    plan = _convert_files(
        dledger_dir, files, old_committed, anchor_index, 0, index_file_bytes, False
    )
    if anchor_index > min(old_committed, plan.last_old_index) + 1:
        # past what this member knows committed, its entries may differ from the others'
        raise ConvertError(
            f"{dledger_dir}: this member's log (ending at {plan.last_old_index}, committed"
            f" to {old_committed} by its checkpoint) does not reach the anchor index"
            f" {anchor_index}: it lags the other members; start the group once more until"
            " it has caught up, stop it and convert"
        )
    first = anchor_index - plan.before_anchor
    report = _convert_files(
        dledger_dir, files, old_committed, anchor_index, first, index_file_bytes, True
    ).report
    if old_committed >= 0:
        Checkpoint(dledger_dir / "checkpoint").save(report.committed_index)
    if first or begin_index:  # the converted log's beginning, should raftmq open it
        begin = (first, begin_pos, before_term, None)  # None: CRCs are zero, no chain
        atomic_write(dledger_dir / BEGIN_FILE, begin_text(begin))
    return report


def begin_index(dledger_dir: Path) -> int:
    """Where the member's log begins: the anchor every member is converted with is the
    largest of these."""
    return _begin(dledger_dir)[0]


def _begin(dledger_dir: Path) -> tuple[int, int, int]:
    """The log's beginning as raftmq's `begin` file has it: (index, pos, term before)."""
    try:
        text = (dledger_dir / BEGIN_FILE).read_text()
    except FileNotFoundError:
        return 0, 0, -1
    try:
        return parse_begin(text)[:3]
    except ValueError as exc:
        raise ConvertError(f"{dledger_dir / BEGIN_FILE}: unreadable: {exc!r}") from None


@attrs.frozen
class _Converted:
    report: Report
    before_anchor: int  # messages whose old index is below the anchor
    last_old_index: int


def _convert_files(
    dledger_dir, files, old_committed, anchor, first_index, index_file_bytes, write
) -> _Converted:
    index = _IndexWriter(dledger_dir / "index", index_file_bytes) if write else None
    messages = absorbed = before_anchor = 0
    moved: list[Moved] = []
    # the last committed entry kept: at least the message before the first (when the
    # committed ones here are entries that are not messages, opening the log)
    next_index, committed, last_old_index = first_index, first_index - 1, -1
    try:
        for path in files:
            base = int(path.name)
            with (
                open(path, "r+b" if write else "rb") as f,
                mmap.mmap(
                    f.fileno(), 0, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ
                ) as view,
            ):
                result = _convert_file(view, base, next_index, old_committed, anchor, write)
                if write:
                    view.flush()
                    os.fsync(f.fileno())
            if path is files[0] and not result.kept:
                raise ConvertError(
                    f"data file {base:020d}, the log's first, holds no message (only entries"
                    " that are not messages), and DLedger 0.3.1.2 begins a log with its"
                    " first file's first entry"
                )
            if index is not None:
                index.add(result.kept, base)
            next_index += len(result.kept)
            messages += len(result.kept)
            absorbed += result.absorbed
            before_anchor += result.before_anchor
            moved += result.moved
            if result.last_committed is not None:
                committed = result.last_committed
            if result.last_old_index >= 0:
                last_old_index = result.last_old_index
    finally:
        if index is not None:
            index.close()
    report = Report(messages, absorbed, moved, committed, first_index)
    return _Converted(report, before_anchor, last_old_index)
