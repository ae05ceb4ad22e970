"""Message traces: RocketMQ's trace records, their text format, and their sending.

A client that traces (the Java client's `enableMsgTrace`) sends, besides its own
messages, records of what it did to a trace topic (`RMQ_SYS_TRACE_TOPIC` unless named):
a `Pub` after each send, a `SubBefore` and a `SubAfter` around each consumption. The
format is `TraceDataEncoder`'s: the fields of a record joined by CONTENT_SPLITOR
(U+0001), each record ended by FIELD_SPLITOR (U+0002), several records to one trace
message, whose KEYS are the traced msgIds and their keys (so the broker's key index
finds a message's records by its msgId). The same text comes from the Java, C++ and
Go clients, and `decode` reads theirs: `mqadmin queryMsgTraceById` and the console
print what it returns.

`TraceDispatcher` sends records as the Java client's `AsyncTraceDispatcher` does: in
the background, in batches, never slowing or failing the traced send or consumption.
Its queue is bounded; a record that finds it full is dropped and counted.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Iterable

import attrs
import trio

from raftmq.client.errors import MQClientError
from raftmq.client.instance import local_ip
from raftmq.protocol.message import MessageConst, MessageExt
from raftmq.protocol.msgid import UniqIdGenerator

__all__ = [
    "TRACE_TOPIC",
    "ConsumeReturnType",
    "MessageType",
    "TraceDispatcher",
    "TraceRecord",
    "TraceType",
    "consume_records",
    "decode",
    "encode",
    "new_request_id",
    "records_of",
    "trace_keys",
]

log = logging.getLogger(__name__)

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"  # TopicValidator.RMQ_SYS_TRACE_TOPIC
CONTENT_SPLITOR = "\u0001"  # TraceConstants: between the fields of a record
FIELD_SPLITOR = "\u0002"  # TraceConstants: after each record
KEY_SEPARATOR = " "  # MessageConst.KEY_SEPARATOR
GROUP_NAME_PREFIX = "_INNER_TRACE_PRODUCER"  # TraceConstants: the trace producer's group
DEFAULT_REGION = "DefaultRegion"
MAX_BATCH_RECORDS = 100  # AsyncTraceDispatcher's batchSize
MAX_MESSAGE_BYTES = 128 * 1024  # AsyncTraceDispatcher's maxMsgSize
QUEUE_RECORDS = 2048  # AsyncTraceDispatcher's queueSize
CLOSE_TIMEOUT_S = 3.0  # what a closing dispatcher waits for its last records to go
_request_ids = UniqIdGenerator(ip=local_ip())


class TraceType(enum.Enum):
    Pub = "Pub"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class MessageType(enum.IntEnum):
    """`MessageType`, written as its ordinal."""

    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3
    Order_Msg = 4


class ConsumeReturnType(enum.IntEnum):
    """`ConsumeReturnType`: a SubAfter's contextCode."""

    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


@attrs.frozen
class TraceRecord:
    """One record: Java's `TraceContext` with its one `TraceBean`. Which fields a type
    writes is `encode`'s; the others keep their defaults when decoded. A SubAfter from
    a client before 4.9 carries no timestamp or group (0 and "")."""

    type: TraceType
    msg_id: str
    timestamp_ms: int = 0
    region_id: str = DEFAULT_REGION
    group: str = ""
    topic: str = ""
    tags: str | None = None  # None is written "null", as Java writes a null
    keys: str | None = None
    store_host: str = ""
    body_length: int = 0
    cost_ms: int = 0
    msg_type: MessageType = MessageType.Normal_Msg
    offset_msg_id: str = ""
    success: bool = True
    request_id: str = ""
    retry_times: int = 0
    context_code: int = 0
    client_host: str = ""  # RocketMQ 5's Pub field; else the trace message's born host


def consume_records(
    group: str,
    messages: list[MessageExt],
    request_id: str,
    started_ms: int,
    outcome: ConsumeReturnType | None,
) -> list[TraceRecord]:
    """SubBefore records of a consumption (`outcome` None) or its SubAfter ones
    (`ConsumeMessageTraceHookImpl`): one per message, paired by `request_id`; the
    cost is the consumption's time shared out among its messages. A message sent with
    TRACE_ON=false is left out."""
    traced = [m for m in messages if m.get_property(MessageConst.PROPERTY_TRACE_SWITCH) != "false"]
    if outcome is None:
        return [
            TraceRecord(
                TraceType.SubBefore,
                m.uniq_key or m.msg_id,
                timestamp_ms=started_ms,
                region_id=m.get_property(MessageConst.PROPERTY_MSG_REGION) or DEFAULT_REGION,
                group=group,
                tags=m.tags,
                keys=m.keys,
                request_id=request_id,
                retry_times=m.reconsume_times,
            )
            for m in traced
        ]
    now_ms = int(time.time() * 1000)
    return [
        TraceRecord(
            TraceType.SubAfter,
            m.uniq_key or m.msg_id,
            timestamp_ms=now_ms,
            group=group,
            keys=m.keys,
            cost_ms=(now_ms - started_ms) // max(1, len(messages)),
            success=outcome is ConsumeReturnType.SUCCESS,
            request_id=request_id,
            context_code=int(outcome),
        )
        for m in traced
    ]


def _text(value: str | None) -> str:
    return "null" if value is None else value  # what Java's StringBuilder appends


def new_request_id() -> str:
    """A consumption's requestId, which pairs its SubBefore and SubAfter records
    (Java's TraceContext takes a fresh `MessageClientIDSetter.createUniqID()`)."""
    return _request_ids.next_id()


def encode(record: TraceRecord) -> str:
    """`TraceDataEncoder.encoderFromContextBean`'s text for one record (4.9's fields)."""
    head = [record.type.value, str(record.timestamp_ms), record.region_id, record.group]
    if record.type is TraceType.Pub:
        fields = [
            *head,
            record.topic,
            record.msg_id,
            record.tags,
            record.keys,
            record.store_host,
            str(record.body_length),
            str(record.cost_ms),
            str(int(record.msg_type)),
            record.offset_msg_id,
            _boolean(record.success),
        ]
    elif record.type is TraceType.SubBefore:
        fields = [
            *head,
            record.request_id,
            record.msg_id,
            str(record.retry_times),
            record.keys,
        ]
    elif record.type is TraceType.SubAfter:
        fields = [
            record.type.value,
            record.request_id,
            record.msg_id,
            str(record.cost_ms),
            _boolean(record.success),
            record.keys,
            str(record.context_code),
            str(record.timestamp_ms),
            record.group,
        ]
    else:
        raise ValueError(f"raftmq's clients write no {record.type.value} records")
    return CONTENT_SPLITOR.join(_text(f) for f in fields) + FIELD_SPLITOR


def _boolean(value: bool) -> str:
    return "true" if value else "false"


def _parse_boolean(text: str) -> bool:
    return text.lower() == "true"  # Boolean.parseBoolean


def decode(data: str) -> list[TraceRecord]:
    """The records of a trace message's body (`decoderFromTraceDataString`): Pub,
    SubBefore and SubAfter of every client version, EndTransaction; other types are
    skipped, as Java skips them. ValueError for a record too short for its type or
    with a number that does not parse."""
    records = []
    for text in data.split(FIELD_SPLITOR):
        line = text.split(CONTENT_SPLITOR)
        try:
            record = _decode_line(line)
        except (IndexError, ValueError) as exc:
            raise ValueError(f"not a trace record: {text!r} ({exc})") from None
        if record is not None:
            records.append(record)
    return records


def _decode_line(line: list[str]) -> TraceRecord | None:
    kind = line[0]
    if kind == TraceType.Pub.value:
        offset_msg_id, success, client_host = "", True, ""
        if len(line) == 13:
            success = _parse_boolean(line[12])
        elif len(line) >= 14:
            offset_msg_id, success = line[12], _parse_boolean(line[13])
            if len(line) >= 15:
                client_host = line[14]
        return _published(
            TraceType.Pub,
            line,
            body_length=int(line[9]),
            cost_ms=int(line[10]),
            msg_type=MessageType(int(line[11])),
            offset_msg_id=offset_msg_id,
            success=success,
            client_host=client_host,
        )
    if kind == TraceType.SubBefore.value:
        return TraceRecord(
            TraceType.SubBefore,
            line[5],
            timestamp_ms=int(line[1]),
            region_id=line[2],
            group=line[3],
            request_id=line[4],
            retry_times=int(line[6]),
            keys=line[7],
        )
    if kind == TraceType.SubAfter.value:
        timestamp_ms, group = 0, ""
        if len(line) >= 9:
            timestamp_ms, group = int(line[7]), line[8]
        return TraceRecord(
            TraceType.SubAfter,
            line[2],
            request_id=line[1],
            cost_ms=int(line[3]),
            success=_parse_boolean(line[4]),
            keys=line[5],
            context_code=int(line[6]) if len(line) >= 7 else 0,
            timestamp_ms=timestamp_ms,
            group=group,
        )
    if kind == TraceType.EndTransaction.value:
        return _published(TraceType.EndTransaction, line, msg_type=MessageType(int(line[9])))
    return None  # an empty tail after the last FIELD_SPLITOR, or a type 4.9 lacks


def records_of(msg_id: str, message: MessageExt) -> list[TraceRecord]:
    """The records about `msg_id` in a trace message (`TraceView.decodeFromTraceTransData`),
    each with its client host: the record's own (RocketMQ 5's Pub), else the IP the
    trace message was born on. A body that is no trace text gives none (logged): one
    client's bad record does not hide the others'."""
    try:
        records = decode((message.body or b"").decode("utf-8", errors="replace"))
    except ValueError as exc:
        log.warning("trace message %s skipped: %s", message.msg_id, exc)
        return []
    born_ip = message.born_host[0]
    return [
        attrs.evolve(r, client_host=r.client_host or born_ip) for r in records if r.msg_id == msg_id
    ]


def _published(kind: TraceType, line: list[str], **fields) -> TraceRecord:
    """A Pub or EndTransaction record: the eight fields after the type are the same."""
    return TraceRecord(
        kind,
        line[5],
        timestamp_ms=int(line[1]),
        region_id=line[2],
        group=line[3],
        topic=line[4],
        tags=line[6],
        keys=line[7],
        store_host=line[8],
        **fields,
    )


def trace_keys(record: TraceRecord) -> list[str]:
    """The KEYS a record adds to its trace message: its msgId and its message's keys."""
    return [record.msg_id, *(k for k in (record.keys or "").split(KEY_SEPARATOR) if k)]


class TraceDispatcher:
    """Sends trace records to `topic` in the background through `producer`, a
    `Producer` of its own (group `_INNER_TRACE_PRODUCER-<traced group>`), which the
    dispatcher enters and closes. `submit` never waits: a record that finds
    `queue_records` records waiting is dropped and counted in `dropped`; records go
    out at most `MAX_BATCH_RECORDS` (and 128 KiB) to a message, as soon as the sender
    is free. A failed trace send is logged and its records counted in `dropped`; the
    traced work never sees it."""

    def __init__(self, producer, topic: str = TRACE_TOPIC, queue_records: int = QUEUE_RECORDS):
        self.producer = producer
        self.topic = topic
        self.dropped = 0
        self.sent_records = 0
        self._send_channel, self._receive_channel = trio.open_memory_channel(queue_records)
        self._done = trio.Event()
        self._started = False

    async def __aenter__(self) -> TraceDispatcher:
        await self.producer.__aenter__()
        self.producer.instance.nursery.start_soon(self._run)
        self._started = True
        return self

    async def __aexit__(self, *exc_info) -> None:
        """Sends what is queued (waiting `CLOSE_TIMEOUT_S` at most), then closes; nothing
        to do if it never started (its owner failed to start before it)."""
        if not self._started:
            return
        try:
            self._send_channel.close()
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                await self._done.wait()
        finally:
            await self.producer.__aexit__(*exc_info)

    def submit(self, records: Iterable[TraceRecord]) -> None:
        for record in records:
            try:
                self._send_channel.send_nowait(record)
            except (trio.WouldBlock, trio.ClosedResourceError):
                self.dropped += 1

    async def _run(self) -> None:
        try:
            async for first in self._receive_channel:
                batch = [first]
                while len(batch) < MAX_BATCH_RECORDS:
                    try:
                        batch.append(self._receive_channel.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._send(batch)
        finally:
            self._done.set()

    async def _send(self, batch: list[TraceRecord]) -> None:
        texts = [encode(record).encode() for record in batch]
        per_message = max(1, math.floor(len(batch) * MAX_MESSAGE_BYTES / sum(map(len, texts))))
        for start in range(0, len(batch), per_message):
            records = batch[start : start + per_message]
            keys = dict.fromkeys(k for record in records for k in trace_keys(record))
            body = b"".join(texts[start : start + per_message])
            try:
                await self.producer.send(self.topic, body, keys=list(keys))
            except MQClientError as exc:
                log.warning("%d trace records not sent to %s: %s", len(records), self.topic, exc)
                self.dropped += len(records)
            else:
                self.sent_records += len(records)
