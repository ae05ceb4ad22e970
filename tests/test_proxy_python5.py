"""Apache's official RocketMQ 5.x Python client, unchanged, through `mqproxy` to a
three-node DLedger group: real processes, real TCP.

`tests/python5/peer.py` runs the client with the interpreter of its own venv (its
package `rocketmq` clashes with the C++ client's) and prints what happened as JSON
lines; the test starts a name server, the brokers and mqproxy, then reads back what
the brokers stored with raftmq's remoting client.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from raftmq.client import PullConsumer, PullStatus
from raftmq.client.admin import Admin
from raftmq.client.errors import MQBrokerError
from raftmq.tools.broker_local import LocalCluster
from raftmq.tools.dledger_local import free_ports
from tests.helpers import (
    PYTHON5,
    error_window_s,
    mqproxy,
    one_node_broker_conf,
    read_until,
    run_peer,
    start_namesrv,
)

pytestmark = [pytest.mark.processes, pytest.mark.requires("rocketmq-python5")]

PEER = Path(__file__).parent / "python5" / "peer.py"
MQBROKER = Path(sys.executable).parent / "mqbroker"
QUEUES = 4


@contextlib.asynccontextmanager
async def python5_peer(base_dir: Path, role: str, *args: object):
    """The official client as `role` (tests/python5/peer.py), its HOME under `base_dir`."""
    started = len(list(base_dir.glob("python5-*")))
    home = base_dir / f"python5-{started}-{role}"
    home.mkdir()
    command = [str(PYTHON5), str(PEER), role, *map(str, args)]
    env = {**os.environ, "HOME": str(home)}  # its log: $HOME/logs/rocketmq_python
    stderr = home / "stderr"
    async with run_peer(f"Python 5.x {role}", command, stderr, ready="started", env=env) as peer:
        yield peer


async def stored(namesrv_addr: str, topic: str) -> dict[int, list]:
    """Every message of `topic`, per queue id, in queue order."""
    found: dict[int, list] = {}
    async with PullConsumer(namesrv_addr, "proxy_check") as consumer:
        for mq in await consumer.fetch_queues(topic):
            offset, messages = 0, []
            while True:
                result = await consumer.pull(mq, offset)
                if result.status is not PullStatus.FOUND:
                    break
                messages += result.messages
                offset = result.next_begin_offset
            found[mq.queue_id] = messages
    return found


@pytest.mark.untimed
async def test_producer_sends_normal_and_fifo_messages_through_mqproxy(tmp_path):
    """Normal sends are stored with the client's message id as UNIQ_KEY, tag and body;
    FIFO sends of one message group all land in one queue, in the order sent."""
    async with LocalCluster(tmp_path) as cluster, mqproxy(cluster) as (endpoint, _proxy):
        await cluster.wait_master()
        await cluster.create_topics(["P5Normal", "P5Fifo"], queues=QUEUES)
        for topic, kind in (("P5Normal", "normal"), ("P5Fifo", "fifo")):
            async with python5_peer(
                cluster.base_dir, "produce", endpoint, topic, kind, 0.01
            ) as peer:
                await peer.wait_for(lambda p=peer: len(p.of("sent")) >= 40, 30, "40 sends")
                await peer.finish()
            assert not peer.of("failed"), peer.of("failed")[:3]
            sent = {e["msg_id"]: e for e in peer.of("sent")}
            queues = await stored(cluster.namesrv_addr, topic)
            by_id = {m.uniq_key: m for messages in queues.values() for m in messages}
            assert set(by_id) == set(sent)
            for msg_id, event in sent.items():
                message = by_id[msg_id]
                assert message.body == str(event["n"]).encode()
                assert message.tags == "peer"
                assert message.queue_offset == event["offset"]
            if kind == "fifo":
                for group in range(4):
                    mine = [m for ms in queues.values() for m in ms if int(m.body) % 4 == group]
                    assert len({m.queue_id for m in mine}) == 1, f"group g{group} spread"
                    numbers = [int(m.body) for m in sorted(mine, key=lambda m: m.queue_offset)]
                    assert numbers == sorted(numbers)
                    assert all(m.properties["__SHARDINGKEY"] == f"g{group}" for m in mine)


@pytest.mark.untimed
async def test_transactions_commit_roll_back_and_orphans_are_checked(tmp_path):
    """A committed half is delivered, a rolled-back one never; one left open is asked
    about on the producer's Telemetry stream, its checker commits it, and it is delivered."""
    topic = "P5Tx"
    conf = {"transactionTimeOut": "1000", "transactionCheckInterval": "500"}
    async with (
        LocalCluster(tmp_path, extra_conf=conf) as cluster,
        mqproxy(cluster) as (endpoint, _proxy),
    ):
        await cluster.wait_master()
        await cluster.create_topic(topic, queues=QUEUES)
        async with python5_peer(cluster.base_dir, "transaction", endpoint, topic) as peer:
            await peer.wait_for(lambda: peer.of("checked"), 30, "the orphan's check")
            halves = {e["body"]: e["msg_id"] for e in peer.of("half")}
            assert [e["msg_id"] for e in peer.of("checked")][:1] == [halves["orphan"]]
            with trio.fail_after(20):
                while True:
                    delivered = {
                        m.uniq_key: m.body
                        for messages in (await stored(cluster.namesrv_addr, topic)).values()
                        for m in messages
                    }
                    if halves["orphan"] in delivered:
                        break
                    await trio.sleep(0.2)
            await peer.finish()
        assert delivered == {halves["commit"]: b"commit", halves["orphan"]: b"orphan"}


@pytest.mark.untimed
@pytest.mark.parametrize("kind", ["simple", "push"])
async def test_consumers_receive_and_acknowledge_every_message_once(tmp_path, kind):
    """A SimpleConsumer (receive + ack) and a PushConsumer (QueryAssignment, long-polled
    receives, ack) each get every message a producer sent through the proxy, once: an
    acknowledged message is not delivered again."""
    topic, group = f"P5{kind.title()}", f"p5_{kind}"
    async with LocalCluster(tmp_path) as cluster, mqproxy(cluster) as (endpoint, _proxy):
        await cluster.wait_master()
        await cluster.create_topic(topic, queues=QUEUES)
        async with python5_peer(cluster.base_dir, kind, endpoint, topic, group) as consumer:
            async with python5_peer(
                cluster.base_dir, "produce", endpoint, topic, "normal", 0.01
            ) as peer:
                await peer.wait_for(lambda p=peer: len(p.of("sent")) >= 50, 30, "50 sends")
                await peer.finish()
            sent = {e["msg_id"] for e in peer.of("sent")}
            await consumer.wait_for(
                lambda: sent <= {e["msg_id"] for e in consumer.of("consumed")}, 40, "every message"
            )
            await trio.sleep(2)  # time for a wrongly repeated delivery to show
            await consumer.finish()
        consumed = [e["msg_id"] for e in consumer.of("consumed")]
        assert sorted(consumed) == sorted(sent)
        assert {e["attempt"] for e in consumer.of("consumed")} == {1}


async def lose_nothing_across(cluster, endpoints: str, topic: str, fault) -> tuple[float, float]:
    """A Producer sending every 10 ms and a SimpleConsumer through `endpoints` while
    `fault()` strikes: every acknowledged send is received and acknowledged. Returns the
    producer's longest run of failures after the fault, and how long the first send
    after it took to be acknowledged."""
    async with python5_peer(cluster.base_dir, "simple", endpoints, topic, "p5_fail") as consumer:
        async with python5_peer(
            cluster.base_dir, "produce", endpoints, topic, "normal", 0.01
        ) as producer:
            await producer.wait_for(lambda: len(producer.of("sent")) >= 100, 30, "100 sends")
            struck_at = time.monotonic()
            await fault()
            await producer.wait_for(
                lambda: sum(e["start"] > struck_at for e in producer.of("sent")) >= 100,
                30,
                "100 sends acknowledged after the fault",
            )
            await producer.finish()
        acked = {e["msg_id"] for e in producer.of("sent")}
        # a message popped from the old master but not acknowledged there comes back
        # after its invisible time (15 s); one whose ack reached a proxy killed before
        # it answered is acknowledged all the same, and counts as received
        await consumer.wait_for(
            lambda: acked <= {e["msg_id"] for e in consumer.of("consumed")},
            60,
            "every acknowledged message received",
        )
        await consumer.finish()
    received = {e["msg_id"] for e in consumer.of("consumed")}
    assert not acked - received, f"acknowledged, never received: {sorted(acked - received)[:5]}"
    after = [e for e in producer.of("sent") if e["start"] > struck_at]
    first_ack_s = min(e["end"] for e in after) - struck_at
    return error_window_s(producer, struck_at), first_ack_s


async def test_a_master_killed_under_a_producer_and_consumer_loses_nothing(tmp_path):
    """SIGKILL of the group's master mid-stream: the Python client's sends fail for at
    most a second (the proxy retries on the new master within the client's 3 s
    deadline), and every acknowledged message is received."""
    topic = "P5Failover"
    async with LocalCluster(tmp_path) as cluster, mqproxy(cluster) as (endpoint, _proxy):
        master = await cluster.wait_master()
        await cluster.create_topic(topic, queues=QUEUES)

        async def kill_master() -> None:
            cluster.kill(master, signal.SIGKILL)

        errors_s, first_ack_s = await lose_nothing_across(cluster, endpoint, topic, kill_master)
    print(f"master killed: errors for {errors_s:.2f} s, next send acknowledged {first_ack_s:.2f} s")
    assert errors_s <= 1.0


async def test_one_of_two_proxies_killed_loses_nothing(tmp_path):
    """Two mqproxy processes behind one endpoint list ("a;b"): QueryRoute answers that
    list, so when one proxy is killed the client's channel goes on through the other."""
    topic = "P5TwoProxies"
    async with (
        LocalCluster(tmp_path) as cluster,
        mqproxy(cluster, "proxy-a") as (endpoint_a, proxy_a),
        mqproxy(cluster, "proxy-b") as (endpoint_b, _proxy_b),
    ):
        await cluster.wait_master()
        await cluster.create_topic(topic, queues=QUEUES)

        async def kill_proxy() -> None:
            proxy_a.kill()

        endpoints = f"{endpoint_a};{endpoint_b}"
        errors_s, first_ack_s = await lose_nothing_across(cluster, endpoints, topic, kill_proxy)
    print(f"proxy killed: errors for {errors_s:.2f} s, next send acknowledged {first_ack_s:.2f} s")
    assert errors_s <= 1.0


@pytest.mark.untimed
async def test_timer_messages_are_never_early_and_a_recalled_one_never_comes(tmp_path):
    """Timer messages (delivery_timestamp, whole seconds from the Python client) become
    visible to a SimpleConsumer no earlier than due, and within the timer's precision
    (1 s) plus a receive's long poll after; the one recalled with its send's recall
    handle is never delivered."""
    topic = "P5Timer"
    async with LocalCluster(tmp_path) as cluster, mqproxy(cluster) as (endpoint, _proxy):
        await cluster.wait_master()
        await cluster.create_topic(topic, queues=QUEUES)
        async with python5_peer(
            cluster.base_dir, "simple", endpoint, topic, "p5_timer"
        ) as consumer:
            async with python5_peer(cluster.base_dir, "timer", endpoint, topic) as producer:
                await producer.wait_for(lambda: len(producer.of("sent")) == 10, 20, "10 sends")
                sent = {e["msg_id"]: e for e in producer.of("sent")}
                (recalled,) = (e["msg_id"] for e in producer.of("recalled"))
                expected = set(sent) - {recalled}
                await consumer.wait_for(
                    lambda: expected <= {e["msg_id"] for e in consumer.of("consumed")},
                    30,
                    "every timer message not recalled",
                )
                # the recalled one's time has passed, and the timer's second after it
                recalled_due_s = sent[recalled]["due"]
                await trio.sleep(max(0.0, recalled_due_s + 2 - time.time()))
                await producer.finish()
            await consumer.finish()
    consumed = {e["msg_id"]: e for e in consumer.of("consumed")}
    assert recalled not in consumed
    assert set(consumed) == expected
    lateness_s = [event["wall"] - sent[msg_id]["due"] for msg_id, event in consumed.items()]
    print(f"timer messages received {min(lateness_s):.2f}-{max(lateness_s):.2f} s after due")
    for msg_id, event in consumed.items():
        late_s = event["wall"] - sent[msg_id]["due"]
        assert late_s >= 0, f"message {sent[msg_id]['n']} delivered {-late_s:.3f} s early"
        assert late_s < 1 + 5 + 1, f"message {sent[msg_id]['n']} {late_s:.3f} s late"


@pytest.mark.untimed
async def test_a_push_consumer_of_an_orderly_group_gets_each_message_group_in_order(tmp_path):
    """A group made orderly (`mqadmin updateSubGroup -o true`) gets `fifo` in its
    Settings: the PushConsumer consumes FIFO messages of each message group in the
    order they were sent, each once."""
    topic, group = "P5FifoPush", "p5_orderly"
    async with LocalCluster(tmp_path) as cluster, mqproxy(cluster) as (endpoint, _proxy):
        await cluster.wait_master()
        await cluster.create_topic(topic, queues=QUEUES)
        async with Admin(cluster.namesrv_addr) as admin:
            config = {"groupName": group, "consumeMessageOrderly": True}
            await admin.create_subscription_group(config, cluster=cluster.cluster_name)
        async with python5_peer(cluster.base_dir, "push", endpoint, topic, group) as consumer:
            async with python5_peer(
                cluster.base_dir, "produce", endpoint, topic, "fifo", 0.01
            ) as peer:
                await peer.wait_for(lambda p=peer: len(p.of("sent")) >= 60, 30, "60 sends")
                await peer.finish()
            sent = {e["msg_id"]: e["n"] for e in peer.of("sent")}
            await consumer.wait_for(
                lambda: set(sent) <= {e["msg_id"] for e in consumer.of("consumed")},
                40,
                "every message",
            )
            await consumer.finish()
    consumed = [int(e["body"]) for e in consumer.of("consumed")]
    assert sorted(consumed) == sorted(sent.values())
    for message_group in range(4):
        mine = [n for n in consumed if n % 4 == message_group]
        assert mine == sorted(mine), f"g{message_group} out of order: {mine}"


@pytest.mark.untimed
async def test_local_mode_a_broker_serves_grpc_itself(tmp_path, nursery):
    """`mqbroker --enable-proxy -pc rmq-proxy.json` (Apache's local mode): the broker's
    process serves the gRPC proxy too, and the official client sends through it."""
    topic = "P5Local"
    namesrv = await start_namesrv(nursery)
    conf, _root = one_node_broker_conf(tmp_path)
    (grpc_port,) = free_ports(1, {"127.0.0.1"})
    proxy_conf = tmp_path / "rmq-proxy.json"
    proxy_conf.write_text(json.dumps({"grpcServerPort": grpc_port, "grpcServerHost": "127.0.0.1"}))
    command = [
        str(MQBROKER),
        "-c",
        str(conf),
        "-n",
        namesrv,
        "--enable-proxy",
        "-pc",
        str(proxy_conf),
    ]
    with (tmp_path / "broker.log").open("wb") as log:
        broker = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, stderr=log)
    try:
        printed = await read_until(broker.stdout, b"The Proxy boot success", timeout_s=30)
        assert f"grpcServerPort={grpc_port}".encode() in printed
        address = re.search(rb"The broker\[broker-t, ([0-9.:]+)\]", printed).group(1).decode()
        async with Admin(namesrv) as admin:
            with trio.fail_after(20):
                while True:  # once the one-node group has elected its master
                    try:
                        await admin.create_topic(topic, QUEUES, QUEUES, broker_addr=address)
                        break
                    except MQBrokerError:
                        await trio.sleep(0.1)
        endpoint = f"127.0.0.1:{grpc_port}"
        async with python5_peer(tmp_path, "produce", endpoint, topic, "normal", 0.01) as peer:
            await peer.wait_for(lambda: len(peer.of("sent")) >= 20, 30, "20 sends")
            await peer.finish()
        sent = {e["msg_id"] for e in peer.of("sent")}
        stored_ids = {m.uniq_key for ms in (await stored(namesrv, topic)).values() for m in ms}
        assert sent == stored_ids
    finally:
        broker.kill()
        await broker.wait()
