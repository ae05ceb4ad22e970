"""RocketMQ 5's POP vocabulary, shared by the broker and the client: the extraInfo a
popped message carries (its receipt handle), the offset-info strings of a
POP_MESSAGE response, and the retry topic's name.

extraInfo (`ExtraInfoUtil.buildExtraInfo`, the message's `POP_CK` property) is eight
fields separated by one space: `<ckStartOffset> <popTime ms> <invisibleTime ms>
<reviveQueueId> <topicType> <brokerName> <queueId> <queueOffset>`; the proxy's receipt
handle appends the message's commit-log offset as a ninth. topicType is 0 for a normal
topic, 1 for a V1 retry topic (`%RETRY%<group>_<topic>`), 2 for a V2 one
(`%RETRY%<group>+<topic>`); reviveQueueId 999 marks an orderly (FIFO) pop. Expiry is
popTime + invisibleTime.
"""

from __future__ import annotations

import base64

import attrs

RETRY_PREFIX = "%RETRY%"
ORDER_REVIVE_QID = 999  # KeyBuilder.POP_ORDER_REVIVE_QUEUE
NORMAL_TOPIC, RETRY_TOPIC_V1, RETRY_TOPIC_V2 = 0, 1, 2
PROPERTY_POP_CK = "POP_CK"
PROPERTY_FIRST_POP_TIME = "1ST_POP_TIME"
# raftmq's: on a redelivered copy, the commit-log offset of the message it copies (each
# round copies the last one), so a master can tell a copy it finds already written
PROPERTY_REVIVED_FROM = "POP_REVIVED_FROM"
INIT_MODE_MIN, INIT_MODE_MAX = 0, 1  # ConsumeInitMode


def retry_topic(group: str, topic: str) -> str:
    """KeyBuilder.buildPopRetryTopicV1: the V1 retry topic of `group` consuming `topic`."""
    return f"{RETRY_PREFIX}{group}_{topic}"


def queue_topic(group: str, topic: str, kind: int) -> str:
    """The topic a handle's queue belongs to: the origin topic, or `group`'s V1 or V2
    retry topic of it, by the handle's topic type."""
    if kind == RETRY_TOPIC_V1:
        return retry_topic(group, topic)
    if kind == RETRY_TOPIC_V2:
        return f"{RETRY_PREFIX}{group}+{topic}"
    return topic


def encode_bitset(indexes: list[int]) -> str:
    """A BATCH_ACK_MESSAGE entry's `b`: Java's `BitSet.toByteArray()` (bit i is bit i % 8
    of byte i // 8, trailing zero bytes dropped) as base64, which is how RocketMQ's
    BitSetSerializerDeserializer writes it through fastjson."""
    data = bytearray((max(indexes) // 8 + 1) if indexes else 0)
    for index in indexes:
        data[index // 8] |= 1 << (index % 8)
    return base64.b64encode(bytes(data)).decode()


def decode_bitset(text: str) -> list[int]:
    """The indexes set in an `encode_bitset` text; HandleError if it is not base64."""
    try:
        data = base64.b64decode(str(text), validate=True)
    except (ValueError, TypeError):
        raise HandleError(f"bitset {text!r} is not base64") from None
    return [i * 8 + bit for i, byte in enumerate(data) for bit in range(8) if byte >> bit & 1]


def topic_type(topic: str) -> int:
    """ExtraInfoUtil.getRetry: which kind of topic a popped message was read from."""
    if not topic.startswith(RETRY_PREFIX):
        return NORMAL_TOPIC
    return RETRY_TOPIC_V2 if "+" in topic else RETRY_TOPIC_V1


class HandleError(ValueError):
    """An extraInfo or receipt handle that does not parse; the text says what is wrong."""


@attrs.frozen
class ReceiptHandle:
    """One popped message's extraInfo, parsed. `commit_log_offset` is -1 when the text
    had the eight remoting fields only."""

    start_offset: int  # ckStartOffset: the first offset of the popped batch
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int
    topic_type: int
    broker_name: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int = -1

    @property
    def visible_at_ms(self) -> int:
        return self.pop_time_ms + self.invisible_ms

    @property
    def is_order(self) -> bool:
        return self.revive_qid == ORDER_REVIVE_QID

    def extra_info(self) -> str:
        """The eight-field text remoting ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME carry."""
        return " ".join(
            str(v)
            for v in (
                self.start_offset, self.pop_time_ms, self.invisible_ms, self.revive_qid,
                self.topic_type, self.broker_name, self.queue_id, self.queue_offset,
            )
        )  # fmt: skip

    def encode(self) -> str:
        """The proxy's receipt handle: extraInfo and the commit-log offset."""
        return f"{self.extra_info()} {self.commit_log_offset}"

    @classmethod
    def parse(cls, text: str) -> ReceiptHandle:
        """An extraInfo (8 fields) or a receipt handle (9); HandleError if neither."""
        fields = str(text).split(" ")
        if len(fields) not in (8, 9):
            raise HandleError(f"extraInfo has {len(fields)} fields, expected 8 or 9: {text!r}")
        try:
            numbers = [int(f) for i, f in enumerate(fields) if i != 5]
        except ValueError:
            raise HandleError(f"extraInfo has a field that is not a number: {text!r}") from None
        so, pt, it, rq, t, qid, qo, *clo = numbers
        if t not in (NORMAL_TOPIC, RETRY_TOPIC_V1, RETRY_TOPIC_V2):
            raise HandleError(f"extraInfo has topic type {t}, expected 0, 1 or 2: {text!r}")
        return cls(so, pt, it, rq, t, fields[5], qid, qo, clo[0] if clo else -1)


def join_infos(entries: list[str]) -> str:
    return ";".join(entries)


def start_offset_info(topic: str, queue_id: int, start_offset: int) -> str:
    """One startOffsetInfo entry (ExtraInfoUtil.buildStartOffsetInfo)."""
    return f"{topic_type(topic)} {queue_id} {start_offset}"


def msg_offset_info(topic: str, queue_id: int, offsets: list[int]) -> str:
    """One msgOffsetInfo entry (ExtraInfoUtil.buildMsgOffsetInfo)."""
    return f"{topic_type(topic)} {queue_id} {','.join(str(o) for o in offsets)}"


def order_count_info(topic: str, queue_id: int, counts: dict[int, int]) -> str:
    """orderCountInfo entries of one queue (ExtraInfoUtil.buildQueueOffsetOrderCountInfo
    per offset, then buildQueueIdOrderCountInfo with the least count)."""
    t = topic_type(topic)
    parts = [f"{t} qo{queue_id}%{offset} {count}" for offset, count in counts.items()]
    parts.append(f"{t} {queue_id} {min(counts.values(), default=0)}")
    return ";".join(parts)


def parse_start_offsets(text: str | None) -> dict[tuple[int, int], int]:
    """startOffsetInfo -> {(topicType, queueId): startOffset}."""
    found = {}
    for entry in filter(None, (text or "").split(";")):
        t, q, so = entry.split(" ")
        found[(int(t), int(q))] = int(so)
    return found


def parse_msg_offsets(text: str | None) -> dict[tuple[int, int], list[int]]:
    """msgOffsetInfo -> {(topicType, queueId): [offsets]}."""
    found = {}
    for entry in filter(None, (text or "").split(";")):
        t, q, offsets = entry.split(" ")
        found[(int(t), int(q))] = [int(o) for o in offsets.split(",")]
    return found


def parse_order_counts(text: str | None) -> dict[tuple[int, int, int], int]:
    """orderCountInfo -> {(topicType, queueId, offset): count}; the per-queue least
    counts are left out (each offset has its own)."""
    found = {}
    for entry in filter(None, (text or "").split(";")):
        t, key, count = entry.split(" ")
        if key.startswith("qo"):
            q, offset = key[2:].split("%")
            found[(int(t), int(q), int(offset))] = int(count)
    return found
