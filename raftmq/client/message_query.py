"""Queries of the brokers' key index: messages by KEYS word or by UNIQ_KEY.

RocketMQ's `MQAdminImpl.queryMessage`: QUERY_MESSAGE goes to the master of every
broker group serving the topic, at once. The index compares hashes only, so what
comes back is filtered here: by key, a message is kept if it is of the topic and one
of its KEYS words is the key; by unique key, only the earliest stored message whose
msgId (its UNIQ_KEY) is the key is kept.
"""

from __future__ import annotations

import json

import trio

from raftmq.client.admin import Admin
from raftmq.client.consumer import PullConsumer, PullStatus
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.route import MessageQueue
from raftmq.client.trace import TRACE_TOPIC, TraceRecord, records_of
from raftmq.protocol.message import MessageExt, decode_all
from raftmq.protocol.msgid import uniq_id_nearly_time
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import RequestCode, ResponseCode

MAX_KEY_HITS = 64  # what queryMsgByKey asks for
UNIQUE_KEY_MAX_NUM = 32  # defaultQueryMaxNum
END_OF_TIME_MS = 2**63 - 1  # Long.MAX_VALUE


def query_header(
    topic: str, key: str, max_num: int, begin_ms: int, end_ms: int, unique: bool
) -> dict:
    """QUERY_MESSAGE's header (`QueryMessageRequestHeader` and the unique-key flag the
    Java client always sends)."""
    return {
        "topic": topic,
        "key": key,
        "maxNum": max_num,
        "beginTimestamp": begin_ms,
        "endTimestamp": end_ms,
        "_UNIQUE_KEY_QUERY": "true" if unique else "false",
    }


async def _query(
    admin: Admin, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int, unique: bool
) -> list[MessageExt]:
    masters = await admin.route_masters(topic)
    ext = query_header(topic, key, max_num, begin_ms, end_ms, unique)
    found: list[MessageExt] = []
    errors: list[MQClientError] = []

    async def ask(address: str) -> None:
        try:
            response = await admin.call(address, RequestCode.QUERY_MESSAGE, ext)
        except MQBrokerError as exc:
            if exc.code != ResponseCode.QUERY_NOT_FOUND:
                errors.append(exc)
            return
        except MQClientError as exc:
            errors.append(exc)
            return
        except (RemotingConnectError, RemotingTimeoutError) as exc:
            errors.append(MQClientError(f"{address}: {exc}"))
            return
        found.extend(decode_all(response.body))

    async with trio.open_nursery() as nursery:
        for address in masters:
            nursery.start_soon(ask, address)
    if not found and errors:
        raise errors[0]
    return found


def _no_message(topic: str, key: str) -> MQBrokerError:
    remark = f"query message by key finished, but no message. {key}"
    return MQBrokerError(ResponseCode.NO_MESSAGE, remark, topic)


async def query_by_key(
    admin: Admin,
    topic: str,
    key: str,
    max_num: int = MAX_KEY_HITS,
    begin_ms: int = 0,
    end_ms: int = END_OF_TIME_MS,
) -> list[MessageExt]:
    """The topic's messages with `key` among their KEYS, stored in [begin_ms, end_ms];
    MQBrokerError NO_MESSAGE (208) when there is none."""
    messages = [
        msg
        for msg in await _query(admin, topic, key, max_num, begin_ms, end_ms, unique=False)
        if msg.topic == topic and key in (msg.keys or "").split(" ")
    ]
    if not messages:
        raise _no_message(topic, key)
    return messages


async def query_traces(
    admin: Admin,
    msg_id: str,
    trace_topic: str = TRACE_TOPIC,
    max_num: int = MAX_KEY_HITS,
    begin_ms: int = 0,
    end_ms: int = END_OF_TIME_MS,
) -> list[TraceRecord]:
    """The trace records about `msg_id` (a UNIQ_KEY) in `trace_topic`, oldest trace
    message first (`QueryMsgTraceByIdSubCommand.queryTraceByMsgId`): the trace messages
    carry the traced msgIds among their KEYS. MQBrokerError NO_MESSAGE when no trace
    message names it."""
    messages = await query_by_key(admin, trace_topic, msg_id, max_num, begin_ms, end_ms)
    messages.sort(key=lambda m: m.store_timestamp)
    return [record for msg in messages for record in records_of(msg_id, msg)]


async def query_by_unique_key(
    admin: Admin, topic: str, uniq_key: str, begin_ms: int | None = None
) -> MessageExt:
    """The message whose UNIQ_KEY is `uniq_key` (the earliest stored, should a
    producer have sent it twice); the search starts a second before the time the
    id holds unless `begin_ms` says otherwise."""
    if begin_ms is None:
        begin_ms = uniq_id_nearly_time(uniq_key) - 1000
    messages = await query_all_by_unique_key(admin, topic, uniq_key, begin_ms)
    return messages[0]


async def query_all_by_unique_key(
    admin: Admin, topic: str, uniq_key: str, begin_ms: int = 0
) -> list[MessageExt]:
    """Every stored message whose msgId is `uniq_key`, earliest first (`-a` of
    queryMsgByUniqueKey); MQBrokerError NO_MESSAGE when there is none."""
    hits = await _query(
        admin, topic, uniq_key, UNIQUE_KEY_MAX_NUM, begin_ms, END_OF_TIME_MS, unique=True
    )
    wanted = uniq_key.upper()
    messages = sorted(
        (msg for msg in hits if (msg.uniq_key or msg.msg_id).upper() == wanted),
        key=lambda m: m.store_timestamp,
    )
    if not messages:
        raise _no_message(topic, uniq_key)
    return messages


async def view_by_either_id(admin: Admin, msg_id: str, topic: str | None) -> MessageExt:
    """A message by either kind of id: as an offset msgId first, then, given the topic,
    as a UNIQ_KEY (`DefaultMQAdminExtImpl.viewMessage(topic, id)` falls back on any
    failure; the two kinds have the same length). ValueError when the id is no offset
    msgId and no topic is given."""
    try:
        return await admin.query_msg_by_id(msg_id)
    except (ValueError, MQClientError):
        if topic is None:
            raise
    return await query_by_unique_key(admin, topic, msg_id)


CONSUME_DIRECTLY_TIMEOUT_S = 15.0  # the broker waits up to 10 s for the consumer


async def consume_message_directly(
    admin: Admin, group: str, client_id: str, msg_id: str, topic: str | None = None
) -> dict:
    """CONSUME_MESSAGE_DIRECTLY (309): the consumer `client_id` of `group` runs its
    handler on the message either kind of id names (`view_by_either_id`); returns its
    ConsumeMessageDirectlyResult (order, autoCommit, consumeResult, remark,
    spentTimeMills). The request goes to a member holding the message, by its offset
    msgId (`DefaultMQAdminExtImpl.consumeMessageDirectly`); MQBrokerError when the
    broker or the consumer refuses (SYSTEM_ERROR "The Consumer <g> <id> not online")."""
    msg = await view_by_either_id(admin, msg_id, topic)
    address, msg = await admin.locate_msg_by_id(msg.msg_id)
    ext = {"consumerGroup": group, "clientId": client_id, "msgId": msg.msg_id, "topic": msg.topic}
    response = await admin.call(
        address,
        RequestCode.CONSUME_MESSAGE_DIRECTLY,
        ext,
        timeout_s=CONSUME_DIRECTLY_TIMEOUT_S,
    )
    try:
        result = json.loads(response.body)
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise MQClientError(f"{address} answered a result that is not an object")
    return result


async def message_at(admin: Admin, mq: MessageQueue, offset: int) -> MessageExt | None:
    """The message at `offset` of `mq` (queryMsgByOffset), pulled as the tools'
    consumer group; None when the queue holds none there."""
    async with PullConsumer(
        admin.namesrv_addrs, "TOOLS_CONSUMER", tls=admin.tls, credentials=admin.credentials
    ) as consumer:
        result = await consumer.pull(mq, offset, 1)
    if result.status is PullStatus.FOUND and result.messages:
        return result.messages[0]
    return None


__all__ = [
    "consume_message_directly",
    "message_at",
    "query_all_by_unique_key",
    "query_by_key",
    "query_by_unique_key",
    "query_header",
    "view_by_either_id",
]
