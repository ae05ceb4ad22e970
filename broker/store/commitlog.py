"""DLedgerCommitLog: RocketMQ CommitLog messages stored one per DLedger entry.

As in RocketMQ's DLedger mode, an entry's body is exactly one serialized CommitLog
record, and a message's physical offset is the entry's position + 48 (the body's
first byte in the DLedger data files). The leader writes both offsets into the
records before it hands them to DLedger: they are placed from the log's end (or
from where its own appends still in flight end: the master is the only writer of its
log), and DLedger writes them there or refuses them whole. Queue offsets therefore
follow log order exactly: an append refused before anything was written
(`codes.NOT_APPENDED`) gives its queue offsets back, and since followers store the
leader's bytes at the leader's positions, every replica holds the same offsets and
the same msgIds.

Reads here are raw: `read` by physical offset (what ConsumeQueue entries and
msgIds point at) and `DLedgerCommitLog.scan_rows` of committed entries for the
dispatcher, which skips the NOOP entries a new DLedger leader appends (RocketMQ's
scanner does not know them). The record layout is read by the message codec
(`protocol.message.read_dispatch_fields`), not here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import attrs
from raftmq.broker.store.consumequeue import ENTRY
from raftmq.broker.store.replicated_log import LogEntries, ReplicatedLog
from raftmq.dledger.codes import NOT_APPENDED, Code, EntryType
from raftmq.dledger.server import DLedgerError
from raftmq.dledger.store import entry as dentry

from raftmq.hotpath import compiled_or
from raftmq.protocol import message as codec
from raftmq.transport.awaited import Awaited

if TYPE_CHECKING:
    from raftmq.broker.store.classic_log import ClassicLog

BODY_OFFSET = dentry.HEADER_SIZE  # DLedgerEntry.BODY_OFFSET: physical offset = pos + 48

_INT = struct.Struct(">i")
# Half and rolled-back transactional messages get no queue offset and no ConsumeQueue
# entry (RocketMQ's CommitLog and dispatcher skip them alike).
TRANSACTIONS_WITHOUT_QUEUE_OFFSET = (
    codec.MessageSysFlag.TRANSACTION_PREPARED_TYPE,
    codec.MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
)


@attrs.define(slots=True)
class DispatchRequest:
    """What one committed message contributes to its ConsumeQueue and to the key index
    (not frozen: a frozen attrs class costs three times as much to build, once per
    message per replica). `uniq_key` and `keys` are its UNIQ_KEY and KEYS properties,
    "" when absent, read while the properties are at hand."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    sysflag: int
    tags_code: int
    store_timestamp: int
    uniq_key: str
    keys: str


def dispatch_fields(view, offset: int, physical_offset: int) -> tuple:
    """A DispatchRequest's fields, in order, for the record at `offset` of `view` (a
    committed entry body).

    The tags code is the hash of the TAGS property, or for a delayed message in
    the schedule topic its delivery time (which RocketMQ keeps there instead).
    """
    try:
        total, queue_id, queue_offset, sysflag, store_timestamp, topic, properties = (
            codec.READ_DISPATCH_FIELDS(view, offset)
        )
    except codec.MessageFormatError as exc:
        raise codec.MessageFormatError(f"{exc} (physical offset {physical_offset})") from None
    return (
        topic,
        queue_id,
        queue_offset,
        physical_offset,
        total,
        sysflag,
        codec.properties_tags_code(properties) if properties else 0,
        store_timestamp,
        *(codec.PROPERTIES_INDEX_KEYS(properties) if properties else ("", "")),
    )


def dispatch_rows(blob, last_index: int) -> tuple[list[tuple[int, tuple | None]], Exception | None]:
    """(index, DispatchRequest fields or None for a NOOP) of each entry of `blob` (entries
    as the store encodes them) up to `last_index`, and the error that stopped the walk
    early, if one did: the rows before a bad entry are still dispatched, and then the
    error raised, as a walk entry by entry would. Compiled where the build allows."""
    view = memoryview(blob)
    rows: list[tuple[int, tuple | None]] = []
    try:
        for offset, etype, _size, e_index, _term, pos, _chain in dentry.iter_entries(view):
            if e_index > last_index:
                break
            if etype == EntryType.NOOP:
                rows.append((e_index, None))
            else:
                body_pos = pos + BODY_OFFSET
                rows.append((e_index, dispatch_fields(view, offset + BODY_OFFSET, body_pos)))
    except Exception as exc:  # noqa: BLE001 - returned; scan raises it after the rows
        return rows, exc
    return rows, None


DISPATCH_ROWS = compiled_or("dispatch_rows", dispatch_rows)

# the bit both sysflags without a queue offset have, and the others lack
_NO_QUEUE_OFFSET_BIT = codec.MessageSysFlag.TRANSACTION_PREPARED_TYPE
assert all(t & _NO_QUEUE_OFFSET_BIT for t in TRANSACTIONS_WITHOUT_QUEUE_OFFSET)
assert not codec.MessageSysFlag.TRANSACTION_COMMIT_TYPE & _NO_QUEUE_OFFSET_BIT


def queue_runs(
    rows: list, start: int, queues: dict, special_topics: frozenset[str], indexed: bool
) -> tuple[dict[tuple[str, int], list], int]:
    """The ConsumeQueue entries of `rows[start:]` (dispatch rows) up to the first row the
    dispatcher has to look at on its own, by queue, and where that row is.

    Returns ({(topic, queue id): [first queue offset, next queue offset, entries
    (ENTRY each, a bytearray), bytes of their messages]}, position of the first row
    left out, len(rows) if none). A row is taken when it has nothing to dispatch (None)
    or is a message that only adds an entry to an existing queue of `queues`: not of
    `special_topics`, not a half or rolled-back transaction (no queue offset), nothing
    for the key index (`indexed` false, or no UNIQ_KEY and no KEYS), and its queue
    offset next after the one before it in its queue's run. Everything else (a new
    queue, a gap or repeat within the run) stops it. Whether a run overlaps what its
    queue holds (a replay after a restart) is the caller's to check. Compiled where
    the build allows: it is the one step of dispatch that runs once per message."""
    runs: dict[tuple[str, int], list] = {}
    for pos in range(start, len(rows)):
        fields = rows[pos][1]
        if fields is None:
            continue
        topic, queue_id, queue_offset, physical, size, sysflag, tags, _ts, uniq, keys = fields
        key = (topic, queue_id)
        if (
            topic in special_topics
            or sysflag & _NO_QUEUE_OFFSET_BIT
            or (indexed and (uniq or keys))
            or key not in queues
        ):
            return runs, pos
        run = runs.get(key)
        if run is None:
            runs[key] = [
                queue_offset,
                queue_offset + 1,
                bytearray(ENTRY.pack(physical, size, tags)),
                size,
            ]
        elif run[1] != queue_offset:
            return runs, pos
        else:
            run[1] += 1
            run[2] += ENTRY.pack(physical, size, tags)
            run[3] += size
    return runs, len(rows)


QUEUE_RUNS = compiled_or("queue_runs", queue_runs)


def place_record(body: bytes, body_pos: int, next_offsets: dict) -> tuple[bytearray, int]:
    """The record `body` as the leader stores it at `body_pos`, and its queue offset:
    the next of its queue (`next_offsets`, which it advances), or 0 for a transactional
    message that gets none. Compiled where the build allows (PLACE_RECORD)."""
    _total, queue_id, _q, sysflag, _ts, topic, _props = codec.read_dispatch_fields(body)
    if codec.MessageSysFlag.get_transaction_value(sysflag) in TRANSACTIONS_WITHOUT_QUEUE_OFFSET:
        queue_offset = 0
    else:
        key = (topic, queue_id)
        queue_offset = next_offsets.get(key, 0)
        next_offsets[key] = queue_offset + 1
    record = bytearray(body)  # the entry codec concatenates it; no copy back to bytes
    codec.patch_offsets(record, queue_offset, body_pos)
    return record, queue_offset


PLACE_RECORD = compiled_or("place_record", place_record)


def place_records(
    bodies: list[bytes], body_positions: list[int], next_offsets: dict
) -> tuple[list[bytearray], list[int]]:
    """`place_record` for each of a batch of records, in order: (the records as stored,
    their queue offsets). Compiled where the build allows (PLACE_RECORDS)."""
    records, queue_offsets = [], []
    for body, body_pos in zip(bodies, body_positions, strict=True):
        record, queue_offset = place_record(body, body_pos, next_offsets)
        records.append(record)
        queue_offsets.append(queue_offset)
    return records, queue_offsets


PLACE_RECORDS = compiled_or("place_records", place_records)


def pull_body(
    entries, codes, max_count, max_bytes, maps, segment_size, low, high, read, matches=None
) -> tuple[bytes, int, int, int]:
    """A pull's response body from `entries` (ConsumeQueue entries from the pulled
    offset on): (the records taken, concatenated; how many; how many entries were
    scanned; the physical offset of the last one taken, or -1).

    The scan stops before an entry once `max_count` records are taken or when its
    record would bring the body past `max_bytes` (the first is taken whatever its
    size): RocketMQ's maxTransferCountOnMessageInMemory and ...BytesOnMessageInMemory.
    An entry whose tags code is not in `codes` (None: every one) is skipped, as is a
    record whose raw PROPERTIES bytes `matches` refuses (an SQL92 filter: the properties,
    TAGS and the other system ones among them, are all it reads). `matches` must give
    the same answer each time it is asked about the same bytes: the compiled call may
    ask again, through this twin, when a record is odd. Whatever it raises ends the
    pull. A record inside [`low`, `high`) is copied from its segment's buffer in `maps`
    (segment start -> buffer, segments of `segment_size` bytes), as the log's `read_at`
    would slice it; any other is read with `read(physical offset, size)`, which raises
    IndexError for one not stored. Compiled where the build allows (PULL_BODY)."""
    parts = []
    total = scanned = 0
    last = -1
    for phys, size, tags in ENTRY.iter_unpack(entries):
        if len(parts) >= max_count or (parts and total + size > max_bytes):
            break
        scanned += 1
        if codes is not None and tags not in codes:
            continue
        record = None
        if low <= phys and size >= 0 and phys <= high - size:
            offset = phys % segment_size
            buffer = maps.get(phys - offset)
            if buffer is not None and offset + size <= len(buffer):
                record = buffer[offset : offset + size]
        if record is None:
            record = read(phys, size)
        if matches is not None and not matches(codec.READ_DISPATCH_FIELDS(record)[6]):
            continue
        parts.append(record)
        total += size
        last = phys
    return b"".join(parts), len(parts), scanned, last


PULL_BODY = compiled_or("pull_body", pull_body)


class RecordReads:
    """Reads of CommitLog records by physical offset, over `store.read_at` (the DLedger
    log's entries, or the classic files): shared by both CommitLogs."""

    store: LogEntries
    # The classic files a DLedger log continues after an upgrade in place (`upgrade`):
    # they hold the offsets below its beginning.
    old_log: ClassicLog | None = None

    def holder(self, physical_offset: int) -> LogEntries:
        """The log holding `physical_offset`."""
        return self.store

    def read(self, physical_offset: int, size: int) -> bytes:
        """The record of `size` bytes at `physical_offset` (IndexError if not stored)."""
        return self.holder(physical_offset).read_at(physical_offset, size)

    def read_message(self, physical_offset: int) -> bytes:
        """The whole record at `physical_offset`, its size read from the record."""
        (size,) = _INT.unpack_from(self.holder(physical_offset).read_at(physical_offset, 4))
        return self.read(physical_offset, size)

    def scan(self, first: int, last: int) -> Iterator[tuple[int, DispatchRequest | None]]:
        """`scan_rows`, each message's fields as a DispatchRequest."""
        for rows in self.scan_rows(first, last):
            for index, fields in rows:
                yield index, None if fields is None else DispatchRequest(*fields)

    def read_pulled(
        self,
        entries: bytes | bytearray,
        codes: frozenset[int] | None,
        max_count: int,
        max_bytes: int,
        matches: Callable[[bytes], bool] | None = None,
    ) -> tuple[bytes, int, int, int]:
        """`pull_body` over this log: records in the log's mapped segments are copied
        from them in one call, the rest (the files before an upgrade) read one by one."""
        maps, segment_size, low, high = self.store.mapped_data()
        return PULL_BODY(
            entries, codes, max_count, max_bytes, maps, segment_size, low, high, self.read, matches
        )


class DLedgerCommitLog(RecordReads):
    """The broker's view of the DLedger log: put records, read them by physical offset.

    `next_offsets` is the leader's topic-queue offset table (RocketMQ's
    `topicQueueTable`): the next queue offset per (topic, queueId). The broker
    rebuilds it from the ConsumeQueues each time this node becomes master.
    """

    def __init__(self, server: ReplicatedLog) -> None:
        self.server = server
        self.store = server.store
        self.next_offsets: dict[tuple[str, int], int] = {}
        self._in_flight = 0  # appends handed to DLedger that it has not answered
        self._next_pos = 0  # where the next record goes while some are in flight

    def reset_offsets(self, table: dict[tuple[str, int], int]) -> None:
        """Install the offset table of a new term."""
        self.next_offsets = dict(table)

    async def put(self, records: list[bytes]) -> list[tuple[int, int]]:
        """Append records as one request; returns (physical offset, queue offset) of
        each once a quorum has it on disk. Raises dledger's DLedgerError."""
        awaited = Awaited()
        self.put_nowait(records, awaited)
        code, placed = await awaited.result()
        if code is not Code.SUCCESS:
            raise DLedgerError(code)
        return placed

    def put_nowait(self, records: list[bytes], done: Callable[[Code, list | None], None]) -> None:
        """`put` with a callback: `done(code, [(physical offset, queue offset)] or None)`.

        The records are placed here, as the log's next entries: each is given its
        physical offset and the next offset of its queue, once."""
        at_pos = self._next_pos if self._in_flight else self.store.end_pos
        sizes = [BODY_OFFSET + len(record) for record in records]
        positions = dentry.places(at_pos, sizes, self.store.segment_size)
        body_positions = [pos + BODY_OFFSET for pos in positions]
        placed, queue_offsets = PLACE_RECORDS(records, body_positions, self.next_offsets)
        end_pos = positions[-1] + sizes[-1]
        self._next_pos = end_pos
        self._in_flight += 1

        def finished(code: Code, entries) -> None:
            self._in_flight -= 1
            if code is Code.SUCCESS:
                if entries[0][1] + BODY_OFFSET != body_positions[0]:
                    raise AssertionError(
                        f"messages placed at physical offset {body_positions[0]} were "
                        f"written at {entries[0][1] + BODY_OFFSET}"
                    )
                done(code, list(zip(body_positions, queue_offsets, strict=True)))
                return
            if code in NOT_APPENDED:  # and every append placed after it: start again here
                self._give_back(placed, queue_offsets)
                self._next_pos = min(self._next_pos, at_pos)
            done(code, None)

        self.server.append_nowait(placed, finished, placed=(at_pos, end_pos))

    def _give_back(self, records: list[bytearray], queue_offsets: list[int]) -> None:
        """The queue offsets of placed records DLedger refused to write: each queue's next
        offset goes back to the lowest it gave them. (DLedger refuses the appends placed
        after a refused one too, so what is given back is everything assigned since.)"""
        next_offsets = self.next_offsets
        for record, queue_offset in zip(records, queue_offsets, strict=True):
            _total, queue_id, _q, sysflag, _ts, topic, _props = codec.READ_DISPATCH_FIELDS(record)
            if codec.MessageSysFlag.get_transaction_value(sysflag) in (
                TRANSACTIONS_WITHOUT_QUEUE_OFFSET
            ):
                continue
            key = (topic, queue_id)
            next_offsets[key] = min(next_offsets[key], queue_offset)

    def scan_rows(self, first: int, last: int) -> Iterator[list[tuple[int, tuple | None]]]:
        """(index, DispatchRequest fields) for entries first..last, a list per read; None
        for a NOOP entry."""
        store = self.store
        index = first
        while index <= last:
            blob, count = store.read_encoded(index, 1 << 20)
            rows, error = DISPATCH_ROWS(blob, last)
            if rows:
                yield rows
            if error is not None:
                raise error
            if rows and rows[-1][0] >= last:
                return
            index += count
