"""Apache RocketMQ's 4.9 Java client (`rocketmq-client` from Maven Central) against raftmq.

The client most RocketMQ applications run, unchanged: `bench/java/Peer.java` drives its
DefaultMQProducer or DefaultMQPushConsumer in a JVM of its own and prints what happened
as JSON lines (bench/javatools.py resolves and compiles it once into a cache). The
tests start a name server and a 3-node DLedger group as real processes, kill the
master with SIGKILL under load, and compare what was acknowledged with what was
delivered.

The Java client's failover habits (rocketmq-client 4.9, `MQClientInstance`,
`DefaultMQProducerImpl`): a producer refreshes routes every `pollNameServerInterval`
(30 s); a send that fails is retried `retryTimesWhenSendFailed` (2) times, on the
same broker name when there is only one. So with the brokers' own addresses in the
route it resumes at its next route poll; with the group's address (`groupAddress`, on
the new master within a failover) it resumes as soon as the new master listens.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import asynccontextmanager

import pytest
import trio
import yaml

from bench.javatools import JavaTool
from raftmq.client import Producer, SessionCredentials
from raftmq.client.admin import Admin
from raftmq.client.errors import MQClientError
from raftmq.client.message_query import query_by_unique_key
from raftmq.tools.broker_local import LocalCluster
from raftmq.transport.tls import ClientTls
from tests.helpers import (
    PROBE,
    TlsCluster,
    all_delivered,
    first_ack_after,
    kill_under_load,
    mqadmin,
    numbers,
    run_peer,
    tls_conf,
    traces_of,
    wait_consuming,
)

pytestmark = [pytest.mark.processes, pytest.mark.requires("rocketmq-java")]


@asynccontextmanager
async def java_peer(
    cluster: LocalCluster,
    name: str,
    role: str,
    *args: object,
    env: dict[str, str] | None = None,
    properties: dict[str, str] | None = None,
):
    """RocketMQ's Java client as `role` against the cluster's name server, its own log
    under the cluster's directory; `env` adds to its environment (RMQ_ACCESS_KEY and
    RMQ_SECRET_KEY sign its requests), `properties` to its system properties (tls.*)."""
    logs = cluster.base_dir / f"java-{name}"
    logs.mkdir()
    properties = {
        "rocketmq.client.logRoot": str(logs),
        "rocketmq.client.logUseSlf4j": "false",
        **(properties or {}),
    }
    command = JavaTool().command("Peer", role, cluster.namesrv_addr, *args, properties=properties)
    ready = "started" if role == "consume" else None
    env = {**os.environ, **(env or {})}
    async with run_peer(f"Java {name}", command, logs / "stderr", ready=ready, env=env) as peer:
        yield peer


async def topic_status_or_none(admin: Admin, topic: str) -> list:
    """The topic's queues, or none before the topic exists."""
    try:
        return await admin.topic_status(topic)
    except MQClientError:
        return []


@asynccontextmanager
async def consumer_and_producer(
    tmp_path, topic: str, group: str, listener: str, mode: str, interval_s: float = 0.01, **conf
):
    """A 3-node DLedger group with a group address (broker keys `conf`), `topic` on 4
    queues, a Java PushConsumer of `group` (`listener` concurrent or orderly) that holds
    every queue, and a Java producer sending in `mode` every `interval_s`: yields
    (cluster, its master, consumer, producer)."""
    async with LocalCluster(tmp_path, group_address=True, extra_conf=conf) as cluster:
        master = await cluster.wait_master()
        await cluster.create_topic(topic, 4)
        consume = ("consume", topic, group, listener, "*")
        async with java_peer(cluster, "consumer", *consume) as consumer:
            await wait_consuming(cluster, consumer, topic, 4)
            produce = ("produce", topic, interval_s, mode)
            async with java_peer(cluster, "producer", *produce) as producer:
                yield cluster, master, consumer, producer


JAVA_SEND_TIMEOUT_S = 3.0  # DefaultMQProducer's sendMsgTimeout
# How long after a broker's death its clients may still write to its connection: until
# their event loop has read the reset (milliseconds; this allows for a busy machine).
CLIENT_NOTICES_RESET_S = 0.1


@pytest.mark.parametrize(
    "mode",
    ["sync", "async", "batch"],
)
async def test_java_producer_and_consumer_lose_nothing_across_a_master_kill(tmp_path, mode):
    """A Java producer sends every 10 ms (`mode`: send, send with a callback, or four
    messages a send) and a Java PushConsumer consumes while the master is killed with
    SIGKILL: every acknowledged message is delivered, nothing never sent is, and sends
    are acknowledged again within 1 s of the kill, at the group's address. (With the
    brokers' own addresses in the route the client resumes at its next route poll:
    28.8 s once, 2026-11-28; tests/test_cpp_client.py checks that habit for the C++
    client, which shares it.)"""
    drill = consumer_and_producer(tmp_path, "JavaFailover", "java_fcg", "concurrent", mode)
    async with drill as (cluster, master, consumer, producer):
        killed_at = await kill_under_load(cluster, producer, master)
        acked = {e["n"] for e in producer.of("sent")}
        await all_delivered(consumer, acked)

    consumed = numbers(consumer)
    assert not acked - consumed, f"acknowledged, never consumed: {sorted(acked - consumed)[:20]}"
    assert consumed <= {e["n"] for e in producer.events}, "delivered something never sent"
    first_ack_s = first_ack_after(producer, killed_at)
    # a send the client had in flight as the master died is failed only at its own
    # timeout (3 s: Java 4.9 does not fail a request when its connection closes), and
    # a synchronous producer sends nothing meanwhile; so is one it wrote to the dead
    # connection before it read the connection's reset (once, with the machine's load
    # average at 3, a sync send begun just after the kill was acknowledged 3.0 s later)
    stuck = [
        e
        for e in producer.events
        if e["start"] <= killed_at + CLIENT_NOTICES_RESET_S and e["end"] > killed_at + 1
    ]
    limit_s = JAVA_SEND_TIMEOUT_S + 1.0 if stuck else 1.0
    print(
        f"Java producer ({mode}): first send acknowledged {first_ack_s:.2f} s after the kill"
        f"{' (a send in flight at the kill waited out the timeout)' if stuck else ''}"
    )
    assert first_ack_s <= limit_s, "sends resume at the group address within a second"


@pytest.mark.untimed
async def test_java_orderly_consumer_keeps_each_queues_order_across_a_master_kill(tmp_path):
    """A Java producer sends with a MessageQueueSelector (message n to queue n mod 4) and a
    Java PushConsumer with a MessageListenerOrderly consumes while the master is killed:
    every acknowledged message is delivered, and each queue's messages are delivered in
    the order they were sent (a message may come twice across the failover, RocketMQ's
    orderly contract, but never after a later one of its queue was first delivered)."""
    queues = 4
    drill = consumer_and_producer(tmp_path, "JavaOrderly", "java_ocg", "orderly", "orderly")
    async with drill as (cluster, master, consumer, producer):
        await kill_under_load(cluster, producer, master)
        acked = {e["n"] for e in producer.of("sent")}
        await all_delivered(consumer, acked)

    assert {e["queue_id"] for e in producer.of("sent")} == set(range(queues))
    assert all(e["queue_id"] == e["n"] % queues for e in producer.of("sent")), (
        "the selector's queue"
    )
    first_deliveries: dict[int, list[int]] = {}
    seen: set[int] = set()
    for e in consumer.of("consumed"):
        if e["body"] != PROBE and int(e["body"]) not in seen:
            seen.add(int(e["body"]))
            first_deliveries.setdefault(e["queue_id"], []).append(int(e["body"]))
    for queue_id, order in first_deliveries.items():
        assert order == sorted(order), f"queue {queue_id} out of order: {order}"


FAST_CHECKS = {"transactionTimeOut": "200", "transactionCheckInterval": "200"}


@pytest.mark.untimed
async def test_java_transactions_are_resolved_across_a_master_kill(tmp_path):
    """A Java TransactionMQProducer commits a third of its messages, rolls back a third
    and leaves a third open (UNKNOW) for the check-back to commit, while the master is
    killed: consumers see exactly the committed and the checked ones — every one of
    them, halves left open on the old master included, checked by the new one — and
    never a rolled-back one."""
    drill = consumer_and_producer(
        tmp_path, "JavaTx", "java_tcg", "concurrent", "transaction", 0.02, **FAST_CHECKS
    )
    async with drill as (cluster, master, consumer, producer):
        await producer.wait_for(lambda: len(producer.of("sent")) >= 60, 30, "60 sends")
        killed_at = time.monotonic()
        cluster.kill(master, signal.SIGKILL)
        await producer.wait_for(
            lambda: sum(e["start"] > killed_at for e in producer.of("sent")) >= 30,
            10, "30 sends acknowledged after the kill",
        )  # fmt: skip
        sent = {e["n"]: e["state"] for e in producer.of("sent")}
        wanted = {n for n, state in sent.items() if state != "ROLLBACK_MESSAGE"}
        # the producer stays up: the check-backs of the open ones come to it
        await consumer.wait_for(
            lambda: wanted <= numbers(consumer), 60,
            lambda: "committed and checked delivered (missing, with their states:"
            f" {[(n, sent[n]) for n in sorted(wanted - numbers(consumer))][:20]};"
            f" checked: {sorted({e['n'] for e in producer.of('checked')})[:60]})",
        )  # fmt: skip
        await producer.finish()
        await consumer.finish()

    assert {"COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"} <= set(sent.values())
    rolled_back = {n for n, state in sent.items() if state == "ROLLBACK_MESSAGE"}
    assert not numbers(consumer) & rolled_back, "a rolled-back message was delivered"
    checked = {e["n"] for e in producer.of("checked")}
    assert {n for n, state in sent.items() if state == "UNKNOW"} <= checked


@pytest.mark.untimed
async def test_java_clients_sign_with_acl_keys_and_filter_by_sql92(tmp_path):
    """With `aclEnable`, a Java producer signing with its AclClientRPCHook sends; one with
    a wrong secret is refused (NO_PERMISSION, the remark naming the key). A Java
    PushConsumer subscribed with MessageSelector.bySql gets exactly the messages whose
    property matches."""

    acl = {"accounts": [{"accessKey": "javaUser1", "secretKey": "javaSecret1", "admin": True}]}
    conf = {"aclEnable": "true", "enablePropertyFilter": "true"}
    cluster = LocalCluster(
        tmp_path, extra_conf=conf, credentials=SessionCredentials("javaUser1", "javaSecret1")
    )
    for node in cluster.ids:
        path = cluster.store_dir(node) / "conf" / "plain_acl.yml"
        path.parent.mkdir(parents=True)
        path.write_text(yaml.safe_dump(acl))
    topic, group = "JavaAcl", "java_acg"
    right = {"RMQ_ACCESS_KEY": "javaUser1", "RMQ_SECRET_KEY": "javaSecret1"}
    wrong = {"RMQ_ACCESS_KEY": "javaUser1", "RMQ_SECRET_KEY": "notTheSecret"}
    async with cluster:
        await cluster.create_topic(topic, 4)
        consume = ("consume", topic, group, "concurrent", "sql:k = '2'")
        async with java_peer(cluster, "consumer", *consume, env=right) as consumer:
            async with java_peer(
                cluster, "refused", "produce", topic, 0.01, "sync", env=wrong
            ) as refused:
                await refused.wait_for(lambda: refused.of("failed"), 30, "a refused send")
                await refused.finish()
            async with java_peer(
                cluster, "producer", "produce", topic, 0.01, "sync", env=right
            ) as producer:
                await producer.wait_for(lambda: len(producer.of("sent")) >= 40, 30, "40 sends")
                await producer.finish()
            matching = {e["n"] for e in producer.of("sent") if e["n"] % 4 == 2}
            await consumer.wait_for(lambda: matching <= numbers(consumer), 30, "matching delivered")
            await trio.sleep(1.0)  # time for a wrongly delivered one to show
            await consumer.finish()

    assert not refused.of("sent"), "a wrong secret's send was acknowledged"
    error = refused.of("failed")[0]["error"]  # NO_PERMISSION, as RocketMQ's broker words it
    assert "CODE: 16" in error and "Check signature failed" in error, error
    assert numbers(consumer) == matching, "bySql delivered a message whose property does not match"


@pytest.mark.untimed
async def test_java_lite_pull_consumer_reads_everything_across_a_master_kill(tmp_path):
    """A Java DefaultLitePullConsumer (subscribe, poll, auto-commit) reads while a Java
    producer sends and the master is killed: every acknowledged message is read."""
    topic, group, queues = "JavaLitePull", "java_lpg", 4
    async with LocalCluster(tmp_path, group_address=True) as cluster:
        old_master = await cluster.wait_master()
        await cluster.create_topic(topic, queues)
        async with java_peer(cluster, "consumer", "litepull", topic, group) as consumer:
            async with java_peer(cluster, "producer", "produce", topic, 0.01, "sync") as producer:
                await kill_under_load(cluster, producer, old_master)
            acked = {e["n"] for e in producer.of("sent")}
            await all_delivered(consumer, acked)
    assert numbers(consumer) <= {e["n"] for e in producer.events}, "read something never sent"


@pytest.mark.untimed
async def test_java_clients_over_tls_to_a_group_that_enforces_it(tmp_path):
    """With the brokers' remoting ports enforcing TLS (tls.server.mode=enforcing), a Java
    producer and consumer with RocketMQ's own TLS switch (-Dtls.enable=true, the group's
    CA as tls.client.trustCertPath, test mode off: the certificate is verified) send
    and receive; a Java producer without TLS is refused."""
    conf, ca = tls_conf(tmp_path)
    tls = {"tls.enable": "true", "tls.test.mode.enable": "false", "tls.client.trustCertPath": ca}
    topic, group = "JavaTls", "java_tlsg"
    # clients hold the group address, which follows the master: a Java client asks the
    # name server for routes every 30 s, so one holding a member's address is stuck
    # that long on a leader change (which a loaded machine can bring about here)
    async with TlsCluster(tmp_path / "cluster", conf, group_address=True) as cluster:
        async with Admin(
            cluster.namesrv_addr, tls=ClientTls(enable=True, trust_cert_path=ca)
        ) as admin:
            await admin.create_topic(topic, 4, 4)
        consume = ("consume", topic, group, "concurrent", "*")
        async with java_peer(cluster, "consumer", *consume, properties=tls) as consumer:
            async with java_peer(cluster, "plain", "produce", topic, 0.01, "sync") as plain:
                await plain.wait_for(lambda: plain.of("failed"), 30, "a refused send")
                await plain.finish()
            produce = ("produce", topic, 0.01, "sync")
            async with java_peer(cluster, "producer", *produce, properties=tls) as producer:
                await producer.wait_for(lambda: len(producer.of("sent")) >= 40, 30, "40 sends")
                await producer.finish()
            acked = {e["n"] for e in producer.of("sent")}
            await all_delivered(consumer, acked, 30)
    assert not plain.of("sent"), "a send without TLS was acknowledged"


@pytest.mark.untimed
async def test_java_consumer_retries_through_the_retry_topic_then_the_dlq(tmp_path):
    """A Java PushConsumer answering RECONSUME_LATER: the message comes back through
    %RETRY%<group> with its reconsume count growing (delay levels shortened to 1 s here),
    and after the consumer's maxReconsumeTimes it goes to %DLQ%<group>, where a pull
    finds it with its original body."""
    levels = {"messageDelayLevel": " ".join(["1s"] * 18)}
    topic, group = "JavaRetry", "java_rcg"
    async with LocalCluster(tmp_path, extra_conf=levels) as cluster:
        await cluster.create_topic(topic, 4)
        consume = ("consume", topic, group, "concurrent", "*")
        limit = {"RMQ_MAX_RECONSUME_TIMES": "2"}
        async with java_peer(cluster, "consumer", *consume, env=limit) as consumer:
            await wait_consuming(cluster, consumer, topic, 4)
            async with Producer(cluster.namesrv_addr) as producer:
                await producer.send(topic, b"fail-2")  # refused twice, then taken
                # refused beyond the limit: the DLQ
                fail_9_id = (await producer.send(topic, b"fail-9")).msg_id
            await consumer.wait_for(
                lambda: [e["reconsume_times"] for e in consumer.of("consumed")
                         if e["body"] == "fail-2"] == [0, 1, 2],
                30, "fail-2 delivered three times",
            )  # fmt: skip
            await consumer.wait_for(
                lambda: len([e for e in consumer.of("consumed") if e["body"] == "fail-9"]) == 3,
                30, "fail-9 delivered 1 + maxReconsumeTimes times",
            )  # fmt: skip
            dlq = f"%DLQ%{group}"  # write-only, as RocketMQ makes it: read back by its key
            async with Admin(cluster.namesrv_addr) as admin:
                with trio.fail_after(30):
                    while not [q for q in await topic_status_or_none(admin, dlq) if q.max_offset]:
                        await trio.sleep(0.5)
                dead = await query_by_unique_key(admin, dlq, fail_9_id)
            await consumer.finish()
    assert dead.body == b"fail-9" and dead.topic == dlq
    assert [e["body"] for e in consumer.of("consumed")].count("fail-9") == 3


@pytest.mark.untimed
async def test_java_oneway_sends_all_arrive_on_a_healthy_group(tmp_path):
    """sendOneway gets no answer, so no failover promise holds for it; on a healthy group
    every message a Java producer hands over that way is delivered, once."""
    topic, group = "JavaOneway", "java_owg"
    async with LocalCluster(tmp_path) as cluster:
        await cluster.create_topic(topic, 4)
        consume = ("consume", topic, group, "concurrent", "*")
        async with java_peer(cluster, "consumer", *consume) as consumer:
            await wait_consuming(cluster, consumer, topic, 4)
            async with java_peer(
                cluster, "producer", "produce", topic, 0.005, "oneway"
            ) as producer:
                await producer.wait_for(lambda: len(producer.of("sent")) >= 200, 30, "200 sends")
                await producer.finish()
            handed = {e["n"] for e in producer.of("sent")}
            await consumer.wait_for(lambda: handed <= numbers(consumer), 30, "all delivered")
            await consumer.finish()
    delivered = [int(e["body"]) for e in consumer.of("consumed") if e["body"] != PROBE]
    assert sorted(delivered) == sorted(handed), "a oneway message delivered twice or never sent"


@pytest.mark.untimed
async def test_java_clients_traces_are_read_by_our_mqadmin(tmp_path):
    """Apache's Java producer and push consumer with enableMsgTrace, to a custom trace
    topic the broker creates (msgTraceTopicName): `mqadmin queryMsgTraceById -t` decodes
    the Java client's records and prints its send and its consumption."""
    topic, group, traces = "JavaTraced", "java_trace_cg", "JavaTraces"
    conf = {"traceTopicEnable": "true", "msgTraceTopicName": traces}
    env = {"RMQ_TRACE_TOPIC": traces}
    async with LocalCluster(tmp_path, nodes=1, extra_conf=conf) as cluster:
        await cluster.wait_master()
        await cluster.create_topic(topic, 1)
        consume = ("consume", topic, group, "concurrent", "*")
        async with java_peer(cluster, "consumer", *consume, env=env) as consumer:
            produce = ("produce", topic, 10.0, "sync")  # one message, then it waits
            async with java_peer(cluster, "producer", *produce, env=env) as producer:
                await consumer.wait_for(lambda: consumer.of("consumed"), 15, "a delivery")
                # its line may come after the consumer's: two processes, two pipes
                await producer.wait_for(lambda: producer.of("sent"), 15, "the send's result")
                msg_id = consumer.of("consumed")[0]["msg_id"]
                assert msg_id == producer.of("sent")[0]["msg_id"]
                # the producer runs on: its trace goes out in the background, and a
                # Java client closing drops what it has not sent yet
                async with Admin(cluster.namesrv_addr) as admin:
                    with trio.fail_after(10):
                        records = await traces_of(admin, msg_id, traces)
        shown = await mqadmin(
            "queryMsgTraceById", "-n", cluster.namesrv_addr, "-i", msg_id, "-t", traces
        )
    assert {r.group for r in records} == {"JavaPeerProducer", group}
    assert shown.returncode == 0, shown.stderr
    rows = [line.split()[:2] for line in shown.stdout.decode().splitlines()]
    assert ["Pub", "JavaPeerProducer"] in rows and ["Sub", group] in rows, rows
