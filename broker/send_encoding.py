"""The bytes of the inline send path: the record a send stores, the responses it gets.

`send_record` and `send_responses` are written with the codecs the rest of the broker
uses, so what a batch of sends stores and answers is what the message-at-a-time path
(`SendProcessor.send`) would. Both have compiled twins in `raftmq.hotpath`, held to
these byte for byte and error for error by tests/test_hotpath.py; `SEND_RECORD` and
`SEND_RESPONSES` are whichever of the two runs.
"""

from __future__ import annotations

from raftmq.hotpath import compiled_or
from raftmq.protocol import message as codec
from raftmq.protocol.headers import SEND_V2_LETTERS, from_send_v2, is_send_v2
from raftmq.protocol.message import MessageConst, MessageExt
from raftmq.protocol.msgid import message_id_from_bytes, unpack_ip
from raftmq.remoting import FLAG_RESPONSE, RemotingCommand, ResponseCode, encode

__all__ = [
    "SEND_FIELDS",
    "SEND_RECORD",
    "SEND_RESPONSES",
    "SEND_VALUES",
    "SEND_VALUE_NAMES",
    "send_fields",
    "send_record",
    "send_responses",
    "send_values",
    "sent_message",
]


def send_fields(ext_fields: dict) -> tuple | None:
    """What a send's header says of its message, as `SendProcessor.send` reads it:
    (topic, queue id (-1: any), flag, sysflag, born timestamp, reconsume times,
    properties, batch), from V2's letters or the long names; None when a number does
    not parse (`send` then names the field)."""
    fields = from_send_v2(ext_fields) if is_send_v2(ext_fields) else ext_fields
    topic = fields.get("topic")
    try:
        numbers = [
            _number(fields.get(name), default)
            for name, default in (
                ("queueId", -1),
                ("flag", 0),
                ("sysFlag", 0),
                ("bornTimestamp", 0),
                ("reconsumeTimes", 0),
            )
        ]
    except (TypeError, ValueError):
        return None
    batch = fields.get("batch")
    batch = False if batch is None else str(batch).lower() == "true"
    return (topic if topic is None else str(topic), *numbers, fields.get("properties", ""), batch)


# The ext fields a raw send request carries the values of (remoting.codec.plain_request):
# those send_fields reads, by SendMessageRequestHeader's names, then by V2's letters.
_SEND_NAMES = (
    "topic", "queueId", "flag", "sysFlag", "bornTimestamp", "reconsumeTimes", "properties", "batch"
)  # fmt: skip
SEND_VALUE_NAMES = (*_SEND_NAMES, *(SEND_V2_LETTERS[name] for name in _SEND_NAMES))


def send_values(values: tuple) -> tuple | None:
    """send_fields of a header whose SEND_VALUE_NAMES fields have `values` (None: absent);
    None also where the header's order decides what `send` reads (V2's letters and long
    names together), for which the whole header is decoded."""
    pairs = zip(SEND_VALUE_NAMES, values, strict=True)
    present = {name: value for name, value in pairs if value is not None}
    if is_send_v2(present) and any(name in present for name in _SEND_NAMES[1:]):
        return None
    return send_fields(present)


def _number(value, default: int) -> int:
    """A header's integer field, read as `broker.headers.integer` reads it."""
    return default if value is None or value == "" else int(value)


def _host(packed: bytes) -> tuple[str, int]:
    """(ip, port) of a store or born host packed as a record holds it (8 or 20 bytes)."""
    return unpack_ip(packed[:-4]), int.from_bytes(packed[-4:], "big")


def send_record(
    store_timestamp_ms: int,
    born_host: bytes,
    store_host: bytes,
    cluster: str,
    topic: str,
    queue_id: int,
    flag: int,
    sysflag: int,
    born_timestamp_ms: int,
    reconsume_times: int,
    properties: str,
    body: bytes,
) -> bytes:
    """The CommitLog record of one sent message, as the send processor stores it: the
    client's properties (wire text) without WAIT, with the broker's CLUSTER; hosts
    packed as the record holds them. MessageFormatError for what a record cannot hold."""
    msg = sent_message(
        cluster,
        codec.string_to_properties(properties),
        store_timestamp=store_timestamp_ms,
        born_host=_host(born_host),
        born_timestamp=born_timestamp_ms,
        store_host=_host(store_host),
        topic=topic,
        queue_id=queue_id,
        reconsume_times=reconsume_times,
        sysflag=sysflag,
        flag=flag,
        body=body,
    )
    return codec.encode(msg)


def sent_message(cluster: str, properties: dict[str, str], **fields) -> MessageExt:
    """A message a producer sent (MessageExt's `fields`), as the broker stores it: the
    client's properties without WAIT (RocketMQ's broker drops it), with its CLUSTER."""
    properties.pop(MessageConst.PROPERTY_WAIT_STORE_MSG_OK, None)
    properties[MessageConst.PROPERTY_CLUSTER] = cluster
    return MessageExt(properties=properties, **fields)


def send_responses(sends: list[tuple[int, int, int, int, int]], store_host: bytes) -> bytes:
    """The SUCCESS responses to a batch of single-message sends, as frames back to back.

    `sends` holds (opaque, serialize type, queue id, queue offset, physical offset)
    per request; each response is what `SendProcessor` answers one send with, stamped
    as `Connection.respond` stamps it.
    """
    frames = []
    for opaque, serialize_type, queue_id, queue_offset, physical_offset in sends:
        ext = {
            "msgId": message_id_from_bytes(store_host, physical_offset),
            "queueId": str(queue_id),
            "queueOffset": str(queue_offset),
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        }
        response = RemotingCommand(
            code=ResponseCode.SUCCESS,
            opaque=opaque,
            flag=FLAG_RESPONSE,
            ext_fields=ext,
            serialize_type=serialize_type,
        )
        frames.append(encode(response))
    return b"".join(frames)


SEND_FIELDS = compiled_or("send_fields", send_fields)
SEND_VALUES = compiled_or("send_values", send_values)
SEND_RECORD = compiled_or("send_record", send_record)
SEND_RESPONSES = compiled_or("send_responses", send_responses)
