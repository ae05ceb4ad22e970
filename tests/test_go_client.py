"""Apache RocketMQ's Go client (github.com/apache/rocketmq-client-go/v2 v2.1.2, the
remoting one) against raftmq, unchanged: `bench/rocketmq_go/main.go` drives its Producer
or PushConsumer in a process of its own and prints JSON lines (built once from the Go
module proxy into the cache, bench/gotools.py `GoModule`). A name server and a 3-node
DLedger group with a group address run as real processes; the master is killed with
SIGKILL under load."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest

from bench.gotools import GoModule
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import (
    all_delivered,
    first_ack_after,
    kill_under_load,
    numbers,
    run_peer,
    wait_consuming,
)

pytestmark = [pytest.mark.processes, pytest.mark.requires("go")]

SEND_TIMEOUT_S = 3.0  # rocketmq-client-go's default send timeout


@asynccontextmanager
async def go_peer(cluster: LocalCluster, role: str, *args: object):
    command = [str(GoModule("rocketmq_go").build()), role, cluster.namesrv_addr, *map(str, args)]
    ready = "started" if role == "consume" else None
    log = cluster.base_dir / f"go-{role}.stderr"
    async with run_peer(f"Go {role}", command, log, ready=ready) as peer:
        yield peer


async def test_go_producer_and_consumer_lose_nothing_across_a_master_kill(tmp_path):
    """A Go producer sends every 10 ms and a Go PushConsumer consumes while the master
    is killed: every acknowledged message is delivered, nothing never sent is, and the
    producer's sends are acknowledged again, at the group's address, within a second
    of the client's own give-up: the Go client (like the C++ one) notices a dead
    connection only when a send on it times out (3 s), and then retries at the same
    address, where the new master already listens. So its first acknowledged send
    after the kill comes 0.38 s after it when no send was caught by the kill, and
    3.01 s when one was (both seen 2026-11-28)."""
    topic, group, queues = "GoFailover", "go_fcg", 4
    async with LocalCluster(tmp_path, group_address=True) as cluster:
        old_master = await cluster.wait_master()
        await cluster.create_topic(topic, queues)
        async with go_peer(cluster, "consume", topic, group) as consumer:
            await wait_consuming(cluster, consumer, topic, queues)
            async with go_peer(cluster, "produce", topic, 0.01) as producer:
                killed_at = await kill_under_load(cluster, producer, old_master)
            acked = {e["n"] for e in producer.of("sent")}
            await all_delivered(consumer, acked)

    assert numbers(consumer) <= {e["n"] for e in producer.events}, "delivered something never sent"
    first_ack_s = first_ack_after(producer, killed_at)
    print(f"Go producer: first send acknowledged {first_ack_s:.2f} s after the kill")
    assert first_ack_s <= SEND_TIMEOUT_S + 1.0, "sends resume at the group address"
