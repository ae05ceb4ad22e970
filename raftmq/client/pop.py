"""POP consumption over remoting (RocketMQ 5): pop, ack, batch_ack,
change_invisible_time, notification, peek and polling_info against one broker.

Each call takes an `invoker`: anything with `await invoker.invoke(address, request,
timeout_s)` (a ConnectionPool), the broker's
address and the broker name clients know it by (routes name brokers; receipt handles
carry the name). The broker must be the master: a slave answers
SERVICE_NOT_AVAILABLE, raised as MQBrokerError like every other refusal (its `code`
and `remark` name the fault: TOPIC_NOT_EXIST 17, NO_PERMISSION 16,
SUBSCRIPTION_GROUP_NOT_EXIST 26, INVALID_PARAMETER 29, NO_MESSAGE 208 for an ack
outside the queue, MESSAGE_ILLEGAL 13 for a handle that does not parse).

A popped message carries its receipt handle (`PoppedMessage.handle`; its text form,
`extra_info`, is the message's `POP_CK` property) and its reconsume count; ack or
change its invisibility with that handle before popTime + invisibleTime, or the
broker redelivers it (through `%RETRY%<group>_<topic>`, reconsumeTimes + 1, then
`%DLQ%<group>` after the group's retryMaxTimes). A change of invisibility returns a
new handle; the old one no longer acks the message.

Example::

    async with ConnectionPool() as pool:
        result = await pop(pool, "127.0.0.1:10911", "broker-a", "G", "T", poll_ms=5000)
        for popped in result.messages:
            await ack(pool, "127.0.0.1:10911", "G", "T", popped.handle)
"""

from __future__ import annotations

import json
import time
from typing import Protocol

import attrs

from raftmq.client.errors import MQBrokerError
from raftmq.protocol import message as codec
from raftmq.protocol import pop as vocabulary
from raftmq.protocol.message import MessageExt
from raftmq.protocol.pop import ReceiptHandle
from raftmq.remoting import RemotingCommand, RequestCode, ResponseCode

__all__ = [
    "PopResult",
    "PoppedMessage",
    "ack",
    "batch_ack",
    "change_invisible_time",
    "notification",
    "peek",
    "polling_info",
    "pop",
]

RPC_MARGIN_S = 3.0  # how much longer than pollTime a long-polled call waits for its answer
FOUND, NO_NEW_MSG, POLLING_FULL = "FOUND", "NO_NEW_MSG", "POLLING_FULL"  # PopStatus


class Invoker(Protocol):
    async def invoke(
        self, address: str, request: RemotingCommand, timeout_s: float
    ) -> RemotingCommand: ...


@attrs.frozen
class PoppedMessage:
    message: MessageExt  # under its origin topic, with POP_CK and 1ST_POP_TIME set
    handle: ReceiptHandle

    @property
    def extra_info(self) -> str:
        """What ack and change_invisible_time send (the `POP_CK` property)."""
        return self.handle.extra_info()

    @property
    def reconsume_times(self) -> int:
        """Deliveries before this one (gRPC's delivery_attempt is this + 1)."""
        return self.message.reconsume_times


@attrs.frozen
class PopResult:
    status: str  # FOUND, NO_NEW_MSG (the poll ended empty) or POLLING_FULL
    messages: list[PoppedMessage]
    pop_time_ms: int = 0
    invisible_ms: int = 0
    revive_qid: int = 0
    rest_num: int = 0  # messages left in the queues read


def _check(response: RemotingCommand, address: str, *accepted: int) -> RemotingCommand:
    if response.code not in (ResponseCode.SUCCESS, *accepted):
        raise MQBrokerError(response.code, response.remark, address)
    return response


async def pop(
    invoker: Invoker,
    broker_addr: str,
    broker_name: str,
    group: str,
    topic: str,
    queue_id: int = -1,
    max_nums: int = 32,
    invisible_ms: int = 60_000,
    poll_ms: int = 0,
    *,
    order: bool = False,
    attempt_id: str | None = None,
    init_mode: int = vocabulary.INIT_MODE_MIN,
    filter_type: str = "TAG",
    filter_expression: str = "*",
    born_ms: int | None = None,
) -> PopResult:
    """POP_MESSAGE: up to `max_nums` (≤ 32) messages of `topic` (queue `queue_id`, -1
    for all, plus the group's retry topic), invisible to other pops for
    `invisible_ms`; waits up to `poll_ms` for one when there is none. `order=True` is
    a FIFO pop (one batch per queue in flight; `attempt_id` lets a retry of a pop
    whose answer was lost get the same batch). `init_mode` 0 (MIN) starts a group new
    to a queue at its first message, 1 (MAX) at its end. `filter_type` "TAG" or
    "SQL92" with `filter_expression`. `born_ms` is the request's bornTime (now when
    None): a broker answers a request that arrives more than 500 ms after bornTime +
    pollTime with POLLING_TIMEOUT, read as NO_NEW_MSG like an empty poll (as Apache's
    client reads both)."""
    if born_ms is None:
        born_ms = int(time.time() * 1000)
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(queue_id),
        "maxMsgNums": str(max_nums),
        "invisibleTime": str(invisible_ms),
        "pollTime": str(poll_ms),
        "bornTime": str(born_ms),
        "initMode": str(init_mode),
        "expType": filter_type,
        "exp": filter_expression,
        "order": str(order).lower(),
    }
    if attempt_id:
        ext["attemptId"] = attempt_id
    request = RemotingCommand(code=RequestCode.POP_MESSAGE, ext_fields=ext)
    response = await invoker.invoke(broker_addr, request, poll_ms / 1000 + RPC_MARGIN_S)
    if response.code == ResponseCode.POLLING_TIMEOUT:
        return PopResult(NO_NEW_MSG, [])
    if response.code == ResponseCode.POLLING_FULL:
        return PopResult(POLLING_FULL, [])
    _check(response, broker_addr)
    return _popped(response, broker_name)


def _popped(response: RemotingCommand, broker_name: str) -> PopResult:
    """Each message's handle, as MQClientAPIImpl.processPopResponse builds it."""
    ext = response.ext_fields
    pop_time_ms = int(ext["popTime"])
    invisible_ms = int(ext["invisibleTime"])
    revive_qid = int(ext["reviveQid"])
    starts = vocabulary.parse_start_offsets(ext.get("startOffsetInfo"))
    counts = vocabulary.parse_order_counts(ext.get("orderCountInfo"))
    messages = []
    for msg in codec.decode_all(response.body or b""):
        extra = msg.properties.get(vocabulary.PROPERTY_POP_CK)
        if extra is not None:  # a message from the retry topic: the broker made its handle
            handle = attrs.evolve(ReceiptHandle.parse(extra), commit_log_offset=msg.physical_offset)
        else:
            kind = vocabulary.topic_type(msg.topic)
            handle = ReceiptHandle(
                starts.get((kind, msg.queue_id), msg.queue_offset),
                pop_time_ms,
                invisible_ms,
                revive_qid,
                kind,
                broker_name,
                msg.queue_id,
                msg.queue_offset,
                msg.physical_offset,
            )
            msg.properties[vocabulary.PROPERTY_POP_CK] = handle.extra_info()
        count = counts.get((handle.topic_type, handle.queue_id, handle.queue_offset))
        if count is not None:
            msg.reconsume_times = count
        msg.properties.setdefault(vocabulary.PROPERTY_FIRST_POP_TIME, str(pop_time_ms))
        messages.append(PoppedMessage(msg, handle))
    return PopResult(
        FOUND, messages, pop_time_ms, invisible_ms, revive_qid, int(ext.get("restNum", 0))
    )


def _handle_fields(group: str, topic: str, handle: ReceiptHandle | str) -> dict[str, str]:
    if isinstance(handle, str):
        handle = ReceiptHandle.parse(handle)
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(handle.queue_id),
        "offset": str(handle.queue_offset),
        "extraInfo": handle.extra_info(),
    }


async def ack(
    invoker: Invoker,
    broker_addr: str,
    group: str,
    topic: str,
    handle: ReceiptHandle | str,
    timeout_s: float = 3.0,
) -> None:
    """ACK_MESSAGE: the message of `handle` (a ReceiptHandle, an extraInfo or a
    receipt handle's text) is consumed and never redelivered once this returns. `topic`
    is the origin topic, also for a message popped from the retry topic. A handle whose
    popTime is no longer the message's (its invisibility was changed since, or it was
    redelivered) acks nothing and returns all the same, as Apache's broker does."""
    ext = _handle_fields(group, topic, handle)
    request = RemotingCommand(code=RequestCode.ACK_MESSAGE, ext_fields=ext)
    _check(await invoker.invoke(broker_addr, request, timeout_s), broker_addr)


async def batch_ack(
    invoker: Invoker,
    broker_addr: str,
    broker_name: str,
    group: str,
    topic: str,
    handles: list[ReceiptHandle | str],
    timeout_s: float = 3.0,
) -> None:
    """BATCH_ACK_MESSAGE: `ack` for many handles in one request (and one replicated
    record); handles of one pop and queue travel as one bitset. Nothing is acked when
    the broker refuses (NO_MESSAGE if an offset is outside its queue)."""
    batches: dict[tuple, list[int]] = {}
    for handle in handles:
        if isinstance(handle, str):
            handle = ReceiptHandle.parse(handle)
        key = (
            handle.topic_type, handle.queue_id, handle.start_offset, handle.revive_qid,
            handle.pop_time_ms, handle.invisible_ms,
        )  # fmt: skip
        batches.setdefault(key, []).append(handle.queue_offset - handle.start_offset)
    acks = [
        {"c": group, "t": topic, "r": str(kind), "so": start, "q": queue_id, "rq": revive_qid,
         "pt": pop_time_ms, "it": invisible_ms, "b": vocabulary.encode_bitset(indexes)}
        for (kind, queue_id, start, revive_qid, pop_time_ms, invisible_ms), indexes
        in batches.items()
    ]  # fmt: skip
    body = json.dumps({"brokerName": broker_name, "acks": acks}).encode()
    request = RemotingCommand(code=RequestCode.BATCH_ACK_MESSAGE, body=body)
    _check(await invoker.invoke(broker_addr, request, timeout_s), broker_addr)


async def change_invisible_time(
    invoker: Invoker,
    broker_addr: str,
    group: str,
    topic: str,
    handle: ReceiptHandle | str,
    invisible_ms: int,
    timeout_s: float = 3.0,
) -> ReceiptHandle:
    """CHANGE_MESSAGE_INVISIBLETIME: the message becomes visible `invisible_ms` from now
    (0: at once, a NACK); returns the new handle, which the next ack must use."""
    if isinstance(handle, str):
        handle = ReceiptHandle.parse(handle)
    ext = {**_handle_fields(group, topic, handle), "invisibleTime": str(invisible_ms)}
    request = RemotingCommand(code=RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext_fields=ext)
    response = _check(await invoker.invoke(broker_addr, request, timeout_s), broker_addr)
    return attrs.evolve(
        handle,
        pop_time_ms=int(response.ext_fields["popTime"]),
        invisible_ms=int(response.ext_fields["invisibleTime"]),
    )


async def notification(
    invoker: Invoker,
    broker_addr: str,
    group: str,
    topic: str,
    queue_id: int = -1,
    poll_ms: int = 0,
    *,
    order: bool = False,
) -> bool:
    """NOTIFICATION: whether a pop would find a message now, waiting up to `poll_ms`
    for one (a long poll that pops nothing)."""
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(queue_id),
        "pollTime": str(poll_ms),
        "bornTime": str(int(time.time() * 1000)),
        "order": str(order).lower(),
    }
    request = RemotingCommand(code=RequestCode.NOTIFICATION, ext_fields=ext)
    response = await invoker.invoke(broker_addr, request, poll_ms / 1000 + RPC_MARGIN_S)
    return _check(response, broker_addr).ext_fields.get("hasMsg") == "true"


async def peek(
    invoker: Invoker,
    broker_addr: str,
    group: str,
    topic: str,
    queue_id: int = -1,
    max_nums: int = 32,
    timeout_s: float = 3.0,
) -> list[MessageExt]:
    """PEEK_MESSAGE: the messages the group's next pop would read, left where they are."""
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(queue_id),
        "maxMsgNums": str(max_nums),
    }
    request = RemotingCommand(code=RequestCode.PEEK_MESSAGE, ext_fields=ext)
    response = await invoker.invoke(broker_addr, request, timeout_s)
    if response.code == ResponseCode.PULL_NOT_FOUND:
        return []
    return codec.decode_all(_check(response, broker_addr).body or b"")


async def polling_info(
    invoker: Invoker, broker_addr: str, group: str, topic: str, queue_id: int = -1
) -> int:
    """POLLING_INFO: how many pops and notifications of the group wait on the queue."""
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)}
    request = RemotingCommand(code=RequestCode.POLLING_INFO, ext_fields=ext)
    response = _check(await invoker.invoke(broker_addr, request, 3.0), broker_addr)
    return int(response.ext_fields["pollingNum"])
