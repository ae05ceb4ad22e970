"""Real processes: timer messages on a 3-node DLedger group whose master is SIGKILLed
while some are due and more are pending — none early, none lost, and those due during
the failover late by no more than the failover itself and one precision."""

from __future__ import annotations

import time

import pytest
import trio
from raftmq.broker.timer import due_time, fire_time

from raftmq.client.producer import Producer
from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageConst
from raftmq.remoting import RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalClassicGroup, LocalCluster
from tests.helpers import mqadmin

pytestmark = pytest.mark.processes

PRECISION_MS = 1000  # timerPrecisionMs's default
TIMERS = 60


def now_ms() -> int:
    return int(time.time() * 1000)


async def consumed(cluster: LocalCluster, node: str, topic: str) -> list[codec.MessageExt]:
    """Every message of the topic's queue 0, pulled from `node`."""
    messages: list[codec.MessageExt] = []
    while True:
        ext = {
            "consumerGroup": "CG", "topic": topic, "queueId": 0, "queueOffset": len(messages),
            "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0,
        }  # fmt: skip
        response = await cluster.broker_call(node, RequestCode.PULL_MESSAGE, ext)
        if response.code != ResponseCode.SUCCESS:
            return messages
        messages += codec.decode_all(response.body)


async def test_timers_due_across_a_master_sigkill_none_early_none_lost(tmp_path):
    async with LocalCluster(tmp_path, nodes=3) as cluster:
        await cluster.create_topic("T", 1)
        old = await cluster.wait_master()
        start = now_ms()
        asked: dict[str, int] = {}
        async with Producer(cluster.namesrv_addr, "PG") as producer:
            for i in range(TIMERS):  # due from 3 s to 15 s from now, one every 200 ms
                deliver_at_ms = start + 3000 + i * 200
                result = await producer.send("T", b"%d" % i, deliver_at_ms=deliver_at_ms)
                assert result.recall_handle
                asked[result.msg_id] = deliver_at_ms
        await trio.sleep(max(0, start + 6000 - now_ms()) / 1000)  # a third are out
        cluster.kill(old)
        killed_ms = now_ms()
        new = await cluster.wait_master(not_node=old)
        failover_ms = now_ms() - killed_ms
        await trio.sleep(max(0, max(asked.values()) + 2 * PRECISION_MS - now_ms()) / 1000)
        messages = await consumed(cluster, new, "T")
        status = await mqadmin("timerStatus", "-n", cluster.namesrv_addr, "-c", "RaftCluster")
    keys = [m.uniq_key for m in messages]
    assert set(keys) == set(asked), f"lost: {sorted(set(asked) - set(keys))}"
    lateness_ms = {}
    for m in messages:
        assert m.store_timestamp >= asked[m.uniq_key], "delivered early"
        assert m.properties[MessageConst.PROPERTY_TIMER_DELIVER_MS] == str(asked[m.uniq_key])
        lateness_ms[m.uniq_key] = m.store_timestamp - asked[m.uniq_key]
    # due to go out (at due + precision, due rounded down) well before the kill, or not
    healthy = {
        k
        for k, at in asked.items()
        if fire_time(due_time(at, PRECISION_MS), PRECISION_MS) < killed_ms - 250
    }
    before = [lateness_ms[k] for k in healthy]
    during = [lateness_ms[k] for k in asked.keys() - healthy]
    assert max(before) <= PRECISION_MS + 250, before  # a healthy group: one precision
    assert max(during) <= failover_ms + PRECISION_MS + 250, (failover_ms, during)
    print(
        f"failover {failover_ms} ms; lateness max {max(before)} ms before the kill, "
        f"{max(during)} ms after; {len(keys) - len(set(keys))} delivered twice"
    )
    assert status.returncode == 0, status.stderr
    table = status.stdout.decode()
    print(table)
    assert table.startswith("#Addr") and len(table.splitlines()) == 3  # every member


async def test_a_classic_slave_restarted_as_master_fires_what_was_pending(tmp_path):
    """Classic HA: the slave files the master's timer messages and applies its firing
    progress from the copied CommitLog; restarted by hand as master (brokerRole and
    brokerId changed) after the master's SIGKILL, it delivers the rest, none early."""
    async with LocalClassicGroup(tmp_path, slaves=1) as group:
        await group.create_topic("T", 1)
        start = now_ms()
        asked: dict[str, int] = {}
        async with Producer(group.namesrv_addr, "PG") as producer:
            for i in range(20):  # due from 1 s to 8.6 s from now
                result = await producer.send("T", b"%d" % i, deliver_at_ms=start + 1000 + i * 400)
                asked[result.msg_id] = start + 1000 + i * 400
        await trio.sleep(max(0, start + 3500 - now_ms()) / 1000)  # some are out
        await group.wait_replicated()
        group.kill("n0")
        killed_ms = now_ms()
        conf = group.conf_path("n1")
        conf.write_text(
            conf.read_text()
            .replace("brokerRole=SLAVE", "brokerRole=ASYNC_MASTER")
            .replace("brokerId=1", "brokerId=0")
        )
        await group.restart("n1")
        await trio.sleep(max(0, max(asked.values()) + 2 * PRECISION_MS - now_ms()) / 1000)
        messages = await consumed(group, "n1", "T")
    assert {m.uniq_key for m in messages} == set(asked)
    for m in messages:
        assert m.store_timestamp >= asked[m.uniq_key], "delivered early"
    by_the_old = sum(m.store_timestamp < killed_ms for m in messages)
    assert 0 < by_the_old < len(asked)  # both masters delivered some
