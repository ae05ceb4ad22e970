"""Topic routes: what GET_ROUTEINFO_BY_TOPIC (105) answers, and a cache that refreshes.

A route names the broker groups holding a topic (`brokerDatas`: brokerName and its
members, brokerId -> address, id 0 the master) and how many queues each offers
(`queueDatas`, with `perm` bits READ 4 / WRITE 2). A producer writes to the masters'
writable queues; a consumer reads the readable queues, from the master or any replica.

Java name servers before 4.9.4 (and later ones, to old clients) write `brokerAddrs` as
fastjson serializes a `HashMap<Long, String>`: with unquoted keys, `{0:"h:p"}`, which
is not JSON. `parse_route` accepts both forms.

`RouteCache` keeps one route per topic and refreshes every topic from the name
servers on a period (30 s, RocketMQ's `pollNameServerInterval`) and at once when asked:
after "not master", SERVICE_NOT_AVAILABLE or a dead connection the client calls
`refresh(topic)` instead of writing to a stale master until the next poll, which is
the difference that lets a producer ride through a DLedger failover within a second.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from raftmq.client.errors import RouteNotFoundError
from raftmq.protocol import fastjson
from raftmq.remoting import RemotingCommand, RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import RequestCode, ResponseCode

__all__ = [
    "MASTER_ID",
    "BrokerData",
    "MessageQueue",
    "QueueData",
    "RouteCache",
    "TopicRouteData",
    "parse_route",
]

log = logging.getLogger(__name__)

MASTER_ID = 0
PERM_WRITE = 2
PERM_READ = 4

Invoke = Callable[[str, RemotingCommand, float], Awaitable[RemotingCommand]]


@attrs.frozen(order=True)
class MessageQueue:
    """One queue of a topic on one broker group; orders as Java's `compareTo` does
    (topic, then brokerName, then queueId), which rebalancing relies on."""

    topic: str
    broker_name: str
    queue_id: int


@attrs.frozen
class BrokerData:
    cluster: str
    broker_name: str
    addrs: dict[int, str]  # brokerId -> "host:port"

    @property
    def master(self) -> str | None:
        return self.addrs.get(MASTER_ID)

    def addresses(self) -> list[str]:
        """Every member's address, the master first, then by brokerId."""
        return [self.addrs[i] for i in sorted(self.addrs)]


@attrs.frozen
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@attrs.frozen
class TopicRouteData:
    topic: str
    brokers: dict[str, BrokerData]  # by brokerName
    queue_datas: tuple[QueueData, ...]
    order_topic_conf: str | None = None

    def master(self, broker_name: str) -> str | None:
        broker = self.brokers.get(broker_name)
        return None if broker is None else broker.master

    def addresses(self, broker_name: str) -> list[str]:
        broker = self.brokers.get(broker_name)
        return [] if broker is None else broker.addresses()

    def all_addresses(self, masters_only: bool = False) -> set[str]:
        if masters_only:
            return {b.master for b in self.brokers.values() if b.master is not None}
        return {a for b in self.brokers.values() for a in b.addrs.values()}

    def write_queues(self) -> list[MessageQueue]:
        """`topicRouteData2TopicPublishInfo`: writable queues of groups that have a master,
        brokers in name order (or as `orderTopicConf` lists them, for ordered topics)."""
        if self.order_topic_conf:
            queues = []
            for item in self.order_topic_conf.split(";"):
                name, _, count = item.partition(":")
                if count.isdigit():
                    queues += [MessageQueue(self.topic, name, i) for i in range(int(count))]
            return queues
        queues = []
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if qd.perm & PERM_WRITE and self.master(qd.broker_name) is not None:
                queues += [
                    MessageQueue(self.topic, qd.broker_name, i) for i in range(qd.write_queue_nums)
                ]
        return queues

    def read_queues(self) -> list[MessageQueue]:
        """`topicRouteData2TopicSubscribeInfo`: readable queues, sorted."""
        return sorted(
            MessageQueue(self.topic, qd.broker_name, i)
            for qd in self.queue_datas
            if qd.perm & PERM_READ
            for i in range(qd.read_queue_nums)
        )


def parse_route(topic: str, body: bytes) -> TopicRouteData:
    """A TopicRouteData body, standard JSON or fastjson's unquoted integer keys.

    Raises ValueError for a body that is neither.
    """
    text = body.decode("utf-8")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = fastjson.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("a route is a JSON object")
    try:
        brokers = {}
        for bd in doc.get("brokerDatas") or ():
            addrs = {int(k): str(v) for k, v in (bd.get("brokerAddrs") or {}).items()}
            name = str(bd["brokerName"])
            brokers[name] = BrokerData(str(bd.get("cluster", "")), name, addrs)
        queue_datas = tuple(
            QueueData(
                str(qd["brokerName"]),
                int(qd.get("readQueueNums", 0)),
                int(qd.get("writeQueueNums", 0)),
                int(qd.get("perm", PERM_READ | PERM_WRITE)),
                int(qd.get("topicSysFlag", 0)),
            )
            for qd in doc.get("queueDatas") or ()
        )
    except (AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed route: {exc!r}") from None
    return TopicRouteData(topic, brokers, queue_datas, doc.get("orderTopicConf") or None)


class _Fetch:
    """One route request in flight, shared by every caller that asks meanwhile."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.route: TopicRouteData | None = None
        self.error: Exception | None = None


class RouteCache:
    """Routes per topic from a list of name servers, tried in turn.

    `invoke(address, request, timeout_s)` does the round trip (the client's connection
    pool). `on_change(topic, route)` runs when a fetched route differs from the cached
    one, the first fetch included (the client then heartbeats new brokers). A fetch
    that fails keeps the old route, as Java does.
    """

    def __init__(
        self,
        namesrv_addrs: Sequence[str],
        invoke: Invoke,
        *,
        poll_interval_s: float = 30.0,
        timeout_s: float = 3.0,
        on_change: Callable[[str, TopicRouteData], None] | None = None,
    ) -> None:
        if not namesrv_addrs:
            raise ValueError("at least one name server address is needed")
        self.namesrv_addrs = list(namesrv_addrs)
        self._invoke = invoke
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self._on_change = on_change
        self._routes: dict[str, TopicRouteData] = {}
        self._stale: set[str] = set()
        self._fetched_at: dict[str, float] = {}  # topic -> trio time of its last fetch
        self._fetches: dict[str, _Fetch] = {}
        self._current = 0  # the name server that answered last: asked first next time

    def cached(self, topic: str) -> TopicRouteData | None:
        return self._routes.get(topic)

    def current(self, topic: str) -> TopicRouteData | None:
        """What `get(topic)` would return without fetching, or None when it would fetch."""
        return None if topic in self._stale else self._routes.get(topic)

    @property
    def topics(self) -> list[str]:
        return list(self._routes)

    def invalidate(self, topic: str) -> None:
        """The next `get(topic)` fetches from a name server instead of the cache."""
        self._stale.add(topic)

    async def get(self, topic: str) -> TopicRouteData:
        """The cached route, fetched first if there is none or it was invalidated."""
        route = self.current(topic)
        if route is None:
            return await self.refresh(topic)
        return route

    async def fresh(self, topic: str, max_age_s: float) -> TopicRouteData:
        """The route as a name server gave it at most `max_age_s` ago, fetched if older:
        however many callers watch a route at once, it is fetched once per `max_age_s`."""
        route = self._routes.get(topic)
        fetched_at = self._fetched_at.get(topic)
        if route is None or fetched_at is None or trio.current_time() - fetched_at > max_age_s:
            return await self.refresh(topic)
        return route

    async def refresh(self, topic: str) -> TopicRouteData:
        """Fetch the route now; callers arriving while a fetch is out share its answer.

        Raises RouteNotFoundError when no name server has the topic or none answers.
        """
        while True:
            fetch = self._fetches.get(topic)
            if fetch is None:
                fetch = self._fetches[topic] = _Fetch()
                try:
                    fetch.route = await self._fetch(topic)
                except RouteNotFoundError as exc:
                    fetch.error = exc
                finally:
                    # One fetch per topic at a time: every caller meanwhile waited for this one.
                    assert self._fetches[topic] is fetch, topic
                    del self._fetches[topic]
                    fetch.done.set()
            else:
                await fetch.done.wait()
            if fetch.route is not None:
                return fetch.route
            if fetch.error is not None:
                raise fetch.error
            # The caller that fetched was cancelled: ask again.

    async def _fetch(self, topic: str) -> TopicRouteData:
        request = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})
        reasons = []
        count = len(self.namesrv_addrs)
        for step in range(count):
            index = (self._current + step) % count
            address = self.namesrv_addrs[index]
            try:
                response = await self._invoke(address, request, self.timeout_s)
            except (RemotingConnectError, RemotingTimeoutError) as exc:
                reasons.append(f"{address}: {exc}")
                continue
            if response.code != ResponseCode.SUCCESS:
                # Another name server may have heard the broker's registration already.
                reasons.append(f"{address}: code {response.code} {response.remark}")
                continue
            try:
                route = parse_route(topic, response.body)
            except (UnicodeDecodeError, ValueError) as exc:
                reasons.append(f"{address}: bad route body: {exc}")
                continue
            self._current = index
            self._store(topic, route)
            return route
        raise RouteNotFoundError(topic, "; ".join(reasons))

    def _store(self, topic: str, route: TopicRouteData) -> None:
        # A client never sends one topic's messages by another topic's route.
        assert route.topic == topic, (topic, route.topic)
        self._stale.discard(topic)
        self._fetched_at[topic] = trio.current_time()
        old = self._routes.get(topic)
        self._routes[topic] = route
        if route != old:
            log.debug("route of %s changed: %s", topic, route)
            if self._on_change is not None:
                self._on_change(topic, route)

    async def run(self) -> None:
        """Refresh every cached topic each `poll_interval_s` (a task of the client)."""
        while True:
            await trio.sleep(self.poll_interval_s)
            for topic in self.topics:
                try:
                    await self.refresh(topic)
                except RouteNotFoundError as exc:
                    log.warning("keeping the old route: %s", exc)
