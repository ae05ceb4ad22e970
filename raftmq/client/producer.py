"""`Producer`: SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320), with failover retries.

What a send does (`DefaultMQProducerImpl.sendDefaultImpl`):

- stamps the message with a UNIQ_KEY (the id the Java client reports as
  `SendResult.msgId`, kept across retries so a consumer can tell a resend) and WAIT=true
  (answer once stored), compresses bodies of 4 KiB or more with zlib;
- picks the topic's next writable queue round-robin, on a different broker group
  than the one that just failed when there is one;
- retries on answers that may succeed elsewhere or a moment later (connection errors,
  timeouts, SYSTEM_ERROR, SYSTEM_BUSY, SERVICE_NOT_AVAILABLE / "not master",
  TOPIC_NOT_EXIST, NO_PERMISSION): `retry_times` more attempts (RocketMQ's
  `retryTimesWhenSendFailed`, 2), each within the rest of `send_timeout_s` and
  one RPC timeout.

Unlike Java, a topic served by one broker group — a DLedger group, whose master moves
on failover — is retried past `retry_times`: the route is refreshed at once and the
send retried with a 50 -> 400 ms back-off until `send_timeout_s` has passed, because
the new master registers with the name servers within about a second. A failure
raises SendError whose `indeterminate` says whether the message may have been stored.

A send with no answer after `hedge_after_s` (0.3 s; `math.inf`: never) is not simply
waited out: the producer asks a name server for the route while it waits, and once the
route names another master for the queue's broker group (a DLedger group elected one:
the old master is paused, cut off, or stepping down with its connections open) it sends
the message there too, marked a resend (PROPERTY_RESEND), and the first stored answer
wins (raftmq.client.hedge). Any attempt after one whose outcome is unknown is marked so.
A raftmq broker answers a resend with the copy it already stores, if any, so a message
is not stored twice (broker.send); RocketMQ's brokers store it again (and keep the mark
as a property). Java's and the C++ client wait out their 3 s send timeout instead. A
batch is not sent again this way.

With `send_latency_fault_enable` (RocketMQ's `sendLatencyFaultEnable`, off by default)
the producer avoids broker groups whose last attempt failed or was slow, for a while
set by `latency_max_ms` and `not_available_duration_ms` (raftmq.client.latency_fault):
once one group's master is dead, sends go to the others at once instead of each trying
the dead one first.

Timer messages (RocketMQ 5): `send(..., deliver_at_ms=...)` or `delay_ms=` asks the
broker to deliver the message at that time (Java's `Message.setDeliverTimeMs` and
`setDelayTimeMs`: the TIMER_DELIVER_MS and TIMER_DELAY_MS properties), never before it
and normally less than the broker's `timerPrecisionMs` (1 s) after; at most
`timerMaxDelaySec` (3 days) ahead. The result's `recall_handle` cancels it while it is
pending: `await producer.recall(topic, handle)` (RECALL_MESSAGE, 370).

Requests are pipelined: concurrent sends share one connection per broker.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import trio

from raftmq.client.errors import MQBrokerError, MQClientError, RouteNotFoundError, SendError
from raftmq.client.hedge import HEDGE_AFTER_S, STORED_CODES, Hedger, attempt
from raftmq.client.instance import ClientInstance, backoff_delays, local_ip
from raftmq.client.latency_fault import (
    LATENCY_MAX_MS,
    NOT_AVAILABLE_DURATION_MS,
    LatencyFaultTolerance,
)
from raftmq.client.route import MessageQueue, TopicRouteData
from raftmq.client.trace import (
    GROUP_NAME_PREFIX,
    TRACE_TOPIC,
    MessageType,
    TraceDispatcher,
    TraceRecord,
    TraceType,
)
from raftmq.protocol.headers import send_header_v2
from raftmq.protocol.message import (
    PROPERTY_RESEND,
    MessageConst,
    MessageSysFlag,
    properties_to_string,
)
from raftmq.protocol.msgid import UniqIdGenerator, decode_message_id
from raftmq.protocol.recall import RecallHandle
from raftmq.remoting import RemotingCommand
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = [
    "RESEND_MARK",
    "Message",
    "Producer",
    "SendResult",
    "SendStatus",
    "encode_batch",
    "send_request",
]

log = logging.getLogger(__name__)

# The auto-create template topic (`TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC`).
COMPRESS_LEVEL = 5  # DefaultMQProducer's `compressLevel`


class SendStatus(enum.Enum):
    """The answers that mean "stored" (`SendStatus`); the three below SEND_OK say the
    flush or the slave copy was late, not that the message is missing."""

    SEND_OK = ResponseCode.SUCCESS
    FLUSH_DISK_TIMEOUT = ResponseCode.FLUSH_DISK_TIMEOUT
    FLUSH_SLAVE_TIMEOUT = ResponseCode.FLUSH_SLAVE_TIMEOUT
    SLAVE_NOT_AVAILABLE = ResponseCode.SLAVE_NOT_AVAILABLE


_STORED = {status.value: status for status in SendStatus}
assert frozenset(_STORED) == STORED_CODES, (_STORED, STORED_CODES)
# `retryResponseCodes` plus SYSTEM_BUSY: worth another attempt.
RETRY_CODES = frozenset(
    (
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
    )
)
# appended to the properties of a send that repeats one whose outcome is unknown
RESEND_MARK = properties_to_string({PROPERTY_RESEND: "true"})


@attrs.frozen
class SendResult:
    """`msg_id` is the UNIQ_KEY (comma-joined for a batch), `offset_msg_id` the broker's
    offset msgId(s) (store host + physical offset), `queue_offset` the first message's
    logical offset in `message_queue`. `recall_handle` is set for a timer message: what
    `Producer.recall` takes to cancel it (SendMessageResponseHeader.recallHandle)."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    recall_handle: str | None = None


@attrs.define
class Message:
    """One message of a batch (`send` takes the same fields as arguments)."""

    body: bytes
    tags: str | None = None
    keys: str | Iterable[str] | None = None
    properties: Mapping[str, str] | None = None


_BATCH_ITEM = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLen
_SHORT = struct.Struct(">h")


def encode_batch(items: Iterable[tuple[bytes, str]]) -> bytes:
    """A SEND_BATCH_MESSAGE body from (body, properties string) pairs
    (`MessageDecoder.encodeMessage`): totalSize, magic 0, bodyCRC 0, flag 0, bodyLen,
    body, short propertiesLength, properties."""
    parts = []
    for body, properties in items:
        props = properties.encode()
        total = _BATCH_ITEM.size + len(body) + _SHORT.size + len(props)
        parts += (_BATCH_ITEM.pack(total, 0, 0, 0, len(body)), body, _SHORT.pack(len(props)), props)
    return b"".join(parts)


def send_request(
    code: int, group: str, mq: MessageQueue, body: bytes, properties: str, sysflag: int
) -> RemotingCommand:
    """A SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE request for `mq` (one attempt's bytes)."""
    header = send_header_v2(
        group,
        mq.topic,
        mq.queue_id,
        born_timestamp_ms=int(time.time() * 1000),
        properties=properties,
        sys_flag=sysflag,
        batch=code == RequestCode.SEND_BATCH_MESSAGE,
        broker_name=mq.broker_name,
    )
    return RemotingCommand(code, ext_fields=header, body=body)


class Producer:
    """`async with Producer("127.0.0.1:9876") as p: result = await p.send("T", b"x")`."""

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        group: str = "DEFAULT_PRODUCER",
        *,
        send_timeout_s: float = 3.0,
        retry_times: int = 2,
        compress_over_bytes: int = 4096,
        rpc_timeout_s: float = 3.0,
        poll_name_server_interval_s: float = 30.0,
        heartbeat_interval_s: float = 30.0,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
        send_latency_fault_enable: bool = False,
        latency_max_ms: Sequence[float] = LATENCY_MAX_MS,
        not_available_duration_ms: Sequence[float] = NOT_AVAILABLE_DURATION_MS,
        hedge_after_s: float = HEDGE_AFTER_S,
        enable_trace: bool = False,
        trace_topic: str = TRACE_TOPIC,
    ) -> None:
        """`enable_trace` (the Java client's `enableMsgTrace`): a `Pub` trace record
        after each `send`, to `trace_topic`, in the background (`trace.TraceDispatcher`)."""
        self.group = group
        self.latency_fault = (
            LatencyFaultTolerance(latency_max_ms, not_available_duration_ms)
            if send_latency_fault_enable
            else None
        )
        self.send_timeout_s = send_timeout_s
        self.retry_times = retry_times
        self.compress_over_bytes = compress_over_bytes
        self.instance = ClientInstance(
            namesrv_addr,
            rpc_timeout_s=rpc_timeout_s,
            poll_name_server_interval_s=poll_name_server_interval_s,
            heartbeat_interval_s=heartbeat_interval_s,
            tls=tls,
            credentials=credentials,
        )
        self.instance.producer_group = group
        self.hedger = Hedger(self.instance, hedge_after_s)
        self._once = Hedger(self.instance, math.inf)  # a batch: never sent twice at once
        self._uniq_ids = UniqIdGenerator(ip=local_ip())
        self._next_queue: dict[str, int] = {}  # per topic, Java's `sendWhichQueue`
        # per topic, the route last sent by and its writable queues (a send's route is
        # usually the cached one, whose queues need not be listed again)
        self._write_queues: dict[str, tuple[TopicRouteData, list[MessageQueue]]] = {}
        self.trace = (
            trace_dispatcher(namesrv_addr, group, trace_topic, rpc_timeout_s, tls, credentials)
            if enable_trace
            else None
        )

    async def __aenter__(self) -> Producer:
        await self.instance.__aenter__()
        if self.trace is not None:
            try:
                await self.trace.__aenter__()
            except BaseException:
                await self.instance.__aexit__(None, None, None)
                raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        try:
            if self.trace is not None:
                await self.trace.__aexit__(*exc_info)
        finally:
            await self.instance.__aexit__(*exc_info)

    def _properties(
        self,
        tags: str | None,
        keys: str | Iterable[str] | None,
        properties: Mapping[str, str] | None,
    ) -> dict[str, str]:
        props = dict(properties or {})
        if tags:
            props[MessageConst.PROPERTY_TAGS] = tags
        if keys:
            if not isinstance(keys, str):
                keys = MessageConst.KEY_SEPARATOR.join(keys)
            props[MessageConst.PROPERTY_KEYS] = keys
        props[MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = self._uniq_ids.next_id()
        props[MessageConst.PROPERTY_WAIT_STORE_MSG_OK] = "true"
        return props

    async def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | Iterable[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue: MessageQueue | None = None,
        *,
        deliver_at_ms: int | None = None,
        delay_ms: int | None = None,
    ) -> SendResult:
        """Send one message, to `queue` if given (retried there), else round-robin.

        `deliver_at_ms` (ms since the epoch) or `delay_ms` (from when the broker stores
        it) makes it a timer message, delivered then and never before; a time already
        past delivers it at once; more than the broker's `timerMaxDelaySec` ahead is
        refused (SendError, code MESSAGE_ILLEGAL, 13). Its result's `recall_handle`
        cancels it (`recall`).

        Raises SendError when it is not acknowledged within `send_timeout_s`.
        """
        props = self._properties(tags, keys, properties)
        if deliver_at_ms is not None and delay_ms is not None:
            raise ValueError("deliver_at_ms or delay_ms, not both")
        if deliver_at_ms is not None:
            props[MessageConst.PROPERTY_TIMER_DELIVER_MS] = str(int(deliver_at_ms))
        if delay_ms is not None:
            props[MessageConst.PROPERTY_TIMER_DELAY_MS] = str(int(delay_ms))
        started_ms = time.time() * 1000
        result = await self.send_with_properties(topic, body, props, queue)
        if self.trace is not None:
            self.trace.submit([_pub_record(self.group, props, len(body), started_ms, result)])
        return result

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a pending timer message by the `recall_handle` of its send: it is then
        never delivered. Returns its msgId (UNIQ_KEY). ValueError for a handle that does
        not parse; MQBrokerError when the broker refuses (ILLEGAL_OPERATION, 604: the
        handle names another topic, or its time has come) or RouteNotFoundError when the
        handle's broker group has no master in the topic's route. It is not retried:
        recalling twice is harmless, so a caller may simply call again after a failover
        (the old master answers SLAVE_NOT_AVAILABLE, 11)."""
        handle = RecallHandle.parse(recall_handle)
        route = await self.instance.routes.get(topic)
        address = route.master(handle.broker_name)
        if address is None:
            raise RouteNotFoundError(topic, f"no master for {handle.broker_name!r}")
        header = {"topic": topic, "recallHandle": recall_handle, "producerGroup": self.group}
        request = RemotingCommand(RequestCode.RECALL_MESSAGE, ext_fields=header)
        response, reason, _sent = await attempt(
            self.instance, address, request, trio.current_time() + self.send_timeout_s
        )
        if response is None:
            raise MQClientError(f"recall of {handle.uniq_key}: {reason}")
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        return response.ext_fields.get("msgId", handle.uniq_key)

    async def send_with_properties(
        self,
        topic: str,
        body: bytes,
        props: dict[str, str],
        queue: MessageQueue | None,
        sysflag: int = 0,
    ) -> SendResult:
        """One message with the properties the caller made (UNIQ_KEY set: mqproxy keeps
        its clients' message ids), compressed if large."""
        if len(body) >= self.compress_over_bytes:
            body = zlib.compress(body, COMPRESS_LEVEL)
            sysflag |= MessageSysFlag.COMPRESSED_FLAG
        text = properties_to_string(props)
        uniq_key = props[MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
        return await self._send(
            topic,
            queue,
            lambda mq, resend: send_request(
                RequestCode.SEND_MESSAGE_V2,
                self.group,
                mq,
                body,
                text + RESEND_MARK if resend else text,
                sysflag,
            ),
            uniq_key,
            hedge=True,
        )

    async def send_batch(self, topic: str, messages: Iterable[bytes | Message]) -> SendResult:
        """Send messages as one SEND_BATCH_MESSAGE: one queue, consecutive offsets,
        stored all or none. Bodies are not compressed (Java never compresses a batch)."""
        items = []
        uniq_keys = []
        for message in messages:
            if not isinstance(message, Message):
                message = Message(message)
            props = self._properties(message.tags, message.keys, message.properties)
            uniq_keys.append(props[MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX])
            items.append((bytes(message.body), properties_to_string(props)))
        if not items:
            raise ValueError("a batch needs at least one message")
        body = encode_batch(items)
        header_props = properties_to_string({MessageConst.PROPERTY_WAIT_STORE_MSG_OK: "true"})
        return await self._send(
            topic,
            None,
            lambda mq, _resend: send_request(
                RequestCode.SEND_BATCH_MESSAGE, self.group, mq, body, header_props, 0
            ),
            ",".join(uniq_keys),
            hedge=False,
        )

    def _select(self, route: TopicRouteData, avoid_broker: str | None) -> MessageQueue | None:
        """The next writable queue round-robin, on another broker group than
        `avoid_broker` if the topic has one (`selectOneMessageQueue(lastBrokerName)`)
        and, with latency fault avoidance, on a group not avoided for now."""
        topic = route.topic
        known = self._write_queues.get(topic)
        if known is None or known[0] is not route:
            known = self._write_queues[topic] = (route, route.write_queues())
        queues = known[1]
        if not queues:
            return None
        index = self._next_queue.get(topic)
        if index is None:
            index = random.randrange(len(queues))
        candidates = [queues[(index + step) % len(queues)] for step in range(len(queues))]
        mq = self._choose(route, candidates, avoid_broker)
        self._next_queue[topic] = index + candidates.index(mq) + 1
        return mq

    def _choose(
        self, route: TopicRouteData, candidates: list[MessageQueue], avoid_broker: str | None
    ) -> MessageQueue:
        """The first of `candidates` (in round-robin order) to use."""
        fault = self.latency_fault
        if fault is not None:
            for mq in candidates:
                if mq.broker_name != avoid_broker and fault.available(
                    mq.broker_name, route.master(mq.broker_name)
                ):
                    return mq
            least_bad = fault.least_bad({mq.broker_name for mq in candidates})
            for mq in candidates:
                if mq.broker_name == least_bad:
                    return mq
        for mq in candidates:
            if mq.broker_name != avoid_broker:
                return mq
        return candidates[0]

    async def _send(
        self,
        topic: str,
        fixed_queue: MessageQueue | None,
        make_request: Callable[[MessageQueue, bool], RemotingCommand],
        msg_id: str,
        *,
        hedge: bool,
    ) -> SendResult:
        """Attempts until one is stored, a refusal, or `send_timeout_s`. `make_request(mq,
        resend)` is an attempt's request; `hedge`: whether a slow attempt is sent to a
        new master as well (`hedger`), which a request marked `resend` must make safe."""
        routes = self.instance.routes
        deadline = trio.current_time() + self.send_timeout_s
        delays = backoff_delays()
        attempts = 0
        indeterminate = False
        code: int | None = None
        reason = f"no route for topic {topic!r}"
        failed_broker: str | None = None

        def failure() -> SendError:
            return SendError(reason, code=code, indeterminate=indeterminate, attempts=attempts)

        while True:
            route = await self._route(topic, deadline)
            if trio.current_time() >= deadline:
                raise failure()
            failed_address = None
            mq = None if route is None else fixed_queue or self._select(route, failed_broker)
            address = None if mq is None else route.master(mq.broker_name)
            if address is None:
                if route is not None:
                    code, reason = None, f"no master for topic {topic!r} in the route"
            else:
                attempts += 1
                started = trio.current_time()
                sent = await (self.hedger if hedge else self._once).send(
                    mq, address, make_request, deadline, resend=indeterminate
                )
                response, reason, address = sent.response, sent.reason, sent.address
                if self.latency_fault is not None:
                    self.latency_fault.update(
                        mq.broker_name,
                        address,
                        (trio.current_time() - started) * 1000,
                        failed=response is None or response.code not in _STORED,
                    )
                if response is not None and response.code in _STORED:
                    return _result(response, msg_id, mq)
                code = None if response is None else response.code
                indeterminate |= sent.unknown
                if code is not None and code not in RETRY_CODES:
                    raise failure()
                log.debug("send to %s failed (%s), retrying", address, reason)
                failed_broker, failed_address = mq.broker_name, address
            routes.invalidate(topic)
            if trio.current_time() >= deadline:
                raise failure()
            if failed_address is not None and not self._one_broker(route, fixed_queue):
                if attempts <= self.retry_times:
                    continue  # at once, on another broker group
                raise failure()
            # One broker group, or no master yet: the route now may name a new master.
            fresh = await self._route(topic, deadline)
            if failed_address is None:
                moved = fresh is not None and bool(fresh.write_queues())
            else:
                moved = fresh is not None and fresh.master(failed_broker) not in (
                    None,
                    failed_address,
                )
            if not moved:
                await trio.sleep(max(0.0, min(next(delays), deadline - trio.current_time())))
                routes.invalidate(topic)

    @staticmethod
    def _one_broker(route: TopicRouteData, fixed_queue: MessageQueue | None) -> bool:
        return fixed_queue is not None or len({q.broker_name for q in route.queue_datas}) <= 1

    async def _route(self, topic: str, deadline: float) -> TopicRouteData | None:
        route = self.instance.routes.current(topic)
        if route is not None:  # cached: no fetch to bound by the deadline
            return route
        with trio.move_on_after(max(0.0, deadline - trio.current_time())):
            try:
                return await self.instance.routes.get(topic)
            except RouteNotFoundError as exc:
                log.debug("%s", exc)
        return None


def trace_dispatcher(
    namesrv_addr: str | Sequence[str],
    group: str,
    trace_topic: str,
    rpc_timeout_s: float,
    tls: ClientTls | None,
    credentials: SessionCredentials | None,
) -> TraceDispatcher:
    """A traced client's dispatcher, with a producer of its own in group
    `_INNER_TRACE_PRODUCER-<group>` (the Java client's trace producer)."""
    producer = Producer(
        namesrv_addr,
        f"{GROUP_NAME_PREFIX}-{group}",
        rpc_timeout_s=rpc_timeout_s,
        tls=tls,
        credentials=credentials,
    )
    return TraceDispatcher(producer, trace_topic)


def _pub_record(
    group: str, props: dict[str, str], body_bytes: int, started_ms: float, result: SendResult
) -> TraceRecord:
    """The `Pub` record of a send (`SendMessageTraceHookImpl`): a timer message is a
    Delay_Msg; the store host is the one the offset msgId names."""
    delayed = {MessageConst.PROPERTY_TIMER_DELIVER_MS, MessageConst.PROPERTY_TIMER_DELAY_MS}
    try:
        ip, port = decode_message_id(result.offset_msg_id).host
        store_host = f"{ip}:{port}"
    except ValueError:
        store_host = ""
    return TraceRecord(
        TraceType.Pub,
        result.msg_id,
        timestamp_ms=int(started_ms),
        group=group,
        topic=result.message_queue.topic,
        tags=props.get(MessageConst.PROPERTY_TAGS),
        keys=props.get(MessageConst.PROPERTY_KEYS),
        store_host=store_host,
        body_length=body_bytes,
        cost_ms=int(time.time() * 1000 - started_ms),
        msg_type=MessageType.Delay_Msg if delayed & props.keys() else MessageType.Normal_Msg,
        offset_msg_id=result.offset_msg_id,
        success=result.status is SendStatus.SEND_OK,
    )


def _result(response: RemotingCommand, msg_id: str, mq: MessageQueue) -> SendResult:
    ext = response.ext_fields
    queue_id = int(ext.get("queueId", mq.queue_id))
    return SendResult(
        status=_STORED[response.code],
        msg_id=msg_id,
        offset_msg_id=ext.get("msgId", ""),
        message_queue=MessageQueue(mq.topic, mq.broker_name, queue_id),
        queue_offset=int(ext.get("queueOffset", -1)),
        recall_handle=ext.get("recallHandle"),
    )
