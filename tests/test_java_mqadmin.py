"""RocketMQ's own `mqadmin` (rocketmq-tools 4.9.8, MQAdminStartup) against raftmq, beside ours.

Operators script RocketMQ's tool; ours claims the same verbs. Each verb that exists in
both is run by both against one live group (a name server and three DLedger brokers,
real processes), and what they print is compared: the same routes, queue offsets,
broker status keys and values, message fields and group progress.

Where they differ by design (checked here too): RocketMQ's `queryMsgById` writes the
body to a file under /tmp and prints its path, ours prints the body; a message
without tags is `[null]` in Java's output and `[]` in ours; RocketMQ's `topicRoute`
prints fastjson (bare integer keys), ours standard JSON.
"""

from __future__ import annotations

import json
import re

import pytest
import trio

from bench.javatools import JavaTool
from raftmq.client import ConsumeFromWhere, Producer, PushConsumer
from raftmq.protocol.fastjson import loads as fastjson_loads
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import mqadmin

pytestmark = [pytest.mark.processes, pytest.mark.requires("rocketmq-java"), pytest.mark.untimed]

MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"


async def java_mqadmin(cluster: LocalCluster, *args: str) -> str:
    """RocketMQ's mqadmin ARGS against the cluster's name server: what it printed."""
    properties = {"rocketmq.client.logRoot": str(cluster.base_dir / "java-mqadmin")}
    command = JavaTool().command(MQADMIN_MAIN, *args, "-n", cluster.namesrv_addr,
                                 properties=properties)  # fmt: skip
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()


async def our_mqadmin(cluster: LocalCluster, *args: str) -> str:
    done = await mqadmin(*args, "-n", cluster.namesrv_addr)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def fields(text: str) -> dict[str, str]:
    """`Name:   value` lines (queryMsgById, brokerStatus) as a dict."""
    return {
        m.group(1).strip(): m.group(2).strip()
        for m in re.finditer(r"^([A-Za-z][\w ]*?)\s*:\s*(.*)$", text, re.MULTILINE)
    }


def rows(text: str) -> list[list[str]]:
    """The whitespace-split lines of a table, header and blank lines left out."""
    return [line.split() for line in text.splitlines() if line.strip() and line[0] != "#"]


def properties(text: str) -> dict[str, str]:
    """`{A=1, B=2}` as a dict (the order differs between the tools)."""
    return dict(item.split("=", 1) for item in text.strip("{}").split(", ") if item)


async def test_rocketmqs_mqadmin_and_ours_print_the_same(tmp_path):
    topic, group = "AdminCompared", "admin_cg"
    async with LocalCluster(tmp_path) as cluster:
        master = await cluster.wait_master()
        await cluster.create_topic(topic, 4)
        async with Producer(cluster.namesrv_addr) as producer:
            sent = [await producer.send(topic, b"body-%d" % n, keys=f"key{n}") for n in range(8)]
        consumed: list = []

        async def handle(messages) -> bool:
            consumed.extend(messages)
            return True

        async with PushConsumer(
            cluster.namesrv_addr, group, topic, handle,
            consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        ) as consumer:  # fmt: skip
            with trio.fail_after(30):
                while len(consumed) < len(sent):
                    await trio.sleep(0.05)
            await trio.sleep(6)  # the consumer's offsets reach the broker (every 5 s)

            conf = f"{cluster.broker_name}:4"
            await our_mqadmin(cluster, "updateOrderConf", "-t", topic, "-m", "put", "-v", conf)
            verbs = (
                ("clusterList",),
                ("topicRoute", "-t", topic),
                ("topicStatus", "-t", topic),
                ("brokerStatus", "-b", cluster.broker_addrs[master]),
                ("queryMsgById", "-i", sent[3].offset_msg_id),
                ("consumerProgress",),
                ("consumerProgress", "-g", group),
                ("topicList",),
                ("topicClusterList", "-t", topic),
                ("getConsumerConfig", "-g", group),
                ("brokerConsumeStats", "-b", cluster.broker_addrs[master]),
                ("consumerStatus", "-g", group, "-i", consumer.client_id),
                ("getNamesrvConfig",),
                ("updateOrderConf", "-t", topic, "-m", "get"),
                ("cleanUnusedTopic", "-c", "RaftCluster"),
            )
            both = await run_both(cluster, verbs)
            metrics = {}
            for tool, run in (("java", java_mqadmin), ("ours", our_mqadmin)):
                printed = await run(
                    cluster, "exportMetrics", "-c", "RaftCluster", "-f", str(tmp_path / tool)
                )
                assert printed == f"export {tmp_path / tool}/metrics.json success"
                metrics[tool] = json.loads((tmp_path / tool / "metrics.json").read_text())

    java, ours = both["clusterList", 1]
    assert [r[:5] for r in rows(java)] == [
        r[:5] for r in rows(ours)
    ]  # name, broker, id, addr, version
    for java_row, our_row in zip(rows(java), rows(ours), strict=True):  # #SPACE, a moving figure
        assert float(java_row[-1]) == pytest.approx(float(our_row[-2]), abs=0.05)  # ours adds one

    java, ours = both["topicRoute", 3]
    assert fastjson_loads(java) == json.loads(ours)

    java, ours = both["topicStatus", 3]
    assert rows(java) == rows(ours) and len(rows(ours)) == 4

    java, ours = both["brokerStatus", 3]
    java_status, our_status = fields(java), fields(ours)
    assert set(java_status) == set(our_status)
    for key in ("brokerId", "brokerName", "brokerRole", "commitLogMaxOffset", "dLegerGroup",
                "dLegerLeaderId", "dLegerPeers", "dLegerRole", "dLegerSelfId", "dLegerTerm",
                "msgPutTotalTodayNow"):  # fmt: skip
        assert java_status[key] == our_status[key], key

    java, ours = both["queryMsgById", 3]
    java_msg, our_msg = fields(java), fields(ours)
    assert java_msg.pop("Message Body Path").startswith("/tmp/rocketmq/msgbodys/")
    assert our_msg.pop("Message Body") == "body-3"
    assert properties(java_msg.pop("Properties")) == properties(our_msg.pop("Properties"))
    assert (java_msg.pop("Tags"), our_msg.pop("Tags")) == ("[null]", "[]")
    assert {k: v for k, v in java_msg.items() if k in our_msg} == our_msg
    assert our_msg["Keys"] == "[key3]" and our_msg["OffsetID"] == sent[3].offset_msg_id

    java, ours = both["consumerProgress", 1]
    # #Group #Count #Version #Type #Model #TPS #Diff Total; the TPS is a rate over the
    # broker's last minute (8 pulls), read seconds apart by the two tools: it moves
    assert [r[:5] + r[6:] for r in rows(java)] == [r[:5] + r[6:] for r in rows(ours)]
    assert all(int(r[5]) >= 0 for r in rows(java) + rows(ours))
    assert [r[0] for r in rows(ours)] == [group]

    java, ours = both["consumerProgress", 3]
    java_rows = [r for r in rows(java) if not r[0].startswith(("Consume", "Diff"))]
    our_rows = [r for r in rows(ours) if not r[0].startswith(("Consume", "Diff"))]
    # topic, broker, queue, broker offset, consumer offset; then the client IP (ours NA)
    assert [r[:5] for r in java_rows] == [r[:5] for r in our_rows], (java, ours)
    assert len([r for r in our_rows if r[0] == topic]) == 4
    assert re.search(r"Diff Total: 0", java) and re.search(r"Diff Total: 0", ours)

    java, ours = both["topicList", 1]
    assert sorted(java.split()) == sorted(ours.split())

    java, ours = both["topicClusterList", 3]
    assert java.split() == ours.split() == ["RaftCluster"]

    java, ours = both["getConsumerConfig", 3]
    java_config, our_config = config_lines(java), config_lines(ours)
    assert (
        java.splitlines()[0]
        == ours.splitlines()[0]
        == (
            f"=============================RaftCluster:{cluster.broker_name}"
            "============================="
        )
    )
    assert java_config and {k: our_config.get(k) for k in java_config} == java_config

    java, ours = both["brokerConsumeStats", 3]
    assert java.split() == ours.split()
    assert [r[:2] for r in rows(ours) if r[0] == topic] == [[topic, group]] * 4

    java, ours = both["consumerStatus", 5]
    for section in ("#Consumer Offset#", "#Consumer MQ Detail#"):  # asked at two moments
        java_rows, our_rows = (
            re.sub(r"last(Pull|Consume)Timestamp=\d+", "", text.split(section)[1].split("\n\n")[0])
            for text in (java, ours)
        )
        assert java_rows == our_rows
    java_subs, our_subs = (
        sorted(line for line in text.splitlines() if re.match(r"\d{3} Topic: ", line))
        for text in (java, ours)
    )
    assert java_subs == our_subs and len(our_subs) == 2  # the topic and the retry topic
    assert properties_section(java) == properties_section(ours)

    java, ours = both["getNamesrvConfig", 1]
    assert config_lines(java) == config_lines(ours)

    java, ours = both["cleanUnusedTopic", 3]
    assert java == ours == "success"

    # the same shape, and the same figures where they do not move between the two runs
    assert shape(metrics["java"]) == shape(metrics["ours"])
    java_report, our_report = (metrics[t]["evaluateReport"][cluster.broker_name] for t in metrics)
    compared = (
        ("runtimeQuota", "topicSize"), ("runtimeQuota", "groupSize"),
        ("runtimeQuota", "oneDayNum"), ("runtimeQuota", "messageAverageSize"),
        ("runtimeEnv", "totalMemKBytes"), ("runtimeVersion", "clientInfo"),
    )  # fmt: skip
    for part, key in compared:
        assert java_report[part][key] == our_report[part][key], (part, key)
    assert our_report["runtimeQuota"]["topicSize"] == 1  # the topic; its retry topic not

    java, ours = both["updateOrderConf", 5]
    assert (
        java.strip()
        == ours.strip()
        == (f"get orderConf success. topic=[{topic}], orderConf=[{conf}]")
    )


async def run_both(cluster: LocalCluster, verbs) -> dict[tuple[str, int], tuple[str, str]]:
    """Each verb run by both tools, keyed by (verb, argument count): what each printed.
    Two JVMs at a time (each is seconds of CPU at start); the verbs only read (the
    group has no deleted topic for cleanUnusedTopic to drop)."""
    both: dict[tuple[str, int], tuple[str, str]] = {}
    limit = trio.CapacityLimiter(2)

    async def one(verb: tuple[str, ...]) -> None:
        async with limit:
            java = await java_mqadmin(cluster, *verb)
        both[verb[0], len(verb)] = (java, await our_mqadmin(cluster, *verb))

    async with trio.open_nursery() as nursery:
        for verb in verbs:
            nursery.start_soon(one, verb)
    return both


def shape(doc):
    """A JSON document's keys, nested, without its values."""
    if isinstance(doc, dict):
        return {key: shape(value) for key, value in doc.items()}
    return None


def config_lines(text: str) -> dict[str, str]:
    """`key   =  value` lines (getConsumerConfig, getNamesrvConfig) as a dict."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)\s*=  (.*)$", text, re.MULTILINE)}


def properties_section(text: str) -> dict[str, str]:
    """consumerStatus's `#Consumer Properties#` lines (a Java Properties: any order)."""
    section = text.split("#Consumer Properties#\n")[1].split("\n\n")[0]
    return dict((part.strip() for part in line.split(": ", 1)) for line in section.splitlines())
