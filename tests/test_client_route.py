"""Topic routes: parsing both JSON dialects, queue lists, and the cache against real
name servers (in-process NamesrvServer over TCP)."""

from __future__ import annotations

import pytest
import trio

from raftmq.client.errors import RouteNotFoundError
from raftmq.client.route import MessageQueue, RouteCache, parse_route
from raftmq.remoting import RemotingClient, RemotingCommand
from raftmq.tools.dledger_local import free_ports
from tests.helpers import register_request, start_namesrv

JAVA_BODY = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,'
    b'"topicSysFlag":0,"writeQueueNums":4}]}'
)


def test_fastjson_unquoted_broker_ids_parse():
    route = parse_route("T", JAVA_BODY)
    broker = route.brokers["broker-a"]
    assert broker.addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    assert route.master("broker-a") == "10.0.0.1:10911"
    assert route.addresses("broker-a") == ["10.0.0.1:10911", "10.0.0.2:10911"]
    assert route == parse_route("T", JAVA_BODY.replace(b"{0:", b'{"0":').replace(b",1:", b',"1":'))


def test_bare_keys_are_found_only_outside_strings():
    body = (
        b'{"brokerDatas":[{"brokerAddrs":{ 2 :"h:2", 0:"h:0"},"brokerName":"a,1:b",'
        b'"cluster":"{0:x}"}],"queueDatas":[]}'
    )
    route = parse_route("T", body)
    assert route.brokers["a,1:b"].addrs == {0: "h:0", 2: "h:2"}
    assert route.brokers["a,1:b"].cluster == "{0:x}"


@pytest.mark.parametrize("body", [b"", b"[]", b"{0:", b'{"brokerDatas":[{"brokerAddrs":{}}]}'])
def test_bad_route_bodies_raise_value_error(body):
    with pytest.raises(ValueError):
        parse_route("T", body)


def test_write_and_read_queues():
    body = (
        b'{"brokerDatas":['
        b'{"brokerAddrs":{"0":"b:1"},"brokerName":"b","cluster":"c"},'
        b'{"brokerAddrs":{"0":"a:1"},"brokerName":"a","cluster":"c"},'
        b'{"brokerAddrs":{"1":"n:2"},"brokerName":"nomaster","cluster":"c"},'
        b'{"brokerAddrs":{"0":"r:1"},"brokerName":"readonly","cluster":"c"}],'
        b'"queueDatas":['
        b'{"brokerName":"b","perm":6,"readQueueNums":1,"writeQueueNums":2},'
        b'{"brokerName":"a","perm":6,"readQueueNums":2,"writeQueueNums":1},'
        b'{"brokerName":"nomaster","perm":6,"readQueueNums":1,"writeQueueNums":1},'
        b'{"brokerName":"readonly","perm":4,"readQueueNums":1,"writeQueueNums":1}]}'
    )
    route = parse_route("T", body)
    assert route.write_queues() == [
        MessageQueue("T", "a", 0),
        MessageQueue("T", "b", 0),
        MessageQueue("T", "b", 1),
    ]
    assert route.read_queues() == [
        MessageQueue("T", "a", 0),
        MessageQueue("T", "a", 1),
        MessageQueue("T", "b", 0),
        MessageQueue("T", "nomaster", 0),
        MessageQueue("T", "readonly", 0),
    ]
    assert route.all_addresses() == {"a:1", "b:1", "n:2", "r:1"}
    assert route.all_addresses(masters_only=True) == {"a:1", "b:1", "r:1"}


def test_ordered_topic_queues_follow_order_topic_conf():
    body = b'{"brokerDatas":[],"queueDatas":[],"orderTopicConf":"b:2;a:1"}'
    assert parse_route("T", body).write_queues() == [
        MessageQueue("T", "b", 0),
        MessageQueue("T", "b", 1),
        MessageQueue("T", "a", 0),
    ]


def test_message_queues_order_like_java():
    queues = [MessageQueue("T", "b", 0), MessageQueue("S", "z", 9), MessageQueue("T", "a", 10)]
    assert sorted(queues) == [
        MessageQueue("S", "z", 9),
        MessageQueue("T", "a", 10),
        MessageQueue("T", "b", 0),
    ]


class Registrar:
    """Registers broker addresses (nothing listens on them) with a name server."""

    def __init__(self, client: RemotingClient) -> None:
        self.client = client

    async def register(self, address: str, broker_id: int, topics=None) -> None:
        request = register_request("broker-a", address, broker_id, topics or {"T": 4})
        assert (await self.client.invoke(request)).code == 0


def pool_invoke(requests: list[str]):
    """An `invoke` for RouteCache that opens a connection per call and counts calls."""

    async def invoke(address: str, request: RemotingCommand, timeout_s: float):
        requests.append(address)
        async with RemotingClient(address) as client:
            return await client.invoke(request, timeout_s)

    return invoke


async def test_cache_follows_a_new_master_when_refreshed(nursery):
    namesrv = await start_namesrv(nursery)
    requests: list[str] = []
    changes: list[str | None] = []
    with trio.fail_after(10):
        async with RemotingClient(namesrv) as link:
            registrar = Registrar(link)
            await registrar.register("127.0.0.1:1001", 0)
            await registrar.register("127.0.0.1:1002", 1)
            cache = RouteCache(
                [namesrv],
                pool_invoke(requests),
                on_change=lambda topic, route: changes.append(route.master("broker-a")),
            )
            assert (await cache.get("T")).master("broker-a") == "127.0.0.1:1001"
            assert (await cache.get("T")).master("broker-a") == "127.0.0.1:1001"
            assert len(requests) == 1  # the second get was served from the cache

            await registrar.register("127.0.0.1:1002", 0)  # the slave is elected
            cache.invalidate("T")
            route = await cache.get("T")
            assert route.master("broker-a") == "127.0.0.1:1002"
            assert route.brokers["broker-a"].addrs == {0: "127.0.0.1:1002"}
            assert changes == ["127.0.0.1:1001", "127.0.0.1:1002"]
            await cache.refresh("T")  # nothing changed: no callback
            assert len(changes) == 2


async def test_concurrent_refreshes_share_one_request(nursery):
    namesrv = await start_namesrv(nursery)
    requests: list[str] = []
    with trio.fail_after(10):
        async with RemotingClient(namesrv) as link:
            await Registrar(link).register("127.0.0.1:1001", 0)
            cache = RouteCache([namesrv], pool_invoke(requests))
            routes = []

            async def refresh():
                routes.append(await cache.refresh("T"))

            async with trio.open_nursery() as inner:
                for _ in range(20):
                    inner.start_soon(refresh)
            assert len(routes) == 20 and len(requests) == 1


async def test_a_fresh_route_is_fetched_once_per_max_age(nursery):
    """What a slow send watching for a new master asks of the name servers: a route
    younger than `max_age_s` is the cached one, however often it is asked for."""
    namesrv = await start_namesrv(nursery)
    requests: list[str] = []
    with trio.fail_after(10):
        async with RemotingClient(namesrv) as link:
            registrar = Registrar(link)
            await registrar.register("127.0.0.1:1001", 0)
            cache = RouteCache([namesrv], pool_invoke(requests))
            for _ in range(5):
                assert (await cache.fresh("T", 60.0)).master("broker-a") == "127.0.0.1:1001"
            assert len(requests) == 1
            await registrar.register("127.0.0.1:1002", 0)  # elected
            assert (await cache.fresh("T", 60.0)).master("broker-a") == "127.0.0.1:1001"
            await trio.sleep(0.02)
            assert (await cache.fresh("T", 0.01)).master("broker-a") == "127.0.0.1:1002"
            assert len(requests) == 2


async def test_name_servers_are_tried_in_turn(nursery):
    empty = await start_namesrv(nursery)  # knows no topic
    full = await start_namesrv(nursery)
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    requests: list[str] = []
    with trio.fail_after(10):
        async with RemotingClient(full) as link:
            await Registrar(link).register("127.0.0.1:1001", 0)
            cache = RouteCache([dead, empty, full], pool_invoke(requests))
            assert (await cache.get("T")).master("broker-a") == "127.0.0.1:1001"
            assert requests == [dead, empty, full]
            await cache.refresh("T")  # the one that answered is asked first
            assert requests[3:] == [full]
            with pytest.raises(RouteNotFoundError, match="No topic route info"):
                await cache.get("nope")


async def test_routes_are_polled_on_a_period(nursery):
    namesrv = await start_namesrv(nursery)
    changed = trio.Event()
    with trio.fail_after(10):
        async with RemotingClient(namesrv) as link:
            registrar = Registrar(link)
            await registrar.register("127.0.0.1:1001", 0)
            cache = RouteCache(
                [namesrv],
                pool_invoke([]),
                poll_interval_s=0.05,
                on_change=lambda topic, route: (
                    route.master("broker-a") == "127.0.0.1:1002" and changed.set()
                ),
            )
            await cache.get("T")
            nursery.start_soon(cache.run)
            await registrar.register("127.0.0.1:1002", 0)
            await changed.wait()
