"""`ClientInstance`: what a producer or consumer shares with the brokers it talks to.

RocketMQ's `MQClientInstance`: a client id, the connection pool, the route cache, the
heartbeat (HEART_BEAT every 30 s, and at once when a route changes, so a newly elected
master knows the client before it asks for anything) and UNREGISTER_CLIENT at close.
Each Producer, PullConsumer and PushConsumer owns one; its tasks live in the
instance's nursery and end when the owner closes.

`call_broker` is the request path for everything except sends: it goes to the broker
group's master (or, for reads, any member), and on a dead connection, a timeout or
an answer that says "ask someone else" (SERVICE_NOT_AVAILABLE from a slave, SYSTEM_BUSY,
SYSTEM_ERROR) it refreshes the route at once and tries again with a short back-off
until its deadline, instead of waiting for the 30 s route poll as Java's client does.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack

import trio

from raftmq.client.connections import ConnectionPool
from raftmq.client.errors import MQBrokerError, RouteNotFoundError
from raftmq.client.route import RouteCache, TopicRouteData
from raftmq.config.address import parse_address_list
from raftmq.remoting import (
    Connection,
    RemotingCommand,
    RemotingConnectError,
    RemotingTimeoutError,
    not_supported,
)
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = ["ClientInstance", "backoff_delays", "local_ip", "parse_namesrv_addrs"]

log = logging.getLogger(__name__)

# Answers after which another member, or the same one a moment later, may succeed.
ASK_ELSEWHERE_CODES = frozenset(
    (ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE)
)

_serial = itertools.count()

# A request a broker sends, and the connection it came on (to answer with a request).
Handler = Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand | None]]


def local_ip() -> str:
    """The address this host reaches the network from (no packet is sent), else loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def parse_namesrv_addrs(namesrv_addr: str | Sequence[str]) -> list[str]:
    """A list, or RocketMQ's `namesrvAddr` form: addresses joined by ';'."""
    addrs = list(parse_address_list(namesrv_addr))
    if not addrs:
        raise ValueError("no name server address given")
    return addrs


def namesrv_from_flag(given: str | None) -> list[str]:
    """A command's `-n`, else the NAMESRV_ADDR environment variable, as RocketMQ's tools
    read it; ValueError saying which is missing or malformed."""
    text = given or os.environ.get("NAMESRV_ADDR")
    if not text:
        raise ValueError("no name server: give -n or set NAMESRV_ADDR")
    try:
        return parse_namesrv_addrs(text)
    except ValueError as exc:
        raise ValueError(f"-n {text!r}: {exc}") from None


def backoff_delays(first_s: float = 0.05, max_s: float = 0.4) -> Iterator[float]:
    """50, 100, 200, 400, 400, ... ms: a new master registers within about a second."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


class ClientInstance:
    """`async with ClientInstance(namesrv) as instance:`; the owner sets
    `producer_group` or `consumer_data` (a ConsumerData dict for the heartbeat),
    `handlers` (request code -> handler for requests brokers send) and
    `route_listeners` before entering."""

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        rpc_timeout_s: float = 3.0,
        poll_name_server_interval_s: float = 30.0,
        heartbeat_interval_s: float = 30.0,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self.namesrv_addrs = parse_namesrv_addrs(namesrv_addr)
        # Java's `ip@pid#nanotime`: two clients of one process are two group members.
        self.client_id = f"{local_ip()}@{os.getpid()}#{next(_serial)}"
        self.rpc_timeout_s = rpc_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.producer_group: str | None = None
        # More producer groups to heartbeat as: mqproxy's, one per topic its clients
        # publish to (Apache's proxy uses the topic as PGROUP), so that brokers send it
        # the transaction checks of those groups.
        self.more_producer_groups: set[str] = set()
        # Heartbeat every member, not only masters (a transactional producer: a new
        # master must know whom to ask about open transactions).
        self.heartbeat_replicas = False
        self.consumer_data: dict | None = None
        self.handlers: dict[int, Handler] = {}
        # Called with (topic, route) when a topic's route changes, after the heartbeat
        # to its brokers is under way.
        self.route_listeners: list[Callable[[str, TopicRouteData], None]] = []
        self.pool = ConnectionPool(
            self._serve, connect_timeout_s=rpc_timeout_s, tls=tls, credentials=credentials
        )
        self.routes = RouteCache(
            self.namesrv_addrs,
            self.pool.invoke,
            poll_interval_s=poll_name_server_interval_s,
            timeout_s=rpc_timeout_s,
            on_change=self._route_changed,
        )
        self._nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> ClientInstance:
        stack = AsyncExitStack()
        await stack.enter_async_context(self.pool)
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        self._nursery.start_soon(self.routes.run)
        self._nursery.start_soon(self._heartbeat_loop)
        return self

    async def __aexit__(self, *exc_info) -> None:
        try:
            await self.unregister()
        finally:
            self._nursery.cancel_scope.cancel()
            stack, self._stack = self._stack, None
            await stack.aclose()

    @property
    def nursery(self) -> trio.Nursery:
        """For the owner's tasks: they stop when the instance closes."""
        return self._nursery

    async def _serve(self, request: RemotingCommand, connection: Connection):
        handler = self.handlers.get(request.code)
        if handler is None:
            return not_supported(request)
        return await handler(request, connection)

    # ------------------------------------------------------------------ heartbeats
    @property
    def _registered(self) -> bool:
        return (
            self.producer_group is not None
            or bool(self.more_producer_groups)
            or self.consumer_data is not None
        )

    def heartbeat_addresses(self) -> set[str]:
        """Masters of every route in use; consumers also heartbeat the slaves they may
        pull from (Java's `sendHeartbeatToAllBroker`)."""
        masters_only = self.consumer_data is None and not self.heartbeat_replicas
        addrs: set[str] = set()
        for topic in self.routes.topics:
            addrs |= self.routes.cached(topic).all_addresses(masters_only)
        return addrs

    def heartbeat_body(self) -> bytes:
        groups = [] if self.producer_group is None else [self.producer_group]
        groups += sorted(self.more_producer_groups - set(groups))
        data = {
            "clientID": self.client_id,
            "consumerDataSet": [] if self.consumer_data is None else [self.consumer_data],
            "producerDataSet": [{"groupName": group} for group in groups],
        }
        return json.dumps(data, separators=(",", ":")).encode()

    async def heartbeat(self) -> None:
        """HEART_BEAT to every heartbeat address at once; failures are only logged."""
        if not self._registered:
            return
        body = self.heartbeat_body()

        async def one(address: str) -> None:
            request = RemotingCommand(RequestCode.HEART_BEAT, body=body)
            try:
                response = await self.pool.invoke(address, request, self.rpc_timeout_s)
            except (RemotingConnectError, RemotingTimeoutError) as exc:
                log.debug("heartbeat to %s failed: %s", address, exc)
                return
            if response.code != ResponseCode.SUCCESS:
                log.warning("heartbeat to %s: code %d %s", address, response.code, response.remark)

        async with trio.open_nursery() as nursery:
            for address in self.heartbeat_addresses():
                nursery.start_soon(one, address)

    async def _heartbeat_loop(self) -> None:
        while True:
            await trio.sleep(self.heartbeat_interval_s)
            await self.heartbeat()

    def _route_changed(self, topic: str, route: TopicRouteData) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self.heartbeat)
        for listener in self.route_listeners:
            listener(topic, route)

    async def unregister(self) -> None:
        """UNREGISTER_CLIENT to every heartbeat address, bounded by one RPC timeout."""
        if not self._registered:
            return
        fields = {"clientID": self.client_id}
        if self.producer_group is not None:
            fields["producerGroup"] = self.producer_group
        if self.consumer_data is not None:
            fields["consumerGroup"] = self.consumer_data["groupName"]

        async def one(address: str) -> None:
            request = RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields=dict(fields))
            try:
                await self.pool.invoke(address, request, self.rpc_timeout_s)
            except (RemotingConnectError, RemotingTimeoutError) as exc:
                log.debug("unregister from %s failed: %s", address, exc)

        with trio.move_on_after(self.rpc_timeout_s):
            async with trio.open_nursery() as nursery:
                for address in self.heartbeat_addresses():
                    nursery.start_soon(one, address)

    # ------------------------------------------------------------------ requests
    async def call_broker(
        self,
        topic: str,
        broker_name: str,
        request: RemotingCommand,
        timeout_s: float | None = None,
        *,
        replicas: bool = False,
    ) -> RemotingCommand:
        """Send `request` to `broker_name`'s master (then, with `replicas`, to the other
        members) and return the first answer that is not an "ask elsewhere" code.

        Retries with a fresh route and back-off until `timeout_s` (the RPC timeout by
        default) has passed, then raises what the last attempt got: MQBrokerError,
        RemotingConnectError, RemotingTimeoutError or RouteNotFoundError.
        """
        deadline = trio.current_time() + (self.rpc_timeout_s if timeout_s is None else timeout_s)
        delays = backoff_delays()
        last: Exception | None = None
        while True:
            try:
                route = await self.routes.get(topic)
            except RouteNotFoundError as exc:
                last, route = exc, None
            if route is not None:
                if replicas:
                    addresses = route.addresses(broker_name)
                else:
                    master = route.master(broker_name)
                    addresses = [] if master is None else [master]
                if not addresses:  # the master died and its successor is not known yet
                    last = MQBrokerError(
                        ResponseCode.SERVICE_NOT_AVAILABLE, "no master in the route", broker_name
                    )
                    self.routes.invalidate(topic)
                for address in addresses:
                    remaining = deadline - trio.current_time()
                    if remaining <= 0:
                        break
                    try:
                        response = await self.pool.invoke(address, request, remaining)
                    except (RemotingConnectError, RemotingTimeoutError) as exc:
                        last = exc
                        self.routes.invalidate(topic)
                        continue
                    if response.code not in ASK_ELSEWHERE_CODES:
                        return response
                    last = MQBrokerError(response.code, response.remark, address)
                    self.routes.invalidate(topic)
            pause = min(next(delays), deadline - trio.current_time())
            if pause <= 0:
                raise last
            await trio.sleep(pause)
