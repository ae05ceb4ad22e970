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

With `send_latency_fault_enable` (RocketMQ's `sendLatencyFaultEnable`, off by default)
the producer avoids broker groups whose last attempt failed or was slow, for a while
set by `latency_max_ms` and `not_available_duration_ms` (raftmq.client.latency_fault):
once one group's master is dead, sends go to the others at once instead of each trying
the dead one first.

Requests are pipelined: concurrent sends share one connection per broker.
"""

from __future__ import annotations

import enum
import logging
import random
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import trio

from raftmq.client.errors import RouteNotFoundError, SendError
from raftmq.client.instance import ClientInstance, backoff_delays, local_ip
from raftmq.client.latency_fault import (
    LATENCY_MAX_MS,
    NOT_AVAILABLE_DURATION_MS,
    LatencyFaultTolerance,
)
from raftmq.client.route import MessageQueue, TopicRouteData
from raftmq.protocol.headers import send_header_v2
from raftmq.protocol.message import MessageConst, MessageSysFlag, properties_to_string
from raftmq.protocol.msgid import UniqIdGenerator
from raftmq.remoting import RemotingCommand, RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = ["Message", "Producer", "SendResult", "SendStatus", "encode_batch", "send_request"]

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
# The one error answer that leaves the outcome open: the broker failed after accepting
# the request (a processor error, or a quorum-ack timeout: the entry may still commit).
# Every other error code is a refusal.
OUTCOME_UNKNOWN_CODES = frozenset((ResponseCode.SYSTEM_ERROR,))


@attrs.frozen
class SendResult:
    """`msg_id` is the UNIQ_KEY (comma-joined for a batch), `offset_msg_id` the broker's
    offset msgId(s) (store host + physical offset), `queue_offset` the first message's
    logical offset in `message_queue`."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int


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
    ) -> None:
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
        self._uniq_ids = UniqIdGenerator(ip=local_ip())
        self._next_queue: dict[str, int] = {}  # per topic, Java's `sendWhichQueue`

    async def __aenter__(self) -> Producer:
        await self.instance.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
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
    ) -> SendResult:
        """Send one message, to `queue` if given (retried there), else round-robin.

        Raises SendError when it is not acknowledged within `send_timeout_s`.
        """
        props = self._properties(tags, keys, properties)
        return await self._send_message(topic, body, props, queue)

    async def _send_message(
        self,
        topic: str,
        body: bytes,
        props: dict[str, str],
        queue: MessageQueue | None,
        sysflag: int = 0,
    ) -> SendResult:
        """One message with its properties (UNIQ_KEY set), compressed if large."""
        if len(body) >= self.compress_over_bytes:
            body = zlib.compress(body, COMPRESS_LEVEL)
            sysflag |= MessageSysFlag.COMPRESSED_FLAG
        text = properties_to_string(props)
        uniq_key = props[MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
        return await self._send(
            topic,
            queue,
            lambda mq: send_request(
                RequestCode.SEND_MESSAGE_V2, self.group, mq, body, text, sysflag
            ),
            uniq_key,
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
            lambda mq: send_request(
                RequestCode.SEND_BATCH_MESSAGE, self.group, mq, body, header_props, 0
            ),
            ",".join(uniq_keys),
        )

    def _select(self, route: TopicRouteData, avoid_broker: str | None) -> MessageQueue | None:
        """The next writable queue round-robin, on another broker group than
        `avoid_broker` if the topic has one (`selectOneMessageQueue(lastBrokerName)`)
        and, with latency fault avoidance, on a group not avoided for now."""
        queues = route.write_queues()
        if not queues:
            return None
        topic = route.topic
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
        make_request: Callable[[MessageQueue], RemotingCommand],
        msg_id: str,
    ) -> SendResult:
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
                response, reason, sent = await self._attempt(address, make_request(mq), deadline)
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
                indeterminate |= sent and (code is None or code in OUTCOME_UNKNOWN_CODES)
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
        with trio.move_on_after(max(0.0, deadline - trio.current_time())):
            try:
                return await self.instance.routes.get(topic)
            except RouteNotFoundError as exc:
                log.debug("%s", exc)
        return None

    async def _attempt(
        self, address: str, request: RemotingCommand, deadline: float
    ) -> tuple[RemotingCommand | None, str, bool]:
        """One request: (response or None, what went wrong, whether the request left)."""
        pool = self.instance.pool
        client = None
        with trio.move_on_after(max(0.0, deadline - trio.current_time())):
            try:
                client = await pool.get(address)
            except RemotingConnectError as exc:
                return None, str(exc), False
        if client is None:
            return None, f"connecting to {address} timed out", False
        # One RPC timeout at most: a master that hangs (stopped, cut off) should not
        # use up the time in which its successor could take the send.
        timeout_s = min(self.instance.rpc_timeout_s, max(0.001, deadline - trio.current_time()))
        try:
            response = await client.invoke(request, timeout_s)
        except (RemotingConnectError, RemotingTimeoutError) as exc:
            return None, str(exc), True
        # Its answer: what the result reports (stored or not, queue offset, msgId) is
        # this message's, never another send's on the same connection.
        assert response.is_response and response.opaque == request.opaque, (request, response)
        return response, f"broker {address} answered {response.code}: {response.remark}", True


def _result(response: RemotingCommand, msg_id: str, mq: MessageQueue) -> SendResult:
    ext = response.ext_fields
    queue_id = int(ext.get("queueId", mq.queue_id))
    return SendResult(
        status=_STORED[response.code],
        msg_id=msg_id,
        offset_msg_id=ext.get("msgId", ""),
        message_queue=MessageQueue(mq.topic, mq.broker_name, queue_id),
        queue_offset=int(ext.get("queueOffset", -1)),
    )
