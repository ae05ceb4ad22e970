"""`PushConsumer`: a clustering consumer group member that calls a handler per message.

RocketMQ's `DefaultMQPushConsumer` in clustering mode, built on PullConsumer's calls:

- **Membership.** HEART_BEAT with the group's ConsumerData to every member of every
  broker group of the topic (at start, every 30 s, and when a route changes), which
  also makes the broker create `%RETRY%<group>`; that topic is subscribed too. An
  SQL92 subscription (`MessageSelector.by_sql`) is first checked with every master of
  the topic (CHECK_CLIENT_CONFIG, as Java's consumer does at start): entering raises
  MQBrokerError with the broker's remark when one refuses it (property filters
  disabled, or an expression that does not compile).
- **Rebalance.** The topic's readable queues and the member ids
  (GET_CONSUMER_LIST_BY_GROUP) are allocated averagely (`allocate_averagely`) at start,
  every `rebalance_interval_s`, and at once when a broker sends
  NOTIFY_CONSUMER_IDS_CHANGED. A queue this member no longer owns is released: its
  pull loop stops after the handler call in progress, and its offset is committed
  before the queue counts as released.
- **Consumption.** One task per owned queue: a long-polling pull (SUSPEND, held up to
  `long_poll_s`, carrying the committed offset), then the handler on each chunk of
  `consume_batch_size` messages in queue order, one call at a time per queue; queues
  run concurrently. `async def handler(msgs) -> bool`: True means consumed; False or
  an exception sends the messages back (CONSUMER_SEND_MSG_BACK, the broker redelivers
  them later through the retry topic) and counts them consumed; if even that fails,
  the handler sees them again a second later. Retried messages get their original
  topic back from the RETRY_TOPIC property.
- **Offsets.** Per queue, everything below the committed offset is consumed
  (`QueueOffsets`); commits go to the master (UPDATE_CONSUMER_OFFSET) every
  `persist_interval_s`, on release and at close. A queue with no committed offset
  starts where `consume_from` says. Delivery is at least once: a member that dies
  between consuming and committing leaves those messages to the next owner.
  RESET_CONSUMER_CLIENT_OFFSET (220, `mqadmin resetOffsetByTime`) restarts each owned
  queue it names from the offset it gives, dropping the queue's own progress.
- **Consume directly.** CONSUME_MESSAGE_DIRECTLY (309, `mqadmin queryMsgById -g -d`)
  runs the handler on the one message the broker sends, outside any queue's order and
  offsets, and answers ConsumeMessageDirectlyResult: CR_SUCCESS for True, CR_LATER for
  False, CR_THROW_EXCEPTION (the exception in the remark) for an exception, as Java's
  ConsumeMessageConcurrentlyService.consumeMessageDirectly does. Nothing is sent back.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import trio

from raftmq.client.allocate import allocate_averagely
from raftmq.client.consumer import (
    MAX_RECONSUME_TIMES,
    TAG,
    MessageSelector,
    PullConsumer,
    PullStatus,
    Subscription,
)
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.instance import backoff_delays
from raftmq.client.offsets import QueueOffsets
from raftmq.client.producer import trace_dispatcher
from raftmq.client.route import MessageQueue, TopicRouteData
from raftmq.client.running_info import (
    QueueState,
    consumer_status_body,
    java_timestamp,
    running_info_body,
)
from raftmq.client.trace import (
    TRACE_TOPIC,
    ConsumeReturnType,
    consume_records,
    new_request_id,
)
from raftmq.protocol import fastjson
from raftmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageFormatError,
    decode,
    inflate,
)
from raftmq.remoting import Connection, RemotingCommand, RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = ["ConsumeFromWhere", "PushConsumer", "retry_topic"]

log = logging.getLogger(__name__)

Handler = Callable[[list[MessageExt]], Awaitable[bool]]

# What a broker round trip can raise; the loops log these and carry on.
_CALL_ERRORS = (MQClientError, RemotingConnectError, RemotingTimeoutError, MessageFormatError)
REDELIVER_LOCALLY_S = 1.0  # when even the send-back failed


class ConsumeFromWhere(enum.Enum):
    """Where a queue with no committed offset starts (`ConsumeFromWhere`)."""

    CONSUME_FROM_LAST_OFFSET = "LAST"
    CONSUME_FROM_FIRST_OFFSET = "FIRST"
    CONSUME_FROM_TIMESTAMP = "TIMESTAMP"

    @classmethod
    def parse(cls, value: ConsumeFromWhere | str) -> ConsumeFromWhere:
        if isinstance(value, cls):
            return value
        for member in cls:
            if value in (member.name, member.value):
                return member
        raise ValueError(f"consume_from must be one of {[m.name for m in cls]}, not {value!r}")


def retry_topic(group: str) -> str:
    return f"%RETRY%{group}"


class _QueueWorker:
    """The state of one owned queue; `stop()` ends its loop after the current handler."""

    def __init__(self, mq: MessageQueue, start: int, committed: int | None) -> None:
        self.mq = mq
        self.offsets = QueueOffsets(start)
        self.committed = committed
        self.stopping = False
        self.stopped = trio.Event()
        self.pull_scope = trio.CancelScope()
        self.commit_lock = trio.Lock()  # commits of one queue land in order
        self.reset = False  # its progress was overruled by an offset reset: never commit it
        self.last_pull_ms = 0  # when a pull last answered, and the handler last returned
        self.last_consume_ms = 0

    def stop(self) -> None:
        self.stopping = True
        self.pull_scope.cancel()


class PushConsumer:
    """`async with PushConsumer(namesrv, "group", "Topic", handler) as consumer: ...`.

    Entering sends the first heartbeat and runs the first rebalance, so the member
    owns its queues when the block starts (if the broker knows it by then).
    """

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        group: str,
        topic: str,
        handler: Handler,
        subscription: str | MessageSelector = "*",
        consume_from: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        *,
        consume_timestamp_ms: int | None = None,
        rebalance_interval_s: float = 20.0,
        persist_interval_s: float = 5.0,
        pull_batch_size: int = 32,
        consume_batch_size: int = 1,
        long_poll_s: float = 15.0,
        max_reconsume_times: int = MAX_RECONSUME_TIMES,
        rpc_timeout_s: float = 3.0,
        poll_name_server_interval_s: float = 30.0,
        heartbeat_interval_s: float = 30.0,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
        enable_trace: bool = False,
        trace_topic: str = TRACE_TOPIC,
    ) -> None:
        """`enable_trace` (the Java client's `enableMsgTrace`): a `SubBefore` and a
        `SubAfter` trace record per consumed message, to `trace_topic`, in the
        background (`trace.TraceDispatcher`)."""
        self.group = group
        self.topic = topic
        self.handler = handler
        self.consume_from = ConsumeFromWhere.parse(consume_from)
        # Java's default consumeTimestamp: half an hour ago.
        self.consume_timestamp_ms = (
            int(time.time() * 1000) - 30 * 60 * 1000
            if consume_timestamp_ms is None
            else consume_timestamp_ms
        )
        self.rebalance_interval_s = rebalance_interval_s
        self.persist_interval_s = persist_interval_s
        self.pull_batch_size = pull_batch_size
        self.consume_batch_size = consume_batch_size
        self.long_poll_s = long_poll_s
        self.max_reconsume_times = max_reconsume_times
        self.retry_topic = retry_topic(group)
        self.subscriptions = {
            topic: Subscription.of(topic, subscription),
            self.retry_topic: Subscription(self.retry_topic, "*"),
        }
        self._pull = PullConsumer(
            namesrv_addr,
            group,
            rpc_timeout_s=rpc_timeout_s,
            poll_name_server_interval_s=poll_name_server_interval_s,
            heartbeat_interval_s=heartbeat_interval_s,
            tls=tls,
            credentials=credentials,
        )
        self.instance = self._pull.instance
        self.instance.consumer_data = {
            "consumeFromWhere": self.consume_from.name,
            "consumeType": "CONSUME_PASSIVELY",
            "groupName": group,
            "messageModel": "CLUSTERING",
            "subscriptionDataSet": [s.to_json() for s in self.subscriptions.values()],
            "unitMode": False,
        }
        self.instance.handlers[RequestCode.NOTIFY_CONSUMER_IDS_CHANGED] = self._on_ids_changed
        self.instance.handlers[RequestCode.RESET_CONSUMER_CLIENT_OFFSET] = self._on_reset_offset
        self.instance.handlers[RequestCode.CONSUME_MESSAGE_DIRECTLY] = self._on_consume_directly
        self.instance.handlers[RequestCode.GET_CONSUMER_RUNNING_INFO] = self._on_running_info
        self.instance.handlers[RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT] = self._on_status
        self.started_ms = int(time.time() * 1000)
        self.instance.route_listeners.append(self._route_changed)
        self._workers: dict[MessageQueue, _QueueWorker] = {}
        self._closing = False
        self._loops = trio.CancelScope()
        self._wakeup: trio.Event | None = None
        self._assignment_changed: trio.Event | None = None
        self.trace = (
            trace_dispatcher(namesrv_addr, group, trace_topic, rpc_timeout_s, tls, credentials)
            if enable_trace
            else None
        )

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    @property
    def assigned_queues(self) -> frozenset[MessageQueue]:
        return frozenset(self._workers)

    async def wait_for_assignment(
        self, check: Callable[[frozenset[MessageQueue]], bool]
    ) -> frozenset[MessageQueue]:
        """Wait until `check(assigned_queues)` holds after a rebalance; returns them."""
        while not check(self.assigned_queues):
            await self._assignment_changed.wait()
        return self.assigned_queues

    async def __aenter__(self) -> PushConsumer:
        self._wakeup = trio.Event()
        self._assignment_changed = trio.Event()
        await self._pull.__aenter__()
        try:
            if self.trace is not None:
                await self.trace.__aenter__()
            for topic in self.subscriptions:
                try:
                    await self.instance.routes.get(topic)
                except MQClientError as exc:  # the retry topic appears after the heartbeat
                    log.debug("%s", exc)
            await self._check_subscriptions()
            await self.instance.heartbeat()
            await self._rebalance()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        self.instance.nursery.start_soon(self._run_loops)
        return self

    async def _check_subscriptions(self) -> None:
        """CHECK_CLIENT_CONFIG for each subscription that is not by tag, with every
        master of its topic; MQBrokerError for the first refusal."""
        for subscription in self.subscriptions.values():
            if subscription.expression_type == TAG:
                continue
            route = await self.instance.routes.get(subscription.topic)
            body = json.dumps(
                {
                    "clientId": self.client_id,
                    "group": self.group,
                    "subscriptionData": subscription.to_json(),
                }
            ).encode()
            for address in sorted(route.all_addresses(masters_only=True)):
                request = RemotingCommand(RequestCode.CHECK_CLIENT_CONFIG, body=body)
                response = await self.instance.pool.invoke(
                    address, request, self.instance.rpc_timeout_s
                )
                if response.code != ResponseCode.SUCCESS:
                    raise MQBrokerError(response.code, response.remark, address)

    async def __aexit__(self, *exc_info) -> None:
        try:
            self._closing = True
            self._loops.cancel()
            async with trio.open_nursery() as nursery:
                for mq in list(self._workers):
                    nursery.start_soon(self._release, mq)
        finally:
            try:
                if self.trace is not None:
                    await self.trace.__aexit__(*exc_info)
            finally:
                await self._pull.__aexit__(*exc_info)

    async def _on_ids_changed(self, request: RemotingCommand, _connection: Connection) -> None:
        if request.ext_fields.get("consumerGroup") == self.group:
            self._wakeup.set()

    async def _on_reset_offset(self, request: RemotingCommand, _connection: Connection) -> None:
        """The broker committed new offsets for the group (ResetOffsetBody: MessageQueue
        -> offset); the queues restart from them in a task, not on the connection's."""
        if request.ext_fields.get("group") != self.group:
            return
        try:
            table = fastjson.loads(request.body.decode("utf-8")).get("offsetTable") or []
            offsets = {
                MessageQueue(str(mq["topic"]), str(mq["brokerName"]), int(mq["queueId"])): int(o)
                for mq, o in table
            }
        except (UnicodeDecodeError, ValueError, AttributeError, KeyError, TypeError) as exc:
            log.warning("unreadable offset reset: %r", exc)
            return
        self.instance.nursery.start_soon(self._reset_offsets, offsets)

    async def _on_consume_directly(self, request: RemotingCommand, _connection: Connection):
        """ClientRemotingProcessor.consumeMessageDirectly: the handler on the message in
        the body; the result as ConsumeMessageDirectlyResult JSON."""
        group = request.ext_fields.get("consumerGroup")
        if group != self.group:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"The Consumer Group <{group}> not exist in this consumer",
            )
        try:
            msg = decode(request.body)[0]
        except MessageFormatError as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad message: {exc}")
        inflate(msg)
        self._restore_topic(msg)
        remark = None
        started = time.monotonic()
        try:
            result = "CR_SUCCESS" if await self.handler([msg]) else "CR_LATER"
        except Exception as exc:
            log.warning("handler failed on %s, consumed directly", msg.msg_id, exc_info=True)
            result, remark = "CR_THROW_EXCEPTION", f"{type(exc).__name__}: {exc}"
        spent_ms = int((time.monotonic() - started) * 1000)
        answer = {
            "autoCommit": True,
            "consumeResult": result,
            "order": False,
            "remark": remark,
            "spentTimeMills": spent_ms,
        }
        body = json.dumps({k: v for k, v in answer.items() if v is not None}).encode()
        return request.make_response(ResponseCode.SUCCESS, body=body)

    def _queue_states(self) -> list[QueueState]:
        return [
            QueueState(
                mq, w.offsets.consumed, w.offsets.in_flight, w.last_pull_ms, w.last_consume_ms
            )
            for mq, w in self._workers.items()
        ]

    async def _on_running_info(self, request: RemotingCommand, _connection: Connection):
        """ClientRemotingProcessor.getConsumerRunningInfo (raftmq.client.running_info)."""
        properties = {
            "consumerGroup": self.group,
            "messageModel": "CLUSTERING",
            "consumeFromWhere": self.consume_from.name,
            "consumeTimestamp": java_timestamp(self.consume_timestamp_ms),
            "pullBatchSize": str(self.pull_batch_size),
            "consumeMessageBatchMaxSize": str(self.consume_batch_size),
            "maxReconsumeTimes": str(self.max_reconsume_times),
            "namesrvAddr": ";".join(self.instance.namesrv_addrs),
            "PROP_NAMESERVER_ADDR": ";".join(self.instance.namesrv_addrs),
            "PROP_CONSUMER_START_TIMESTAMP": str(self.started_ms),
        }
        subscriptions = [s.to_json() for s in self.subscriptions.values()]
        body = running_info_body(properties, subscriptions, self._queue_states())
        return request.make_response(ResponseCode.SUCCESS, body=body)

    async def _on_status(self, request: RemotingCommand, _connection: Connection):
        """ClientRemotingProcessor.getConsumeStatus: the offsets of a topic's queues."""
        topic = request.ext_fields.get("topic") or ""
        body = consumer_status_body(topic, self._queue_states())
        return request.make_response(ResponseCode.SUCCESS, body=body)

    def _restore_topic(self, msg: MessageExt) -> None:
        """A retried message's original topic, from its RETRY_TOPIC property
        (`resetRetryAndNamespace`)."""
        original = msg.get_property(MessageConst.PROPERTY_RETRY_TOPIC)
        if msg.topic == self.retry_topic and original:
            msg.topic = original

    async def _reset_offsets(self, offsets: dict[MessageQueue, int]) -> None:
        for mq, offset in sorted(offsets.items()):
            worker = self._workers.pop(mq, None)
            if worker is None:
                continue
            worker.reset = True
            worker.stop()
            await worker.stopped.wait()
            try:  # the last word on the offset: a commit of the old progress may have raced
                await self._pull.update_offset(mq, offset)
            except _CALL_ERRORS as exc:
                log.warning("cannot commit the reset offset %d of %s: %s", offset, mq, exc)
            await self._acquire(mq)

    def _route_changed(self, topic: str, route: TopicRouteData) -> None:
        """A long poll held by a master that stopped answering would wait out its hold
        (up to 30 s); after a route change each queue pulls again, from the new master."""
        for worker in self._workers.values():
            if worker.mq.topic == topic:
                worker.pull_scope.cancel()

    async def _run_loops(self) -> None:
        with self._loops:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._rebalance_loop)
                nursery.start_soon(self._persist_loop)

    async def _rebalance_loop(self) -> None:
        while True:
            with trio.move_on_after(self.rebalance_interval_s):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            await self._rebalance()

    async def _persist_loop(self) -> None:
        while True:
            await trio.sleep(self.persist_interval_s)
            for worker in list(self._workers.values()):
                await self._commit(worker)

    # ------------------------------------------------------------------ rebalance
    async def _rebalance(self) -> None:
        before = self.assigned_queues
        for topic in self.subscriptions:
            try:
                route = await self.instance.routes.get(topic)
                members = await self._pull.consumer_ids(topic)
            except _CALL_ERRORS as exc:
                log.info("rebalance of %s skipped: %s", topic, exc)
                continue
            log.debug("%s: members of %s for %s: %s", self.client_id, self.group, topic, members)
            mine = set(allocate_averagely(route.read_queues(), members, self.client_id))
            async with trio.open_nursery() as nursery:
                for mq in self._workers:
                    if mq.topic == topic and mq not in mine:
                        nursery.start_soon(self._release, mq)
            async with trio.open_nursery() as nursery:
                for mq in sorted(mine - self._workers.keys()):
                    nursery.start_soon(self._acquire, mq)
        if self.assigned_queues != before:
            log.info("%s now consumes %s", self.client_id, sorted(self._workers))
            self._assignment_changed.set()
            self._assignment_changed = trio.Event()

    async def _release(self, mq: MessageQueue) -> None:
        worker = self._workers.pop(mq, None)
        if worker is not None:
            worker.stop()
            await worker.stopped.wait()

    async def _acquire(self, mq: MessageQueue) -> None:
        try:
            committed = await self._pull.query_offset(mq)
            start = committed if committed is not None else await self._initial_offset(mq)
        except _CALL_ERRORS as exc:
            log.warning("cannot take %s yet: %s", mq, exc)
            return
        if self._closing or mq in self._workers:
            return
        worker = self._workers[mq] = _QueueWorker(mq, start, committed)
        self.instance.nursery.start_soon(self._work, worker)

    async def _initial_offset(self, mq: MessageQueue) -> int:
        """`computePullFromWhere` for a queue the group has never committed."""
        if (
            mq.topic == self.retry_topic
            or self.consume_from is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        ):
            return await self._pull.min_offset(mq)
        if self.consume_from is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return await self._pull.max_offset(mq)
        return await self._pull.search_offset(mq, self.consume_timestamp_ms)

    # ------------------------------------------------------------------ consuming
    async def _work(self, worker: _QueueWorker) -> None:
        try:
            await self._consume_queue(worker)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(self.instance.rpc_timeout_s):
                await self._commit(worker)
            worker.stopped.set()

    async def _consume_queue(self, worker: _QueueWorker) -> None:
        mq = worker.mq
        subscription = self.subscriptions[mq.topic]
        delays = backoff_delays()
        while not worker.stopping:
            result = None
            with trio.CancelScope() as worker.pull_scope:
                try:
                    result = await self._pull.pull(
                        mq,
                        worker.offsets.next_pull,
                        self.pull_batch_size,
                        subscription=subscription,
                        long_poll_s=self.long_poll_s,
                        commit_offset=worker.offsets.consumed,
                    )
                except _CALL_ERRORS as exc:
                    log.info("pull from %s failed: %s", mq, exc)
                    await trio.sleep(next(delays))
            if result is None:
                continue
            worker.last_pull_ms = int(time.time() * 1000)
            delays = backoff_delays()
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "%s: offset %d out of range, moving to %d",
                    mq,
                    worker.offsets.next_pull,
                    result.next_begin_offset,
                )
                worker.offsets.reset(result.next_begin_offset)
                await self._commit(worker)
                continue
            worker.offsets.pulled(
                (m.queue_offset for m in result.messages), result.next_begin_offset
            )
            messages = result.messages
            for start in range(0, len(messages), self.consume_batch_size):
                if worker.stopping:
                    break
                await self._consume(worker, messages[start : start + self.consume_batch_size])

    async def _consume(self, worker: _QueueWorker, messages: list[MessageExt]) -> None:
        for msg in messages:
            self._restore_topic(msg)
        pending = messages
        while True:
            request_id, started_ms = new_request_id(), int(time.time() * 1000)
            self._trace(pending, request_id, started_ms, None)
            try:
                consumed = bool(await self.handler(pending))
            except Exception:
                log.exception("handler failed on %d messages of %s", len(pending), worker.mq)
                consumed = False
                self._trace(pending, request_id, started_ms, ConsumeReturnType.EXCEPTION)
            else:
                outcome = ConsumeReturnType.SUCCESS if consumed else ConsumeReturnType.FAILED
                self._trace(pending, request_id, started_ms, outcome)
            worker.last_consume_ms = int(time.time() * 1000)
            if consumed:
                worker.offsets.done(m.queue_offset for m in pending)
                return
            failed = []
            for msg in pending:
                try:
                    await self._pull.send_back(worker.mq, msg, 0, self.max_reconsume_times)
                except _CALL_ERRORS as exc:
                    log.warning("cannot send back %s: %s", msg.msg_id, exc)
                    failed.append(msg)
                else:
                    worker.offsets.done([msg.queue_offset])
            pending = failed
            if not pending or worker.stopping:
                return
            await trio.sleep(REDELIVER_LOCALLY_S)

    def _trace(
        self,
        messages: list[MessageExt],
        request_id: str,
        started_ms: int,
        outcome: ConsumeReturnType | None,
    ) -> None:
        if self.trace is not None:
            self.trace.submit(
                consume_records(self.group, messages, request_id, started_ms, outcome)
            )

    async def _commit(self, worker: _QueueWorker) -> None:
        async with worker.commit_lock:
            offset = worker.offsets.consumed
            if offset == worker.committed or worker.reset:
                return
            try:
                await self._pull.update_offset(worker.mq, offset)
            except _CALL_ERRORS as exc:
                log.warning("cannot commit offset %d of %s: %s", offset, worker.mq, exc)
                return
            worker.committed = offset
