"""Two DLedger groups in one cluster, as real processes: a topic spread over both by
`mqadmin updateTopic -c`, a producer that keeps sending to the second group while the
first one's master is killed, and a consumer group that reads every acknowledged
message from both, and a query by key that finds messages in both."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import trio

from raftmq.client import ConsumeFromWhere, MessageQueue, Producer, PushConsumer
from raftmq.client.admin import Admin
from raftmq.client.errors import MQBrokerError
from raftmq.client.message_query import query_by_key
from raftmq.tools.broker_local import LocalGroups
from tests.helpers import NO_ANSWER, consuming_all, mqadmin, read_until

TOPIC = "Spread"


@pytest.mark.processes
async def test_kill_one_groups_master_while_sending(tmp_path):
    async with LocalGroups(tmp_path, groups=2) as cluster:
        first = cluster.groups[0]
        completed = await mqadmin(
            "updateTopic", "-n", cluster.namesrv_addr, "-c", cluster.cluster_name,
            "-t", TOPIC, "-r", "4", "-w", "4",
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        async with Admin(cluster.namesrv_addr) as admin:
            with trio.fail_after(10):
                while True:
                    try:
                        route = await admin.topic_route(TOPIC)
                    except NO_ANSWER:
                        route = None
                    if route and len({q.broker_name for q in route.queue_datas}) == 2:
                        break
                    await trio.sleep(0.05)
        assert {q.broker_name for q in route.queue_datas} == {"RaftNode00", "RaftNode01"}

        acked: dict[bytes, str] = {}  # body -> brokerName
        ack_times_s: list[tuple[float, str]] = []
        killed_at_s = 0.0
        async with Producer(cluster.namesrv_addr, "spreader", send_timeout_s=3.0) as producer:

            async def sends(stop_at_s: float) -> None:
                index = 0
                while time.monotonic() < stop_at_s:
                    body = f"m{index}".encode()
                    index += 1
                    try:
                        result = await producer.send(TOPIC, body)
                    except NO_ANSWER:
                        continue
                    acked[body] = result.message_queue.broker_name
                    ack_times_s.append((time.monotonic(), result.message_queue.broker_name))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sends, time.monotonic() + 12.0)
                await trio.sleep(2.0)
                master = await first.wait_master()
                killed_at_s = time.monotonic()
                first.kill(master, signal.SIGKILL)
                new_master = await first.wait_master(timeout_s=30.0, not_node=master)
                failover_s = time.monotonic() - killed_at_s
                assert new_master != master

        after = [(t, b) for t, b in ack_times_s if t > killed_at_s]
        times = [killed_at_s] + [t for t, _ in after]
        longest_gap_s = max(b - a for a, b in itertools.pairwise(times))
        second_times = [killed_at_s] + [t for t, b in after if b == "RaftNode01"]
        second_gap_s = max(b - a for a, b in itertools.pairwise(second_times))
        print(
            f"failover {failover_s:.2f}s longest gap {longest_gap_s:.2f}s "
            f"group-2 gap {second_gap_s:.2f}s acked {len(acked)}"
        )
        assert {b for _, b in after} >= {"RaftNode01"}
        assert second_gap_s < 1.5, (second_gap_s, failover_s)
        assert longest_gap_s < max(1.5, failover_s / 2), (longest_gap_s, failover_s)

        async with consuming_all(cluster.namesrv_addr, "reader", TOPIC, set(acked)) as consumer:
            # one consumer owns every queue of both groups
            assert {mq.broker_name for mq in consumer.assigned_queues} == {
                "RaftNode00",
                "RaftNode01",
            }

        # a query by key asks every group's master: messages from both are found
        sent_ids: dict[str, set[str]] = {}
        async with Producer(cluster.namesrv_addr, "keyed") as producer:
            with trio.fail_after(10):
                while len(sent_ids) < 2:
                    result = await producer.send(TOPIC, b"keyed", keys="fan-out")
                    sent_ids.setdefault(result.message_queue.broker_name, set()).add(result.msg_id)
        wanted = set().union(*sent_ids.values())
        async with Admin(cluster.namesrv_addr) as admin:
            with trio.fail_after(10):  # until every replica's dispatcher indexed them
                while True:
                    try:
                        found = await query_by_key(admin, TOPIC, "fan-out")
                    except MQBrokerError:
                        found = []
                    if {m.uniq_key for m in found} == wanted:
                        break
                    await trio.sleep(0.1)


@pytest.mark.processes
async def test_one_command_starts_a_classic_2m_2s_cluster(tmp_path):
    """`python -m raftmq.tools.broker_local --classic --groups 2`: two masters, each with
    its slave replicating, in one cluster; `updateTopic -c` spreads a topic over both
    groups; Ctrl-C stops every process."""
    command = [sys.executable, "-m", "raftmq.tools.broker_local", "--classic", "--groups", "2",
               "--role", "SYNC_MASTER", "--dir", str(tmp_path)]  # fmt: skip
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    try:
        text = (await read_until(process.stdout, b"Ctrl-C stops every process")).decode()
        namesrv = text.split()[2].rstrip(",")
        assert "cluster DefaultCluster" in text
        for name in ("broker-a", "broker-b"):
            assert f"{name} SYNC_MASTER:" in text and f"{name} SLAVE:" in text
        completed = await mqadmin("clusterList", "-n", namesrv)
        assert completed.returncode == 0, completed.stderr
        rows = [line.split() for line in completed.stdout.decode().splitlines()[1:]]
        # cluster, brokerName, brokerId, address, ...: a master and a slave per group
        assert sorted((row[1], row[2]) for row in rows) == [
            ("broker-a", "0"), ("broker-a", "1"), ("broker-b", "0"), ("broker-b", "1"),
        ], completed.stdout  # fmt: skip
        completed = await mqadmin(
            "updateTopic", "-n", namesrv, "-c", "DefaultCluster", "-t", TOPIC, "-r", "2", "-w", "2"
        )
        assert completed.returncode == 0, completed.stderr
        async with Admin(namesrv) as admin:
            with trio.fail_after(10):
                while True:
                    with contextlib.suppress(Exception):
                        route = await admin.topic_route(TOPIC)
                        if len(route.queue_datas) == 2:
                            break
                    await trio.sleep(0.05)
        assert {q.broker_name for q in route.queue_datas} == {"broker-a", "broker-b"}
        assert all(sorted(b.addrs) == [0, 1] for b in route.brokers.values()), route
        broker_addresses = [a for b in route.brokers.values() for a in b.addresses()]
        async with Producer(namesrv, "two-groups") as producer:
            sent = {(await producer.send(TOPIC, b"x")).message_queue.broker_name for _ in range(8)}
        assert sent == {"broker-a", "broker-b"}
    finally:
        process.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            status = await process.wait()
    assert status == 130
    for address in broker_addresses:  # every broker stopped with the command
        host, port = address.rsplit(":", 1)
        with pytest.raises(OSError):
            await trio.open_tcp_stream(host, int(port))


@pytest.mark.processes
async def test_latency_fault_avoidance_skips_a_hung_master_at_once(tmp_path, caplog):
    """Classic 2m-2s, broker-a's master hung (SIGSTOP: a machine gone without closing
    its connections, which the name server notices only when the registration expires;
    a process killed on a live host closes them, and the route drops it at once). With
    sendLatencyFaultEnable the first send that times out there isolates broker-a and
    every later one goes to broker-b directly; without it, each round-robin turn of
    broker-a costs an RPC timeout before the retry on broker-b."""
    rpc_timeout_s = 1.0
    async with LocalGroups(tmp_path, groups=2, nodes=2, master_role="ASYNC_MASTER") as cluster:
        await cluster.create_topic(TOPIC, 4)
        hung = cluster.groups[0]
        os.kill(hung.pid("n0"), signal.SIGSTOP)
        try:
            outcomes = {}
            for enable in (True, False):  # avoidance first: before the route drops broker-a
                caplog.clear()
                with caplog.at_level(logging.DEBUG, logger="raftmq.client.producer"):
                    async with Producer(
                        cluster.namesrv_addr, f"avoid-{enable}",
                        rpc_timeout_s=rpc_timeout_s, send_latency_fault_enable=enable,
                    ) as producer:  # fmt: skip
                        started_s = time.monotonic()
                        names = [(await producer.send(TOPIC, b"x")).message_queue.broker_name
                                 for _ in range(20)]  # fmt: skip
                        took_s = time.monotonic() - started_s
                failures = sum("failed" in r.getMessage() for r in caplog.records)
                outcomes[enable] = (failures, took_s, set(names))
        finally:
            os.kill(hung.pid("n0"), signal.SIGCONT)
    print(outcomes)
    failures, took_s, names = outcomes[True]
    assert names == {"broker-b"}, names
    assert failures == 1 and took_s < 2 * rpc_timeout_s, outcomes
    failures, took_s, names = outcomes[False]
    assert names == {"broker-b"}
    assert failures >= 3 and took_s >= 3 * rpc_timeout_s, outcomes


@pytest.mark.processes
async def test_two_consumers_split_both_groups_and_survive_a_master_kill(tmp_path):
    """Two push consumers of one group on a topic over 2 DLedger groups x 3 brokers:
    they split the 8 queues between them; one group left without a master (its master
    and a follower killed, so no election either) does not stop consumption from the
    other; when one consumer leaves, the other takes every queue
    of both groups and reads what is sent next."""
    async with LocalGroups(tmp_path, groups=2) as cluster:
        await cluster.create_topic(TOPIC, 4)
        received: dict[str, list[tuple[bytes, float]]] = {"c1": [], "c2": []}

        def handler(name: str):
            async def handle(msgs) -> bool:
                received[name].extend((m.body, time.monotonic()) for m in msgs)
                return True

            return handle

        def consumer(name: str) -> PushConsumer:
            return PushConsumer(
                cluster.namesrv_addr, "splitters", TOPIC, handler(name), "*",
                ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, rebalance_interval_s=2.0,
            )  # fmt: skip

        def owned(c: PushConsumer) -> set:
            return {mq for mq in c.assigned_queues if mq.topic == TOPIC}

        def bodies() -> set[bytes]:
            return {body for got in received.values() for body, _ in got}

        async with (
            Producer(cluster.namesrv_addr, "split-producer") as producer,
            consumer("c1") as c1,
        ):
            async with consumer("c2") as c2:
                with trio.fail_after(30):
                    while not (
                        len(owned(c1)) == len(owned(c2)) == 4 and len(owned(c1) | owned(c2)) == 8
                    ):
                        await trio.sleep(0.1)
                assert {mq.broker_name for mq in owned(c1) | owned(c2)} == {
                    "RaftNode00", "RaftNode01",
                }  # fmt: skip
                sent = {f"before-{i}".encode() for i in range(40)}
                for body in sorted(sent):
                    await producer.send(TOPIC, body)
                with trio.fail_after(30):
                    while not sent <= bodies():
                        await trio.sleep(0.1)
                assert received["c1"] and received["c2"]

                # Group 0 loses its master and a follower: no quorum, no master, until
                # they restart. Group 1's queues keep being consumed all the while.
                first = cluster.groups[0]
                master = await first.wait_master()
                down = [master, next(n for n in first.ids if n != master)]
                for node in down:
                    first.kill(node, signal.SIGKILL)
                killed_at_s = time.monotonic()
                during = {f"during-{i}".encode() for i in range(8)}
                for i, body in enumerate(sorted(during)):
                    await producer.send(TOPIC, body, queue=MessageQueue(TOPIC, "RaftNode01", i % 4))
                with trio.fail_after(30):
                    while not during <= bodies():
                        await trio.sleep(0.05)
                consumed_s = max(
                    t - killed_at_s for got in received.values() for b, t in got if b in during
                )
                print(f"group 1 consumed {consumed_s:.2f}s after group 0 lost its master")
                assert await first.master_address() is None, "group 0 is still down"
                assert consumed_s < 3.0, consumed_s
                for node in down:
                    await first.restart(node)
                await first.wait_master(timeout_s=30.0)
            # c2 left: c1 owns all 8 queues and reads everything sent now
            with trio.fail_after(30):
                while len(owned(c1)) != 8:
                    await trio.sleep(0.1)
            after = {f"after-{i}".encode() for i in range(40)}
            for body in sorted(after):
                await producer.send(TOPIC, body)
            with trio.fail_after(30):
                while not after <= {body for body, _ in received["c1"]}:
                    await trio.sleep(0.1)
