"""Prometheus metrics: the collectors read the state sends and pulls leave behind, the
rates follow RocketMQ's sampled windows, the endpoint serves from the trio loop, and
a real 3-broker group scraped through a master kill shows the failover.

Expositions are parsed with prometheus_client's own parser, as a scraper reads them.
"""

from __future__ import annotations

import datetime
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from raftmq.broker.config import load_broker_config
from raftmq.broker.stats import BrokerStats, Rates, record_at_midnight
from raftmq.namesrv.config import load_config

from raftmq.client import Producer
from raftmq.client.mqadmin.brokers import day_totals
from raftmq.process.metrics_endpoint import MetricsPortError, serve_metrics
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalClassicGroup, LocalCluster, LocalControllerGroup
from tests.helpers import (
    CLASSIC_FAMILIES,
    CONTROLLER_FAMILIES,
    DASHBOARD,
    DLEDGER_GROUP_FAMILIES,
    PROXY_FAMILIES,
    consuming_all,
    create_topic,
    dashboard_metrics,
    group,
    read_until,
    stopped,
    wait_for,
)

pytestmark = pytest.mark.untimed


def samples(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Sample name -> [(labels, value)] of an exposition."""
    found: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(found: dict, name: str, **labels) -> float:
    """The one sample of `name` whose labels include `labels`."""
    matches = [v for ls, v in found.get(name, []) if labels.items() <= ls.items()]
    assert len(matches) == 1, (name, labels, found.get(name))
    return matches[0]


def scrape_registry(registry) -> dict:
    return samples(generate_latest(registry).decode())


def http_get(url: str, accept: str = "text/plain") -> tuple[int, str]:
    try:
        request = urllib.request.Request(url, headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# ---------------------------------------------------------------- rates


def test_rates_use_the_oldest_sample_inside_the_window():
    rates = Rates(longest_window_s=600)
    for second in range(0, 701, 10):
        rates.sample(float(second), {"k": second * 2})  # 2 per second throughout
    now = 705.0
    assert Rates.per_second(rates.base(now, 60), now, "k", 1410) == pytest.approx(2.0)
    assert Rates.per_second(rates.base(now, 600), now, "k", 1410) == pytest.approx(2.0, rel=0.01)
    # a count the window's base lacks started from zero after it; one that fell gives 0
    assert Rates.per_second(rates.base(now, 60), now, "new", 110) == pytest.approx(2.0)
    rates.sample(710.0, {"k": 5})
    assert Rates.per_second(rates.base(715.0, 10), 715.0, "k", 3) == 0.0


async def test_todays_totals_start_at_local_midnight(nursery, autojump_clock):
    """msgPutTotalTodayNow counted from the start with nothing to subtract, so "today"
    was since the broker started; RocketMQ snapshots the totals at every local midnight
    (msgPutTotalTodayMorning, msgPutTotalYesterdayMorning) and today is the difference."""
    stats = BrokerStats()
    evening_s = datetime.datetime(2026, 11, 27, 23, 59, 30).timestamp()  # local time
    started_s = trio.current_time()
    nursery.start_soon(
        record_at_midnight, stats, lambda: evening_s + trio.current_time() - started_s
    )

    def today_and_yesterday() -> tuple[int, ...]:
        table = {key: int(value) for key, value in stats.runtime_info().items()}
        return day_totals(table)  # as `mqadmin clusterList -m` computes them

    stats.put_messages, stats.got_messages = 5, 2  # on the 27th
    await trio.sleep(29)
    assert today_and_yesterday() == (0, 0, 5, 2)  # 23:59:59
    await trio.sleep(2)
    stats.put_messages, stats.got_messages = 8, 3  # on the 28th
    assert today_and_yesterday() == (5, 2, 3, 1)
    await trio.sleep(24 * 3600)
    stats.put_messages += 1  # on the 29th
    assert today_and_yesterday() == (3, 1, 1, 0)
    assert stats.runtime_info()["msgPutTotalTodayNow"] == "9"  # the total, as RocketMQ's


def test_rates_of_a_young_process_start_at_its_first_sample():
    rates = Rates()
    assert rates.base(5.0, 60) is None  # no sample yet: every rate is 0
    assert Rates.per_second(None, 5.0, "k", 100) == 0.0
    rates.sample(0.0, {"k": 0})
    assert Rates.per_second(rates.base(20.0, 60), 20.0, "k", 100) == pytest.approx(5.0)


# ---------------------------------------------------------------- config keys


def test_metrics_port_is_a_config_key_of_broker_and_name_server(tmp_path):
    config, _ = load_broker_config(None, overrides={"metricsPort": "5557"})
    assert config.metrics_port == 5557
    assert load_broker_config(None)[0].metrics_port == 0  # off unless set
    with pytest.raises(ValueError, match="metricsPort"):
        load_broker_config(None, overrides={"metricsPort": "70000"})
    conf = tmp_path / "namesrv.conf"
    conf.write_text("metricsPort=5558\n")
    assert load_config(str(conf))[0].metrics_port == 5558
    conf.write_text("metricsPort=http\n")
    with pytest.raises(ValueError, match="metricsPort"):
        load_config(str(conf))


# ---------------------------------------------------------------- the endpoint


async def test_endpoint_serves_the_registry_and_names_a_busy_port(tmp_path):
    async with trio.open_nursery() as nursery:
        g = await group(nursery, tmp_path)
        master = g.master()
        port = await nursery.start(serve_metrics, master.registry, "127.0.0.1", 0)
        status, text = await trio.to_thread.run_sync(http_get, f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert value(samples(text), "dledger_role", role="LEADER") == 1.0
        status, text = await trio.to_thread.run_sync(
            http_get, f"http://127.0.0.1:{port}/metrics", "application/openmetrics-text"
        )
        assert status == 200 and text.endswith("# EOF\n")  # OpenMetrics when asked for
        status, text = await trio.to_thread.run_sync(http_get, f"http://127.0.0.1:{port}/")
        assert status == 404 and "/metrics" in text
        with pytest.raises(MetricsPortError, match=f"metricsPort={port}"):
            await nursery.start(serve_metrics, master.registry, "127.0.0.1", port)
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- the collectors


async def test_broker_metrics_reflect_sends_and_pulls(tmp_path):
    async with trio.open_nursery() as nursery:
        g = await group(nursery, tmp_path)
        master = g.master()
        topic = "MetricsTopic"
        await create_topic(g, topic, queues=2)
        # A sample 30 s ago with nothing counted, the oldest (the sampler's own, taken at
        # start, dropped): every rate is then count / 30 s.
        master.metrics.rates = Rates()
        master.metrics.rates.sample(trio.current_time() - 30.0, {})
        bodies = [b"x" * 100] * 5
        for body in bodies:
            assert (await g.send(master, topic, body, queue_id=0)).code == ResponseCode.SUCCESS
        for _ in range(3):
            assert (await g.send(master, topic, b"y" * 10, queue_id=1)).code == 0
        await wait_for(lambda: master.store.max_offset(topic, 1) == 3)
        # group CG pulls queue 0 (5 messages), then commits 2 of them
        pulled = await g.pull(master, topic, 0, 0)
        assert pulled.code == ResponseCode.SUCCESS
        assert await master.offsets.commit_and_wait("CG", topic, 0, 2)  # False: not master
        assert await master.offsets.commit_and_wait("CG", topic, 1, 3)

        found = scrape_registry(master.registry)
        ours = {"cluster": "TestCluster", "broker": "broker-t", "topic": topic}
        assert value(found, "rocketmq_producer_offset", **ours) == 8
        assert value(found, "rocketmq_producer_tps", **ours) == pytest.approx(8 / 30, rel=0.05)
        stored_bytes = value(found, "rocketmq_producer_message_size", **ours) * 30
        assert stored_bytes == pytest.approx(sum(len(r) for r in _records(master, topic)), rel=0.05)
        group_labels = {**ours, "group": "CG"}
        assert value(found, "rocketmq_consumer_tps", **group_labels) == pytest.approx(5 / 30, 0.05)
        pulled_bytes = value(found, "rocketmq_consumer_message_size", **group_labels) * 30
        assert pulled_bytes == pytest.approx(len(pulled.body), rel=0.05)
        assert value(found, "rocketmq_consumer_offset", **group_labels) == 2 + 3
        assert value(found, "rocketmq_group_queue_diff", queueid="0", **group_labels) == 3
        assert value(found, "rocketmq_group_queue_diff", queueid="1", **group_labels) == 0
        assert value(found, "rocketmq_group_diff", group="CG", topic=topic, msgModel="1") == 3
        age_ms = value(found, "rocketmq_group_get_latency_by_storetime", **group_labels)
        assert 0 <= age_ms < 30_000
        assert value(found, "rocketmq_brokeruntime_msg_put_total_today_now") == 8
        assert value(found, "rocketmq_brokeruntime_msg_gettotal_today_now") == 5
        assert value(found, "rocketmq_brokeruntime_put_tps60") == pytest.approx(8 / 30, 0.05)
        assert value(found, "rocketmq_brokeruntime_commitlog_maxoffset") > 0
        assert 0.0 < value(found, "rocketmq_brokeruntime_commitlog_disk_ratio") < 1.0
        assert value(found, "rocketmq_broker_tps", brokerIP=master.address) == pytest.approx(
            8 / 30, 0.05
        )

        # A slave reports its runtime and its DLedger member, not topics or groups:
        # the whole group shares the brokerName label.
        await wait_for(lambda: all(s.store.max_offset(topic, 1) == 3 for s in g.slaves()))
        for slave in g.slaves():
            found = scrape_registry(slave.registry)
            assert "rocketmq_producer_offset" not in found
            assert "rocketmq_group_diff" not in found
            assert value(found, "rocketmq_brokeruntime_commitlog_maxoffset") > 0
        nursery.cancel_scope.cancel()


def _records(broker, topic: str) -> list[bytes]:
    """Every stored record of `topic` (what the byte rate counts)."""
    records = []
    for queue_id in (0, 1):
        result = broker.store.get_message(topic, queue_id, 0, 32)
        records += result.records
    return records


async def test_dledger_metrics_show_roles_indexes_and_fsyncs(tmp_path):
    async with trio.open_nursery() as nursery:
        g = await group(nursery, tmp_path)
        master = g.master()
        await create_topic(g, "T")
        for _ in range(3):
            assert (await g.send(master, "T", b"m")).code == ResponseCode.SUCCESS
        end = master.dledger.store.end_index
        await wait_for(
            lambda: all(b.dledger.replica.committed_index >= end for b in g.brokers.values())
        )
        leader_id = master.self_id
        member = {"dledger_group": "broker-t", "self_id": leader_id}
        followers = sorted(set(g.ids) - {leader_id})

        def matched() -> bool:
            """A follower may hold the commit before its answer to the push reaches the
            leader (its match index is -1 until then: seen under four test workers)."""
            found = scrape_registry(master.registry)
            return all(
                value(found, "dledger_follower_match_index", peer=peer, **member) >= end
                for peer in followers
            )

        await wait_for(matched)
        found = scrape_registry(master.registry)
        assert value(found, "dledger_role", role="LEADER", **member) == 1
        assert value(found, "dledger_role", role="FOLLOWER", **member) == 0
        term = value(found, "dledger_term", **member)
        assert term == master.dledger.replica.term >= 0
        assert value(found, "dledger_ledger_end_index", **member) >= end
        assert value(found, "dledger_committed_index", **member) >= end
        assert value(found, "dledger_elections_won_total", **member) >= 1
        assert value(found, "dledger_leader_changes_total", **member) >= 1
        peers = sorted(ls["peer"] for ls, _ in found["dledger_follower_match_index"])
        assert peers == followers
        assert value(found, "dledger_fsync_seconds_count", **member) >= 3
        assert value(found, "dledger_fsync_seconds_sum", **member) > 0
        for slave in g.slaves():
            found = scrape_registry(slave.registry)
            follower = {"dledger_group": "broker-t", "self_id": slave.self_id}
            assert value(found, "dledger_role", role="FOLLOWER", **follower) == 1
            assert value(found, "dledger_term", **follower) == term
            assert "dledger_follower_match_index" not in found  # only the leader has them
        nursery.cancel_scope.cancel()


async def test_namesrv_metrics_count_brokers_topics_and_route_lookups(tmp_path):
    async with trio.open_nursery() as nursery:
        g = await group(nursery, tmp_path)
        await create_topic(g, "Routed")
        namesrv = g.namesrv
        before = scrape_registry(namesrv.metrics)
        await wait_for(
            lambda: value(scrape_registry(namesrv.metrics), "rocketmq_namesrv_brokers") == 3
        )
        for topic in ("Routed", "NoSuchTopic"):
            await _route(g, topic)
        found = scrape_registry(namesrv.metrics)
        broker = {"cluster": "TestCluster", "broker": "broker-t"}
        assert value(found, "rocketmq_namesrv_broker_master", **broker) == 1
        assert value(found, "rocketmq_namesrv_topics") >= 1
        for result in ("found", "not_found"):
            name = "rocketmq_namesrv_route_requests_total"
            assert value(found, name, result=result) >= value(before, name, result=result) + 1
        assert value(found, "rocketmq_namesrv_broker_registrations_total") >= 3
        nursery.cancel_scope.cancel()


async def _route(g, topic: str):
    async with RemotingClient(g.namesrv_addr) as client:
        request = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}
        )
        return await client.invoke(request, 5.0)


# ---------------------------------------------------------------- the Grafana dashboard


def test_the_grafana_dashboard_imports_and_reads_only_served_families():
    """docs/grafana/raftmq.json imports into Grafana with a Prometheus data source chosen
    at import; every family it reads is documented, and is checked against what real
    processes serve by one of the scrapes below (or the proxy's, tests/test_proxy.py)."""
    board = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    charts = [panel for panel in board["panels"] if panel["type"] != "row"]
    for panel in charts:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}" and panel["targets"], panel
        assert {t["refId"] for t in panel["targets"]} == {
            chr(65 + k) for k in range(len(panel["targets"]))
        }
    read = dashboard_metrics("rocketmq_", "dledger_")
    families = (DLEDGER_GROUP_FAMILIES, CLASSIC_FAMILIES, CONTROLLER_FAMILIES, PROXY_FAMILIES)
    assert read == set().union(*(dashboard_metrics(*f) for f in families))
    documented = (DASHBOARD.parents[1] / "metrics.md").read_text()
    for name in read:
        # the table shortens a family's kin to their tails: `_elections_won_total`,
        # `_put_tps10/60/600`
        words = re.sub(r"_(bucket|count|sum)$|\d+$", "", name).split("_")
        tails = {"_" + "_".join(words[k:]) for k in range(1, len(words) - 1)}
        assert any(f"`{t}" in documented for t in {*tails, "_".join(words)}), name


# ---------------------------------------------------------------- real processes


async def _scrape(address: str) -> dict | None:
    """A process's metrics, None while it does not answer."""
    try:
        status, text = await trio.to_thread.run_sync(http_get, f"http://{address}/metrics")
    except OSError:
        return None
    return samples(text) if status == 200 else None


@pytest.mark.processes
async def test_metrics_scraped_through_a_master_kill(tmp_path):
    """Every broker of a 3-member group and the name server serve /metrics. Before the
    kill the master's member reports LEADER and counts the puts; after it, another
    member reports LEADER in a higher term, the committed index keeps rising, and the
    name server shows a master again. They serve every family of a DLedger group the
    Grafana dashboard reads."""
    async with LocalCluster(tmp_path, metrics=True) as cluster:
        await cluster.create_topic("Scraped")
        old_master = await cluster.wait_master()
        member = {"dledger_group": cluster.broker_name}
        async with Producer(cluster.namesrv_addr, "PG") as producer:
            for i in range(20):
                await producer.send("Scraped", f"before {i}".encode())
            sent = {f"before {i}".encode() for i in range(20)}
            async with consuming_all(cluster.namesrv_addr, "ScrapedGroup", "Scraped", sent):
                pass  # its offsets are committed as it stops
            await cluster.wait_caught_up()
            before = {n: await _scrape(cluster.metrics_addrs[n]) for n in cluster.ids}
            assert all(found is not None for found in before.values())
            namesrv = await _scrape(cluster.metrics_addrs["namesrv"])
            served = set(namesrv).union(*before.values())
            assert dashboard_metrics(*DLEDGER_GROUP_FAMILIES) <= served
            leaders = [
                n for n, found in before.items() if value(found, "dledger_role", role="LEADER") == 1
            ]
            assert leaders == [old_master]
            old_term = value(before[old_master], "dledger_term", self_id=old_master, **member)
            committed_before = value(before[old_master], "dledger_committed_index", **member)
            stored = value(before[old_master], "rocketmq_producer_offset", topic="Scraped")
            assert stored == 20
            assert value(before[old_master], "rocketmq_brokeruntime_msg_put_total_today_now") >= 20

            cluster.kill(old_master, signal.SIGKILL)
            assert await _scrape(cluster.metrics_addrs[old_master]) is None
            survivors = [n for n in cluster.ids if n != old_master]
            with trio.fail_after(30):
                while True:
                    after = {n: await _scrape(cluster.metrics_addrs[n]) for n in survivors}
                    leaders = [
                        n
                        for n, found in after.items()
                        if found and value(found, "dledger_role", role="LEADER") == 1
                    ]
                    if leaders:
                        break
                    await trio.sleep(0.1)
            (new_master,) = leaders
            assert value(after[new_master], "dledger_term", **member) > old_term
            await cluster.wait_master(not_node=old_master)
            for i in range(10):
                await producer.send("Scraped", f"after {i}".encode())
            await cluster.wait_caught_up()
            found = await _scrape(cluster.metrics_addrs[new_master])
            assert value(found, "dledger_committed_index", **member) > committed_before
            assert value(found, "rocketmq_producer_offset", topic="Scraped") == 30
            assert value(found, "rocketmq_brokeruntime_msg_put_total_today_now") >= 10
            assert value(found, "dledger_elections_won_total", **member) >= 1
            peers = {ls["peer"]: v for ls, v in found["dledger_follower_lag_entries"]}
            assert set(peers) == set(cluster.ids) - {new_master}
            namesrv = await _scrape(cluster.metrics_addrs["namesrv"])
            assert value(namesrv, "rocketmq_namesrv_broker_master", broker=cluster.broker_name) == 1
            assert value(namesrv, "rocketmq_namesrv_route_requests_total", result="found") >= 1


@pytest.mark.processes
async def test_a_classic_master_and_slave_serve_broker_metrics_without_dledger_ones(tmp_path):
    """A classic group has no DLedger member: its brokers serve the broker metrics (the
    master counting the puts, the slave reporting the copied CommitLog) and no
    `dledger_` family."""
    async with LocalClassicGroup(tmp_path, slaves=1, metrics=True) as group:
        await group.create_topic("ClassicScraped")
        async with Producer(group.namesrv_addr, "PG") as producer:
            for i in range(10):
                await producer.send("ClassicScraped", f"m{i}".encode())
        await group.wait_replicated()
        master, slave = [await _scrape(group.metrics_addrs[n]) for n in group.ids]
    assert value(master, "rocketmq_producer_offset", topic="ClassicScraped") == 10
    assert value(master, "rocketmq_brokeruntime_msg_put_total_today_now") == 10
    copied = value(slave, "rocketmq_brokeruntime_commitlog_maxoffset")
    assert copied == value(master, "rocketmq_brokeruntime_commitlog_maxoffset") > 0
    assert not [name for name in {**master, **slave} if name.startswith("dledger_")]
    assert dashboard_metrics(*CLASSIC_FAMILIES) <= set(master)


@pytest.mark.processes
async def test_controller_mode_metrics_show_epochs_sync_state_sets_and_elections(tmp_path):
    """Controllers and brokers of a 2-replica controller-mode group, scraped before and
    after the master's SIGKILL: every controller reports the group's master epoch,
    SyncStateSet size and epoch and the elections (one more after the kill), one of
    them leads; the master reports its in-sync replicas and epoch, the slave that it
    is not master, and the new master the next epoch with itself alone in sync."""
    conf = {"controllerHeartBeatTimeoutMills": "3000"}
    async with LocalControllerGroup(tmp_path, replicas=2, extra_conf=conf, metrics=True) as group:
        master = await group.wait_in_sync(2)
        [slave] = [n for n in group.ids if n != master]
        controllers = [await _scrape(group.metrics_addrs[c]) for c in group.CONTROLLERS]
        for found in controllers:
            assert value(found, "rocketmq_controller_master_epoch", broker="broker-a") == 1
            assert value(found, "rocketmq_controller_sync_state_set_size") == 2
            assert value(found, "rocketmq_controller_sync_state_set_epoch") == 2
            assert value(found, "rocketmq_controller_elections_total") == 1
        assert sum(value(f, "rocketmq_controller_leader") for f in controllers) == 1
        on_master = await _scrape(group.metrics_addrs[master])
        assert value(on_master, "rocketmq_ha_is_master") == 1
        assert value(on_master, "rocketmq_ha_in_sync_replicas") == 2
        assert value(on_master, "rocketmq_ha_master_epoch") == 1
        assert value(on_master, "rocketmq_ha_sync_state_set_epoch") == 2
        on_slave = await _scrape(group.metrics_addrs[slave])
        served = set(on_master).union(*controllers)
        assert dashboard_metrics(*CONTROLLER_FAMILIES) <= served  # what Grafana reads
        assert value(on_slave, "rocketmq_ha_is_master") == 0
        assert value(on_slave, "rocketmq_ha_master_epoch") == 1
        assert "rocketmq_ha_in_sync_replicas" not in on_slave

        group.kill(master)
        elected = await _scrape_until(
            group.metrics_addrs["c0"],
            lambda f: f is not None and value(f, "rocketmq_controller_elections_total") == 2,
        )
        assert value(elected, "rocketmq_controller_master_epoch") == 2
        assert value(elected, "rocketmq_controller_sync_state_set_size") == 1
        on_new = await _scrape_until(
            group.metrics_addrs[slave],
            lambda f: f is not None and value(f, "rocketmq_ha_is_master") == 1,
        )
        assert value(on_new, "rocketmq_ha_master_epoch") == 2
        assert value(on_new, "rocketmq_ha_in_sync_replicas") == 1


def _diffs(found: dict | None) -> list[float] | None:
    if found is None:
        return None
    return [v for _labels, v in found.get("rocketmq_broker_commitlog_diff", [])]


async def _scrape_until(address: str, check, timeout_s: float = 10.0) -> dict:
    """Scrape `address` every 0.1 s until `check(found)` holds."""
    with trio.fail_after(timeout_s):
        while not check(found := await _scrape(address)):
            await trio.sleep(0.1)
    return found


@pytest.mark.processes
async def test_classic_slave_lag_rises_while_it_is_stopped_and_falls_when_it_resumes(tmp_path):
    """The master's view of its slave: while the slave process is stopped (SIGSTOP) the
    master keeps taking sends and the bytes the slave has not acknowledged rise by what
    was sent; once it resumes they fall back to 0, and the slave reports its own offset
    and the master's, equal again."""
    async with LocalClassicGroup(tmp_path, slaves=1, metrics=True) as group:
        master_node, slave_node = group.ids
        await group.create_topic("Lagging")
        async with Producer(group.namesrv_addr, "PG") as producer:
            for _ in range(3):
                await producer.send("Lagging", b"before")
            await group.wait_replicated()
            master_metrics = group.metrics_addrs[master_node]
            found = await _scrape_until(master_metrics, lambda found: _diffs(found) == [0])
            assert value(found, "rocketmq_ha_connections") == 1
            before = value(found, "rocketmq_ha_slave_ack_offset_bytes")
            assert before == value(found, "rocketmq_brokeruntime_commitlog_maxoffset") > 0

            with stopped(group.pid(slave_node)):
                for _ in range(40):
                    await producer.send("Lagging", b"x" * 1000)
                # at once: the master drops a slave silent for haHousekeepingInterval (4 s)
                found = await _scrape(master_metrics)
        end = value(found, "rocketmq_brokeruntime_commitlog_maxoffset")
        acked = value(found, "rocketmq_ha_slave_ack_offset_bytes")
        (behind,) = _diffs(found)
        assert behind == end - acked >= 40 * 1000
        assert acked == before  # the stopped slave acknowledged nothing more

        found = await _scrape_until(master_metrics, lambda found: _diffs(found) == [0], 30)
        assert value(found, "rocketmq_ha_slave_ack_offset_bytes") == end
        await group.wait_replicated()
        slave = await _scrape(group.metrics_addrs[slave_node])
    assert value(slave, "rocketmq_ha_slave_max_offset_bytes") == end
    assert value(slave, "rocketmq_ha_master_offset_bytes") == end
    assert value(slave, "rocketmq_ha_master_connected") == 1
    assert value(slave, "rocketmq_ha_connections") == 0
    assert "rocketmq_broker_commitlog_diff" not in slave


@pytest.mark.processes
async def test_broker_local_metrics_flag_prints_addresses_that_serve_metrics(tmp_path):
    """`python -m raftmq.tools.broker_local --classic --metrics` gives the name server
    and every broker a metrics port and prints each address; each one answers."""
    command = [sys.executable, "-m", "raftmq.tools.broker_local", "--classic", "--metrics"]
    process = await trio.lowlevel.open_process(
        [*command, "--dir", str(tmp_path)], stdout=subprocess.PIPE
    )
    try:
        lines = (await read_until(process.stdout, b"Ctrl-C")).decode().splitlines()
        addresses = {
            line.split()[1].rstrip(":"): line.split()[2]
            for line in lines
            if line.strip().startswith("metrics ")
        }
        assert set(addresses) == {"namesrv", "n0", "n1"}, lines
        for name, url in addresses.items():
            status, text = await trio.to_thread.run_sync(http_get, url)
            assert status == 200, (name, text)
            family = "rocketmq_namesrv_" if name == "namesrv" else "rocketmq_ha_connections"
            assert any(key.startswith(family) for key in samples(text)), (name, text[:500])
    finally:
        process.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            assert await process.wait() == 130


async def test_timer_gauges_show_the_backlog_and_the_fired_progress(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1, timerPrecisionMs="200")
    await create_topic(g, "T", 1)
    master = g.master()
    now_ms = int(time.time() * 1000)
    for uniq_key, deliver_ms in (("soon", now_ms + 300), ("tomorrow", now_ms + 86_400_000)):
        props = f"UNIQ_KEY\x01{uniq_key}\x02TIMER_DELIVER_MS\x01{deliver_ms}\x02"
        assert (await g.send(master, "T", b"x", props=props)).code == ResponseCode.SUCCESS
    await wait_for(lambda: master.store.max_offset("T", 0) == 1, timeout_s=5)
    await wait_for(lambda: master.store.metadata.timer_progress[0] >= now_ms)
    found = scrape_registry(master.registry)
    assert value(found, "rocketmq_timer_backlog", broker="broker-t") == 1  # tomorrow's
    assert value(found, "rocketmq_timer_in_memory", broker="broker-t") == 0
    assert value(found, "rocketmq_timer_fired_ms", broker="broker-t") >= now_ms
    assert 0 <= value(found, "rocketmq_timer_lateness_ms", broker="broker-t") <= 200 + 300
