"""SendMessage's checks and its mapping onto a stored RocketMQ message.

`check_message` makes Apache's SendMessageActivity checks in its order, each failure a
`Refusal` with the v2 `Code` and a message naming the field; `message_type` infers the
type from what the message carries (TRANSACTION, DELAY, FIFO, NORMAL, in Apache's
order); `stored_properties` writes the properties a RocketMQ 4.x/5.x consumer reads
(TAGS, KEYS, UNIQ_KEY, TIMER_DELIVER_MS, __SHARDINGKEY, TRAN_MSG, PGROUP, ...);
`fifo_queue_index` is Guava's `Hashing.consistentHash(group.hashCode(), n)`, so a
message group lands on the queue Apache's proxy would choose.
"""

from __future__ import annotations

import re

import attrs

from raftmq.protocol.message import MessageConst, java_string_hash
from raftmq.proxy.apis import definition

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DELAY_MS",
    "Refusal",
    "check_message",
    "fifo_queue_index",
    "message_type",
    "stored_properties",
]

Code = definition.Code
MessageType = definition.MessageType

MAX_BODY_BYTES = 4 * 1024 * 1024  # ProxyConfig maxMessageSize
MAX_USER_PROPERTIES = 128  # maxUserPropertyNum
MAX_PROPERTIES_BYTES = 16 * 1024  # maxMessagePropertySize: user props + tag + keys
MAX_GROUP_BYTES = 64  # maxMessageGroupSize
MAX_TOPIC_CHARS = 127
MAX_DELAY_MS = 24 * 3600 * 1000  # ProxyConfig maxDelayTimeMills
MAX_ORPHAN_RECOVERY_S = 3600  # maxTransactionRecoverySecond

TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
SHARDING_KEY = "__SHARDINGKEY"  # MessageConst.PROPERTY_SHARDING_KEY: the message group
BORN_HOST = "__BORNHOST"
BORN_TIMESTAMP = "BORN_TIMESTAMP"
TRACE_CONTEXT = "TRACE_CONTEXT"

# Names a user property may not take (Apache's MessageConst.STRING_HASH_SET).
RESERVED_KEYS = frozenset(
    {value for name, value in vars(MessageConst).items() if name.startswith("PROPERTY_")}
    | {TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, SHARDING_KEY, BORN_HOST}
    | {"TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES"}
    | {"TIMER_DEL_UNIQKEY", "POP_CK", "1ST_POP_TIME", "DLQ_ORIGIN_TOPIC", TRACE_CONTEXT}
    | {"POP_REVIVED_FROM"}  # raftmq's revive (raftmq.protocol.pop), not the user's
    | {"DLQ_ORIGIN_MESSAGE_ID", "__transactionId__", "INNER_NUM", "INNER_BASE", BORN_TIMESTAMP}
)
_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_")
SYSTEM_TOPICS = frozenset(
    {"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC"}
    | {"RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"}
)


@attrs.frozen
class Refusal(Exception):
    """A request refused with `code`; `message` names the field."""

    code: int
    message: str


def check_topic(topic: str) -> None:
    """ILLEGAL_TOPIC for a blank, too long, badly spelt or system topic."""
    if not topic.strip():
        raise Refusal(Code.ILLEGAL_TOPIC, "topic name cannot be blank")
    if len(topic) > MAX_TOPIC_CHARS:
        raise Refusal(Code.ILLEGAL_TOPIC, f"topic name {topic!r} is longer than 127 characters")
    if not _TOPIC.match(topic):
        raise Refusal(
            Code.ILLEGAL_TOPIC, f"topic name {topic!r} has characters other than [%|a-zA-Z0-9_-]"
        )
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES):
        raise Refusal(Code.ILLEGAL_TOPIC, f"topic {topic!r} is a system topic")


def message_type(message) -> int:
    """The v2 MessageType a message's fields make (`TopicMessageType.parseFromMessageProperty`
    order: transaction, delivery time, group, else normal)."""
    system = message.system_properties
    if system.message_type == MessageType.TRANSACTION:
        return MessageType.TRANSACTION
    if system.HasField("delivery_timestamp"):
        return MessageType.DELAY
    if system.HasField("message_group"):
        return MessageType.FIFO
    return MessageType.NORMAL


def check_message(message, now_ms: int, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Raise Refusal for the first check one message fails."""
    check_topic(message.topic.name)
    system = message.system_properties
    body = message.body
    if not body:
        raise Refusal(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body_bytes:
        raise Refusal(
            Code.MESSAGE_BODY_TOO_LARGE,
            f"message body is {len(body)} bytes, more than the {max_body_bytes} allowed",
        )
    user = message.user_properties
    if len(user) > MAX_USER_PROPERTIES:
        raise Refusal(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"{len(user)} user properties, more than {MAX_USER_PROPERTIES}",
        )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in user.items())
    size += len(system.tag.encode()) + sum(len(key.encode()) for key in system.keys)
    if size > MAX_PROPERTIES_BYTES:
        raise Refusal(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"user properties, tag and keys take {size} bytes, more than {MAX_PROPERTIES_BYTES}",
        )
    for key, value in user.items():
        if key in RESERVED_KEYS:
            raise Refusal(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {key!r} is a reserved name"
            )
        if not key or _CONTROL.search(key) or _CONTROL.search(value):
            raise Refusal(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"user property {key!r} is empty or has control characters",
            )
    if system.HasField("tag"):
        tag = system.tag
        if not tag.strip() or "|" in tag or _CONTROL.search(tag):
            raise Refusal(
                Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank or has '|' or control characters"
            )
    for key in system.keys:
        if not key.strip() or _CONTROL.search(key):
            raise Refusal(
                Code.ILLEGAL_MESSAGE_KEY, f"key {key!r} is blank or has control characters"
            )
    if system.HasField("message_group"):
        group = system.message_group
        if not group.strip() or len(group.encode()) >= MAX_GROUP_BYTES or _CONTROL.search(group):
            raise Refusal(
                Code.ILLEGAL_MESSAGE_GROUP,
                f"message_group {group!r} is blank, {MAX_GROUP_BYTES} bytes or longer,"
                " or has control characters",
            )
    if not system.message_id.strip():
        raise Refusal(Code.ILLEGAL_MESSAGE_ID, "message_id cannot be blank")
    if system.HasField("delivery_timestamp"):
        deliver_ms = system.delivery_timestamp.ToMilliseconds()
        if deliver_ms - now_ms > MAX_DELAY_MS:
            raise Refusal(
                Code.ILLEGAL_DELIVERY_TIME,
                f"delivery_timestamp is {deliver_ms - now_ms} ms ahead; max is {MAX_DELAY_MS}",
            )
    if system.HasField("orphaned_transaction_recovery_duration"):
        recovery_s = system.orphaned_transaction_recovery_duration.ToSeconds()
        if recovery_s > MAX_ORPHAN_RECOVERY_S:
            raise Refusal(
                Code.BAD_REQUEST,
                f"orphaned_transaction_recovery_duration is {recovery_s} s;"
                f" max is {MAX_ORPHAN_RECOVERY_S}",
            )


def check_type(message, topic_type: int) -> None:
    """MESSAGE_PROPERTY_CONFLICT_WITH_TYPE unless the message's type is the topic's
    (`DefaultTopicMessageTypeValidator`); a MIXED topic takes every type."""
    if topic_type == MessageType.MESSAGE_TYPE_UNSPECIFIED:  # MIXED
        return
    made = message_type(message)
    if made != topic_type:
        raise Refusal(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"topic {message.topic.name!r} accepts {MessageType.Name(topic_type)} messages,"
            f" this message is {MessageType.Name(made)}",
        )


def stored_properties(message, producer_group: str, born_host: str) -> dict[str, str]:
    """The RocketMQ properties of `message` (`SendMessageActivity.buildMessageProperty`)."""
    system = message.system_properties
    props = dict(message.user_properties)
    if system.HasField("tag"):
        props[MessageConst.PROPERTY_TAGS] = system.tag
    if system.keys:
        props[MessageConst.PROPERTY_KEYS] = MessageConst.KEY_SEPARATOR.join(system.keys)
    props[MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = system.message_id
    kind = message_type(message)
    if kind == MessageType.TRANSACTION:
        props[MessageConst.PROPERTY_TRANSACTION_PREPARED] = "true"
        if system.HasField("orphaned_transaction_recovery_duration"):
            seconds = system.orphaned_transaction_recovery_duration.ToSeconds()
            props[MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
    if system.HasField("delivery_timestamp"):
        props[TIMER_DELIVER_MS] = str(system.delivery_timestamp.ToMilliseconds())
    if system.delivery_attempt > 0:
        props[MessageConst.PROPERTY_RECONSUME_TIME] = str(system.delivery_attempt)
    props[MessageConst.PROPERTY_PRODUCER_GROUP] = producer_group
    if system.HasField("message_group"):
        props[SHARDING_KEY] = system.message_group
    if system.HasField("trace_context"):
        props[TRACE_CONTEXT] = system.trace_context
    props[BORN_HOST] = system.born_host or born_host
    if system.HasField("born_timestamp"):
        props[BORN_TIMESTAMP] = str(system.born_timestamp.ToMilliseconds())
    props[MessageConst.PROPERTY_WAIT_STORE_MSG_OK] = "true"
    return props


_LCG_MULTIPLIER = 2862933555777941757
_MASK64 = (1 << 64) - 1


def fifo_queue_index(message_group: str, queues: int) -> int:
    """Guava's `Hashing.consistentHash(group.hashCode(), queues)`: the index Apache's
    proxy picks among a topic's writable queues for this message group."""
    assert queues > 0
    state = java_string_hash(message_group) & _MASK64
    candidate = 0
    while True:
        state = (_LCG_MULTIPLIER * state + 1) & _MASK64
        high = (state >> 33) + 1  # a 31-bit int plus one, which wraps in Java's int
        if high == 1 << 31:
            high = -(1 << 31)
        next_double = high / float(1 << 31)
        following = int((candidate + 1) / next_double)
        if 0 <= following < queues:
            candidate = following
        else:
            return candidate
