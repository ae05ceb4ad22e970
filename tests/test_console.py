"""The console's JSON API (raftmq.console.app) against an in-process broker group.

The app runs in the test's trio loop behind httpx's ASGI transport, over the same
`Admin` the `mqconsole` command opens; the group is the real BrokerController over
real TCP (tests.inprocess_broker). The page itself, in a browser against real
processes, is tests/test_console_browser.py.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import trio

from raftmq.client import Producer
from raftmq.client.admin import Admin
from raftmq.client.connections import ConnectionPool
from raftmq.client.pop import pop
from raftmq.console import main
from raftmq.console.app import create_app
from raftmq.console.sampler import DEFAULT_INTERVAL_S, PrometheusSeries, Sampler
from raftmq.protocol.message import properties_to_string
from raftmq.remoting import RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalClassicGroup
from raftmq.tools.dledger_local import free_ports
from tests.helpers import (
    group,
    read_until,
    stopped,
    traced_send_and_consumption,
    traces_of,
    wait_for,
)

pytestmark = pytest.mark.untimed

CLUSTER = "TestCluster"  # tests.inprocess_broker's
BROKER = "broker-t"


@contextlib.asynccontextmanager
async def console(namesrv_addr: str, timeout_s: float = 2.0, sample_interval_s: float = 0.0):
    """The app over an `Admin`; with `sample_interval_s`, its charts sampled that often."""
    async with (
        Admin(namesrv_addr, timeout_s=timeout_s) as admin,
        trio.open_nursery() as nursery,
    ):
        sampler = Sampler(admin, sample_interval_s or DEFAULT_INTERVAL_S)
        if sample_interval_s:
            await nursery.start(sampler.run)
        app = create_app(admin, sampler)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            yield client
        nursery.cancel_scope.cancel()


async def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


async def listed(client: httpx.AsyncClient, what: str) -> set[str]:
    """The names /api/topics or /api/groups lists."""
    doc = await ok(await client.get(f"/api/{what}s"))
    return {item[what] for item in doc[f"{what}s"]}


async def send(g, topic: str, body: bytes, queue_id: int, **props: str) -> str:
    response = await g.send(g.master(), topic, body, queue_id, properties_to_string(props))
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response.ext_fields["msgId"]


async def test_cluster_shows_every_member_with_its_role_and_the_master(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    master_id = g.master().config.dleger_self_id
    async with console(g.namesrv_addr) as client:
        with trio.fail_after(10):  # a member that has not heard the leader yet is a CANDIDATE
            while True:
                doc = await ok(await client.get("/api/cluster"))
                roles = sorted(m["role"] for m in doc["groups"][0]["members"])
                if roles == ["FOLLOWER", "FOLLOWER", "LEADER"]:
                    break
                await trio.sleep(0.05)
        assert doc["namesrv"] == g.namesrv_addr
        assert doc["clusters"] == {CLUSTER: [BROKER]}
        [view] = doc["groups"]
        assert view["brokerName"] == BROKER
        assert view["master"]["selfId"] == master_id == view["leader"]
        assert view["master"]["addr"] == g.master().address
        members = {m["selfId"]: m for m in view["members"]}
        assert set(members) == set(g.ids)
        assert members[master_id]["role"] == "LEADER"
        assert members[master_id]["brokerId"] == 0
        assert len({m["term"] for m in members.values()}) == 1
        assert all(m["committedIndex"] is not None for m in members.values())

        g.crash(master_id)  # the page follows a failover: the killed member shows unreachable
        new_master = await g.wait_master()
        new_id = new_master.config.dleger_self_id
        with trio.fail_after(10):
            while True:
                [view] = (await ok(await client.get("/api/cluster")))["groups"]
                if view["master"] and view["master"]["selfId"] == new_id:
                    break
                await trio.sleep(0.1)
        members = {m["selfId"]: m for m in view["members"]}
        assert members[master_id]["role"] == "UNREACHABLE"
        assert members[master_id]["term"] is None


async def series_until(client: httpx.AsyncClient, done, timeout_s: float = 10.0) -> dict:
    """/api/series (the last minute) once `done(document)` holds."""
    with trio.fail_after(timeout_s):
        while True:
            doc = await ok(await client.get("/api/series", params={"window": 60}))
            if done(doc):
                return doc
            await trio.sleep(0.1)


def peaks(doc: dict, chart: str) -> dict[str, float]:
    """Each series of the chart's highest value."""
    return {s["name"]: max(p[1] for p in s["points"]) for s in doc["charts"].get(chart, [])}


def latest(doc: dict, chart: str) -> dict[str, float]:
    """Each series of the chart's last value."""
    return {s["name"]: s["points"][-1][1] for s in doc["charts"].get(chart, [])}


@pytest.mark.slow
async def test_series_chart_rates_lag_commit_lag_and_an_election(nursery, tmp_path):
    """The console samples the group every 200 ms: the master's and the topic's put rate
    rise with sends, the group's lag is what it has not committed, every member has a
    commit lag, a crashed master's successor is an election mark in a higher term, and
    the old master restarted (its put total from 0 again) charts no negative rate."""
    g = await group(nursery, tmp_path)
    async with console(g.namesrv_addr, sample_interval_s=0.2) as client:
        await ok(await client.post("/api/topics", json={"topic": "Charted", "cluster": CLUSTER}))
        new_group = {"groupName": "charting", "cluster": CLUSTER}
        await ok(await client.post("/api/groups", json=new_group))
        ext = {"consumerGroup": "charting", "topic": "Charted", "queueId": 0, "commitOffset": 5}
        response = await g.call(g.master(), RequestCode.UPDATE_CONSUMER_OFFSET, ext)
        assert response.code == ResponseCode.SUCCESS, response.remark
        master = g.master()
        for n in range(30):
            await send(g, "Charted", b"c%d" % n, 0)
            await trio.sleep(0.02)
        master_series = f"{BROKER} {master.address}"

        def charted(doc: dict) -> bool:
            return (
                latest(doc, "groupLag").get("charting") == 25
                and peaks(doc, "brokerPutTps").get(master_series, 0) > 0
                and peaks(doc, "topicPutTps").get("Charted", 0) > 0
                and len(latest(doc, "commitLag")) == 3
            )

        doc = await series_until(client, charted)
        assert doc["source"] == "memory" and doc["stepS"] == 0.2
        members = {f"{BROKER} {m.address}" for m in g.brokers.values()}
        assert set(peaks(doc, "brokerPutTps")) == members
        assert set(latest(doc, "commitLag")) == {f"{BROKER} {node}" for node in g.ids}
        assert doc["elections"] == []

        [view] = (await ok(await client.get("/api/cluster")))["groups"]
        terms = {m["term"] for m in view["members"]}
        g.crash(master.config.dleger_self_id)
        new_master = await g.wait_master()
        # marked when the term rose (a candidate's vote), its leader named once elected
        doc = await series_until(client, lambda d: d["elections"] and d["elections"][-1]["leader"])
        assert all(e["brokerName"] == BROKER and e["term"] > max(terms) for e in doc["elections"])
        assert doc["elections"][-1]["leader"] == new_master.config.dleger_self_id

        # the old master back: its put total restarts from 0, which is no negative rate
        restarted_ms = time.time() * 1000
        await g.start_member(master.config.dleger_self_id)

        def resampled(doc: dict) -> bool:
            [series] = [s for s in doc["charts"]["brokerPutTps"] if s["name"] == master_series]
            return series["points"][-1][0] > restarted_ms + 1000  # a bucket after the restart

        doc = await series_until(client, resampled)
        rates = [p[1] for s in doc["charts"]["brokerPutTps"] for p in s["points"]]
        assert min(rates) >= 0, rates

        response = await client.get("/api/series", params={"window": 5})
        assert response.status_code == 400
        assert response.json() == {"error": "window must be from 60 to 21600 seconds"}


async def test_charts_survive_an_unreachable_cluster_and_prometheus():
    """A sample the name servers do not answer is skipped, not fatal; a Prometheus server
    that cannot be reached is a 502 naming it."""
    async with Admin("127.0.0.1:1", timeout_s=0.2) as admin, trio.open_nursery() as nursery:
        sampler = Sampler(admin, 0.05)
        await nursery.start(sampler.run)
        with trio.fail_after(5):
            while sampler.failed_samples < 2:
                await trio.sleep(0.05)
        assert sampler.history.series_count() == 0
        nursery.cancel_scope.cancel()
        app = create_app(admin, PrometheusSeries("http://127.0.0.1:1", timeout_s=1.0))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            response = await client.get("/api/series")
        assert response.status_code == 502
        assert response.json()["error"].startswith("http://127.0.0.1:1: "), response.text


async def test_topic_created_listed_with_queues_and_deleted(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    async with console(g.namesrv_addr) as client:
        new = {"topic": "Orders", "cluster": CLUSTER, "readQueueNums": 2, "writeQueueNums": 2}
        doc = await ok(await client.post("/api/topics", json=new))
        assert doc == {"topic": "Orders", "written": [g.master().address]}
        for n in range(5):
            await send(g, "Orders", b"m%d" % n, n % 2)
        with trio.fail_after(10):
            while True:
                doc = await ok(await client.get("/api/topics"))
                topics = {t["topic"]: t for t in doc["topics"]}
                if "Orders" in topics and topics["Orders"]["messages"] == 5:
                    break
                await trio.sleep(0.1)
        orders = topics["Orders"]
        assert [(q["queueId"], q["minOffset"], q["maxOffset"]) for q in orders["queues"]] == [
            (0, 0, 3),
            (1, 0, 2),
        ]
        assert orders["brokers"] == [
            {"brokerName": BROKER, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
        ]
        assert orders["putLastDay"] == 5 and orders["putTps"] > 0
        assert doc["clusters"] == [CLUSTER]
        assert "TBW102" not in topics and BROKER not in topics  # system topics on request only
        doc = await ok(await client.get("/api/topics", params={"system": "true"}))
        system = {t["topic"] for t in doc["topics"]}
        assert {"TBW102", BROKER, CLUSTER, "Orders"} <= system

        doc = await ok(await client.delete("/api/topics/Orders", params={"cluster": CLUSTER}))
        assert doc["written"] == [g.master().address]
        assert "Orders" not in await listed(client, "topic")


async def test_subscription_group_lag_per_queue_and_delete(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    async with console(g.namesrv_addr) as client:
        await ok(await client.post("/api/topics", json={"topic": "Bills", "cluster": CLUSTER}))
        new = {"groupName": "billing", "cluster": CLUSTER, "retryMaxTimes": 3}
        doc = await ok(await client.post("/api/groups", json=new))
        assert doc["written"] == [g.master().address]
        assert doc["config"]["retryMaxTimes"] == 3 and doc["config"]["consumeEnable"] is True
        for n in range(4):
            await send(g, "Bills", b"b%d" % n, 0)
        ext = {"consumerGroup": "billing", "topic": "Bills", "queueId": 0, "commitOffset": 1}
        response = await g.call(g.master(), RequestCode.UPDATE_CONSUMER_OFFSET, ext)
        assert response.code == ResponseCode.SUCCESS, response.remark

        groups = {x["group"]: x for x in (await ok(await client.get("/api/groups")))["groups"]}
        billing = groups["billing"]
        assert billing["config"]["retryMaxTimes"] == 3
        assert billing["diffTotal"] == 3
        [queue] = billing["queues"]
        assert (queue["topic"], queue["queueId"], queue["brokerOffset"]) == ("Bills", 0, 4)
        assert (queue["consumerOffset"], queue["diff"]) == (1, 3)

        doc = await ok(await client.delete("/api/groups/billing", params={"cluster": CLUSTER}))
        assert doc["topicsDeleted"] == ["%RETRY%billing", "%DLQ%billing"]
        assert "billing" not in await listed(client, "group")


async def test_message_lookup_by_key_unique_key_msg_id_and_offset(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    async with console(g.namesrv_addr) as client:
        await ok(await client.post("/api/topics", json={"topic": "Orders", "cluster": CLUSTER}))
        uniq = "7F0000010001000000000000000000AB"
        await send(g, "Orders", b"first", 1, KEYS="order-1 shared")
        msg_id = await send(g, "Orders", b"second", 1, KEYS="order-2 shared", UNIQ_KEY=uniq)
        end = g.master().dledger.replica.committed_index
        await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))

        async def lookup(**params) -> list[dict]:
            return (await ok(await client.get("/api/messages", params=params)))["messages"]

        [found] = await lookup(by="key", topic="Orders", key="order-2")
        assert (found["body"], found["msgId"], found["uniqKey"]) == ("second", msg_id, uniq)
        assert found["keys"] == "order-2 shared" and found["queueId"] == 1
        assert [m["body"] for m in await lookup(by="key", topic="Orders", key="shared")] == [
            "first",
            "second",
        ]
        assert [m["body"] for m in await lookup(by="uniqKey", topic="Orders", uniqKey=uniq)] == [
            "second"
        ]
        assert [m["body"] for m in await lookup(by="msgId", msgId=msg_id)] == ["second"]
        [at] = await lookup(by="offset", topic="Orders", brokerName=BROKER, queueId=1, offset=0)
        assert (at["body"], at["queueOffset"], at["brokerName"]) == ("first", 0, BROKER)
        past_the_end = {"topic": "Orders", "brokerName": BROKER, "queueId": 1, "offset": 9}
        assert await lookup(by="offset", **past_the_end) == []


async def test_a_message_s_trace_is_shown_for_its_msg_id(nursery, tmp_path):
    """/api/traces: a traced message's send and consumption, as queryMsgTraceById finds
    them; an id no trace names has none; no msgId is a 400."""
    g = await group(nursery, tmp_path, nodes=1, traceTopicEnable="true")
    async with console(g.namesrv_addr) as client:
        await ok(await client.post("/api/topics", json={"topic": "Orders", "cluster": CLUSTER}))
        with trio.fail_after(10):
            result, _dropped = await traced_send_and_consumption(g.namesrv_addr, "Orders", b"x")
            async with Admin(g.namesrv_addr) as admin:
                await traces_of(admin, result.msg_id)
        doc = await ok(await client.get("/api/traces", params={"msgId": result.msg_id}))
        assert doc["traceTopic"] == "RMQ_SYS_TRACE_TOPIC"
        by_type = {t["type"]: t for t in doc["traces"]}
        assert sorted(by_type) == ["Pub", "SubAfter", "SubBefore"]
        assert (by_type["Pub"]["group"], by_type["Pub"]["topic"]) == ("pg", "Orders")
        assert by_type["SubAfter"]["group"] == "cg" and by_type["SubAfter"]["success"]
        none = await ok(await client.get("/api/traces", params={"msgId": "7F00000100000000"}))
        assert none["traces"] == []
        missing = await client.get("/api/traces")
        assert missing.status_code == 400 and "msgId is required" in missing.json()["error"]


async def test_errors_are_one_line_json_with_a_status(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    async with console(g.namesrv_addr) as client:
        for path, params, reason in (
            ("/api/messages", {"by": "name"}, "by must be key, uniqKey, msgId or offset"),
            ("/api/messages", {"by": "key", "topic": "Orders"}, "key is required"),
            ("/api/messages", {"by": "msgId", "msgId": "not-an-id"}, "msgId must be 32 or 56 hex"),
            ("/api/messages", {"by": "offset", "topic": "T", "brokerName": "b", "queueId": "x"},
             "queueId must be a whole number"),
            ("/api/topics", {"system": "maybe"}, "system must be true or false"),
        ):  # fmt: skip
            response = await client.get(path, params=params)
            assert response.status_code == 400, response.text
            assert reason in response.json()["error"]
        response = await client.post("/api/topics", content=b"{")
        assert response.status_code == 400
        assert response.json() == {"error": "the request body is not JSON"}
        response = await client.post("/api/topics", json={"topic": "T"})
        assert (response.status_code, response.json()) == (400, {"error": "cluster is required"})

        response = await client.get("/api/messages", params={"by": "key", "topic": "T", "key": "k"})
        assert response.status_code == 502  # the name server answered TOPIC_NOT_EXIST
        assert "code 17 (TOPIC_NOT_EXIST)" in response.json()["error"]
        response = await client.post("/api/topics", json={"topic": "a b", "cluster": CLUSTER})
        assert response.status_code == 502
        assert g.master().address in response.json()["error"]  # the broker's remark, named

    [dead_port] = free_ports(1)
    async with console(f"127.0.0.1:{dead_port}") as client:
        for path in ("/api/cluster", "/api/topics", "/api/groups"):
            response = await client.get(path)
            assert response.status_code == 503, response.text
            assert response.json()["error"].startswith("no name server answered")


async def test_the_page_and_its_files_are_served_from_the_package():
    async with console("127.0.0.1:1") as client:  # no call reaches the cluster
        page = await client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/static/console.js">' in page.text
        for name, kind in (("console.js", "javascript"), ("console.css", "text/css")):
            response = await client.get(f"/static/{name}")
            assert response.status_code == 200 and kind in response.headers["content-type"]
            assert "://" not in response.text  # nothing fetched from elsewhere
        assert "://" not in page.text


def test_command_line_errors_are_one_line_and_an_exit_status(monkeypatch, capsys):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    assert main([]) == 2
    assert main(["-n", "localhost"]) == 2  # no port
    assert main(["-n", "127.0.0.1:9876", "--listen", "8080"]) == 2
    assert main(["-n", "127.0.0.1:9876", "--timeout-ms", "0"]) == 2
    assert main(["-n", "127.0.0.1:9876", "--sample-interval-ms", "0"]) == 2
    assert main(["-n", "127.0.0.1:9876", "--prometheus", "localhost:9090"]) == 2
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["-n", "127.0.0.1:9876", "--listen", f"127.0.0.1:{port}"]) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "mqconsole: no name server: give -n or set NAMESRV_ADDR",
        "mqconsole: -n 'localhost': bad address 'localhost': expected host:port",
        "mqconsole: bad address '8080': expected host:port",
        "mqconsole: --timeout-ms must be positive",
        "mqconsole: --sample-interval-ms must be positive",
        "mqconsole: --prometheus must be an http(s) URL, not 'localhost:9090'",
        f"mqconsole: cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use",
    ]


@pytest.mark.processes
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
async def test_a_stop_signal_stops_the_console_cleanly(sig):
    """SIGTERM stopped it cleanly; SIGHUP (a closed terminal) killed it mid-request with
    status -1. Both now stop it as RocketMQ's JVM stops on them: status 0, port free."""
    namesrv_port, port = free_ports(2)
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "raftmq.console", "-n", f"127.0.0.1:{namesrv_port}",
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    await read_until(process.stdout, b"mqconsole: http://")
    process.send_signal(sig)
    with trio.fail_after(10):
        assert await process.wait() == 0
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)


# a stopped slave is dropped by its master after haHousekeepingInterval: long enough here
# for the master to report the slave's lag meanwhile
SLOW_HOUSEKEEPING = {"haHousekeepingInterval": "30000"}


async def _classic_view(client: httpx.AsyncClient, check, timeout_s: float = 20.0) -> dict:
    """The one group /api/cluster shows, once `check(view)` holds."""
    with trio.fail_after(timeout_s):
        while True:
            [view] = (await ok(await client.get("/api/cluster")))["groups"]
            if check(view):
                return view
            await trio.sleep(0.1)


@pytest.mark.processes
async def test_cluster_shows_a_classic_group_as_master_and_slave_with_the_slave_lag(tmp_path):
    """A classic group is shown as master and slave (brokerRole, CommitLog end, how
    far the slave is behind), not as DLedger members; a stopped slave is UNREACHABLE
    while the master reports the bytes it has not acknowledged, and both lags fall
    back to 0 when it resumes."""
    async with (
        LocalClassicGroup(tmp_path, slaves=1, extra_conf=SLOW_HOUSEKEEPING) as classic,
        console(classic.namesrv_addr, timeout_s=1.0) as client,
    ):
        master_node, slave_node = classic.ids
        await classic.create_topic("ClassicShown")
        async with Producer(classic.namesrv_addr, "PG") as producer:
            await producer.send("ClassicShown", b"first")
            await classic.wait_replicated()
            view = await _classic_view(
                client, lambda v: [m["slaveFallBehindBytes"] for m in v["members"]] == [0, 0]
            )
            assert view["replication"] == "classic"
            assert view["master"] == {"brokerId": 0, "addr": classic.broker_addrs[master_node]}
            master, slave = view["members"]
            assert (master["brokerId"], master["role"], master["haConnections"]) == (
                0,
                "ASYNC_MASTER",
                1,
            )
            assert (slave["brokerId"], slave["role"]) == (1, "SLAVE")
            assert slave["addr"] == classic.broker_addrs[slave_node]
            assert slave["haMasterAddr"] == classic.ha_addrs[master_node]
            assert master["commitLogMaxOffset"] == slave["commitLogMaxOffset"] > 0
            assert "term" not in master and "selfId" not in master

            with stopped(classic.pid(slave_node)):
                for _ in range(20):
                    await producer.send("ClassicShown", b"x" * 500)
                view = await _classic_view(
                    client, lambda v: v["members"][1]["role"] == "UNREACHABLE"
                )
        master, slave = view["members"]
        assert master["slaveFallBehindBytes"] >= 20 * 500
        assert slave["slaveFallBehindBytes"] is None and slave["commitLogMaxOffset"] is None

        view = await _classic_view(
            client,
            lambda v: (
                [m["role"] for m in v["members"]] == ["ASYNC_MASTER", "SLAVE"]
                and [m["slaveFallBehindBytes"] for m in v["members"]] == [0, 0]
            ),
        )
        master, slave = view["members"]
        assert master["commitLogMaxOffset"] == slave["commitLogMaxOffset"]


async def test_pop_in_flight_and_pending_timers_are_shown(nursery, tmp_path):
    """The groups page shows what RocketMQ 5 POP consumers hold un-acked (per group and
    queue, as `mqadmin popStatus`), the cluster page each member's pending timer
    messages (as `mqadmin timerStatus`)."""
    g = await group(nursery, tmp_path)
    async with console(g.namesrv_addr) as client:
        await ok(await client.post("/api/topics", json={"topic": "Jobs", "cluster": CLUSTER}))
        new = {"groupName": "workers", "cluster": CLUSTER}
        await ok(await client.post("/api/groups", json=new))
        for n in range(3):
            await send(g, "Jobs", b"j%d" % n, 0)
        async with ConnectionPool() as pool:
            popped = await pop(pool, g.master().address, BROKER, "workers", "Jobs", max_nums=2)
        assert len(popped.messages) == 2
        async with Producer(g.namesrv_addr) as producer:
            for n in range(5):  # due in an hour: pending
                await producer.send("Jobs", b"t%d" % n, delay_ms=3_600_000)

        groups = {x["group"]: x for x in (await ok(await client.get("/api/groups")))["groups"]}
        workers = groups["workers"]
        assert workers["popInFlight"] == 2
        assert [q["popInFlight"] for q in workers["queues"] if q["queueId"] == 0] == [2]
        with trio.fail_after(10):  # the timer messages are filed as they are dispatched
            while True:
                doc = await ok(await client.get("/api/cluster"))
                [members] = [x["members"] for x in doc["groups"]]
                master = [m for m in members if m["brokerId"] == 0]
                if master and master[0]["timerBacklog"] == 5:
                    break
                await trio.sleep(0.1)
