"""A stored RocketMQ message as a v2 `Message` (`GrpcConverter.buildMessage`).

What a 5.x client reads: topic, user properties (every property that is not a system
one), tag, keys, message_id (the UNIQ_KEY, else the broker's offset msgId), an MD5
digest of the body in upper-case hex (the Python client checks it), the encoding,
the type as the properties make it, born/store timestamps and hosts, the delivery time
of a timer message, the message group of a FIFO one, queue id and offset, and
`delivery_attempt` = reconsumeTimes + 1.
"""

from __future__ import annotations

import hashlib

from raftmq.protocol.message import MessageConst, MessageExt, MessageSysFlag
from raftmq.proxy.apis import definition
from raftmq.proxy.sending import (
    RESERVED_KEYS,
    SHARDING_KEY,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TRACE_CONTEXT,
)

__all__ = ["outbound_message"]

MessageType = definition.MessageType


def _type_of(properties: dict[str, str]) -> int:
    if properties.get(MessageConst.PROPERTY_TRANSACTION_PREPARED) == "true":
        return MessageType.TRANSACTION
    timed = (MessageConst.PROPERTY_DELAY_TIME_LEVEL, TIMER_DELIVER_MS, TIMER_DELAY_SEC)
    if any(key in properties for key in timed) or TIMER_DELAY_MS in properties:
        return MessageType.DELAY
    if SHARDING_KEY in properties:
        return MessageType.FIFO
    return MessageType.NORMAL


def _host(host) -> str:
    ip, port = host
    return f"{ip}:{port}"


def outbound_message(ext: MessageExt, *, receipt_handle: str | None = None) -> definition.Message:
    """`ext` as a v2 Message (with `receipt_handle` when it was received by POP)."""
    props = ext.properties
    message = definition.Message(body=ext.body)
    message.topic.name = ext.topic
    for key, value in props.items():
        if key not in RESERVED_KEYS:
            message.user_properties[key] = value
    system = message.system_properties
    tags = props.get(MessageConst.PROPERTY_TAGS)
    if tags:
        system.tag = tags
    system.keys.extend(ext.key_list)
    system.message_id = ext.uniq_key or ext.msg_id
    system.body_digest.type = definition.DigestType.MD5
    system.body_digest.checksum = hashlib.md5(ext.body).hexdigest().upper()
    compressed = ext.sysflag & MessageSysFlag.COMPRESSED_FLAG
    system.body_encoding = definition.Encoding.GZIP if compressed else definition.Encoding.IDENTITY
    system.message_type = _type_of(props)
    system.born_timestamp.FromMilliseconds(ext.born_timestamp)
    system.born_host = _host(ext.born_host)
    system.store_timestamp.FromMilliseconds(ext.store_timestamp)
    system.store_host = _host(ext.store_host)
    if TIMER_DELIVER_MS in props and props[TIMER_DELIVER_MS].isdigit():
        system.delivery_timestamp.FromMilliseconds(int(props[TIMER_DELIVER_MS]))
    if SHARDING_KEY in props:
        system.message_group = props[SHARDING_KEY]
    if TRACE_CONTEXT in props:
        system.trace_context = props[TRACE_CONTEXT]
    if receipt_handle is not None:
        system.receipt_handle = receipt_handle
    system.queue_id = ext.queue_id
    system.queue_offset = ext.queue_offset
    system.delivery_attempt = ext.reconsume_times + 1
    return message
