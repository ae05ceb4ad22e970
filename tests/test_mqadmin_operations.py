"""`mqadmin`'s operator verbs against real processes: a name server and two DLedger
groups of one broker each (RaftNode00, RaftNode01), one cluster, started once for the
module. Each test checks what its verb changed (a route, where a producer's messages
go, a group's offsets), not only what it printed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import signal
import subprocess
import sys
from collections import Counter

import pytest
import trio

from raftmq.client import ConsumeFromWhere, Producer, PushConsumer
from raftmq.client.admin import Admin
from raftmq.client.mqadmin import main
from raftmq.client.route import MessageQueue
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import RemotingCommand, RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalGroups
from tests.helpers import mqadmin

pytestmark = pytest.mark.untimed

CLUSTER = "RaftCluster"
FIRST, SECOND = "RaftNode00", "RaftNode01"


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    local = LocalGroups(tmp_path_factory.mktemp("operations"), groups=2, nodes=1)
    trio.run(local.__aenter__)
    try:
        yield local
    finally:
        trio.run(local.__aexit__, None, None, None)


async def run(groups: LocalGroups, *args: str, status: int = 0) -> str:
    """`mqadmin ARGS -n <the name server>`: its stdout, the exit status checked."""
    done = await mqadmin(*args, "-n", groups.namesrv_addr)
    assert done.returncode == status, (done.stdout.decode(), done.stderr.decode())
    return done.stdout.decode()


async def route_perms(admin: Admin, topic: str) -> dict[str, int]:
    return {q.broker_name: q.perm for q in (await admin.topic_route(topic)).queue_datas}


@contextlib.asynccontextmanager
async def consuming(groups: LocalGroups, group: str, topic: str, count: int):
    """A push consumer of `group` from the first offsets (or the group's committed
    ones), entered once it has received `count` messages: (it, what it received)."""
    received: list = []

    async def handle(messages) -> bool:
        received.extend(messages)
        return True

    async with PushConsumer(
        groups.namesrv_addr, group, topic, handle,
        consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    ) as consumer:  # fmt: skip
        with trio.fail_after(30):
            while len(received) < count:
                await trio.sleep(0.05)
        yield consumer, received


async def brokers_sent_to(groups: LocalGroups, topic: str, count: int) -> Counter:
    """Which broker groups a new producer's `count` sends went to."""
    async with Producer(groups.namesrv_addr, "operations_pg") as producer:
        results = [await producer.send(topic, b"m%d" % n) for n in range(count)]
    return Counter(r.message_queue.broker_name for r in results)


@pytest.mark.processes
async def test_wipe_write_perm_drains_a_broker_and_add_write_perm_restores_it(groups):
    """The name server's routes show the wiped group's queues read-only, so a real
    producer sends only to the other group; addWritePerm gives them back."""
    topic = "Drained"
    await groups.create_topic(topic, 2)
    out = await run(groups, "wipeWritePerm", "-b", FIRST)
    wiped = f"wipe write perm of broker[{FIRST}] in name server[{groups.namesrv_addr}] OK, "
    assert out.startswith(wiped) and out.count("\n") == 1
    count = int(out[len(wiped) :])
    async with Admin(groups.namesrv_addr) as admin:
        assert await route_perms(admin, topic) == {FIRST: 4, SECOND: 6}
    assert count >= 2  # this topic and the group's own (RaftNode00), at least
    assert await brokers_sent_to(groups, topic, 20) == {SECOND: 20}
    out = await run(groups, "addWritePerm", "-b", FIRST)
    assert out == (
        f"add write perm of broker[{FIRST}] in name server[{groups.namesrv_addr}] OK, {count}\n"
    )
    async with Admin(groups.namesrv_addr) as admin:
        assert await route_perms(admin, topic) == {FIRST: 6, SECOND: 6}
    assert await brokers_sent_to(groups, topic, 20) == {FIRST: 10, SECOND: 10}


@pytest.mark.processes
async def test_kv_config_and_order_conf(groups):
    """updateKvConfig/deleteKvConfig write every name server's KV table; updateOrderConf
    is its ORDER_TOPIC_CONFIG namespace, which routes carry as orderTopicConf once the
    name server's orderMessageEnable is true (updateNamesrvConfig, at run time)."""
    assert await run(groups, "updateKvConfig", "-s", "NS", "-k", "K", "-v", "V") == (
        "create or update kv config to namespace success.\n"
    )
    async with Admin(groups.namesrv_addr) as admin:
        answer = await admin.call(
            groups.namesrv_addr, RequestCode.GET_KV_CONFIG, {"namespace": "NS", "key": "K"}
        )
        assert answer.ext_fields["value"] == "V"
    assert await run(groups, "deleteKvConfig", "-s", "NS", "-k", "K") == (
        "delete kv config from namespace success.\n"
    )
    async with Admin(groups.namesrv_addr) as admin:
        request = RemotingCommand(
            RequestCode.GET_KV_CONFIG, ext_fields={"namespace": "NS", "key": "K"}
        )
        answer = await admin.pool.invoke(groups.namesrv_addr, request, 5)
        assert (answer.code, answer.remark) == (
            ResponseCode.QUERY_NOT_FOUND,
            "No config item, Namespace: NS Key: K",
        )

    topic = "Ordered"
    await groups.create_topic(topic, 2)
    conf = f"{FIRST}:2;{SECOND}:1"
    assert await run(groups, "updateOrderConf", "-t", topic, "-m", "put", "-v", conf) == (
        f"update orderConf success. topic=[{topic}], orderConf=[{conf}]\n"
    )
    assert await run(groups, "updateOrderConf", "-t", topic, "-m", "get") == (
        f"get orderConf success. topic=[{topic}], orderConf=[{conf}] \n"
    )
    route = json.loads(await run(groups, "topicRoute", "-t", topic))
    assert "orderTopicConf" not in route  # orderMessageEnable is false, as by default
    out = await run(groups, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "true")
    assert out == (  # the -n list, as Java prints a List
        f"update name server config success![{groups.namesrv_addr}]\norderMessageEnable : true\n"
    )
    config = await run(groups, "getNamesrvConfig")
    assert config.startswith(f"============{groups.namesrv_addr}============\n")
    assert f"{'orderMessageEnable':<50}=  true\n" in config
    async with Admin(groups.namesrv_addr) as admin:
        route = await admin.topic_route(topic)
        assert route.order_topic_conf == conf
        # an ordered topic's producer writes the queues the conf lists
        assert route.write_queues() == route.read_queues()[:3]
    await run(groups, "updateOrderConf", "-t", topic, "-m", "delete")
    await run(groups, "updateOrderConf", "-t", topic, "-m", "get", status=1)
    await run(groups, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "false")


@pytest.mark.processes
async def test_update_namesrv_config_refuses_what_cannot_change(groups):
    done = await mqadmin(
        "updateNamesrvConfig", "-n", groups.namesrv_addr, "-k", "listenPort", "-v", "1"
    )
    assert done.returncode == 1
    err = done.stderr.decode()
    assert "code 1 (SYSTEM_ERROR)" in err and "listenPort: cannot change at run time" in err


@pytest.mark.processes
async def test_update_topic_perm_topic_cluster_list_and_allocate_mq(groups):
    topic = "Permed"
    await groups.create_topic(topic, 2)
    master = groups.groups[0].broker_addrs["n0"]
    out = await run(groups, "updateTopicPerm", "-t", topic, "-b", master, "-p", "4")
    assert out.startswith(f"update topic perm from 6 to 4 in {master} success.\n")
    async with Admin(groups.namesrv_addr) as admin:
        with trio.fail_after(10):  # the broker registers its new config at once
            while await route_perms(admin, topic) != {FIRST: 4, SECOND: 6}:
                await trio.sleep(0.05)
    assert await run(groups, "updateTopicPerm", "-t", topic, "-b", master, "-p", "4") == (
        "new perm equals to the old one!\n"
    )
    out = await run(groups, "updateTopicPerm", "-t", topic, "-c", CLUSTER, "-p", "6")
    assert out.count("success.") == 2
    assert await run(groups, "topicClusterList", "-t", topic) == f"{CLUSTER}\n"
    result = json.loads(await run(groups, "allocateMQ", "-t", topic, "-i", "a,b,c"))["result"]
    assert {ip: [(q["brokerName"], q["queueId"]) for q in qs] for ip, qs in result.items()} == {
        "a": [(FIRST, 0), (FIRST, 1)],
        "b": [(SECOND, 0)],
        "c": [(SECOND, 1)],
    }


@pytest.mark.processes
async def test_clone_group_offset_makes_the_target_group_consume_from_the_cloned_offsets(groups):
    topic, source, target = "Cloned", "clone_src", "clone_dest"
    await groups.create_topic(topic, 2)
    async with Producer(groups.namesrv_addr, "operations_pg") as producer:
        for n in range(40):
            await producer.send(topic, b"c%d" % n)
    async with Admin(groups.namesrv_addr) as admin:
        route = await admin.topic_route(topic)
        committed = {}
        for n, mq in enumerate(route.read_queues()):
            committed[mq.broker_name, mq.queue_id] = n + 1  # as the source group's consumer
            await admin.update_consume_offset(
                route.master(mq.broker_name), source, topic, mq.queue_id, n + 1
            )
    out = await run(groups, "cloneGroupOffset", "-s", source, "-d", target, "-t", topic)
    assert out == (
        f"clone group offset success. srcGroup[{source}], destGroup=[{target}], topic[{topic}]\n"
    )
    async with consuming(groups, target, topic, 40 - sum(committed.values())) as (_, received):
        await trio.sleep(0.5)  # nothing before the cloned offsets comes after
    names = {g.broker_addrs["n0"]: g.broker_name for g in groups.groups}
    first = {}
    for msg in received:
        key = (names["{}:{}".format(*msg.store_host)], msg.queue_id)
        first[key] = min(first.get(key, msg.queue_offset), msg.queue_offset)
    assert first == committed
    assert len(received) == 40 - sum(committed.values())


@pytest.mark.processes
async def test_skip_accumulated_message_moves_a_group_to_the_queues_ends(groups):
    topic, group = "Skipped", "skipper"
    await groups.create_topic(topic, 2)
    async with Producer(groups.namesrv_addr, "operations_pg") as producer:
        for n in range(10):
            await producer.send(topic, b"s%d" % n)
    async with Admin(groups.namesrv_addr) as admin:
        route = await admin.topic_route(topic)
        for mq in route.read_queues():
            await admin.update_consume_offset(
                route.master(mq.broker_name), group, topic, mq.queue_id, 0
            )
        assert (await admin.consumer_progress(group, topic)).diff_total == 10
        out = await run(groups, "skipAccumulatedMessage", "-g", group, "-t", topic)
        header, *rows = [line.split() for line in out.splitlines()]
        assert header == ["#brokerName", "#queueId", "#offset"]
        status = await admin.topic_status(topic)
        assert sorted((r[0], int(r[1]), int(r[2])) for r in rows) == sorted(
            (s.broker_name, s.queue_id, s.max_offset) for s in status
        )
        assert (await admin.consumer_progress(group, topic)).diff_total == 0


@pytest.mark.processes
async def test_get_consumer_config_shows_the_group_on_each_broker(groups):
    await run(groups, "updateSubGroup", "-c", CLUSTER, "-g", "configured", "-r", "5")
    out = await run(groups, "getConsumerConfig", "-g", "configured")
    sections = out.split("=============================")
    assert [s for s in sections if s.startswith(CLUSTER)] == [
        f"{CLUSTER}:{FIRST}",
        f"{CLUSTER}:{SECOND}",
    ]
    assert out.count(f"{'retryMaxTimes':<40}=  5\n") == 2
    assert out.count(f"{'groupName':<40}=  configured\n") == 2
    assert await run(groups, "getConsumerConfig", "-g", "no_such_group") == ""


@pytest.mark.processes
async def test_check_msg_send_rt_and_send_msg_status_send_and_time(groups):
    topic = "Timed"
    await groups.create_topic(topic, 2)
    async with Admin(groups.namesrv_addr) as admin:
        before = sum(s.max_offset for s in await admin.topic_status(topic))
        out = await run(groups, "checkMsgSendRT", "-t", topic, "-a", "8", "-s", "64")
        header, *rows, average = out.splitlines()
        assert header.split() == ["#Broker", "Name", "#QID", "#Send", "Result", "#RT"]
        assert [(r.split()[0], int(r.split()[1]), r.split()[2]) for r in rows] == [
            (name, qid, "true") for name in (FIRST, SECOND) for qid in (0, 1)
        ] * 2
        assert float(average.removeprefix("Avg RT: ")) >= 0
        assert sum(s.max_offset for s in await admin.topic_status(topic)) == before + 8
    out = await run(groups, "sendMsgStatus", "-b", SECOND, "-c", "3", "-s", "32")
    lines = out.splitlines()
    assert len(lines) == 3
    for line in lines:
        assert re.fullmatch(
            rf"rt=\d+ms, SendResult=SendResult \[sendStatus=SEND_OK, msgId=[0-9A-F]+, "
            rf"offsetMsgId=[0-9A-F]+, messageQueue=MessageQueue \[topic={SECOND}, "
            rf"brokerName={SECOND}, queueId=0\], queueOffset=\d+\]",
            line,
        ), line


@pytest.mark.processes
async def test_export_metadata_and_configs(groups, tmp_path):
    await groups.create_topic("Exported", 2)
    await run(groups, "updateSubGroup", "-c", CLUSTER, "-g", "exported_cg", "-q", "1")
    out = await run(groups, "exportMetadata", "-c", CLUSTER, "-f", str(tmp_path))
    assert out == f"export {tmp_path}/metadata.json success\n"
    doc = json.loads((tmp_path / "metadata.json").read_text())
    topics, groups_table = doc["topicConfigTable"], doc["subscriptionGroupTable"]
    # queues summed over the two masters, as RocketMQ's export does
    assert (topics["Exported"]["readQueueNums"], topics["Exported"]["writeQueueNums"]) == (4, 4)
    for system in ("TBW102", FIRST, SECOND, CLUSTER, "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_RAFTMQ_META"):
        assert system not in topics
    assert not [t for t in topics if t.startswith("%RETRY%")]  # only with -s
    assert groups_table["exported_cg"]["retryQueueNums"] == 2
    assert "TOOLS_CONSUMER" not in groups_table and doc["exportTime"] > 0
    master = groups.groups[0].broker_addrs["n0"]
    out = await run(groups, "exportMetadata", "-b", master, "-t", "-s", "-f", str(tmp_path))
    assert out == f"export {tmp_path}/topic.json success\n"
    only_first = json.loads((tmp_path / "topic.json").read_text())["topicConfigTable"]
    assert only_first["Exported"]["readQueueNums"] == 2
    out = await run(groups, "exportConfigs", "-c", CLUSTER, "-f", str(tmp_path))
    assert out == f"export {tmp_path}/configs.json success\n"
    configs = json.loads((tmp_path / "configs.json").read_text())
    assert configs["clusterScale"] == {
        "namesrvSize": 1,
        "masterBrokerSize": 2,
        "slaveBrokerSize": 0,
    }
    assert configs["brokerConfigs"][SECOND]["brokerName"] == SECOND
    assert configs["brokerConfigs"][FIRST]["brokerClusterName"] == CLUSTER


@pytest.mark.processes
async def test_consumer_status_and_get_consumer_status_ask_the_running_consumer(groups, tmp_path):
    """GET_CONSUMER_RUNNING_INFO (consumerStatus) and INVOKE_BROKER_TO_GET_CONSUMER_STATUS
    (getConsumerStatus) reach our push consumer through a broker, and it answers with
    the queues it owns and how far it consumed them."""
    topic, group = "Watched", "watched_cg"
    await groups.create_topic(topic, 2)
    async with Producer(groups.namesrv_addr, "operations_pg") as producer:
        for n in range(12):
            await producer.send(topic, b"w%d" % n)
    async with consuming(groups, group, topic, 12) as (consumer, _received):
        out = await run(groups, "consumerStatus", "-g", group, "-i", consumer.client_id)
        assert out.startswith("#Consumer Properties#\n")
        assert f"{'consumerGroup':<40}: {group}\n" in out
        subscriptions = re.findall(
            r"^(\d{3}) Topic: (\S+)\s+ClassFilter: false\s+SubExpression: (.*)$", out, re.M
        )
        # in SubscriptionData's order, as Java's TreeSet has them: '%' sorts before letters
        assert subscriptions == [("001", f"%RETRY%{group}", "*"), ("002", topic, "*")]
        offsets_section = out.split("#Consumer Offset#\n")[1].split("\n\n")[0]
        header, *rows = offsets_section.splitlines()
        owned = {
            (r.split()[1], int(r.split()[2])): int(r.split()[3])
            for r in rows
            if r.split()[0] == topic
        }
        # it owns all four queues and has consumed them to their ends (3 each)
        assert owned == {(name, qid): 3 for name in (FIRST, SECOND) for qid in (0, 1)}
        assert "ProcessQueueInfo [commitOffset=3, cachedMsgMinOffset=0" in out

        out = await run(groups, "getConsumerStatus", "-g", group, "-t", topic)
        first, header, *rows = out.splitlines()
        assert (
            first
            == f"get consumer status from client. group={group}, topic={topic}, originClientId="
        )
        assert sorted(
            (r.split()[0], r.split()[1], int(r.split()[2]), int(r.split()[3])) for r in rows
        ) == [(consumer.client_id, name, qid, 3) for name in (FIRST, SECOND) for qid in (0, 1)]

        second = groups.groups[1].broker_addrs["n0"]  # -b: that broker's view of the group
        out = await run(groups, "consumerConnection", "-g", group, "-b", second)
        assert out.startswith(f"001  {consumer.client_id} ")

        listing = await mqadmin("consumerStatus", "-n", groups.namesrv_addr, "-g", group,
                                cwd=tmp_path)  # fmt: skip
        assert listing.returncode == 0, listing.stderr
        header, line, *_analysis = listing.stdout.decode().splitlines()
        assert header.split() == ["#Index", "#ClientId", "#Version", "#ConsumerRunningInfoFile"]
        index, client_id, version, path = line.split()
        assert (index, client_id) == ("1", consumer.client_id) and version.startswith("V4_")
        assert (tmp_path / path).read_text().startswith("#Consumer Properties#\n")
        assert "Same subscription in the same group of consumer" in listing.stdout.decode()
    gone = await mqadmin("consumerStatus", "-n", groups.namesrv_addr, "-g", group, "-i", "nobody")
    assert gone.returncode == 1


@pytest.mark.processes
async def test_broker_consume_stats_query_cq_and_producer_read_one_broker(groups):
    topic, group = "Lagging", "lagger"
    await groups.create_topic(topic, 2)
    master = groups.groups[0].broker_addrs["n0"]
    async with Producer(groups.namesrv_addr, "visible_pg") as producer:
        sent = [await producer.send(topic, b"l%d" % n, queue=MessageQueue(topic, FIRST, n % 2))
                for n in range(6)]  # fmt: skip
        out = await run(groups, "producer", "-b", master)
        assert (
            f"producer group (visible_pg) instance : clientId={producer.instance.client_id}," in out
        )
    async with Admin(groups.namesrv_addr) as admin:
        await admin.update_consume_offset(master, group, topic, 0, 1)
        await admin.update_consume_offset(master, group, topic, 1, 0)  # nothing consumed: not shown
    out = await run(groups, "brokerConsumeStats", "-b", master)
    header, *rows, blank, total = out.splitlines()
    assert header.split()[:4] == ["#Topic", "#Group", "#Broker", "Name"] and blank == ""
    mine = [r.split()[:7] for r in rows if r.split()[:2] == [topic, group]]
    assert mine == [[topic, group, FIRST, "0", "3", "1", "2"]]
    assert int(total.removeprefix("Diff Total: ")) >= 2 + 3
    out = await run(groups, "brokerConsumeStats", "-b", master, "-l", "1000")
    assert len(out.splitlines()) == 3  # the header, a blank line and the total

    out = await run(groups, "queryCq", "-t", topic, "-q", "0", "-i", "1", "-c", "2", "-b", master)
    lines = out.splitlines()
    assert lines[:3] == ["Queue data: ", "max: 3, min: 0", "======================================"]
    first, second = (decode_message_id(r.offset_msg_id).offset for r in sent[2:5:2])
    assert lines[3] == "idx: 1"
    assert lines[4].startswith(f"ConsumeQueueData{{physicOffset={first}, physicSize=")
    assert lines[6] == "idx: 2" and f"physicOffset={second}," in lines[7]
    out = await run(groups, "queryCq", "-t", topic, "-q", "0", "-i", "0", "-b", master, "-g", group)
    assert f"Filter data: \n{group}@{topic} is not online!" in out
    assert await run(groups, "queryCq", "-t", topic, "-q", "9", "-i", "0", "-b", master,
                     status=1) == ""  # fmt: skip


@pytest.mark.processes
async def test_topic_route_list_format_and_clean_expired_cq(groups):
    topic = "Listed"
    await groups.create_topic(topic, 2)
    out = await run(groups, "topicRoute", "-t", topic, "-l")
    header, first, second, rule, total = out.splitlines()
    assert header.split() == ["#ClusterName", "#BrokerName", "#BrokerAddrs", "#ReadQueue",
                              "#WriteQueue", "#Perm"]  # fmt: skip
    for line, group in ((first, groups.groups[0]), (second, groups.groups[1])):
        address = group.broker_addrs["n0"]
        assert line.split() == [CLUSTER, group.broker_name, f"{{0={address}}}", "2", "2", "6"]
    assert rule == "-" * 158 and total.split() == ["Total:", "2", "4", "4"]
    # every member of the cluster answers CLEAN_EXPIRED_CONSUMEQUEUE
    assert await run(groups, "cleanExpiredCQ", "-c", CLUSTER) == "success"
    master = groups.groups[1].broker_addrs["n0"]
    assert await run(groups, "cleanExpiredCQ", "-b", master) == "success"


def test_a_verb_that_does_not_apply_says_why_in_one_line(capsys):
    assert main(["deleteExpiredCommitLog", "-n", "127.0.0.1:1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "mqadmin deleteExpiredCommitLog: not applicable to raftmq: a raftmq broker deletes "
        "expired log files as soon as fileReservedTime allows, at any hour (it has no "
        "deleteWhen window for this to override)\n"
    )
    assert main(["help", "startMonitoring"]) == 0
    assert "Not applicable to raftmq: the brokers export" in capsys.readouterr().out


@pytest.mark.processes
async def test_print_msg_by_queue_prints_one_queue_and_counts_its_tags(groups):
    topic = "Tagged"
    await groups.create_topic(topic, 2)
    queue = MessageQueue(topic, FIRST, 0)
    async with Producer(groups.namesrv_addr, "operations_pg") as producer:
        for n, tag in enumerate(("A", "A", "B", "A", None)):
            await producer.send(topic, b"t%d" % n, tags=tag, queue=queue)
    argv = ("printMsgByQueue", "-t", topic, "-a", FIRST, "-i", "0")
    out = await run(groups, *argv, "-p", "true", "-d", "true", "-f", "true")
    *messages, a_count, b_count = out.splitlines()
    assert [m.rsplit(" BODY: ", 1)[1] for m in messages] == ["t0", "t1", "t2", "t3", "t4"]
    assert all(m.startswith("MSGID: ") for m in messages)
    assert (a_count.split(), b_count.split()) == (["Tag:", "A", "Count:", "3"],
                                                  ["Tag:", "B", "Count:", "1"])  # fmt: skip
    only_b = (await run(groups, *argv, "-s", "B", "-p", "true")).splitlines()
    assert len(only_b) == 1 and only_b[0].endswith(" BODY: NOT PRINT BODY")
    assert await run(groups, *argv) == ""  # neither -p nor -f: nothing, as RocketMQ's


@pytest.mark.processes
async def test_export_metrics_reports_what_the_broker_stored(tmp_path):
    """exportMetrics' figures against what was sent to a broker of its own: the
    average stored size of the messages (every record of the same length: the size
    of each in the ConsumeQueue), the delayed messages counted as scheduleInTps and
    scheduleOneDayInNum, the user topics and groups, the online consumer's version."""
    local = LocalGroups(tmp_path / "groups", groups=1, nodes=1)
    async with local:
        (group,) = local.groups
        master = group.broker_addrs["n0"]
        topic, consumer_group = "Measured", "measuring"
        await local.create_topic(topic, 1)
        async with Producer(local.namesrv_addr, "metrics_pg") as producer:
            for n in range(10):
                await producer.send(
                    topic, b"%04d" % n, queue=MessageQueue(topic, group.broker_name, 0)
                )
        async with Admin(local.namesrv_addr) as admin:
            ext = {"topic": topic, "queueId": "0", "index": "0", "count": "10"}
            cq = await admin.broker_json(master, RequestCode.QUERY_CONSUME_QUEUE, ext)
        sizes = {entry["physicSize"] for entry in cq["queueData"]}
        assert len(cq["queueData"]) == 10 and len(sizes) == 1, cq

        async def export() -> dict:
            out = await run(local, "exportMetrics", "-c", CLUSTER, "-f", str(tmp_path))
            assert out == f"export {tmp_path}/metrics.json success"
            return json.loads((tmp_path / "metrics.json").read_text())

        doc = await export()
        report = doc["evaluateReport"][group.broker_name]
        quota = report["runtimeQuota"]
        assert float(quota["messageAverageSize"]) == sizes.pop()
        assert quota["tps"]["normalInTps"] > 0 and quota["tps"]["scheduleInTps"] == 0
        assert (quota["topicSize"], quota["groupSize"]) == (1, 0)
        assert 0 < float(quota["diskRatio"]["commitLogDiskRatio"]) < 1
        assert int(report["runtimeEnv"]["totalMemKBytes"]) > 0
        assert report["runtimeVersion"] == {"rocketmqVersion": "V4_9_8", "clientInfo": []}
        assert doc["totalData"]["totalTps"]["totalNormalInTps"] == quota["tps"]["normalInTps"]

        async with consuming(local, consumer_group, topic, 10):
            async with Producer(local.namesrv_addr, "metrics_pg") as producer:
                for n in range(3):  # level 3: 10 s, delivered after the export
                    await producer.send(topic, b"later%d" % n, properties={"DELAY": "3"})
            doc = await export()
            async with Admin(local.namesrv_addr) as admin:
                members = (await admin.consumer_connection(consumer_group))["connectionSet"]
        report = doc["evaluateReport"][group.broker_name]
        quota = report["runtimeQuota"]
        assert quota["oneDayNum"]["scheduleOneDayInNum"] == 3
        assert quota["tps"]["scheduleInTps"] == 3 / 60
        assert quota["groupSize"] == 1
        assert report["runtimeVersion"]["clientInfo"] == [
            f"{m['language']}%V4_9_8" for m in members
        ]
        totals = doc["totalData"]
        assert totals["totalOneDayNum"]["scheduleOneDayInNum"] == 3
        assert totals["totalTps"]["totalScheduleInTps"] == 3 / 60


@pytest.mark.processes
async def test_delete_sub_group_r_drops_the_groups_offsets_too(groups):
    """deleteSubGroup keeps the group's committed offsets (as RocketMQ 4.x does);
    with -r true they go too, through the log."""
    topic, kept, dropped = "Offsets", "offsets_kept", "offsets_dropped"
    await groups.create_topic(topic, 1)
    master = groups.groups[0].broker_addrs["n0"]

    async def offset_table(admin: Admin) -> dict:
        response = await admin.call(master, RequestCode.GET_ALL_CONSUMER_OFFSET)
        return json.loads(response.body)["offsetTable"]

    async with Admin(groups.namesrv_addr) as admin:
        for group in (kept, dropped):
            await admin.update_consume_offset(master, group, topic, 0, 7)
        wanted = {f"{topic}@{g}" for g in (kept, dropped)}
        with trio.fail_after(10):  # committed through the log
            while not wanted <= (await offset_table(admin)).keys():
                await trio.sleep(0.05)
        await run(groups, "deleteSubGroup", "-b", master, "-g", kept)
        await run(groups, "deleteSubGroup", "-b", master, "-g", dropped, "-r", "true")
        table = await offset_table(admin)
    assert table[f"{topic}@{kept}"] == {"0": 7}
    assert f"{topic}@{dropped}" not in table


@pytest.mark.processes
async def test_cluster_list_i_prints_the_table_again_every_interval(groups):
    """clusterList -i 1 prints the table every second until interrupted (exit 130),
    each whole, about a second apart."""
    command = [sys.executable, "-m", "raftmq.client.mqadmin", "clusterList", "-i", "1",
               "-n", groups.namesrv_addr]  # fmt: skip
    out, seen_s = b"", []
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    try:
        with trio.fail_after(20):
            while len(seen_s) < 3:
                chunk = await process.stdout.receive_some()
                assert chunk, out
                seen_s += [trio.current_time()] * chunk.count(b"#Cluster Name")
                out += chunk
        process.send_signal(signal.SIGINT)
        with trio.fail_after(10):
            while chunk := await process.stdout.receive_some():
                out += chunk
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 130
    lines = out.decode().splitlines()
    headers = [n for n, line in enumerate(lines) if line.startswith("#Cluster Name")]
    assert all(b - a == 3 for a, b in itertools.pairwise(headers)), out  # a row per broker
    assert all(0.8 < b - a < 5 for a, b in itertools.pairwise(seen_s[:3])), seen_s
    assert await run(groups, "clusterList", "-i", "-1", status=2) == ""


@pytest.mark.processes
async def test_consumer_progress_s_shows_each_queues_consumer(groups):
    """consumerProgress -s true names, per queue, the IP of the consumer it is
    allocated to (from the consumer's running info); without -s the column says NA."""
    topic, group = "Allocated", "allocated_cg"
    await groups.create_topic(topic, 2)
    async with Producer(groups.namesrv_addr, "operations_pg") as producer:
        for n in range(8):
            await producer.send(topic, b"a%d" % n)
    async with consuming(groups, group, topic, 8):
        async with Admin(groups.namesrv_addr) as admin:
            (member,) = (await admin.consumer_connection(group))["connectionSet"]
        with_ip = await run(groups, "consumerProgress", "-g", group, "-s", "true")
        without = await run(groups, "consumerProgress", "-g", group)
    ip = member["clientId"].split("@")[0]
    for out, expected in ((with_ip, ip), (without, "NA")):
        header, *rows = out.split("\n\n")[0].splitlines()
        assert header.split()[8:10] == ["#Client", "IP"]
        cells = [row.split() for row in rows if row.split()[0] == topic]
        assert len(cells) == 4 and {c[5] for c in cells} == {expected}, out
