"""Apache RocketMQ's 5.x Java client (rocketmq-client-java 5.2.0 from Maven Central, gRPC)
through `mqproxy` to a 3-node DLedger group: real processes, the client unchanged.

`bench/java/client5/Client5Peer.java` drives its Producer, SimpleConsumer or
PushConsumer in a JVM of its own and prints JSON lines (bench/javatools.py resolves
and compiles it once into a cache). The master is killed with SIGKILL under a
producer and a consumer: nothing acknowledged is lost, and sends are acknowledged
again about as soon as the new master registers.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest

from bench.javatools import CLIENT5_POM, JavaTool
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import (
    PeerProcess,
    all_delivered,
    error_window_s,
    first_ack_after,
    kill_under_load,
    mqproxy,
    numbers,
    run_peer,
)

pytestmark = [pytest.mark.processes, pytest.mark.requires("rocketmq-java")]


@asynccontextmanager
async def java5_peer(cluster: LocalCluster, name: str, role: str, *args: object):
    home = cluster.base_dir / f"java5-{name}"
    home.mkdir()
    command = JavaTool(CLIENT5_POM).command("Client5Peer", role, *args,
                                            properties={"user.home": str(home)})  # fmt: skip
    ready = None if role == "produce" else "started"
    async with run_peer(f"Java 5.x {name}", command, home / "stderr", ready=ready) as peer:
        yield peer


@pytest.mark.parametrize("kind", ["simple", "push"])
async def test_java5_clients_lose_nothing_across_a_master_kill(tmp_path, kind):
    """A Java 5.x Producer sends every 10 ms through mqproxy and a SimpleConsumer or
    PushConsumer receives and acknowledges while the group's master is SIGKILLed:
    every acknowledged message is received, and the producer sees at most a second of
    failing sends (the first send after the kill was acknowledged 0.79-0.85 s after it,
    2026-11-28: the proxy holds it until the new master registers).

    A message the old master handed out whose answer the kill cut off comes back when
    its invisibility ends: a PushConsumer's receives get the proxy's
    `defaultInvisibleTimeMills` (60 s by default, RocketMQ's too), cut here to 10 s so
    the wait for it is short."""
    topic, group = f"J5{kind.title()}", f"j5_{kind}"
    async with (
        LocalCluster(tmp_path) as cluster,
        mqproxy(cluster, defaultInvisibleTimeMills=10_000) as (endpoint, _proxy),
    ):
        old_master = await cluster.wait_master()
        await cluster.create_topic(topic, 4)
        async with java5_peer(cluster, "consumer", kind, endpoint, topic, group) as consumer:
            async with java5_peer(
                cluster, "producer", "produce", endpoint, topic, 0.01, "normal"
            ) as producer:
                killed_at = await kill_under_load(cluster, producer, old_master, timeout_s=15)
            acked = {e["n"] for e in producer.of("sent")}
            await all_delivered(consumer, acked, 90)
    assert numbers(consumer) <= {e["n"] for e in producer.events}, "received something never sent"
    first_ack_s = first_ack_after(producer, killed_at)
    print(f"Java 5.x producer through mqproxy: first send acknowledged {first_ack_s:.2f} s later")
    assert error_window_s(producer, killed_at) <= 1.0


async def sent_and_received(
    cluster: LocalCluster, endpoint: str, kind: str, count: int, interval_s: float
) -> tuple[PeerProcess, PeerProcess]:
    """`count` messages of `kind` sent by a Java 5.x producer to topic J5<Kind> and
    received by a SimpleConsumer: the (producer, consumer) peers, both finished."""
    topic, group = f"J5{kind.title()}", f"j5_{kind}"
    async with java5_peer(
        cluster, f"{kind}-consumer", "simple", endpoint, topic, group
    ) as consumer:
        produce = ("produce", endpoint, topic, interval_s, kind)
        async with java5_peer(cluster, kind, *produce) as producer:
            await producer.wait_for(lambda: len(producer.of("sent")) >= count, 60, "the sends")
            await producer.finish()
        await all_delivered(consumer, {e["n"] for e in producer.of("sent")})
    return producer, consumer


@pytest.mark.untimed
async def test_java5_fifo_and_delay_messages(tmp_path):
    """FIFO: a Java 5.x producer's messages of one message group arrive at a
    SimpleConsumer in the order sent; delay: a message due 2 s after it was sent is
    never received before that."""
    async with LocalCluster(tmp_path) as cluster, mqproxy(cluster) as (endpoint, _proxy):
        await cluster.wait_master()
        await cluster.create_topics(["J5Fifo", "J5Delay"], 4)
        _, consumer = await sent_and_received(cluster, endpoint, "fifo", 40, 0.01)
        for group in range(4):
            order = [int(e["body"]) for e in consumer.of("consumed") if e["group"] == f"g{group}"]
            assert order == sorted(order) and order, (group, order)
        producer, consumer = await sent_and_received(cluster, endpoint, "delay", 5, 0.2)
        sent = {e["n"]: e for e in producer.of("sent")}
        for event in consumer.of("consumed"):
            assert event["t"] >= sent[int(event["body"])]["start"] + 2.0 - 0.01, event
