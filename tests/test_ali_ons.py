"""An independent RocketMQ client, the npm package ali-ons, against a real broker group.

Our own client shares our reading of the protocol, so it cannot show that we got it
right; ali-ons was written against Alibaba's Java brokers. `tests/ali_ons/scenario.js`
runs its Producer or its clustering push Consumer in a node process and prints what
happened as JSON lines; these tests start a name server and three DLedger brokers,
drive the clients, and compare what was acknowledged with what was delivered.

CI installs node and the package (`.ci/run` runs npm in tests/ali_ons); elsewhere the
tests are skipped when either is missing (`requires`, tests/conftest.py).
"""

from __future__ import annotations

import itertools
import os
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import yaml

from raftmq.remoting import ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import PeerProcess, run_peer

ALI_ONS_DIR = Path(__file__).parent / "ali_ons"
pytestmark = [pytest.mark.processes, pytest.mark.requires("node", "ali-ons")]

# A failed message's first retry uses delay level 3 (10 s by default); eighteen 1 s levels
# keep the retry path (send back, schedule topic, %RETRY% topic) at a test's pace.
FAST_DELAY_LEVELS = " ".join(["1s"] * 18)

_serial = itertools.count()  # names each client's stderr file in the cluster directory


def now_ms() -> float:
    """Wall-clock milliseconds, the clock of node's Date.now() in the events."""
    return time.time() * 1000


@asynccontextmanager
async def ali_ons(role: str, cluster: LocalCluster, **settings):
    """Run scenario.js as `role` against the cluster's name server; killed on the way out."""
    env = {**os.environ, "NAMESRV": cluster.namesrv_addr}
    env.update({k: str(v) for k, v in settings.items()})
    log_path = cluster.base_dir / f"ali-ons-{role}-{next(_serial)}.stderr"
    command = ["node", str(ALI_ONS_DIR / "scenario.js"), role]
    async with run_peer(
        f"ali-ons {role}", command, log_path, ready="ready", cwd=ALI_ONS_DIR, env=env
    ) as client:
        yield client


def deliveries(consumer: PeerProcess) -> dict[str, list[dict]]:
    """Every delivery the consumer's handler saw, by message body, in arrival order."""
    by_body = defaultdict(list)
    for event in consumer.of("received"):
        by_body[event["body"]].append(event)
    return by_body


def assert_dense_per_queue(events: list[dict]) -> None:
    """Queue offsets run 0, 1, 2, ... in every queue the events name, without a gap."""
    offsets = defaultdict(set)
    for event in events:
        offsets[event["queueId"]].add(event["queueOffset"])
    for queue_id, seen in offsets.items():
        assert seen == set(range(len(seen))), f"queue {queue_id} offsets {sorted(seen)}"


async def test_ali_ons_sends_and_push_consumes_with_a_retry(tmp_path):
    """N sends with tags and keys (some compressed); a clustering push consumer handles
    each exactly once, and the one its handler fails comes back through
    CONSUMER_SEND_MSG_BACK, the schedule topic and %RETRY%<group>, with reconsumeTimes 1
    and the original topic. A second group subscribed to one tag gets just that tag."""
    count, topic, group, failing = 40, "AliOnsTopic", "ali_cg", "msg-7"
    async with LocalCluster(tmp_path, extra_conf={"messageDelayLevel": FAST_DELAY_LEVELS}) as c:
        await c.create_topic(topic, 4)
        async with (
            ali_ons("consume", c, TOPIC=topic, GROUP=group, FAIL_BODIES=failing) as consumer,
            ali_ons("consume", c, TOPIC=topic, GROUP="ali_tag_cg", SUBSCRIPTION="tag1") as tagged,
        ):
            async with ali_ons(
                "produce", c, TOPIC=topic, GROUP="ali_pg", COUNT=count, LARGE_EVERY=10
            ) as producer:
                await producer.wait_for(lambda: producer.of("done"), 30, "all sends")
                await producer.finish()

            def handled():
                return {body for body, ds in deliveries(consumer).items() if not ds[-1]["fail"]}

            await consumer.wait_for(lambda: len(handled()) == count, 30, "every message")
            await tagged.wait_for(lambda: len(deliveries(tagged)) == count // 3, 30, "tag1")
            await trio.sleep(1.5)  # room for a duplicate to show up (none may)
            await consumer.finish()
            await tagged.finish()

    sent = producer.of("sent")
    assert producer.of("send_failed") == []
    assert [e["body"] for e in sent] == [f"msg-{i}" for i in range(count)]
    assert {e["status"] for e in sent} == {"SEND_OK"}
    assert len({e["msgId"] for e in sent}) == count
    assert_dense_per_queue(sent)
    large = {e["body"] for e in sent if e["sentBytes"] < e["bytes"]}
    assert large == {f"msg-{i}" for i in range(9, count, 10)}  # compressed by ali-ons

    got = deliveries(consumer)
    assert set(got) == {e["body"] for e in sent}
    for e in sent:
        first = got[e["body"]][0]
        i = e["i"]
        assert (first["msgId"], first["queueId"], first["queueOffset"]) == (
            e["msgId"],
            e["queueId"],
            e["queueOffset"],
        )
        assert (first["topic"], first["tags"], first["keys"]) == (topic, f"tag{i % 3}", f"key-{i}")
        assert (first["bytes"], first["compressed"]) == (e["bytes"], e["body"] in large)
        assert first["reconsumeTimes"] == 0
        assert len(got[e["body"]]) == (2 if e["body"] == failing else 1), got[e["body"]]

    failed, retried = got[failing]
    assert failed["fail"] and not retried["fail"]
    assert retried["reconsumeTimes"] == 1
    assert retried["topic"] == topic  # ali-ons restores it from RETRY_TOPIC
    assert (retried["tags"], retried["keys"]) == (failed["tags"], failed["keys"])
    assert retried["originMsgId"] == failed["msgId"] != retried["msgId"]
    retry_delay_ms = retried["storeTimestamp"] - failed["t"]
    assert retry_delay_ms >= 900, "delay level 3 (1 s here) was not applied"

    tag1 = [e["body"] for e in tagged.of("received")]
    assert sorted(tag1) == sorted(e["body"] for e in sent if e["i"] % 3 == 1)

    for client in (consumer, tagged):
        errors = [e for e in client.of("error") if e.get("code") != ResponseCode.QUERY_NOT_FOUND]
        assert [e["message"] for e in errors] == (
            [
                f"process mq message failed, topic: {topic}, msgId: {failed['msgId']}, "
                f"scripted failure of {failing}"
            ]
            if client is consumer
            else []
        )
    latencies = sorted(got[e["body"]][0]["t"] - e["start"] for e in sent)
    print(
        f"\nali-ons: {count} sent (send p50 {sorted(e['ms'] for e in sent)[count // 2]} ms, "
        f"{len(large)} compressed), each handled once, send-to-handler p50 "
        f"{latencies[count // 2]:.0f} ms max {latencies[-1]:.0f} ms; {len(tag1)} to the "
        f"tag1 group; {failing} failed once and was redelivered from %RETRY%{group} "
        f"{retried['t'] - failed['t']:.0f} ms later (stored {retry_delay_ms:.0f} ms after "
        f"the failure; delay level 3 = 1 s here)"
    )


async def test_ali_ons_across_a_master_kill(tmp_path):
    """The producer keeps sending while the master is killed with SIGKILL: every message
    ali-ons acknowledged reaches the consumer, with the msgId and queue offset the send
    reported; afterwards a new consumer of the group resumes from the committed offsets."""
    topic, group = "AliOnsFailover", "ali_fcg"
    async with LocalCluster(tmp_path) as c:
        await c.create_topic(topic, 4)
        async with (
            ali_ons("consume", c, TOPIC=topic, GROUP=group) as consumer,
            ali_ons(
                "produce", c, TOPIC=topic, GROUP="ali_fpg", COUNT=100_000, INTERVAL_MS=10
            ) as producer,
        ):
            await producer.wait_for(lambda: len(producer.of("sent")) >= 100, 30, "100 sends")
            old = await c.wait_master()
            killed_at = now_ms()
            c.kill(old)
            new = await c.wait_master(not_node=old)
            master_after_ms = now_ms() - killed_at

            def acked_after_kill():
                return [e for e in producer.of("sent") if e["start"] > killed_at]

            await producer.wait_for(lambda: len(acked_after_kill()) >= 100, 30, "acks after kill")
            await producer.finish()
            acked = {e["body"]: e for e in producer.of("sent")}
            await consumer.wait_for(
                lambda: set(deliveries(consumer)) >= set(acked), 30, "every acked message"
            )
            await trio.sleep(1.5)  # the committed offsets reach the new master meanwhile
            await consumer.finish()

        # A consumer of the same group starting now reads from the offsets the first one
        # committed (oneway, to the new master): only a new message should arrive.
        marker_settings = {"TOPIC": topic, "GROUP": "ali_fpg", "COUNT": 1, "BODY_PREFIX": "marker"}
        async with ali_ons("produce", c, **marker_settings) as marker:
            await marker.wait_for(lambda: marker.of("done"), 30, "the marker send")
            await marker.finish()
        async with ali_ons("consume", c, TOPIC=topic, GROUP=group) as resumed:
            await resumed.wait_for(lambda: "marker-0" in deliveries(resumed), 30, "the marker")
            await trio.sleep(1.0)
            await resumed.finish()

    got = deliveries(consumer)
    lost = sorted(set(acked) - set(got), key=lambda body: int(body[4:]))
    assert lost == []
    for body, e in acked.items():
        first = got[body][0]
        assert (first["msgId"], first["queueId"], first["queueOffset"]) == (
            e["msgId"],
            e["queueId"],
            e["queueOffset"],
        ), body
    assert_dense_per_queue([ds[0] for ds in got.values()])
    duplicates = sum(len(ds) - 1 for ds in got.values())
    failed = producer.of("send_failed")
    stored_unacked = [e["body"] for e in failed if e["body"] in got]
    assert set(got) <= set(acked) | {e["body"] for e in failed}
    assert len(marker.of("sent")) == 1
    redelivered = [e["body"] for e in resumed.of("received")]
    assert redelivered == ["marker-0"], "the new consumer did not resume from committed offsets"

    first_ack = min(e["t"] for e in acked_after_kill())
    failing_ms = max(e["t"] for e in failed) - min(e["start"] for e in failed) if failed else 0
    receipts = sorted(e["t"] for e in consumer.of("received"))
    longest_pause = max(b - a for a, b in itertools.pairwise(receipts))
    print(
        f"\nali-ons across a master kill: {old} killed, {new} master after "
        f"{master_after_ms:.0f} ms; {len(failed)} sends failed over {failing_ms:.0f} ms, "
        f"first ack {first_ack - killed_at:.0f} ms after the kill; {len(acked)} acked, "
        f"0 lost, {duplicates} duplicates, {len(stored_unacked)} delivered though the send "
        f"failed; longest pause between deliveries {longest_pause:.0f} ms"
    )


def ali_selected(i: int) -> bool:
    """What ALI_SQL92 selects of message i (n = i, kind = red, blue, green by i % 3)."""
    return i % 3 == 0 or 10 <= i <= 14 or (i > 150 and i % 3 == 1)


ALI_SQL92 = "kind = 'red' OR n BETWEEN 10 AND 14 OR n > 150 AND kind <> 'green'"


async def test_ali_ons_sql92_subscription_across_a_master_kill(tmp_path):
    """ali-ons subscribes with `{expressionType: 'SQL92', subString}` (sent in its
    heartbeats and in every pull); the producer keeps sending with user properties
    while the master is killed: every acknowledged message that matches is delivered,
    none that does not, whether its send was acknowledged or not."""
    topic = "AliOnsSql92"
    async with LocalCluster(tmp_path, extra_conf={"enablePropertyFilter": "true"}) as c:
        await c.create_topic(topic, 4)
        async with (
            ali_ons("consume", c, TOPIC=topic, GROUP="ali_sql_cg", SQL92=ALI_SQL92) as consumer,
            ali_ons(
                "produce", c, TOPIC=topic, GROUP="ali_sql_pg", COUNT=100_000, INTERVAL_MS=10,
                PROPS=1,
            ) as producer,
        ):  # fmt: skip
            await producer.wait_for(lambda: len(producer.of("sent")) >= 100, 30, "100 sends")
            delivered_before_kill = len(consumer.of("received"))
            old = await c.wait_master()
            killed_at = now_ms()
            c.kill(old)
            await c.wait_master(not_node=old)

            def acked_after_kill():
                return [e for e in producer.of("sent") if e["start"] > killed_at]

            await producer.wait_for(lambda: len(acked_after_kill()) >= 100, 30, "acks after kill")
            await producer.finish()
            wanted = {e["body"] for e in producer.of("sent") if ali_selected(e["i"])}
            await consumer.wait_for(
                lambda: set(deliveries(consumer)) >= wanted, 30, "every matching acked message"
            )
            await trio.sleep(1.5)  # room for a wrong delivery to show up
            await consumer.finish()

    tried = {e["body"]: e["i"] for e in producer.of("sent") + producer.of("send_failed")}
    got = deliveries(consumer)
    assert set(got) >= wanted
    wrong = sorted(body for body in got if not ali_selected(tried[body]))
    assert wrong == []
    for body, events in got.items():  # the properties came through as sent
        i = tried[body]
        assert {(e["n"], e["kind"]) for e in events} == {(str(i), ("red", "blue", "green")[i % 3])}
    assert delivered_before_kill > 0
    assert any(tried[body] > 150 for body in got)  # the part of the expression after the kill
    errors = [e for e in consumer.of("error") if e.get("code") != ResponseCode.QUERY_NOT_FOUND]
    print(
        f"\nali-ons SQL92 across a master kill: {len(tried)} sends, "
        f"{len(producer.of('sent'))} acked, {len(wanted)} acked and matching all delivered, "
        f"{len(set(got) - wanted)} matching but unacknowledged delivered, 0 not matching, "
        f"{sum(len(ds) - 1 for ds in got.values())} duplicates, "
        f"{delivered_before_kill} delivered before the kill; consumer errors: "
        f"{sorted({e['message'][:80] for e in errors})}"
    )


async def test_ali_ons_signs_requests_as_the_acl_expects(tmp_path):
    """ali-ons with `accessKeyId`/`accessKeySecret` signs RocketMQ's way (HmacSHA1 over
    the sorted header values and the body; it adds an `OnsChannel` field, which it also
    signs): against brokers with aclEnable its sends and its push consumer work with the
    right keys, and a wrong secret is refused without anything stored."""
    topic, count = "AliOnsAcl", 5
    keys = {"ACCESS_KEY": "aliUser01", "SECRET_KEY": "aliSecret01"}
    acl = {
        "accounts": [
            {"accessKey": "adminUser", "secretKey": "adminSecret1", "admin": True},
            {
                "accessKey": keys["ACCESS_KEY"],
                "secretKey": keys["SECRET_KEY"],
                "defaultTopicPerm": "DENY",
                "topicPerms": [f"{topic}=PUB|SUB"],
                "groupPerms": ["ali_acl_cg=SUB"],
            },
        ]
    }
    cluster = LocalCluster(
        tmp_path,
        extra_conf={"aclEnable": "true"},
        credentials=SessionCredentials("adminUser", "adminSecret1"),
    )
    for node in cluster.ids:
        path = cluster.store_dir(node) / "conf" / "plain_acl.yml"
        path.parent.mkdir(parents=True)
        path.write_text(yaml.safe_dump(acl))
    async with cluster as c:
        await c.create_topic(topic, 2)
        wrong = {**keys, "SECRET_KEY": "notTheSecret"}
        async with ali_ons("produce", c, TOPIC=topic, GROUP="ali_acl_pg", COUNT=1, **wrong) as bad:
            # ali-ons gives up on the send, then its close fails too: its UNREGISTER_CLIENT
            # is refused with the same remark, which it reports as a fatal error
            await bad.wait_for(lambda: bad.of("fatal") or bad.of("done"), 30, "the refusal")
        async with ali_ons("consume", c, TOPIC=topic, GROUP="ali_acl_cg", **keys) as consumer:
            async with ali_ons(
                "produce", c, TOPIC=topic, GROUP="ali_acl_pg", COUNT=count, **keys
            ) as producer:
                await producer.wait_for(lambda: producer.of("done"), 30, "all sends")
                await producer.finish()
            await consumer.wait_for(lambda: len(deliveries(consumer)) == count, 30, "every one")
            await consumer.finish()
        master = await c.wait_master()
        table = await c.member_state(master)

    [refused] = bad.of("send_failed")
    assert refused["message"].startswith("Send [4] times, still failed")
    [fatal] = bad.of("fatal")
    assert fatal["message"] == "Check signature failed for accessKey=aliUser01 (wrong secretKey?)"
    assert producer.of("send_failed") == []
    assert {e["status"] for e in producer.of("sent")} == {"SEND_OK"}
    assert set(deliveries(consumer)) == {f"msg-{i}" for i in range(count)}
    assert int(table["msgPutTotalTodayNow"]) == count  # the refused send stored nothing
