"""`Brokers`: everything mqproxy asks of the broker groups, behind one narrow interface.

Over RocketMQ remoting, with raftmq's own client (raftmq.client): routes from the name
servers, sends with its failover retries (a DLedger group's new master is found within
about a second), END_TRANSACTION, POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME
and CONSUMER_SEND_MSG_BACK at the group's current master (`ClientInstance.call_broker`:
a fresh route and another try when the master moved), and the brokers'
CHECK_TRANSACTION_STATE requests, handed to `on_transaction_check`. The proxy
heartbeats as a producer of every group its clients publish for (PGROUP = the topic,
as Apache's proxy does), so the brokers send it those checks.

The proxy holds no message state of its own: what EndTransaction needs travels in the
transaction id the send returned (`TransactionRef`), so any proxy can end any
transaction, after a restart too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence

import attrs

from raftmq.client import Producer, RouteNotFoundError, SendResult, TopicRouteData
from raftmq.client import pop as popping
from raftmq.client.consumer import send_back_request
from raftmq.client.errors import MQBrokerError
from raftmq.client.instance import ClientInstance
from raftmq.client.route import MessageQueue
from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageExt, MessageSysFlag
from raftmq.protocol.msgid import decode_message_id
from raftmq.protocol.pop import ReceiptHandle
from raftmq.remoting import Connection, RemotingCommand
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = ["Brokers", "TransactionRef"]

log = logging.getLogger(__name__)

PROXY_PRODUCER_GROUP = "PROXY_SEND"  # the header group of sends (PGROUP names the topic)
_REF_VERSION = "t1"


@attrs.frozen
class TransactionRef:
    """Where a half message is: what END_TRANSACTION needs. Its text is the v2
    `transaction_id` the proxy hands out: `t1 <brokerName> <commitLogOffset>
    <queueOffset> <messageId>`."""

    broker_name: str
    commit_log_offset: int
    queue_offset: int
    message_id: str

    def __str__(self) -> str:
        return " ".join(
            (
                _REF_VERSION,
                self.broker_name,
                str(self.commit_log_offset),
                str(self.queue_offset),
                self.message_id,
            )
        )

    @classmethod
    def parse(cls, text: str) -> TransactionRef:
        """ValueError saying what is wrong with `text`."""
        parts = text.split(" ")
        if len(parts) != 5 or parts[0] != _REF_VERSION:
            raise ValueError(f"transaction_id {text!r} was not issued by mqproxy")
        try:
            return cls(parts[1], int(parts[2]), int(parts[3]), parts[4])
        except ValueError:
            raise ValueError(f"transaction_id {text!r} has a malformed offset") from None


# the half message as the producer sent it (its real topic), and where it is
TransactionCheck = Callable[[MessageExt, TransactionRef], None]


class Brokers:
    """`async with Brokers(namesrv) as brokers:`; set `on_transaction_check` before."""

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        send_timeout_s: float = 3.0,
        rpc_timeout_s: float = 3.0,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self.producer = Producer(
            namesrv_addr,
            PROXY_PRODUCER_GROUP,
            send_timeout_s=send_timeout_s,
            rpc_timeout_s=rpc_timeout_s,
            compress_over_bytes=1 << 62,  # bodies are stored as the client sent them
            tls=tls,
            credentials=credentials,
        )
        self.instance = self.producer.instance
        self.instance.heartbeat_replicas = True  # a new master knows whom to check
        self.instance.handlers[RequestCode.CHECK_TRANSACTION_STATE] = self._on_check
        self.on_transaction_check: TransactionCheck | None = None
        self._round_robin: dict[str, int] = {}

    async def __aenter__(self) -> Brokers:
        await self.producer.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.producer.__aexit__(*exc_info)

    async def route(self, topic: str) -> TopicRouteData:
        """The topic's route (cached, refreshed as the client refreshes it);
        RouteNotFoundError when no name server knows it."""
        return await self.instance.routes.get(topic)

    async def topic_attributes(self, topic: str) -> dict[str, str]:
        """The topic's attributes (GET_TOPIC_CONFIG at a member of its first group);
        RouteNotFoundError for a topic no name server knows, MQBrokerError when the
        broker answers otherwise."""
        route = await self.route(topic)
        if not route.queue_datas:
            return {}
        broker_name = min(q.broker_name for q in route.queue_datas)
        request = RemotingCommand(RequestCode.GET_TOPIC_CONFIG, ext_fields={"topic": topic})
        response = await self.instance.call_broker(topic, broker_name, request, replicas=True)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, broker_name)
        try:
            doc = json.loads(response.body or b"{}")
            attributes = doc.get("attributes") or {}
            return {str(k): str(v) for k, v in attributes.items()}
        except (ValueError, AttributeError) as exc:
            raise MQBrokerError(response.code, f"bad topic config: {exc}", broker_name) from None

    async def group_config(self, topic: str, group: str) -> dict | None:
        """The subscription group's config as the broker keeps it (its JSON), from a
        member of the topic's first group (GET_ALL_SUBSCRIPTIONGROUP_CONFIG); None when
        the group has none there."""
        route = await self.route(topic)
        if not route.queue_datas:
            return None
        broker_name = min(q.broker_name for q in route.queue_datas)
        request = RemotingCommand(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        response = await self.instance.call_broker(topic, broker_name, request, replicas=True)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, broker_name)
        try:
            table = json.loads(response.body or b"{}").get("subscriptionGroupTable") or {}
        except (ValueError, AttributeError) as exc:
            raise MQBrokerError(response.code, f"bad group table: {exc}", broker_name) from None
        found = table.get(group)
        return found if isinstance(found, dict) else None

    async def publish_for(self, topics: Sequence[str]) -> None:
        """Heartbeat as the producer group of each topic (at once when one is new)."""
        new = set(topics) - self.instance.more_producer_groups
        if new:
            self.instance.more_producer_groups |= new
            for topic in new:
                try:
                    await self.route(topic)  # its brokers are heartbeat targets from now
                except RouteNotFoundError as exc:
                    log.debug("%s", exc)
            await self.instance.heartbeat()

    async def send(
        self,
        topic: str,
        body: bytes,
        properties: dict[str, str],
        *,
        sysflag: int = 0,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        """Store one message (to `queue` if given, else round-robin with failover);
        SendError when it is not acknowledged."""
        return await self.producer.send_with_properties(topic, body, properties, queue, sysflag)

    async def recall(self, topic: str, recall_handle: str) -> str:
        """RECALL_MESSAGE for a timer message: its message id. ValueError for a handle
        that does not parse, MQBrokerError for the broker's refusal."""
        return await self.producer.recall(topic, recall_handle)

    async def end_transaction(
        self, topic: str, ref: TransactionRef, *, commit: bool, from_check: bool
    ) -> RemotingCommand:
        """END_TRANSACTION at the master of the half's group: its answer. Raises the
        client's errors (MQBrokerError, RemotingConnectError, ...) when no master
        answers within the RPC timeout."""
        end_type = (
            MessageSysFlag.TRANSACTION_COMMIT_TYPE
            if commit
            else MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
        )
        header = {
            "producerGroup": topic,
            "tranStateTableOffset": str(ref.queue_offset),
            "commitLogOffset": str(ref.commit_log_offset),
            "commitOrRollback": str(end_type),
            "fromTransactionCheck": "true" if from_check else "false",
            "msgId": ref.message_id,
            "transactionId": ref.message_id,
            "bname": ref.broker_name,
        }
        request = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=header)
        return await self.instance.call_broker(topic, ref.broker_name, request)

    async def pop(self, topic: str, broker_name: str, group: str, **options) -> popping.PopResult:
        """POP_MESSAGE at `broker_name`'s master (raftmq.client.pop.pop's options)."""
        master = _Master(self.instance, topic, broker_name)
        return await popping.pop(master, broker_name, broker_name, group, topic, **options)

    async def ack(self, topic: str, group: str, handle: ReceiptHandle) -> None:
        master = _Master(self.instance, topic, handle.broker_name)
        await popping.ack(master, handle.broker_name, group, topic, handle)

    async def change_invisible_time(
        self, topic: str, group: str, handle: ReceiptHandle, invisible_ms: int
    ) -> ReceiptHandle:
        master = _Master(self.instance, topic, handle.broker_name)
        return await popping.change_invisible_time(
            master, handle.broker_name, group, topic, handle, invisible_ms
        )

    async def to_dead_letter_queue(
        self, topic: str, group: str, handle: ReceiptHandle, message_id: str
    ) -> None:
        """CONSUMER_SEND_MSG_BACK with delay level -1: the message (by the commit-log
        offset its handle carries) is copied to %DLQ%<group>."""
        message = MessageExt(topic, physical_offset=handle.commit_log_offset)
        message.uniq_key = message_id
        request = send_back_request(group, message, -1, 0)
        response = await self.instance.call_broker(topic, handle.broker_name, request)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, handle.broker_name)

    async def _on_check(self, request: RemotingCommand, connection: Connection) -> None:
        """CHECK_TRANSACTION_STATE from a broker: the half and where it is, to
        `on_transaction_check` (which asks a producer of the topic)."""
        ext = request.ext_fields
        try:
            half, _size = codec.decode(request.body)
            commit_log_offset = int(ext["commitLogOffset"])
            queue_offset = int(ext["tranStateTableOffset"])
        except (codec.MessageFormatError, KeyError, ValueError) as exc:
            log.warning("CHECK_TRANSACTION_STATE from %s unreadable: %s", connection, exc)
            return
        broker_name = await self._broker_name(half.topic, connection.remote_address, ext)
        if broker_name is None or self.on_transaction_check is None:
            log.info("transaction check from %s: broker group unknown", connection)
            return
        message_id = half.uniq_key or ext.get("msgId", "")
        ref = TransactionRef(broker_name, commit_log_offset, queue_offset, message_id)
        self.on_transaction_check(half, ref)

    async def _broker_name(self, topic: str, address: str, ext: Mapping[str, str]) -> str | None:
        """The group of the broker at `address` (or that stored the half, by its
        offset msgId), from the topic's route."""
        try:
            route = await self.route(topic)
        except RouteNotFoundError:
            return None
        hosts = {address}
        if ext.get("offsetMsgId"):
            try:
                host, port = decode_message_id(ext["offsetMsgId"]).host
                hosts.add(f"{host}:{port}")
            except ValueError:
                pass
        for name, broker in route.brokers.items():
            if hosts & set(broker.addrs.values()):
                return name
        return None


class _Master:
    """What raftmq.client.pop calls `invoker`, for one broker group: each request goes
    to the group's current master, through `call_broker` (the address given is unused)."""

    def __init__(self, instance: ClientInstance, topic: str, broker_name: str) -> None:
        self._instance = instance
        self._topic = topic
        self._broker_name = broker_name

    async def invoke(self, _address: str, request: RemotingCommand, timeout_s: float):
        return await self._instance.call_broker(self._topic, self._broker_name, request, timeout_s)
