"""Request headers both ends of a send agree on.

RocketMQ's SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE carry SendMessageRequestHeaderV2:
SendMessageRequestHeader's fields under one-letter names, to keep the hottest
request's header short. A client builds it with `to_send_v2` (Java's
`createSendMessageRequestHeaderV2`), a broker reads it with `from_send_v2`
(`createSendMessageRequestHeaderV1`); the letters are written only here.
"""

from __future__ import annotations

from collections.abc import Mapping

# SendMessageRequestHeaderV2's letter -> SendMessageRequestHeader's field name.
SEND_V2_FIELD_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}
SEND_V2_LETTERS = {name: letter for letter, name in SEND_V2_FIELD_NAMES.items()}

# The topic a broker creates new topics from when a producer sends to an unknown one
# (MixAll.AUTO_CREATE_TOPIC_KEY_TOPIC), and the queues a producer asks for then.
DEFAULT_TOPIC = "TBW102"
DEFAULT_TOPIC_QUEUE_NUMS = 4


def send_header_v2(
    producer_group: str,
    topic: str,
    queue_id: int,
    *,
    born_timestamp_ms: int,
    properties: str = "",
    sys_flag: int = 0,
    batch: bool = False,
    broker_name: str | None = None,
) -> dict[str, object]:
    """The ext fields of a SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE request, as a RocketMQ
    producer fills them (DefaultMQProducerImpl.sendKernelImpl) for a first attempt."""
    header: dict[str, object] = {
        "producerGroup": producer_group,
        "topic": topic,
        "defaultTopic": DEFAULT_TOPIC,
        "defaultTopicQueueNums": DEFAULT_TOPIC_QUEUE_NUMS,
        "queueId": queue_id,
        "sysFlag": sys_flag,
        "bornTimestamp": born_timestamp_ms,
        "flag": 0,
        "properties": properties,
        "reconsumeTimes": 0,
        "unitMode": False,
        "batch": batch,
    }
    if broker_name is not None:
        header["brokerName"] = broker_name
    return to_send_v2(header)


def to_send_v2(header: Mapping[str, object]) -> dict[str, object]:
    """A SendMessageRequestHeader (field name -> value) under the V2 letters."""
    unknown = set(header) - set(SEND_V2_LETTERS)
    assert not unknown, f"not SendMessageRequestHeader fields: {sorted(unknown)}"
    return {SEND_V2_LETTERS[name]: value for name, value in header.items()}


def from_send_v2(fields: Mapping[str, object]) -> dict[str, object]:
    """A V2 header's ext fields under SendMessageRequestHeader's names (fields that are
    not letters, such as ones a client added, keep their names)."""
    return {SEND_V2_FIELD_NAMES.get(key, key): value for key, value in fields.items()}


def is_send_v2(fields: Mapping[str, object]) -> bool:
    """Whether a send's ext fields are the V2 letters (SEND_MESSAGE_V2 may carry either)."""
    return "b" in fields and "topic" not in fields
