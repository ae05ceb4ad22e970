"""The source's broker calls, and one blocking client per Python process to make them.

Spark calls a data source from plain threads (the driver's reader, the executors'
`read`), so the trio client runs in a background thread (`client.blocking`) and each
call blocks until the loop answers. One client per (name servers, group) is kept per
process: Spark reuses its Python workers across tasks and queries, so the routes and
the open connections outlive a task, and nothing of it is pickled with a reader (a
lock or socket in a reader fails Spark's pickling).

Reads go through `PullConsumer`, which asks the group's master first and any replica
when the master cannot be reached; every member serves committed messages only, at
the same queue offsets, so whichever answers is right, and at worst behind.
"""

from __future__ import annotations

import logging
import threading

import outcome
import trio

from raftmq.client.blocking import _Blocking, _blocking
from raftmq.client.consumer import PullConsumer, PullResult, PullStatus
from raftmq.client.errors import MQClientError, RouteNotFoundError
from raftmq.client.route import MessageQueue
from raftmq.client.spark.offsets import Bounds, queue_key, split_key
from raftmq.remoting import RemotingConnectError, RemotingError, RemotingTimeoutError

__all__ = ["BROKER_ERRORS", "BlockingSession", "BrokerSession", "session_for"]

log = logging.getLogger(__name__)

# What a broker call raises when the member, the route or the connection let it down.
BROKER_ERRORS = (MQClientError, RemotingError, RemotingConnectError, RemotingTimeoutError)


class _Ahead:
    """A pull sent before it was asked for, and its outcome once it comes."""

    def __init__(
        self, consumer: PullConsumer, mq: MessageQueue, request: tuple[int, int], nursery
    ) -> None:
        self.request = request
        self._done = trio.Event()
        self._outcome: outcome.Outcome | None = None
        nursery.start_soon(self._run, consumer, mq)

    async def _run(self, consumer: PullConsumer, mq: MessageQueue) -> None:
        self._outcome = await outcome.acapture(consumer.pull, mq, *self.request)
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
    ) -> PullResult:
        """Up to `count` messages from `offset`, no long poll, no offset commit riding along.

        With `until` (the end of the range being read), the next pull of the range is sent
        before this one's answer is handed back, so it travels while the caller (Spark's
        thread) converts and ships this one; the next call for that offset takes it.
        """
        mq = MessageQueue(topic, broker_name, queue_id)
        ahead = self._ahead.pop(mq, None)
        if ahead is not None and ahead.request == (offset, count):
            result = await ahead.result()
        else:
            result = await self.consumer.pull(mq, offset, count)
        if until is not None and result.status is PullStatus.FOUND and result.messages:
            following = result.messages[-1].queue_offset + 1
            if following < until:
                request = (following, min(count, until - following))
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

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    queues = _blocking("queues")
    bounds = _blocking("bounds")
    search = _blocking("search")
    pull = _blocking("pull")
    forget_route = _blocking("forget_route")
    commit = _blocking("commit")


_sessions: dict[tuple[str, str], BlockingSession] = {}
_sessions_lock = threading.Lock()


def session_for(namesrv_addr: str, group: str) -> BlockingSession:
    """This process's session for (name servers, group), opened on first use. Its thread
    is a daemon: Spark ends its Python workers without a shutdown hook to close it."""
    key = (namesrv_addr, group)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None or not session.alive():
            session = _sessions[key] = BlockingSession(namesrv_addr, group)
            session.__enter__()
        return session
