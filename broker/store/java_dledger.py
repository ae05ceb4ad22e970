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
Only where no message comes before them in their file (the log's first entry is
always the first leader's NOOP) does the message after them move back over them
instead: its commit-log offset and offset msgId change (`Moved` lists them). Queue
offsets and consumer offsets never change. Entries are renumbered without gaps from
the log's first index; the committed index follows; both CRC fields are written as
zero, as DLedger writes them (raftmq reads such entries unchecked, so the converted
store opens in raftmq too). The index files are rewritten at DLedger 0.3.1.2's index
file size, which RocketMQ does not set. RocketMQ's broker refuses ConsumeQueue files
that are not their full preallocated size, so those go; it rebuilds them from the log.

The rewrite is in place and not atomic: an interrupted one leaves a store neither
broker should open, so keep a copy until the Java brokers serve.
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import attrs
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store.entry import BLANK_HEADER, HEADER, HEADER_SIZE, INDEX_ENTRY
from raftmq.dledger.store.meta import Checkpoint

from raftmq.protocol.message import (
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    MessageFormatError,
    decode,
)
from raftmq.protocol.msgid import create_message_id

# DLedgerConfig's default index file size, which RocketMQ 4.9 and 5.x leave as it is.
JAVA_INDEX_FILE_BYTES = 167_772_160
PAD_PROPERTY = "RAFTMQ_PAD"
_BLANK_MAGIC = -1  # DLedger's end-of-file filler (MmapFileList.BLANK_MAGIC_CODE)
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_LONG = struct.Struct(">q")
_PROPERTIES_MAX_BYTES = 32767  # PROPERTIESLEN is a signed short


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


@attrs.define
class _Entry:
    start: int  # where the entry is in its file
    size: int
    index: int
    term: int
    message: bool


def _entries(view: mmap.mmap) -> Iterator[_Entry]:
    """The entries of one data file, up to its end-of-file filler or its unwritten tail."""
    offset = 0
    while offset + HEADER_SIZE <= len(view):
        magic, size, index, term, _pos, _ch, _chain, _crc, body_len = HEADER.unpack_from(
            view, offset
        )
        if magic in (0, _BLANK_MAGIC):
            return
        if magic not in (EntryType.NORMAL, EntryType.NOOP) or size != HEADER_SIZE + body_len:
            raise ConvertError(f"entry at file offset {offset}: magic {magic}, size {size}")
        # a NOOP, or a member list (a NOOP with a body): not a message
        yield _Entry(offset, size, index, term, magic == EntryType.NORMAL)
        offset += size


def _padded(record: bytes, extra: int, physical_offset: int) -> bytes:
    """`record` (a CommitLog message) `extra` bytes longer, by a padding property after
    its properties, at `physical_offset`."""
    try:
        msg, total = decode(record)
    except MessageFormatError as exc:
        raise ConvertError(f"an entry's body is not a CommitLog message: {exc}") from None
    assert total == len(record), (total, len(record))
    props_len = _props_len(record, total)
    old = record[total - props_len :]
    separator = b"\x02" if old and not old.endswith(b"\x02") else b""
    name = separator + PAD_PROPERTY.encode() + b"\x01"
    filler = extra - len(name) - 1
    if filler < 0 or props_len + extra > _PROPERTIES_MAX_BYTES:
        raise ConvertError(
            f"the message at queue offset {msg.queue_offset} of {msg.topic} cannot take"
            f" {extra} bytes of padding in its properties ({props_len} bytes)"
        )
    head = bytearray(record[: total - props_len - 2])
    _INT.pack_into(head, 0, total + extra)
    _LONG.pack_into(head, PHYSICAL_OFFSET_POSITION, physical_offset)
    return bytes(head) + _SHORT.pack(props_len + extra) + old + name + b"." * filler + b"\x02"


def _props_len(record: bytes, total: int) -> int:
    """PROPERTIESLEN of a record decode() accepted: the fields before the properties
    fill the record up to them, so walk to them."""
    magic = _INT.unpack_from(record, 4)[0]
    sysflag = _INT.unpack_from(record, 36)[0]
    born = 16 if sysflag & 0x10 else 4
    store = 16 if sysflag & 0x20 else 4
    pos = 48 + born + 4 + 8 + store + 4 + 4 + 8
    (body_len,) = _INT.unpack_from(record, pos)
    pos += 4 + body_len
    if magic == MESSAGE_MAGIC_CODE:
        topic_len, pos = record[pos], pos + 1
    else:
        topic_len, pos = int.from_bytes(record[pos : pos + 2], "big"), pos + 2
    pos += topic_len
    (props_len,) = _SHORT.unpack_from(record, pos)
    assert pos + 2 + props_len == total, (pos, props_len, total)
    return props_len


def _msg_id(record: bytes, physical_offset: int) -> str:
    msg, _ = decode(record, read_body=False)
    return create_message_id(msg.store_host, physical_offset)


def _write_entry(view: mmap.mmap, entry: _Entry, record: bytes, base: int) -> None:
    """Write `entry` (a message, `record` its body) at its place: position from the
    file's `base`, both CRCs zero, as DLedger writes them."""
    entry.size = HEADER_SIZE + len(record)
    header = HEADER.pack(
        int(EntryType.NORMAL), entry.size, entry.index, entry.term, base + entry.start,
        0, 0, 0, len(record),
    )  # fmt: skip
    view[entry.start : entry.start + entry.size] = header + record


def _convert_file(view: mmap.mmap, base: int, next_index: int, committed: int):
    """Rewrite one data file (see the module doc): its messages as kept, numbered from
    `next_index`; the entries it absorbed; the messages that moved; the new index of
    the last kept entry at or below the old committed index `committed` (None: none)."""
    kept: list[_Entry] = []
    absorbed, moved = 0, []
    pending = 0  # bytes of entries that are not messages, before this file's first message
    last_committed = None
    for entry in list(_entries(view)):
        body = bytes(view[entry.start + HEADER_SIZE : entry.start + entry.size])
        if not entry.message:
            absorbed += 1
            if not kept:
                pending += entry.size
                continue
            last = kept[-1]
            assert last.start + last.size == entry.start, (last, entry)
            record = bytes(view[last.start + HEADER_SIZE : last.start + last.size])
            physical = base + last.start + HEADER_SIZE
            _write_entry(view, last, _padded(record, entry.size, physical), base)
            if entry.index <= committed:
                last_committed = last.index
            continue
        new = _Entry(entry.start - pending, entry.size, next_index, entry.term, True)
        if pending:
            old_id = _msg_id(body, base + entry.start + HEADER_SIZE)
            body = _padded(body, pending, base + new.start + HEADER_SIZE)
            msg, _ = decode(body, read_body=False)
            new_id = create_message_id(msg.store_host, base + new.start + HEADER_SIZE)
            moved.append(Moved((msg.topic, msg.queue_id), msg.queue_offset, old_id, new_id))
            pending = 0
        _write_entry(view, new, body, base)
        kept.append(new)
        next_index += 1
        if entry.index <= committed:
            last_committed = new.index
    if pending:  # a file of entries that are not messages: DLedger's end-of-file filler
        BLANK_HEADER.pack_into(view, 0, _BLANK_MAGIC, len(view))
    return kept, absorbed, moved, last_committed


def _write_index(index_dir: Path, rows: list[tuple[int, bytes]], file_bytes: int) -> None:
    """DLedger's index files for `rows` ((index, 32-byte entry)), at `file_bytes` each."""
    shutil.rmtree(index_dir, ignore_errors=True)
    index_dir.mkdir(parents=True)
    files: dict[int, int] = {}
    try:
        for index, row in rows:
            offset = index * INDEX_ENTRY.size
            start = offset - offset % file_bytes
            if start not in files:
                fd = os.open(index_dir / f"{start:020d}", os.O_RDWR | os.O_CREAT, 0o644)
                os.ftruncate(fd, file_bytes)
                files[start] = fd
            os.pwrite(files[start], row, offset - start)
        for fd in files.values():
            os.fsync(fd)
    finally:
        for fd in files.values():
            os.close(fd)


def convert(dledger_dir: Path, index_file_bytes: int = JAVA_INDEX_FILE_BYTES) -> Report:
    """Rewrite the stopped member's log under `dledger_dir` (`dledger-<selfId>`, whose
    `data` and `index` hold it) for RocketMQ's DLedger 0.3.1.2; see the module doc."""
    data_dir = dledger_dir / "data"
    files = sorted(
        (p for p in data_dir.iterdir() if p.name.isdigit() and p.stat().st_size > 0),
        key=lambda p: int(p.name),
    ) if data_dir.is_dir() else []  # fmt: skip
    if not files:
        raise ConvertError(f"{data_dir}: no data files")
    checkpoint = Checkpoint(dledger_dir / "checkpoint")
    old_committed = checkpoint.load()
    rows: list[tuple[int, bytes]] = []
    messages = absorbed = 0
    moved: list[Moved] = []
    next_index = None
    committed = -1
    for path in files:
        base = int(path.name)
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as view:
            if next_index is None:
                first = next(_entries(view), None)
                next_index = 0 if first is None else first.index
            kept, file_absorbed, file_moved, last_committed = _convert_file(
                view, base, next_index, old_committed
            )
            view.flush()
            os.fsync(f.fileno())
        magic = int(EntryType.NORMAL)
        rows += [
            (e.index, INDEX_ENTRY.pack(magic, base + e.start, e.size, e.index, e.term))
            for e in kept
        ]
        next_index += len(kept)
        messages += len(kept)
        absorbed += file_absorbed
        moved += file_moved
        if last_committed is not None:
            committed = last_committed
    _write_index(dledger_dir / "index", rows, index_file_bytes)
    if old_committed >= 0:
        checkpoint.save(committed)
    return Report(messages, absorbed, moved, committed)
