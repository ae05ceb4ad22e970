"""The source's and the sink's broker calls, and one blocking client per Python process
to make them.

Spark calls a data source from plain threads (the driver's reader, the executors'
`read` and `write`), so the trio client runs in a background thread (`client.blocking`) and each
call blocks until the loop answers. One client per (name servers, group) is kept per
process: Spark reuses its Python workers across tasks and queries, so the routes and
the open connections outlive a task, and nothing of it is pickled with a reader (a
lock or socket in a reader fails Spark's pickling).

Reads go through `PullConsumer`, which asks the group's master first and any replica
when the master cannot be reached; every member serves committed messages only, at
the same queue offsets, so whichever answers is right, and at worst behind. Writes go
through `Producer`, with its retries and failover; a task waits for every send's result.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import attrs
import outcome
import trio

from raftmq.client.blocking import _Blocking, _blocking
from raftmq.client.consumer import MessageSelector, PullConsumer, PullResult, PullStatus
from raftmq.client.errors import MQClientError, RouteNotFoundError, SendError
from raftmq.client.producer import Message, Producer, SendResult
from raftmq.client.route import MessageQueue
from raftmq.client.spark.exactly_once import (
    PROPERTY_QUERY,
    ROLLBACK,
    UNKNOW,
    Record,
    decide,
    decide_half,
    record_key,
    recorded,
)
from raftmq.client.spark.offsets import Bounds, queue_key, split_key
from raftmq.client.transaction import LocalTransactionState, TransactionProducer
from raftmq.protocol.message import MessageExt
from raftmq.remoting import RemotingConnectError, RemotingError, RemotingTimeoutError

__all__ = [
    "BROKER_ERRORS",
    "BlockingSession",
    "BlockingSinkSession",
    "BrokerSession",
    "Outgoing",
    "SinkSession",
    "session_for",
    "sink_session_for",
]

log = logging.getLogger(__name__)

# The at-least-once sink's batches: a request each, well under the 4 MiB message limit.
BATCH_MESSAGES = 64
BATCH_BYTES = 1 << 20

# What a broker call raises when the member, the route or the connection let it down.
BROKER_ERRORS = (MQClientError, RemotingError, RemotingConnectError, RemotingTimeoutError)


#: a pull's (offset, count, selector; None for every message)
PullRequest = tuple[int, int, MessageSelector | None]


async def _pull(consumer: PullConsumer, mq: MessageQueue, request: PullRequest) -> PullResult:
    offset, count, selector = request
    return await consumer.pull(mq, offset, count, subscription=selector or "*", raw=True)


class _Ahead:
    """A pull sent before it was asked for, and its outcome once it comes."""

    def __init__(self, consumer: PullConsumer, mq: MessageQueue, request: PullRequest, nursery):
        self.request = request
        self._done = trio.Event()
        self._outcome: outcome.Outcome | None = None
        nursery.start_soon(self._run, consumer, mq)

    async def _run(self, consumer: PullConsumer, mq: MessageQueue) -> None:
        self._outcome = await outcome.acapture(_pull, consumer, mq, self.request)
        self._done.set()

    async def result(self) -> PullResult:
        await self._done.wait()
        return self._outcome.unwrap()


class BrokerSession:
    """`async with BrokerSession(namesrv, group):` the calls the source makes."""

    def __init__(self, namesrv_addr: str, group: str, rpc_timeout_s: float = 3.0) -> None:
        self.consumer = PullConsumer(namesrv_addr, group, rpc_timeout_s=rpc_timeout_s)
        self._ahead: dict[MessageQueue, _Ahead] = {}  # at most one per queue

    async def __aenter__(self) -> BrokerSession:
        await self.consumer.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.consumer.__aexit__(*exc_info)

    async def queues(self, topic: str) -> list[str]:
        """The topic's readable queues in the route, as queue keys."""
        return [queue_key(q.broker_name, q.queue_id) for q in await self._read_queues(topic)]

    async def bounds(self, topic: str) -> dict[str, Bounds]:
        """Min and max offset of every readable queue that answered, asked concurrently;
        a queue whose group cannot be reached is left out (and logged)."""
        found: dict[str, Bounds] = {}

        async def one(mq: MessageQueue) -> None:
            try:
                low = await self.consumer.min_offset(mq)
                high = await self.consumer.max_offset(mq)
            except BROKER_ERRORS as exc:
                log.warning(
                    "no offsets for %s:%d of %s: %s", mq.broker_name, mq.queue_id, topic, exc
                )
                return
            found[queue_key(mq.broker_name, mq.queue_id)] = Bounds(low, high)

        async with trio.open_nursery() as nursery:
            for mq in await self._read_queues(topic):
                nursery.start_soon(one, mq)
        return found

    async def _read_queues(self, topic: str) -> list[MessageQueue]:
        """The route's readable queues; the last route known when no name server answers
        (a name server outage must not stop a query whose brokers are fine)."""
        try:
            return await self.consumer.fetch_queues(topic)
        except RouteNotFoundError:
            route = self.consumer.instance.routes.cached(topic)
            if route is None:
                raise
            return route.read_queues()

    async def search(self, topic: str, keys: list[str], timestamp_ms: int) -> dict[str, int]:
        """Per queue, the first offset stored at or after `timestamp_ms`."""
        found: dict[str, int] = {}

        async def one(key: str) -> None:
            mq = MessageQueue(topic, *split_key(key))
            found[key] = await self.consumer.search_offset(mq, timestamp_ms)

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(one, key)
        return found

    async def pull(
        self,
        topic: str,
        broker_name: str,
        queue_id: int,
        offset: int,
        count: int,
        until: int | None = None,
        selector: MessageSelector | None = None,
    ) -> PullResult:
        """Up to `count` messages from `offset` that `selector` selects (None: all), no
        long poll, no offset commit riding along, left undecoded (`PullResult.body`:
        the reader decodes them into columns and checks the tags the broker matched by
        hash).

        With `until` (the end of the range being read), the next pull of the range is sent
        before this one's answer is handed back, so it travels while the caller (Spark's
        thread) converts and ships this one; the next call for that offset takes it: the
        broker's nextBeginOffset, past the messages found, and for a filtered pull past
        those the selector skipped.
        """
        mq = MessageQueue(topic, broker_name, queue_id)
        request = (offset, count, selector)
        ahead = self._ahead.pop(mq, None)
        if ahead is not None and ahead.request == request:
            result = await ahead.result()
        else:
            result = await _pull(self.consumer, mq, request)
        following = result.next_begin_offset
        found = result.status is PullStatus.FOUND or (
            selector is not None and result.status is PullStatus.NO_MATCHED_MSG
        )
        if until is not None and found and offset < following < until:
            request = (following, min(count, until - following), selector)
            self._ahead[mq] = _Ahead(self.consumer, mq, request, self.consumer.instance.nursery)
        return result

    async def forget_route(self, topic: str) -> None:
        """Ask the name server again on the next call: the master may have moved."""
        self.consumer.instance.routes.invalidate(topic)

    async def commit(self, topic: str, offsets: dict[str, int]) -> None:
        """Store `offsets` as the group's consumed offsets on the masters, for monitoring
        (`mqadmin consumerProgress`); a failure is logged, never raised: the checkpoint,
        not the broker, is where the query resumes."""

        async def one(key: str, offset: int) -> None:
            try:
                await self.consumer.update_offset(MessageQueue(topic, *split_key(key)), offset)
            except BROKER_ERRORS as exc:
                log.warning("offset commit of %s at %d for monitoring failed: %s", key, offset, exc)

        async with trio.open_nursery() as nursery:
            for key, offset in offsets.items():
                nursery.start_soon(one, key, offset)


class BlockingSession(_Blocking):
    """BrokerSession's methods, blocking, its loop in a background thread."""

    def __init__(self, namesrv_addr: str, group: str) -> None:
        super().__init__(lambda: BrokerSession(namesrv_addr, group))

    queues = _blocking("queues")
    bounds = _blocking("bounds")
    search = _blocking("search")
    pull = _blocking("pull")
    forget_route = _blocking("forget_route")
    commit = _blocking("commit")


@attrs.frozen
class Outgoing:
    """One message the sink sends."""

    topic: str
    body: bytes
    tags: str | None
    keys: str | None
    properties: dict[str, str] | None


def batches(messages: list[Outgoing]) -> list[tuple[str, list[Message]]]:
    """`messages` as (topic, batch) pairs in their order within each topic, a batch
    holding up to BATCH_MESSAGES messages and BATCH_BYTES of bodies (one at least)."""
    done: list[tuple[str, list[Message]]] = []
    filling: dict[str, tuple[list[Message], int]] = {}  # topic -> its open batch, bytes
    for m in messages:
        batch, size = filling.get(m.topic, ([], 0))
        if batch and (len(batch) == BATCH_MESSAGES or size + len(m.body) > BATCH_BYTES):
            batch, size = [], 0
        if not batch:
            done.append((m.topic, batch))
        batch.append(Message(m.body, m.tags, m.keys, m.properties))
        filling[m.topic] = (batch, size + len(m.body))
    return done


async def _each(items: list, in_flight: int, call) -> list:
    """`await call(item)` for every item, up to `in_flight` at once; their results in
    the items' order. The first exception cancels the rest and is raised."""
    slots = trio.Semaphore(in_flight)
    results: list = [None] * len(items)

    async def one(i: int) -> None:
        try:
            results[i] = await call(items[i])
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        for i in range(len(items)):
            await slots.acquire()
            nursery.start_soon(one, i)
    return results


class SinkSession:
    """`async with SinkSession(namesrv, group, send_timeout_s):` the sink's sends.

    With `records_topic`, the exactly-once mode's too (`exactly_once`): the producer is
    transactional, and it answers the broker's check-backs from the batch records read
    from that topic (cached: a record never changes once written).
    """

    def __init__(
        self, namesrv_addr: str, group: str, send_timeout_s: float, records_topic: str | None
    ) -> None:
        self.records_topic = records_topic
        self.records: list[Record] = []
        self._read_to: dict[MessageQueue, int] = {}  # the next offset to read, per queue
        self._reading = trio.Lock()
        if records_topic is None:
            self.producer = Producer(namesrv_addr, group, send_timeout_s=send_timeout_s)
            self.reader = None
        else:
            # Looking up the records topic's route heartbeats its brokers at once: a
            # restarted query answers the check-backs of halves its crashed run left.
            self.producer = TransactionProducer(
                namesrv_addr,
                group,
                check=self._check,
                topics=(records_topic,),
                send_timeout_s=send_timeout_s,
            )
            self.reader = PullConsumer(namesrv_addr, group)

    async def __aenter__(self) -> SinkSession:
        await self.producer.__aenter__()
        if self.reader is not None:
            await self.reader.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self.reader is not None:
            await self.reader.__aexit__(*exc_info)
        await self.producer.__aexit__(*exc_info)

    async def send_all(self, messages: list[Outgoing], in_flight: int) -> None:
        """Send every message in batches (`batches`), up to `in_flight` batches awaiting
        their result at once; returns when all are acknowledged, raises (SendError)
        when one is not."""
        await _each(batches(messages), in_flight, lambda b: self.producer.send_batch(*b))

    async def send_halves(
        self, messages: list[Outgoing], in_flight: int, properties: dict[str, str]
    ) -> list[SendResult]:
        """Send every message as a half message carrying `properties` too, left open;
        raises when one is not stored."""

        async def one(message: Outgoing) -> SendResult:
            sent = await self.producer.send_in_transaction(
                message.topic,
                message.body,
                lambda _sent: UNKNOW,
                message.tags,
                message.keys,
                {**(message.properties or {}), **properties},
            )
            if sent.local_state is not UNKNOW:  # stored, but not SEND_OK: rolled back
                raise SendError(
                    f"half message to {message.topic}: {sent.send_result.status.name}",
                    code=sent.send_result.status.value,
                    indeterminate=False,
                    attempts=1,
                )
            return sent.send_result

        return await _each(messages, in_flight, one)

    async def recorded_batches(self, query: str) -> dict[int, frozenset[str]]:
        """The query's recorded batches, read up to the records topic's end."""
        async with self._reading:
            for mq in await self.reader.fetch_queues(self.records_topic):
                while True:
                    result = await self.reader.pull(mq, self._read_to.get(mq, 0), 32)
                    if result.status is not PullStatus.FOUND:
                        break
                    for message in result.messages:
                        record = Record.decode(message.body)
                        if record is not None:
                            self.records.append(record)
                    self._read_to[mq] = result.next_begin_offset
        return recorded(self.records, query)

    async def commit_batch(
        self, query: str, batch: int, halves: list[tuple[str, list[SendResult]]], in_flight: int
    ) -> None:
        """Record the batch (unless recorded already: a re-run after a driver crash),
        then end each task attempt's halves as the record decides."""
        committed = await self.recorded_batches(query)
        if batch not in committed:
            record = Record(query, batch, frozenset(task for task, _ in halves))
            await self.producer.send(
                self.records_topic, record.encode(), keys=record_key(query, batch)
            )
            committed[batch] = record.tasks
        ends = [(sent, decide(committed, batch, task)) for task, sents in halves for sent in sents]
        await _each(ends, in_flight, lambda end: self.producer.end(*end))

    async def roll_back(self, halves: list[SendResult], in_flight: int) -> None:
        await _each(halves, in_flight, lambda sent: self.producer.end(sent, ROLLBACK))

    async def _check(self, message: MessageExt) -> LocalTransactionState:
        """The broker asks about a half left open: the records decide."""
        query = message.properties.get(PROPERTY_QUERY)
        committed = await self.recorded_batches(query) if query is not None else {}
        return decide_half(committed, message.properties)


class BlockingSinkSession(_Blocking):
    """SinkSession's methods, blocking, its loop in a background thread."""

    def __init__(self, *args) -> None:
        super().__init__(lambda: SinkSession(*args))

    send_all = _blocking("send_all")
    send_halves = _blocking("send_halves")
    commit_batch = _blocking("commit_batch")
    roll_back = _blocking("roll_back")


_sessions: dict[tuple, BlockingSession | BlockingSinkSession] = {}
_sessions_lock = threading.Lock()


def _open_once(key: tuple, make: Callable[[], BlockingSession | BlockingSinkSession]):
    """This process's session for `key`, opened on first use. Its thread is a daemon:
    Spark ends its Python workers without a shutdown hook to close it."""
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None or not session.alive():
            session = _sessions[key] = make()
            session.__enter__()
        return session


def session_for(namesrv_addr: str, group: str) -> BlockingSession:
    """This process's reading session for (name servers, consumer group)."""
    return _open_once(("read", namesrv_addr, group), lambda: BlockingSession(namesrv_addr, group))


def sink_session_for(
    namesrv_addr: str, group: str, send_timeout_s: float, records_topic: str | None
) -> BlockingSinkSession:
    """This process's writing session for these arguments (`SinkSession`'s)."""
    key = ("write", namesrv_addr, group, send_timeout_s, records_topic)
    return _open_once(key, lambda: BlockingSinkSession(*key[1:]))
