"""DLedgerCommitLog: RocketMQ CommitLog messages stored one per DLedger entry.

As in RocketMQ's DLedger mode, an entry's body is exactly one serialized CommitLog
record, and a message's physical offset is the entry's position + 48 (the body's
first byte in the DLedger data files). The leader writes both offsets into the
record through the store's append hook, at the moment the entry is placed and
before its bytes reach the file: queue offsets therefore follow log order exactly
(an append the replica refuses never consumes one), and since followers store the
leader's bytes at the leader's positions, every replica holds the same offsets and
the same msgIds.

Reads here are raw: `read` by physical offset (what ConsumeQueue entries and
msgIds point at) and `DLedgerCommitLog.scan` of committed entries for the dispatcher, which skips
the NOOP entries a new DLedger leader appends (RocketMQ's scanner does not know
them).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import attrs
import trio

from raftmq.broker.store.replicated_log import ReplicatedLog
from raftmq.dledger.codes import Code, EntryType
from raftmq.dledger.server import DLedgerError
from raftmq.dledger.store import entry as dentry
from raftmq.protocol import message as codec

BODY_OFFSET = dentry.HEADER_SIZE  # DLedgerEntry.BODY_OFFSET: physical offset = pos + 48

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_QUEUE_OFFSETS = struct.Struct(">qq")
_TAGS = (codec.MessageConst.PROPERTY_TAGS + codec.NAME_VALUE_SEPARATOR).encode()
_SEPARATOR = codec.PROPERTY_SEPARATOR.encode()
_TRANSACTION_NO_OFFSET = (
    codec.MessageSysFlag.TRANSACTION_PREPARED_TYPE,
    codec.MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
)


@attrs.define(slots=True)
class DispatchRequest:
    """What one committed message contributes to its ConsumeQueue (not frozen: a frozen
    attrs class costs three times as much to build, once per message per replica)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    sysflag: int
    tags_code: int
    store_timestamp: int


_HEAD = struct.Struct(">iiiiiqqi")  # TOTALSIZE .. SYSFLAG
_BORN_V6 = codec.MessageSysFlag.BORNHOST_V6_FLAG
_STORE_V6 = codec.MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_SHORT = struct.Struct(">h")


def _layout(view, offset: int) -> tuple[int, int, int]:
    """(sysflag, store timestamp position, topic length position) of a record the broker
    itself wrote (V1 magic), without a full decode."""
    (sysflag,) = _INT.unpack_from(view, offset + codec.SYSFLAG_POSITION)
    return (sysflag, *_positions(view, offset, sysflag))


def _positions(view, offset: int, sysflag: int) -> tuple[int, int]:
    ts_pos = offset + codec.BORN_HOST_POSITION + (20 if sysflag & _BORN_V6 else 8)
    body_len_pos = ts_pos + (40 if sysflag & _STORE_V6 else 28)  # + hosts, reconsume, tx
    (body_len,) = _INT.unpack_from(view, body_len_pos)
    return ts_pos, body_len_pos + 4 + body_len


def dispatch_request(view, offset: int, physical_offset: int) -> DispatchRequest:
    """The dispatch fields of the record at `offset` of `view` (a committed entry body).

    The tags code is the hash of the TAGS property, or for a delayed message in
    the schedule topic its delivery time (which RocketMQ keeps there instead).
    """
    total, magic, _crc, queue_id, _flag, queue_offset, _phys, sysflag = _HEAD.unpack_from(
        view, offset
    )
    if magic != codec.MESSAGE_MAGIC_CODE:
        raise codec.MessageFormatError(f"not a V1 message at physical offset {physical_offset}")
    ts_pos, topic_pos = _positions(view, offset, sysflag)
    (store_timestamp,) = _LONG.unpack_from(view, ts_pos)
    topic_end = topic_pos + 1 + view[topic_pos]
    topic = str(view[topic_pos + 1 : topic_end], "utf-8")
    (props_len,) = _SHORT.unpack_from(view, topic_end)
    properties = bytes(view[topic_end + 2 : topic_end + 2 + props_len])
    return DispatchRequest(
        topic,
        queue_id,
        queue_offset,
        physical_offset,
        total,
        sysflag,
        _tags_code(properties) if properties else 0,
        store_timestamp,
    )


def _tags_code(properties: bytes) -> int:
    at = properties.find(_TAGS)
    if at < 0 or (at > 0 and properties[at - 1 : at] != _SEPARATOR):
        return 0
    start = at + len(_TAGS)
    end = properties.find(_SEPARATOR, start)
    return codec.tags_code(properties[start : end if end >= 0 else None].decode())


def topic_and_queue(body: bytes) -> tuple[str, int]:
    """(topic, queueId) of an encoded record (the append hook's lookup)."""
    _sysflag, _ts, topic_pos = _layout(body, 0)
    topic_len = body[topic_pos]
    (queue_id,) = _INT.unpack_from(body, codec.QUEUE_ID_POSITION)
    return body[topic_pos + 1 : topic_pos + 1 + topic_len].decode(), queue_id


class DLedgerCommitLog:
    """The broker's view of the DLedger log: put records, read them by physical offset.

    `next_offsets` is the leader's topic-queue offset table (RocketMQ's
    `topicQueueTable`): the next queue offset per (topic, queueId). The broker
    rebuilds it from the ConsumeQueues each time this node becomes master.
    """

    def __init__(self, replicated_log: ReplicatedLog) -> None:
        self.replicated_log = replicated_log
        self.store = replicated_log.store
        self.next_offsets: dict[tuple[str, int], int] = {}
        self._assigned: dict[int, int] = {}  # physical offset -> queue offset, until taken
        self.store.append_hook = self._place

    def _place(self, body_pos: int, body: bytes) -> bytes:
        key = topic_and_queue(body)
        (sysflag,) = _INT.unpack_from(body, codec.SYSFLAG_POSITION)
        if codec.MessageSysFlag.get_transaction_value(sysflag) in _TRANSACTION_NO_OFFSET:
            queue_offset = 0
        else:
            queue_offset = self.next_offsets.get(key, 0)
            self.next_offsets[key] = queue_offset + 1
        self._assigned[body_pos] = queue_offset
        record = bytearray(body)  # the entry codec concatenates it; no copy back to bytes
        _QUEUE_OFFSETS.pack_into(record, codec.QUEUE_OFFSET_POSITION, queue_offset, body_pos)
        return record

    def reset_offsets(self, table: dict[tuple[str, int], int]) -> None:
        """Install the offset table of a new term (and forget unclaimed assignments)."""
        self.next_offsets = dict(table)
        self._assigned.clear()

    async def put(self, records: list[bytes]) -> list[tuple[int, int]]:
        """Append records as one request; returns (physical offset, queue offset) of
        each once a quorum has it on disk. Raises dledger's DLedgerError."""
        appended = trio.Event()
        outcome: list = []

        def finished(code: Code, placed) -> None:
            outcome[:] = [code, placed]
            appended.set()

        self.replicated_log.append_nowait(records, finished)
        await appended.wait()
        code, placed = outcome
        if code is not Code.SUCCESS:
            raise DLedgerError(code)
        return self._claim(placed)

    def put_nowait(self, records: list[bytes], done: Callable[[Code, list | None], None]) -> None:
        """`put` with a callback: `done(code, [(physical offset, queue offset)] or None)`."""

        def finished(code: Code, placed) -> None:
            done(code, self._claim(placed) if code is Code.SUCCESS else None)

        self.replicated_log.append_nowait(records, finished)

    def _claim(self, placed: list[tuple[int, int]]) -> list[tuple[int, int]]:
        assigned = self._assigned
        return [(pos + BODY_OFFSET, assigned.pop(pos + BODY_OFFSET, 0)) for _i, pos in placed]

    def read(self, physical_offset: int, size: int) -> bytes:
        """The record of `size` bytes at `physical_offset` (IndexError if not stored)."""
        return self.store.read_at(physical_offset, size)

    def read_message(self, physical_offset: int) -> bytes:
        """The whole record at `physical_offset`, its size read from the record."""
        (size,) = _INT.unpack_from(self.store.read_at(physical_offset, 4))
        return self.read(physical_offset, size)

    def scan(self, first: int, last: int) -> Iterator[tuple[int, DispatchRequest | None]]:
        """(index, dispatch request) for entries first..last; None for a NOOP entry."""
        store = self.store
        index = first
        while index <= last:
            blob, count = store.read_encoded(index, 1 << 20)
            view = memoryview(blob)
            for offset, etype, _size, e_index, _term, pos, _chain in dentry.iter_entries(view):
                if e_index > last:
                    return
                if etype == EntryType.NOOP:
                    yield e_index, None
                else:
                    yield e_index, dispatch_request(view, offset + BODY_OFFSET, pos + BODY_OFFSET)
            index += count
