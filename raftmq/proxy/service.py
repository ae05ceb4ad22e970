"""`MessagingService`: the RPCs of `apache.rocketmq.v2.MessagingService`, on trio.

Each method takes the call's `CallContext` and request and returns the response
(ReceiveMessage: the list of stream items). Business errors are answered in
`status` with gRPC OK, as Apache's proxy answers them; only Telemetry fails at the
gRPC level (`Refusal` with a 400xx code -> INVALID_ARGUMENT). What the proxy keeps is
per client id and in memory: the Settings it was sent and its Telemetry stream (for
transaction checks); a client that reaches another proxy after a failover is served
with the defaults until it sends its Settings again.

ReceiveMessage pops with initMode MIN: a group new to a queue starts at its first
stored message. Apache's proxy asks for MAX, which its broker turns into 0 while the
queue's first message is still in memory (so, in practice, for a young topic) and the
queue's end otherwise; raftmq's broker has no such notion, and MAX would skip what was
sent before the group's first receive.
"""

from __future__ import annotations

import logging
import time

import attrs
import trio

from raftmq.client import RouteNotFoundError, SendError, SendStatus
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.pop import POLLING_FULL
from raftmq.protocol.message import MessageExt, MessageSysFlag
from raftmq.protocol.msgid import decode_message_id
from raftmq.protocol.pop import INIT_MODE_MIN, HandleError, ReceiptHandle
from raftmq.proxy.apis import definition, service
from raftmq.proxy.bridge import Outbox
from raftmq.proxy.brokers import Brokers, TransactionRef
from raftmq.proxy.outbound import outbound_message
from raftmq.proxy.renewal import Renewals
from raftmq.proxy.routes import assignments, message_queues
from raftmq.proxy.sending import (
    Refusal,
    check_message,
    check_topic,
    check_type,
    fifo_queue_index,
    message_type,
    stored_properties,
)
from raftmq.proxy.settings import merged_settings
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import ResponseCode

__all__ = ["CallContext", "MessagingService", "status", "status_of_broker_code"]

log = logging.getLogger(__name__)

Code = definition.Code
MessageType = definition.MessageType
MIXED = "MIXED"  # the message.type of a topic created without one (see docs/proxy.md)
MESSAGE_TYPE_ATTRIBUTE = "message.type"
TOPIC_TYPE_TTL_S = 5.0  # how long a topic's message.type is taken as read
CLIENT_SILENCE_S = 30.0  # three heartbeats missed: the client is gone (renewals stop)
MAX_BATCH = 32  # messages per POP
MAX_POLL_MS = 20_000  # ProxyConfig grpcClientConsumerMaxLongPollingTimeoutMillis
POLL_MARGIN_S = 1.0  # of the call's deadline left for the answer's way back
MIN_INVISIBLE_MS = 10_000  # ProxyConfig minInvisibleTimeMillsForRecv
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # maxInvisibleTimeMills

_STORED_CODES = {
    SendStatus.SEND_OK: Code.OK,
    SendStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    SendStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    SendStatus.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
}
# `ResponseBuilder.buildStatus`: remoting code -> v2 Code; anything else is
# INTERNAL_SERVER_ERROR.
_BROKER_CODES = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
}


def status(code: int, message: str = "") -> definition.Status:
    return definition.Status(code=code, message=message or definition.Code.Name(code))


def status_of_broker_code(code: int | None, remark: str | None) -> definition.Status:
    """A broker's answer as a v2 Status; None (no answer in time) is PROXY_TIMEOUT."""
    if code is None:
        return status(Code.PROXY_TIMEOUT, remark or "no broker answered in time")
    return status(_BROKER_CODES.get(code, Code.INTERNAL_SERVER_ERROR), remark or "")


@attrs.frozen
class CallContext:
    """What a call's metadata said: `client_id` is x-mq-client-id (never blank here)."""

    client_id: str
    peer_host: str = ""
    time_remaining_s: float | None = None  # until the call's deadline, when it has one


@attrs.define
class ClientState:
    settings: definition.Settings | None = None
    outbox: Outbox | None = None  # its Telemetry stream, while open
    last_seen_s: float = attrs.field(factory=trio.current_time)  # its last call


class MessagingService:
    """The trio side of mqproxy; `brokers` is how it reaches the broker groups."""

    def __init__(self, brokers: Brokers, renewals: Renewals | None = None) -> None:
        self.brokers = brokers
        if renewals is None:
            renewals = Renewals(brokers.change_invisible_time)
        self.renewals = renewals
        self.renewals.alive = self._alive
        self.clients: dict[str, ClientState] = {}
        self._topic_types: dict[str, tuple[str, float]] = {}  # topic -> (type, until)
        brokers.on_transaction_check = self._on_transaction_check

    async def topic_type(self, topic: str) -> str:
        """The topic's `message.type` attribute, read from a broker at most every
        TOPIC_TYPE_TTL_S; MIXED for a topic without one, or when no broker answers
        (the broker refuses what it must anyway)."""
        now = trio.current_time()
        known = self._topic_types.get(topic)
        if known is not None and known[1] > now:
            return known[0]
        try:
            attributes = await self.brokers.topic_attributes(topic)
        except _BROKER_ERRORS as exc:
            log.info("message.type of topic %s unknown: %s", topic, exc)
            return MIXED
        kind = attributes.get(MESSAGE_TYPE_ATTRIBUTE, MIXED)
        if kind == "UNSPECIFIED":
            kind = MIXED
        self._topic_types[topic] = (kind, now + TOPIC_TYPE_TTL_S)
        return kind

    # ----------------------------------------------------------------- routes
    async def query_route(self, ctx: CallContext, request) -> service.QueryRouteResponse:
        topic = request.topic.name
        try:
            check_topic(topic)
            route = await self.brokers.route(topic)
        except Refusal as refusal:
            return service.QueryRouteResponse(status=status(refusal.code, refusal.message))
        except RouteNotFoundError as exc:
            return service.QueryRouteResponse(status=status(Code.TOPIC_NOT_FOUND, str(exc)))
        queues = message_queues(route, request.endpoints, await self.topic_type(topic))
        return service.QueryRouteResponse(status=status(Code.OK), message_queues=queues)

    async def query_assignment(self, ctx: CallContext, request) -> service.QueryAssignmentResponse:
        topic = request.topic.name
        try:
            route = await self.brokers.route(topic)
        except RouteNotFoundError as exc:
            return service.QueryAssignmentResponse(status=status(Code.TOPIC_NOT_FOUND, str(exc)))
        settings = self._settings(ctx)
        fifo = settings is not None and settings.subscription.fifo
        found = assignments(route, request.endpoints, fifo)
        if not found:
            return service.QueryAssignmentResponse(
                status=status(Code.FORBIDDEN, f"no readable queue in topic {topic!r}")
            )
        return service.QueryAssignmentResponse(status=status(Code.OK), assignments=found)

    # ----------------------------------------------------------------- clients
    def seen(self, ctx: CallContext) -> ClientState:
        """The client's state, noting that it called now."""
        state = self.clients.setdefault(ctx.client_id, ClientState())
        state.last_seen_s = trio.current_time()
        return state

    def _alive(self, client_id: str) -> bool:
        state = self.clients.get(client_id)
        return state is not None and trio.current_time() - state.last_seen_s < CLIENT_SILENCE_S

    def _settings(self, ctx: CallContext) -> definition.Settings | None:
        state = self.clients.get(ctx.client_id)
        return None if state is None else state.settings

    async def heartbeat(self, ctx: CallContext, request) -> service.HeartbeatResponse:
        self.seen(ctx)
        return service.HeartbeatResponse(status=status(Code.OK))

    async def notify_client_termination(
        self, ctx: CallContext, request
    ) -> service.NotifyClientTerminationResponse:
        state = self.clients.pop(ctx.client_id, None)
        self.renewals.release_client(ctx.client_id)
        if state is not None and state.outbox is not None:
            state.outbox.close()
        return service.NotifyClientTerminationResponse(status=status(Code.OK))

    async def telemetry(
        self, ctx: CallContext, command, outbox: Outbox
    ) -> service.TelemetryCommand | None:
        """One command a client wrote on its stream; the answer to write back, if any.
        Refusal (BAD_REQUEST) for Settings of neither a producer nor a consumer."""
        if command.WhichOneof("command") != "settings":
            return None  # a thread stack or a verify result: nothing asks for them
        given = command.settings
        pub_sub = given.WhichOneof("pub_sub")
        if pub_sub is None:
            raise Refusal(Code.BAD_REQUEST, "settings carry neither publishing nor subscription")
        state = self.seen(ctx)
        group = None
        if pub_sub == "subscription" and given.subscription.subscriptions:
            topic = given.subscription.subscriptions[0].topic.name
            try:
                group = await self.brokers.group_config(topic, given.subscription.group.name)
            except _BROKER_ERRORS as exc:
                log.info("config of group %s unknown: %s", given.subscription.group.name, exc)
        state.settings = merged_settings(given, group=group)
        state.outbox = outbox
        if pub_sub == "publishing":
            await self.brokers.publish_for([t.name for t in given.publishing.topics])
        return service.TelemetryCommand(status=status(Code.OK), settings=state.settings)

    async def telemetry_closed(self, ctx: CallContext, outbox: Outbox) -> None:
        state = self.clients.get(ctx.client_id)
        if state is not None and state.outbox is outbox:
            state.outbox = None

    def _on_transaction_check(self, half: MessageExt, ref: TransactionRef) -> None:
        """A broker asks about an open transaction: ask one producer of its topic over
        its Telemetry stream; nobody to ask leaves it to the broker's next check."""
        for client_id, state in list(self.clients.items()):
            settings = state.settings
            if state.outbox is None or settings is None or not settings.HasField("publishing"):
                continue
            if half.topic not in {t.name for t in settings.publishing.topics}:
                continue
            command = service.TelemetryCommand(
                status=status(Code.OK),
                recover_orphaned_transaction_command=service.RecoverOrphanedTransactionCommand(
                    message=outbound_message(half), transaction_id=str(ref)
                ),
            )
            if state.outbox.put(command):
                log.debug("transaction %s checked with client %s", ref, client_id)
                return
        log.info("no producer of topic %s connected to check transaction %s", half.topic, ref)

    # ----------------------------------------------------------------- producing
    async def send_message(self, ctx: CallContext, request) -> service.SendMessageResponse:
        messages = request.messages
        if not messages:
            return service.SendMessageResponse(
                status=status(Code.MESSAGE_CORRUPTED, "no message in the request")
            )
        if len({m.topic.name for m in messages}) > 1:
            return service.SendMessageResponse(
                status=status(Code.MESSAGE_CORRUPTED, "messages of one request have one topic")
            )
        entries = [await self._send_one(ctx, message) for message in messages]
        codes = {entry.status.code for entry in entries}
        if len(codes) == 1:
            top = entries[0].status
        else:
            top = status(Code.MULTIPLE_RESULTS, "the messages have different results")
        return service.SendMessageResponse(status=top, entries=entries)

    async def _send_one(self, ctx: CallContext, message) -> service.SendResultEntry:
        topic = message.topic.name
        message_id = message.system_properties.message_id
        try:
            check_message(message, int(time.time() * 1000))
            check_type(message, _topic_type_code(await self.topic_type(topic)))
        except Refusal as refusal:
            return service.SendResultEntry(
                status=status(refusal.code, refusal.message), message_id=message_id
            )
        kind = message_type(message)
        props = stored_properties(message, topic, ctx.peer_host)
        sysflag = MessageSysFlag.TRANSACTION_PREPARED_TYPE if kind == MessageType.TRANSACTION else 0
        try:
            queue = None
            if kind == MessageType.FIFO:
                writable = (await self.brokers.route(topic)).write_queues()
                if writable:
                    group = message.system_properties.message_group
                    queue = writable[fifo_queue_index(group, len(writable))]
            result = await self.brokers.send(
                topic, message.body, props, sysflag=sysflag, queue=queue
            )
        except RouteNotFoundError as exc:
            return service.SendResultEntry(
                status=status(Code.TOPIC_NOT_FOUND, str(exc)), message_id=message_id
            )
        except SendError as exc:
            code = None if exc.indeterminate else exc.code
            return service.SendResultEntry(
                status=status_of_broker_code(code, str(exc)), message_id=message_id
            )
        entry = service.SendResultEntry(
            status=status(_STORED_CODES[result.status]),
            message_id=result.msg_id,
            offset=result.queue_offset,
            recall_handle=result.recall_handle or "",
        )
        if kind == MessageType.TRANSACTION:
            ref = TransactionRef(
                result.message_queue.broker_name,
                decode_message_id(result.offset_msg_id).offset,
                result.queue_offset,
                result.msg_id,
            )
            entry.transaction_id = str(ref)
        return entry

    async def end_transaction(self, ctx: CallContext, request) -> service.EndTransactionResponse:
        def answer(code: int, message: str = "") -> service.EndTransactionResponse:
            return service.EndTransactionResponse(status=status(code, message))

        if not request.transaction_id.strip():
            return answer(Code.INVALID_TRANSACTION_ID, "transaction_id cannot be blank")
        try:
            ref = TransactionRef.parse(request.transaction_id)
        except ValueError as exc:
            return answer(Code.INVALID_TRANSACTION_ID, str(exc))
        resolution = request.resolution
        if resolution not in (
            definition.TransactionResolution.COMMIT,
            definition.TransactionResolution.ROLLBACK,
        ):
            return answer(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        from_check = request.source == definition.TransactionSource.SOURCE_SERVER_CHECK
        try:
            response = await self.brokers.end_transaction(
                request.topic.name,
                ref,
                commit=resolution == definition.TransactionResolution.COMMIT,
                from_check=from_check,
            )
        except (MQClientError, RemotingConnectError, RemotingTimeoutError) as exc:
            return answer(Code.PROXY_TIMEOUT, str(exc))
        return service.EndTransactionResponse(
            status=status_of_broker_code(response.code, response.remark)
        )

    async def recall_message(self, ctx: CallContext, request) -> service.RecallMessageResponse:
        """Cancel a pending timer message by the recall handle its send returned."""
        topic = request.topic.name
        try:
            check_topic(topic)
            message_id = await self.brokers.recall(topic, request.recall_handle)
        except Refusal as refusal:
            return service.RecallMessageResponse(status=status(refusal.code, refusal.message))
        except ValueError as exc:
            return service.RecallMessageResponse(status=status(Code.BAD_REQUEST, str(exc)))
        except _BROKER_ERRORS as exc:
            return service.RecallMessageResponse(status=status(*_code_of(exc)))
        return service.RecallMessageResponse(status=status(Code.OK), message_id=message_id)

    # ----------------------------------------------------------------- consuming
    async def receive_message(self, ctx: CallContext, request) -> list:
        """A long-polled POP at the requested queue's broker group (every queue of it,
        as Apache's proxy pops queueId -1): [status OK, messages..., delivery time] or
        [MESSAGE_NOT_FOUND, delivery time] after an empty poll."""

        def answer(code: int, message: str = "") -> list:
            return [
                service.ReceiveMessageResponse(status=status(code, message)),
                _delivery_timestamp_now(),
            ]

        group = request.group.name
        topic = request.message_queue.topic.name
        broker_name = request.message_queue.broker.name
        settings = self.seen(ctx).settings
        if request.auto_renew:
            invisible_ms = self.renewals.default_invisible_ms
        else:
            invisible_ms = request.invisible_duration.ToMilliseconds()
            if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
                return answer(
                    Code.ILLEGAL_INVISIBLE_TIME,
                    f"invisible_duration {invisible_ms} ms is outside"
                    f" [{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}]",
                )
        poll_ms = MAX_POLL_MS
        if request.HasField("long_polling_timeout"):
            poll_ms = min(poll_ms, request.long_polling_timeout.ToMilliseconds())
        if ctx.time_remaining_s is not None:
            poll_ms = min(poll_ms, int((ctx.time_remaining_s - POLL_MARGIN_S) * 1000))
        if poll_ms < 0:
            return answer(Code.ILLEGAL_POLLING_TIME, "the call's deadline leaves no time to poll")
        expression = request.filter_expression
        filter_type = "SQL92" if expression.type == definition.FilterType.SQL else "TAG"
        fifo = settings is not None and settings.subscription.fifo
        try:
            popped = await self.brokers.pop(
                topic,
                broker_name,
                group,
                max_nums=min(request.batch_size or MAX_BATCH, MAX_BATCH),
                invisible_ms=invisible_ms,
                poll_ms=poll_ms,
                order=fifo,
                attempt_id=request.attempt_id or None,
                init_mode=INIT_MODE_MIN,  # see the module's docstring
                filter_type=filter_type,
                filter_expression=expression.expression or "*",
            )
        except _BROKER_ERRORS as exc:
            return answer(*_code_of(exc))
        if popped.status == POLLING_FULL:
            return answer(Code.TOO_MANY_REQUESTS, "too many long polls at the broker")
        if not popped.messages:
            return answer(Code.MESSAGE_NOT_FOUND, "no new message")
        items = [service.ReceiveMessageResponse(status=status(Code.OK))]
        for one in popped.messages:
            message = outbound_message(one.message, receipt_handle=one.handle.encode())
            if request.auto_renew:
                key = (ctx.client_id, group, topic, message.system_properties.message_id)
                self.renewals.hold(key, one.handle)
            items.append(service.ReceiveMessageResponse(message=message))
        items.append(_delivery_timestamp_now())
        return items

    def _handle(self, text: str, renewed: ReceiptHandle | None = None) -> ReceiptHandle:
        """The handle to use: the newest renewal of the message if the proxy renewed it,
        else `text`; Refusal INVALID_RECEIPT_HANDLE for one that does not parse or expired."""
        if renewed is not None:
            return renewed
        try:
            handle = ReceiptHandle.parse(text)
        except HandleError as exc:
            raise Refusal(Code.INVALID_RECEIPT_HANDLE, str(exc)) from None
        if handle.visible_at_ms <= time.time() * 1000:
            raise Refusal(Code.INVALID_RECEIPT_HANDLE, "the receipt handle has expired")
        return handle

    async def ack_message(self, ctx: CallContext, request) -> service.AckMessageResponse:
        group, topic = request.group.name, request.topic.name
        entries = []
        for entry in request.entries:

            async def ack(text: str = entry.receipt_handle, message_id=entry.message_id):
                renewed = self.renewals.release((ctx.client_id, group, topic, message_id))
                await self.brokers.ack(topic, group, self._handle(text, renewed))

            result = await _outcome(ack)
            entries.append(
                service.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=result
                )
            )
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            top = entries[0].status
        elif not codes:
            top = status(Code.BAD_REQUEST, "no entry to acknowledge")
        else:
            top = status(Code.MULTIPLE_RESULTS, "the entries have different results")
        return service.AckMessageResponse(status=top, entries=entries)

    async def change_invisible_duration(
        self, ctx: CallContext, request
    ) -> service.ChangeInvisibleDurationResponse:
        """A new handle for the message; with a failure, the given handle (the Python
        client keeps whatever handle the answer carries, before it reads the status)."""

        def answer(code: int, message: str = "", handle: str = request.receipt_handle):
            return service.ChangeInvisibleDurationResponse(
                status=status(code, message), receipt_handle=handle
            )

        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            return answer(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible_duration {invisible_ms} ms is outside [0, {MAX_INVISIBLE_MS}]",
            )
        key = (ctx.client_id, request.group.name, request.topic.name, request.message_id)
        try:
            handle = self._handle(request.receipt_handle, self.renewals.release(key))
            changed = await self.brokers.change_invisible_time(
                request.topic.name, request.group.name, handle, invisible_ms
            )
        except Refusal as refusal:
            return answer(refusal.code, refusal.message)
        except _BROKER_ERRORS as exc:
            return answer(*_code_of(exc))
        return answer(Code.OK, handle=changed.encode())

    async def forward_message_to_dead_letter_queue(
        self, ctx: CallContext, request
    ) -> service.ForwardMessageToDeadLetterQueueResponse:
        """Copy the message to %DLQ%<group>, then acknowledge it."""
        group, topic = request.group.name, request.topic.name

        async def forward() -> None:
            key = (ctx.client_id, group, topic, request.message_id)
            handle = self._handle(request.receipt_handle, self.renewals.release(key))
            await self.brokers.to_dead_letter_queue(topic, group, handle, request.message_id)
            await self.brokers.ack(topic, group, handle)

        return service.ForwardMessageToDeadLetterQueueResponse(status=await _outcome(forward))


_BROKER_ERRORS = (MQClientError, RemotingConnectError, RemotingTimeoutError)


async def _outcome(work) -> definition.Status:
    """OK once `await work()` returns; else the Refusal's or the broker failure's code."""
    try:
        await work()
    except Refusal as refusal:
        return status(refusal.code, refusal.message)
    except _BROKER_ERRORS as exc:
        return status(*_code_of(exc))
    return status(Code.OK)


def _code_of(exc: Exception) -> tuple[int, str]:
    """A failed broker call as (v2 code, message)."""
    if isinstance(exc, MQBrokerError):
        mapped = status_of_broker_code(exc.code, exc.remark)
        return mapped.code, str(exc)
    if isinstance(exc, RouteNotFoundError):
        return Code.TOPIC_NOT_FOUND, str(exc)
    return Code.PROXY_TIMEOUT, str(exc)


def _delivery_timestamp_now() -> service.ReceiveMessageResponse:
    item = service.ReceiveMessageResponse()
    item.delivery_timestamp.FromMilliseconds(int(time.time() * 1000))
    return item


def _topic_type_code(topic_type: str) -> int:
    """The MessageType a topic accepts alone; MESSAGE_TYPE_UNSPECIFIED for MIXED."""
    if topic_type == MIXED:
        return MessageType.MESSAGE_TYPE_UNSPECIFIED
    known = MessageType.DESCRIPTOR.values_by_name
    return known[topic_type].number if topic_type in known else MessageType.NORMAL
