"""`mqadmin` and `client.admin.Admin` against a real name server and DLedger group.

One LocalCluster serves the whole module (started once: booting three brokers is
most of the time); the test that kills the master runs last. The CLI runs as a
subprocess where its output and exit status are the point, in process elsewhere.
"""

import datetime
import json
import os
import re
import shutil
import subprocess
import time

import pytest
import trio

from raftmq.client import ConsumeFromWhere, Producer, PushConsumer
from raftmq.client.admin import UNREACHABLE, Admin, group_members, parse_cluster_info
from raftmq.client.consumer import Subscription, pull_request, pull_result
from raftmq.client.errors import MQBrokerError
from raftmq.client.message_query import query_by_key, query_by_unique_key
from raftmq.client.mqadmin import main
from raftmq.client.mqadmin.commands import human_ms, parse_timestamp_ms
from raftmq.client.route import BrokerData, MessageQueue
from raftmq.protocol.headers import send_header_v2
from raftmq.protocol.message import properties_to_string
from raftmq.protocol.msgid import create_message_id
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalCluster
from raftmq.tools.dledger_local import free_ports
from tests.helpers import NO_ANSWER, mqadmin, wait_for

pytestmark = pytest.mark.untimed

CLUSTER = "RaftCluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("mqadmin"), nodes=3, cluster_name=CLUSTER)
    trio.run(local.__aenter__)
    try:
        yield local
    finally:
        local.stop()


def table(completed: subprocess.CompletedProcess) -> list[list[str]]:
    """stdout split into rows of whitespace-separated cells, the header first."""
    return [line.split() for line in completed.stdout.decode().splitlines() if line.strip()]


async def wait_route(admin: Admin, topic: str):
    with trio.fail_after(10):
        while True:
            try:
                return await admin.topic_route(topic)
            except NO_ANSWER:
                await trio.sleep(0.05)


async def send(address: str, topic: str, body: bytes, queue_id: int) -> str:
    """One SEND_MESSAGE_V2, as a Java producer sends it; returns the offset msgId."""
    header = send_header_v2(
        "mqadmin-test",
        topic,
        queue_id,
        born_timestamp_ms=int(time.time() * 1000),
        properties=properties_to_string({"TAGS": "TagA", "KEYS": body.decode()}),
    )
    async with RemotingClient(address) as client:
        response = await client.invoke(
            RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=header, body=body), 5
        )
    assert response.code == ResponseCode.SUCCESS, response
    return response.ext_fields["msgId"]


# ---------------------------------------------------------------------- without servers


def test_no_arguments_list_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The most commonly used mqadmin commands are:")
    for name in ("clusterList", "updateTopic", "queryMsgById", "dledgerStatus"):
        assert f"   {name:<20} " in out


def test_usage_errors_exit_2(monkeypatch, capsys):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    assert main(["noSuchCommand"]) == 2
    assert main(["topicStatus", "-n", "127.0.0.1:9876"]) == 2  # -t is required
    assert main(["topicStatus", "-t", "T"]) == 2  # no -n, no NAMESRV_ADDR
    assert main(["updateTopic", "-n", "127.0.0.1:9876", "-t", "T"]) == 2  # no -b or -c
    assert main(["queryMsgById", "-n", "127.0.0.1:9876", "-i", "not-an-id"]) == 2
    assert main(["printMsg", "-n", "127.0.0.1:9876", "-t", "T", "-c", "no-such"]) == 2
    err = capsys.readouterr().err
    assert "give either -b (a broker) or -c (a cluster)" in err
    assert "mqadmin printMsg: unknown charsetName 'no-such'" in err


@pytest.mark.parametrize("argv", [["help"], ["-h"], ["--help"]])
def test_help_flags_list_the_commands(argv, capsys):
    """They answered "The sub command --help not exist." """
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("The most commonly used mqadmin commands are:")


def test_help_for_one_command(capsys):
    assert main(["-h", "updateTopic"]) == 0
    assert "usage: mqadmin updateTopic" in capsys.readouterr().out


def test_a_broker_without_a_port_is_a_one_line_usage_error(capsys):
    assert main(["brokerStatus", "-n", "127.0.0.1:1", "-b", "localhost"]) == 2
    err = capsys.readouterr().err
    assert err == "mqadmin brokerStatus: bad address 'localhost': expected host:port\n"


def test_a_name_server_without_a_port_is_a_usage_error(capsys):
    """`-n localhost` raised a traceback from inside trio.run."""
    assert main(["clusterList", "-n", "localhost"]) == 2
    err = capsys.readouterr().err
    assert err == "mqadmin: -n 'localhost': bad address 'localhost': expected host:port\n"


def test_reset_timestamps_are_now_milliseconds_or_local_time(capsys):
    assert parse_timestamp_ms("now") == -1
    assert parse_timestamp_ms("1700000000123") == 1700000000123
    local = datetime.datetime(2024, 3, 1, 12, 30, 5, 250000).timestamp()
    assert parse_timestamp_ms("2024-03-01#12:30:05:250") == int(local * 1000)
    argv = ["resetOffsetByTime", "-n", "127.0.0.1:1", "-g", "G", "-t", "T", "-s", "yesterday"]
    assert main(argv) == 2
    assert "-s 'yesterday': expected now, epoch milliseconds or" in capsys.readouterr().err


def test_nothing_reachable_exits_3(capsys):
    (port,) = free_ports(1)
    assert main(["clusterList", "-n", f"127.0.0.1:{port}"]) == 3
    assert "no name server answered" in capsys.readouterr().err


def test_cluster_info_from_a_java_name_server():
    body = (
        b'{"brokerAddrTable":{"b":{"brokerAddrs":{0:"h:1",2:"h:3"},"brokerName":"b",'
        b'"cluster":"C"}},"clusterAddrTable":{"C":["b"]}}'
    )
    info = parse_cluster_info(body)
    assert info.brokers["b"].addrs == {0: "h:1", 2: "h:3"}
    assert [b.broker_name for b in info.broker_datas("C")] == ["b"]
    assert info.broker_datas("other") == []


def test_group_members_reports_silent_members():
    """Registered but silent members keep their broker address (a slave by the
    brokerId = selfId number + 1 rule, the master when one member is left over);
    members the name server dropped are known from the peers the others report."""
    n2 = {
        "dLegerGroup": "g",
        "dLegerSelfId": "n2",
        "dLegerRole": "FOLLOWER",
        "dLegerTerm": "4",
        "dLegerLedgerEndIndex": "9",
        "dLegerCommittedIndex": "8",
        "dLegerPeers": "n0-h:10;n1-h:11;n2-h:12",
    }
    broker = BrokerData("C", "b", {0: "h:0", 2: "h:2", 3: "h:3"})
    members = group_members(broker, {0: None, 2: None, 3: n2})
    assert [(m.group, m.self_id, m.addr, m.peer_addr, m.role, m.term) for m in members] == [
        ("g", "n0", "h:0", "h:10", UNREACHABLE, None),
        ("g", "n1", "h:2", "h:11", UNREACHABLE, None),
        ("g", "n2", "h:3", "h:12", "FOLLOWER", 4),
    ]
    assert (members[2].ledger_end_index, members[2].committed_index) == (9, 8)
    # Two members unaccounted for: which one the silent master is, nobody can tell.
    n2["dLegerPeers"] += ";n3-h:13"
    members = group_members(BrokerData("C", "b", {0: "h:0", 3: "h:3"}), {0: None, 3: n2})
    assert [(m.self_id, m.addr) for m in members] == [
        ("?0", "h:0"),
        ("n0", None),
        ("n1", None),
        ("n2", "h:3"),
        ("n3", None),
    ]


# ---------------------------------------------------------------------- one cluster


@pytest.mark.processes
async def test_cluster_list(cluster):
    env = {**os.environ, "NAMESRV_ADDR": cluster.namesrv_addr}
    completed = await mqadmin("clusterList", env=env)  # -n from the environment
    assert completed.returncode == 0, completed.stderr
    header, *rows = table(completed)
    assert completed.stdout.decode().startswith(
        "#Cluster Name     #Broker Name            #BID  #Addr                  #Version"
    )
    assert header[:3] == ["#Cluster", "Name", "#Broker"]
    assert sorted(r[3] for r in rows) == sorted(cluster.broker_addrs.values())
    master = cluster.broker_addrs[await cluster.wait_master()]
    slaves = {f"{int(node[1:]) + 1}" for node, a in cluster.broker_addrs.items() if a != master}
    assert {(r[2], r[3]) for r in rows if r[2] == "0"} == {("0", master)}
    assert {r[2] for r in rows if r[2] != "0"} == slaves  # selfId number + 1
    assert {(r[0], r[1], r[4]) for r in rows} == {(CLUSTER, cluster.broker_name, "V4_9_8")}
    # RocketMQ's #InTPS(LOAD) ... #SPACE, then #FallBehind(B): a classic group's HA lag only
    assert header[-5:] == ["#OutTPS(LOAD)", "#PCWait(ms)", "#Hour", "#SPACE", "#FallBehind(B)"]
    for row in rows:
        assert re.fullmatch(r"\d+\.\d\d\(-,-ms\)", row[5]) and row[6].endswith("(-,-ms)")
        assert 0.0 <= float(row[9]) <= 1.0 and row[10] == "-"
    # -m: in and out yesterday and today; no midnight since the brokers started, so
    # today's are the totals and yesterday's 0
    completed = await mqadmin("clusterList", "-m", env=env)
    assert completed.returncode == 0, completed.stderr
    header, *rows = table(completed)
    assert header[-4:] == ["#InTotalYest", "#OutTotalYest", "#InTotalToday", "#OutTotalToday"]
    async with Admin(cluster.namesrv_addr) as admin:
        totals = [await admin.broker_status(a) for a in sorted(cluster.broker_addrs.values())]
    assert sorted(tuple(map(int, row[2:])) for row in rows) == sorted(
        (0, 0, int(t["msgPutTotalTodayNow"]), int(t["msgGetTotalTodayNow"])) for t in totals
    )
    assert {(row[0], row[1]) for row in rows} == {(CLUSTER, cluster.broker_name)}


@pytest.mark.processes
async def test_update_topic_shows_in_route_and_list(cluster):
    master = cluster.broker_addrs[await cluster.wait_master()]
    completed = await mqadmin(
        "updateTopic",
        "-n",
        cluster.namesrv_addr,
        "-c",
        CLUSTER,
        "-t",
        "Orders",
        "-r",
        "4",
        "-w",
        "4",
    )
    assert completed.returncode == 0, completed.stderr
    assert f"create topic to {master} success." in completed.stdout.decode()
    async with Admin(cluster.namesrv_addr) as admin:
        route = await wait_route(admin, "Orders")
        assert route.master(cluster.broker_name) == master
        (queues,) = route.queue_datas
        assert (queues.read_queue_nums, queues.write_queue_nums, queues.perm) == (4, 4, 6)
        assert "Orders" in await admin.topic_list()


@pytest.mark.processes
async def test_update_topic_sets_attributes(cluster):
    """`-a +message.type=FIFO` (RocketMQ 5's syntax) lands in the topic's config on
    every member of the group."""
    completed = await mqadmin(
        "updateTopic", "-n", cluster.namesrv_addr, "-c", CLUSTER, "-t", "Typed", "-a",
        "+message.type=FIFO",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "attributes=+message.type=FIFO]" in completed.stdout.decode()
    with trio.fail_after(10):
        for node in cluster.ids:
            while True:
                read = await cluster.broker_call(
                    node, RequestCode.GET_TOPIC_CONFIG, {"topic": "Typed"}
                )
                if read.code == ResponseCode.SUCCESS:
                    break
                await trio.sleep(0.05)
            assert json.loads(read.body)["attributes"] == {"message.type": "FIFO"}
    refused = await mqadmin(
        "updateTopic", "-n", cluster.namesrv_addr, "-c", CLUSTER, "-t", "Typed", "-a", "+x=1"
    )
    assert refused.returncode != 0
    assert "unsupported attribute 'x'" in refused.stderr.decode()


@pytest.mark.processes
def test_unknown_topic_exits_1(cluster, capsys):
    assert main(["topicRoute", "-n", cluster.namesrv_addr, "-t", "NoSuchTopic"]) == 1
    assert "code 17 (TOPIC_NOT_EXIST)" in capsys.readouterr().err


@pytest.mark.processes
async def test_topic_status_and_consumer_progress(cluster):
    master = cluster.broker_addrs[await cluster.wait_master()]
    async with Admin(cluster.namesrv_addr) as admin:
        assert await admin.create_topic("Stats", 3, 3, broker_addr=master) == [master]
        await wait_route(admin, "Stats")
        for n, queue_id in enumerate((0, 1, 0, 1, 0)):
            await send(master, "Stats", f"m{n}".encode(), queue_id)
        status = await admin.topic_status("Stats")
        assert [(r.queue_id, r.min_offset, r.max_offset) for r in status] == [
            (0, 0, 3),
            (1, 0, 2),
            (2, 0, 0),
        ]
        async with RemotingClient(master) as client:
            commit = {"consumerGroup": "G", "topic": "Stats", "queueId": 0, "commitOffset": 1}
            response = await client.invoke(
                RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=commit), 5
            )
            assert response.code == ResponseCode.SUCCESS, response
        stats = await admin.consumer_progress("G")
        (queue,) = stats.queues
        assert (queue.topic, queue.queue_id, queue.broker_offset, queue.consumer_offset) == (
            "Stats",
            0,
            3,
            1,
        )
        assert queue.diff == stats.diff_total == 2


@pytest.mark.processes
async def test_consume_stats_measure_the_pull_rate_and_the_store_times(cluster):
    """consumeTps, lastTimestamp and lastUpdateTimestamp were constants (0); RocketMQ's
    are measurements: what the group pulled per second over the last minute, the store
    time of the last message consumed, that of the queue's last message."""
    master = cluster.broker_addrs[await cluster.wait_master()]
    group, topic, pulled = "ProgressG", "Progress", 20
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, 1, 1, broker_addr=master)
        await wait_route(admin, topic)
        for n in range(pulled):
            await send(master, topic, f"p{n}".encode(), 0)
        pull_started_s = time.monotonic()
        mq = MessageQueue(topic, cluster.broker_name, 0)
        subscription = Subscription(topic, "*", 0)
        async with RemotingClient(master) as client:
            response = await client.invoke(pull_request(group, mq, 0, 32, subscription), 5)
            messages = pull_result(response, 0, subscription, cluster.broker_name).messages
            assert len(messages) == pulled
            commit = {"consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": 5}
            response = await client.invoke(
                RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=commit), 5
            )
            assert response.code == ResponseCode.SUCCESS, response
        stats = await admin.consumer_progress(group)
        elapsed_s = time.monotonic() - pull_started_s
        # all `pulled` fell in the last minute, whose start (the oldest sample in it, or
        # the broker's first) came before the pull
        assert pulled / 60.5 <= stats.consume_tps <= pulled / elapsed_s, stats.consume_tps
        (queue,) = stats.queues
        assert queue.last_timestamp_ms == messages[4].store_timestamp  # offset 5 - 1
        (status,) = await admin.topic_status(topic)
        assert status.last_update_ms == messages[-1].store_timestamp
    completed = await mqadmin("consumerProgress", "-n", cluster.namesrv_addr, "-g", group)
    elapsed_s = time.monotonic() - pull_started_s
    assert completed.returncode == 0, completed.stderr
    printed = completed.stdout.decode()
    assert human_ms(messages[4].store_timestamp) in printed
    tps = float(re.search(r"Consume TPS: (\S+)", printed).group(1))
    assert pulled / 60.5 <= tps <= pulled / elapsed_s, printed


@pytest.mark.processes
async def test_broker_stats_avgpt_is_messages_per_put_and_per_pull(cluster):
    """VIEW_BROKER_STATS_DATA's avgpt was always 0; RocketMQ's StatsItem divides the
    count by the calls: messages per put (a batch is one) and per pull."""
    master = cluster.broker_addrs[await cluster.wait_master()]
    topic, group = "Batched", "BatchedG"
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, 1, 1, broker_addr=master)
        await wait_route(admin, topic)
        async with Producer(cluster.namesrv_addr, "batcher") as producer:
            await producer.send_batch(topic, [b"b0", b"b1", b"b2", b"b3"])
            for n in range(2):
                await producer.send(topic, b"s%d" % n)
        mq = MessageQueue(topic, cluster.broker_name, 0)
        subscription = Subscription(topic, "*", 0)
        async with RemotingClient(master) as client:

            async def commit(offset: int) -> None:
                ext = {"consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": offset}
                response = await client.invoke(
                    RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=ext), 5
                )
                assert response.code == ResponseCode.SUCCESS, response

            await commit(0)  # where the group starts: counted from here
            for offset, max_nums, pulled in ((0, 4, 4), (4, 32, 2)):  # two pulls
                request = pull_request(group, mq, offset, max_nums, subscription)
                result = pull_result(await client.invoke(request, 5), 0, subscription, "b")
                assert len(result.messages) == pulled
            await commit(6)
        put = await admin.broker_stats(master, "TOPIC_PUT_NUMS", topic)
        got = await admin.broker_stats(master, "GROUP_GET_NUMS", f"{topic}@{group}")
    for window in ("statsMinute", "statsHour", "statsDay"):
        assert (put[window]["sum"], put[window]["avgpt"]) == (6, 2.0)  # 6 messages, 3 puts
        assert (got[window]["sum"], got[window]["avgpt"]) == (6, 3.0)  # 6 messages, 2 pulls


@pytest.mark.processes
async def test_stats_bodies_are_maps_keyed_by_message_queue(cluster):
    """GET_TOPIC_STATS_INFO and GET_CONSUME_STATS as fastjson writes them for Java's
    admin: `offsetTable` maps MessageQueue objects to the offsets."""
    master = cluster.broker_addrs[await cluster.wait_master()]
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Shaped", 1, 1, broker_addr=master)
        await wait_route(admin, "Shaped")
    before_ms = int(time.time() * 1000)
    await send(master, "Shaped", b"one", 0)
    after_ms = int(time.time() * 1000)
    async with RemotingClient(master) as client:  # the raw bodies
        stats = await client.invoke(
            RemotingCommand(RequestCode.GET_TOPIC_STATS_INFO, ext_fields={"topic": "Shaped"}), 5
        )
        commit = {"consumerGroup": "Shaper", "topic": "Shaped", "queueId": 0, "commitOffset": 1}
        await client.invoke(
            RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=commit), 5
        )
        consume = await client.invoke(
            RemotingCommand(RequestCode.GET_CONSUME_STATS, ext_fields={"consumerGroup": "Shaper"}),
            5,
        )
    mq = json.dumps({"brokerName": cluster.broker_name, "queueId": 0, "topic": "Shaped"})
    mq = mq.replace(" ", "")
    stored_ms = int(re.search(rb'"lastUpdateTimestamp":(\d+)', stats.body).group(1))
    assert before_ms <= stored_ms <= after_ms  # the store time of the queue's last message
    assert stats.body.decode() == (
        f'{{"offsetTable":{{{mq}:{{"lastUpdateTimestamp":{stored_ms},"maxOffset":1,'
        '"minOffset":0}}}'
    )
    assert consume.body.decode() == (  # nothing pulled: no rate
        f'{{"offsetTable":{{{mq}:{{"brokerOffset":1,"consumerOffset":1,'
        f'"lastTimestamp":{stored_ms}}}}},"consumeTps":0.0}}'
    )


@pytest.mark.processes
async def test_delete_topic_removes_it_from_brokers_and_name_server(cluster):
    """The name server kept the route after the brokers dropped the topic; now
    DELETE_TOPIC_IN_NAMESRV drops it at once."""
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Doomed", 2, 2, cluster=CLUSTER)
        await wait_route(admin, "Doomed")
        completed = await mqadmin(
            "deleteTopic", "-n", cluster.namesrv_addr, "-c", CLUSTER, "-t", "Doomed"
        )
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout.decode() == (
            f"delete topic [Doomed] from cluster [{CLUSTER}] success.\n"
            "delete topic [Doomed] from NameServer success.\n"
        )
        with pytest.raises(MQBrokerError) as gone:
            await admin.topic_route("Doomed")
        assert gone.value.code == ResponseCode.TOPIC_NOT_EXIST
        assert "Doomed" not in await admin.topic_list()
        with trio.fail_after(10):  # every replica applies the deletion from the log
            for address in cluster.broker_addrs.values():
                while "Doomed" in await topic_configs(admin, address):
                    await trio.sleep(0.05)
    usage = await mqadmin("deleteTopic", "-n", cluster.namesrv_addr, "-t", "Doomed")
    assert usage.returncode == 2  # -c is required, as in RocketMQ


async def queue_offsets(cluster: LocalCluster, node: str, topic: str) -> tuple[int, int]:
    """(min, max) offset of `topic`'s queue 0 on one member."""
    ext = {"topic": topic, "queueId": "0"}
    low = await cluster.broker_call(node, RequestCode.GET_MIN_OFFSET, ext)
    high = await cluster.broker_call(node, RequestCode.GET_MAX_OFFSET, ext)
    return int(low.ext_fields["offset"]), int(high.ext_fields["offset"])


@pytest.mark.processes
async def test_deleted_topics_queues_go_from_every_replica_and_offsets_go_on(cluster):
    """deleteTopic drops the topic's ConsumeQueue files on every replica, where each
    applies the deletion from the log (they stayed before); the topic created again
    continues its queues' offsets, on a new master too, so a group's committed offset
    never covers a new message. cleanUnusedTopic drops the queues of a topic the
    broker does not have (here one left in a follower's store while it was stopped)
    on every member."""
    topic, ns = "Recreated", cluster.namesrv_addr
    cq_dirs = {node: cluster.store_dir(node) / "consumequeue" for node in cluster.ids}
    await cluster.create_topic(topic, 1)
    master = await cluster.wait_master()
    for n in range(3):
        await send(cluster.broker_addrs[master], topic, b"old%d" % n, 0)
    await wait_for(lambda: all((d / topic / "0").is_dir() for d in cq_dirs.values()), 10)
    deleted = await mqadmin("deleteTopic", "-n", ns, "-c", CLUSTER, "-t", topic)
    assert deleted.returncode == 0, deleted.stderr
    await wait_for(lambda: not any((d / topic).exists() for d in cq_dirs.values()), 10)

    await cluster.restart(master)  # a new master: its offset table is rebuilt
    master = await cluster.wait_master(not_node=master)
    await cluster.create_topic(topic, 1)
    await send(cluster.broker_addrs[master], topic, b"new", 0)
    with trio.fail_after(10):
        for node in cluster.ids:
            while await queue_offsets(cluster, node, topic) != (3, 4):
                await trio.sleep(0.05)

    follower = next(node for node in cluster.ids if node != master)
    cluster.kill(follower)
    shutil.copytree(cq_dirs[follower] / topic, cq_dirs[follower] / "Orphan")
    cluster.start_broker(follower)
    await send(cluster.broker_addrs[master], topic, b"wakes", 0)  # a commit to learn
    await cluster.wait_caught_up()
    cleaned = await mqadmin("cleanUnusedTopic", "-n", ns, "-c", CLUSTER)
    assert (cleaned.returncode, cleaned.stdout) == (0, b"success"), cleaned.stderr
    assert not (cq_dirs[follower] / "Orphan").exists()
    assert (cq_dirs[follower] / topic / "0").is_dir()  # a topic the broker has stays
    address = cluster.broker_addrs[master]
    cleaned = await mqadmin("cleanUnusedTopic", "-n", ns, "-b", address)
    assert (cleaned.returncode, cleaned.stdout) == (0, b"success"), cleaned.stderr

    for system in ("RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX", CLUSTER):  # as RocketMQ's
        refused = await mqadmin("deleteTopic", "-n", ns, "-c", CLUSTER, "-t", system)
        assert refused.returncode == 1, refused
        assert f"The topic[{system}] is conflict with system topic." in refused.stderr.decode()


async def topic_configs(admin: Admin, address: str) -> dict:
    response = await admin.call(address, RequestCode.GET_ALL_TOPIC_CONFIG)
    return json.loads(response.body)["topicConfigTable"]


@pytest.mark.processes
async def test_update_and_delete_subscription_group(cluster):
    master = cluster.broker_addrs[await cluster.wait_master()]
    async with Admin(cluster.namesrv_addr) as admin:  # as the group's first heartbeat would
        await admin.create_topic("%RETRY%billing", 1, 1, cluster=CLUSTER)
        await admin.create_topic("Invoices", 1, 1, cluster=CLUSTER)  # what it would pull
        await wait_route(admin, "%RETRY%billing")
        await wait_route(admin, "Invoices")
    completed = await mqadmin(
        "updateSubGroup", "-n", cluster.namesrv_addr, "-c", CLUSTER, "-g", "billing",
        "-r", "3", "-q", "2", "-s", "false",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.decode() == (
        f"create subscription group to {master} success.\n"
        "SubscriptionGroupConfig [groupName=billing, consumeEnable=false, "
        "consumeFromMinEnable=false, consumeBroadcastEnable=false, retryQueueNums=2, "
        "retryMaxTimes=3, brokerId=0, whichBrokerWhenConsumeSlowly=1, "
        "notifyConsumerIdsChangedEnable=true]\n"
    )
    async with Admin(cluster.namesrv_addr) as admin:
        with trio.fail_after(10):  # through the log: on every replica
            for address in cluster.broker_addrs.values():
                while "billing" not in await admin.subscription_groups(address):
                    await trio.sleep(0.05)
        (retry_queues,) = (await admin.topic_route("%RETRY%billing")).queue_datas
        assert retry_queues.write_queue_nums == retry_queues.read_queue_nums == 2  # -q 2
        config = (await admin.subscription_groups(master))["billing"]
        assert (config["retryMaxTimes"], config["consumeEnable"]) == (3, False)
        async with RemotingClient(master) as client:  # consumeEnable=false: no pulls
            header = {
                "consumerGroup": "billing", "topic": "Invoices", "queueId": 0, "queueOffset": 0,
                "maxMsgNums": 1, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                "subscription": "*", "subVersion": 0,
            }  # fmt: skip
            pulled = await client.invoke(
                RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=header), 5
            )
        assert pulled.code == ResponseCode.NO_PERMISSION

        completed = await mqadmin(
            "deleteSubGroup", "-n", cluster.namesrv_addr, "-c", CLUSTER, "-g", "billing"
        )
        assert completed.returncode == 0, completed.stderr
        lines = completed.stdout.decode().splitlines()
        assert lines[0] == (
            f"delete subscription group [billing] from broker [{master}] "
            f"in cluster [{CLUSTER}] success."
        )
        assert lines[1:] == [
            f"delete topic [%RETRY%billing] from cluster [{CLUSTER}] success.",
            "delete topic [%RETRY%billing] from NameServer success.",
            f"delete topic [%DLQ%billing] from cluster [{CLUSTER}] success.",
            "delete topic [%DLQ%billing] from NameServer success.",
        ]
        assert "billing" not in await admin.subscription_groups(master)


@pytest.mark.processes
async def test_get_and_update_broker_config(cluster):
    master = cluster.broker_addrs[await cluster.wait_master()]
    slaves = sorted(a for a in cluster.broker_addrs.values() if a != master)
    completed = await mqadmin("getBrokerConfig", "-n", cluster.namesrv_addr, "-b", master)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.decode().splitlines()
    assert lines[0] == f"============{master}============"
    assert f"{'brokerName':<50}=  {cluster.broker_name}" in lines
    assert f"{'autoCreateTopicEnable':<50}=  true" in lines
    assert lines[-1] == ""

    env = {**os.environ, "NAMESRV_ADDR": cluster.namesrv_addr}
    completed = await mqadmin(
        "updateBrokerConfig", "-c", CLUSTER, "-k", "autoCreateTopicEnable", "-v", "false", env=env
    )
    assert completed.returncode == 0, completed.stderr
    updated = [line.split(", ")[1] for line in completed.stdout.decode().splitlines()]
    assert completed.stdout.decode().startswith("update broker config success, ")
    assert sorted(updated) == sorted(cluster.broker_addrs.values())
    try:
        async with Admin(cluster.namesrv_addr) as admin:
            (broker,) = (await admin.cluster_info()).broker_datas(CLUSTER)
        assert broker.addresses() == [master, *slaves] or sorted(broker.addresses()[1:]) == slaves
        completed = await mqadmin("getBrokerConfig", "-c", CLUSTER, env=env)
        lines = completed.stdout.decode().splitlines()
        assert [line for line in lines if line.startswith("====")] == [
            f"============Master: {master}============",
            *(
                f"============My Master: {master}=====Slave: {s}============"
                for s in broker.addresses()[1:]
            ),
        ]
        assert lines.count(f"{'autoCreateTopicEnable':<50}=  false") == 3
        header = send_header_v2("p", "NeverCreated", 0, born_timestamp_ms=0, properties="")
        async with RemotingClient(master) as client:  # no auto-creation now
            response = await client.invoke(
                RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=header, body=b"x"), 5
            )
        assert response.code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        await mqadmin(
            "updateBrokerConfig",
            "-c",
            CLUSTER,
            "-k",
            "autoCreateTopicEnable",
            "-v",
            "true",
            env=env,
        )

    refused = await mqadmin(
        "updateBrokerConfig", "-b", master, "-k", "listenPort", "-v", "1", env=env
    )
    assert refused.returncode == 1
    err = refused.stderr.decode()
    assert "listenPort: cannot change at run time" in err and err.count("\n") == 1


@pytest.mark.processes
async def test_consumer_and_producer_connections(cluster):
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Connected", 2, 2, cluster=CLUSTER)
        await wait_route(admin, "Connected")

    async def handle(msgs) -> bool:
        return True

    async with (
        Producer(cluster.namesrv_addr, "shop") as producer,
        PushConsumer(cluster.namesrv_addr, "audit", "Connected", handle, "TagA || TagB"),
    ):
        await producer.send("Connected", b"x")  # learns the route, then heartbeats
        with trio.fail_after(10):
            while True:
                consumers = await mqadmin(
                    "consumerConnection", "-n", cluster.namesrv_addr, "-g", "audit"
                )
                producers = await mqadmin(
                    "producerConnection",
                    "-n",
                    cluster.namesrv_addr,
                    "-g",
                    "shop",
                    "-t",
                    "Connected",
                )
                if consumers.returncode == producers.returncode == 0:
                    break
                await trio.sleep(0.1)
    lines = consumers.stdout.decode().splitlines()
    row = lines[0].split()
    assert row[0] == "001" and row[3:] == ["PYTHON", "V4_9_8"]
    assert lines[1:] == [
        "",
        "Below is subscription:",
        f"001  Topic: {'Connected':<40} SubExpression: TagA || TagB",
        f"002  Topic: {'%RETRY%audit':<40} SubExpression: *",  # as Java's consumers do
        "ConsumeType: CONSUME_PASSIVELY",
        "MessageModel: CLUSTERING",
        "ConsumeFromWhere: CONSUME_FROM_LAST_OFFSET",
    ]
    (line,) = producers.stdout.decode().splitlines()
    assert line.split()[0] == "0001" and line.split()[3:] == ["PYTHON", "V4_9_8"]
    gone = await mqadmin("consumerConnection", "-n", cluster.namesrv_addr, "-g", "audit")
    assert gone.returncode == 1  # it unregistered on the way out
    assert "code 206 (CONSUMER_NOT_ONLINE): the consumer group[audit] not online" in (
        gone.stderr.decode()
    )


@pytest.mark.processes
async def test_reset_offset_by_time_with_the_group_stopped_and_running(cluster):
    """Stopped: the offsets are committed by the broker (RocketMQ's admin falls back to
    writing them itself). Running: the members are told and consume again from there."""
    master = cluster.broker_addrs[await cluster.wait_master()]
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Rewind", 2, 2, cluster=CLUSTER)
        await wait_route(admin, "Rewind")
        for n in range(3):
            await send(master, "Rewind", f"m{n}".encode(), 0)
        await trio.sleep(0.05)
        middle_ms = int(time.time() * 1000)
        await trio.sleep(0.05)
        for n in range(3, 5):
            await send(master, "Rewind", f"m{n}".encode(), 0)

        completed = await mqadmin(
            "resetOffsetByTime", "-n", cluster.namesrv_addr, "-g", "rewinder", "-t", "Rewind",
            "-s", str(middle_ms),
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        lines = completed.stdout.decode().splitlines()
        assert lines[0] == (
            "rollback consumer offset by specified group[rewinder], topic[Rewind], "
            f"force[true], timestamp(string)[{middle_ms}], timestamp(long)[{middle_ms}]"
        )
        assert lines[1] == f"{'#brokerName':<40}  {'#queueId':<40}  {'#offset':<40}"
        assert [line.split() for line in lines[2:]] == [
            [cluster.broker_name, "0", "3"],
            [cluster.broker_name, "1", "0"],
        ]
        progress = await admin.consumer_progress("rewinder")
        assert [(q.queue_id, q.consumer_offset) for q in progress.queues] == [(0, 3), (1, 0)]
        completed = await mqadmin(
            "resetOffsetByTime", "-n", cluster.namesrv_addr, "-g", "rewinder", "-t", "Rewind",
            "-s", "now",
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        assert [line.split()[1:] for line in completed.stdout.decode().splitlines()[2:]] == [
            ["0", "5"],
            ["1", "0"],
        ]

        seen: list[bytes] = []

        async def handle(msgs) -> bool:
            seen.extend(m.body for m in msgs)
            return True

        async with PushConsumer(
            cluster.namesrv_addr, "rewinder", "Rewind", handle, "*",
            ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, persist_interval_s=0.1,
        ):  # fmt: skip
            await trio.sleep(0.5)
            assert seen == []  # it starts at the committed end
            completed = await mqadmin(
                "resetOffsetByTime", "-n", cluster.namesrv_addr, "-g", "rewinder", "-t",
                "Rewind", "-s", str(middle_ms),
            )  # fmt: skip
            assert completed.returncode == 0, completed.stderr
            with trio.fail_after(10):
                while sorted(seen) != [b"m3", b"m4"]:
                    await trio.sleep(0.05)
            with trio.fail_after(10):  # and its own commits follow from there
                while (await admin.consumer_progress("rewinder", "Rewind")).queues[
                    0
                ].consumer_offset != 5:
                    await trio.sleep(0.05)


@pytest.mark.processes
async def test_query_msg_by_offset_and_print_msg(cluster):
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Ledger", 1, 1, cluster=CLUSTER)
        await wait_route(admin, "Ledger")
    uniq_keys = await send_keyed(cluster, "Ledger")
    by_offset = await mqadmin(
        "queryMsgByOffset", "-n", cluster.namesrv_addr, "-t", "Ledger", "-b", cluster.broker_name,
        "-i", "0", "-o", "1",
    )  # fmt: skip
    assert by_offset.returncode == 0, by_offset.stderr
    out = by_offset.stdout.decode()
    assert "Topic:               Ledger" in out and "Queue Offset:        1" in out
    assert "Message Body:        order-1" in out
    printed = await mqadmin("printMsg", "-n", cluster.namesrv_addr, "-t", "Ledger")
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.decode().splitlines()
    assert lines[0] == (
        f"minOffset=0, maxOffset=3, MessageQueue [topic=Ledger, brokerName={cluster.broker_name},"
        " queueId=0]"
    )
    assert [line.split()[1] for line in lines if line.startswith("MSGID: ")] == uniq_keys
    assert lines[-1] == "-" * 56 and "Consume ok" not in lines  # consumeMessage's line
    assert lines[1].endswith(" BODY: order-0")
    options = ("-t", "Ledger", "-c", "GBK", "-d", "false", "-s", "TagA || TagB")
    selected = await mqadmin("printMsg", "-n", cluster.namesrv_addr, *options)
    assert selected.returncode == 0, selected.stderr
    lines = selected.stdout.decode().splitlines()
    assert not [line for line in lines if line.startswith("MSGID: ")]  # untagged: none
    assert "no matched msg. status=NO_MATCHED_MSG" in lines[1]
    unprinted = await mqadmin("printMsg", "-n", cluster.namesrv_addr, "-t", "Ledger", "-d", "f")
    lines = [line for line in unprinted.stdout.decode().splitlines() if "MSGID" in line]
    assert len(lines) == 3 and all(line.endswith(" BODY: NOT PRINT BODY") for line in lines)


@pytest.mark.processes
async def test_consume_message_directly_and_resend(cluster):
    """queryMsgById/queryMsgByUniqueKey -g -d: the named consumer runs its handler on
    the message and its result is printed; -s true sends the message again."""
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Direct", 1, 1, cluster=CLUSTER)
        await wait_route(admin, "Direct")
    seen: list[tuple[str, bytes]] = []
    failing = False

    async def handle(msgs) -> bool:
        seen.extend((m.topic, m.body) for m in msgs)
        if failing:
            raise RuntimeError("refused on purpose")
        return True

    def consumed(body: bytes) -> int:
        return seen.count(("Direct", body))

    async def wait_consumed(body: bytes, times: int) -> None:
        with trio.fail_after(20):
            while consumed(body) < times:
                await trio.sleep(0.05)

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with (
        Producer(cluster.namesrv_addr, "direct-p") as producer,
        PushConsumer(cluster.namesrv_addr, "direct", "Direct", handle, consume_from=first) as c,
    ):
        sent = await producer.send("Direct", b"parcel-1")
        await wait_consumed(b"parcel-1", 1)
        ns = ("-n", cluster.namesrv_addr)
        by_id = await mqadmin(
            "queryMsgById", *ns, "-i", sent.offset_msg_id, "-g", "direct", "-d", c.client_id
        )
        assert by_id.returncode == 0, by_id.stderr
        out = by_id.stdout.decode().strip()
        assert re.fullmatch(
            r"ConsumeMessageDirectlyResult \[order=false, autoCommit=true, "
            r"consumeResult=CR_SUCCESS, remark=null, spentTimeMills=\d+\]",
            out,
        ), out
        assert consumed(b"parcel-1") == 2  # once pulled, once directly

        failing = True
        by_uniq = await mqadmin(
            "queryMsgByUniqueKey", *ns, "-t", "Direct", "-i", sent.msg_id,
            "-g", "direct", "-d", c.client_id,
        )  # fmt: skip
        assert by_uniq.returncode == 0, by_uniq.stderr
        assert (
            "consumeResult=CR_THROW_EXCEPTION, remark=RuntimeError: refused on purpose"
            in by_uniq.stdout.decode()
        )
        assert consumed(b"parcel-1") == 3
        failing = False

        unknown = await mqadmin(
            "queryMsgById", *ns, "-i", sent.offset_msg_id, "-g", "direct", "-d", "nobody@1"
        )
        assert unknown.returncode == 1 and unknown.stdout == b""
        (line,) = unknown.stderr.decode().splitlines()
        assert line.endswith(
            "answered code 1 (SYSTEM_ERROR): The Consumer <direct> <nobody@1> not online"
        ), line
        assert consumed(b"parcel-1") == 3
        async with Admin(cluster.namesrv_addr) as admin:
            address, msg = await admin.locate_msg_by_id(sent.offset_msg_id)
            elsewhere = create_message_id(("10.9.8.7", 1234), msg.physical_offset)
            for msg_id in (elsewhere, "not-an-id"):
                ext = {"consumerGroup": "direct", "clientId": c.client_id, "msgId": msg_id}
                with pytest.raises(MQBrokerError) as refused:
                    await admin.call(address, RequestCode.CONSUME_MESSAGE_DIRECTLY, ext)
                assert refused.value.code == ResponseCode.SYSTEM_ERROR
                assert refused.value.remark == f"can not find message by the msgId, {msg_id}"
        assert consumed(b"parcel-1") == 3  # a record of another id is not passed on

        resent = await mqadmin("queryMsgById", *ns, "-i", sent.offset_msg_id, "-s", "true")
        assert resent.returncode == 0, resent.stderr
        lines = resent.stdout.decode().splitlines()
        assert lines[0] == f"prepare resend msg. originalMsgId={sent.offset_msg_id}"
        assert re.fullmatch(
            r"SendResult \[sendStatus=SEND_OK, msgId=[0-9A-F]{32}, offsetMsgId=[0-9A-F]{32}, "
            r"messageQueue=MessageQueue \[topic=Direct, brokerName=\S+, queueId=0\], "
            r"queueOffset=1\]",
            lines[1],
        ), lines
        assert sent.msg_id not in lines[1]  # the copy has a UNIQ_KEY of its own
        await wait_consumed(b"parcel-1", 4)  # the copy is delivered
        quiet = await mqadmin("queryMsgById", *ns, "-i", sent.offset_msg_id, "-s", "false")
        assert quiet.returncode == 0 and quiet.stdout == b""


@pytest.mark.processes
async def test_send_message_then_consume_message(cluster):
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic("Mail", 2, 2, cluster=CLUSTER)
        await wait_route(admin, "Mail")
    sent = await mqadmin(
        "sendMessage", "-n", cluster.namesrv_addr, "-t", "Mail", "-p", "hello",
        "-k", "k1", "-c", "TagA", "-b", cluster.broker_name, "-i", "1",
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    header, row = sent.stdout.decode().splitlines()
    assert header == f"{'#Broker Name':<32}  {'#QID':<4}  {'#Send Result':<20}    #MsgId"
    broker_name, qid, status, msg_id = row.split()
    assert (broker_name, qid, status) == (cluster.broker_name, "1", "SEND_OK")
    assert len(msg_id) == 32  # the producer's UNIQ_KEY, as Java's getMsgId() gives

    got = await mqadmin(
        "consumeMessage", "-n", cluster.namesrv_addr, "-t", "Mail", "-b", cluster.broker_name,
        "-i", "1",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    lines = got.stdout.decode().splitlines()
    assert lines[0] == "Consume ok"
    assert lines[1].startswith(f"MSGID: {msg_id} MessageExt [brokerName={cluster.broker_name}, ")
    assert "queueId=1, queueOffset=0," in lines[1] and "tags=TagA, keys=k1]" in lines[1]
    assert lines[1].endswith(" BODY: hello")
    mq = f"MessageQueue [topic=Mail, brokerName={cluster.broker_name}, queueId=1]"
    assert lines[2] == f"{mq} print msg finished. status=NO_NEW_MSG, offset=1"

    every = await mqadmin("consumeMessage", "-n", cluster.namesrv_addr, "-t", "Mail", "-c", "5")
    assert every.returncode == 0, every.stderr
    assert [line for line in every.stdout.decode().splitlines() if line.startswith("MSGID")] == [
        lines[1]
    ]
    usage = await mqadmin(
        "sendMessage", "-n", cluster.namesrv_addr, "-t", "Mail", "-p", "x", "-i", "0"
    )
    assert usage.returncode == 2
    assert "Broker name must be set if the queue is chosen!" in usage.stderr.decode()
    nowhere = await mqadmin(
        "sendMessage", "-n", cluster.namesrv_addr, "-t", "Mail", "-p", "x", "-b", "NoSuchBroker",
        "-i", "0",
    )  # fmt: skip
    assert nowhere.returncode == 1
    assert nowhere.stderr.decode().startswith("mqadmin sendMessage failed: ")
    assert nowhere.stderr.decode().count("\n") == 1


@pytest.mark.processes
async def test_cluster_rt_sends_to_each_group_topic(cluster):
    completed = await mqadmin(
        "clusterRT", "-n", cluster.namesrv_addr, "-a", "4", "-s", "16", "-r", "2", "-i", "0.1"
    )
    assert completed.returncode == 0, completed.stderr
    header, *rows = completed.stdout.decode().splitlines()
    assert header == (
        f"{'#Cluster Name':<24}  {'#Broker Name':<24}  {'#RT':<4}  {'#successCount':<8}  "
        f"{'#failCount':<8}"
    )
    assert len(rows) == 2  # one group, two rounds
    for row in rows:
        cluster_name, broker_name, rt_ms, sent, failed = row.split()
        assert (cluster_name, broker_name, sent, failed) == (CLUSTER, cluster.broker_name, "4", "0")
        assert float(rt_ms) > 0
    tlog = await mqadmin(
        "clusterRT", "-n", cluster.namesrv_addr, "-a", "2", "-r", "1", "-p", "true"
    )
    (line,) = tlog.stdout.decode().splitlines()
    assert line.split("|")[1:4] == ["noname", CLUSTER, cluster.broker_name]


@pytest.mark.processes
async def test_stats_all_counts_what_was_stored_and_consumed(cluster):
    master = cluster.broker_addrs[await cluster.wait_master()]
    async with Admin(cluster.namesrv_addr) as admin:
        for topic in ("Counted", "Unread"):
            await admin.create_topic(topic, 2, 2, cluster=CLUSTER)
            await wait_route(admin, topic)
    for n in range(3):
        await send(master, "Counted", f"c{n}".encode(), 0)
    await send(master, "Unread", b"u", 1)
    async with RemotingClient(master) as client:
        for offset in (1, 2):  # two commits: the group consumed 2 of the 3
            commit = {"consumerGroup": "counter", "topic": "Counted", "queueId": 0,
                      "commitOffset": offset}  # fmt: skip
            response = await client.invoke(
                RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=commit), 5
            )
            assert response.code == ResponseCode.SUCCESS

    completed = await mqadmin("statsAll", "-n", cluster.namesrv_addr, "-t", "Counted")
    assert completed.returncode == 0, completed.stderr
    header, row = completed.stdout.decode().splitlines()
    assert header.split() == [
        "#Topic", "#Consumer", "Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour",
        "#OutMsg24Hour",
    ]  # fmt: skip
    # Only the commit from 1 to 2 is an advance the broker saw: the first had no
    # earlier offset to move from.
    assert row.split() == ["Counted", "counter", "1", "0.05", "0.02", "3", "1"]
    assert row.startswith(f"{'Counted':<64}  {'counter':<64} ")

    completed = await mqadmin("statsAll", "-n", cluster.namesrv_addr, "-a")
    rows = [line.split() for line in completed.stdout.decode().splitlines()[1:]]
    assert ["Unread", "0", "0.02", "1", "NO_CONSUMER"] in rows
    assert "Counted" in [r[0] for r in rows]
    assert "TBW102" not in [r[0] for r in rows]  # -a: active topics only


async def stable_members(admin: Admin, not_leader: str | None = None):
    """dledger_status once exactly one member leads (not `not_leader`) and every
    reachable member is in its term."""
    with trio.fail_after(10):
        while True:
            members = await admin.dledger_status()
            leaders = [m for m in members if m.role == "LEADER"]
            terms = {m.term for m in members if m.reachable}
            if len(leaders) == 1 and leaders[0].self_id != not_leader and len(terms) == 1:
                return members
            await trio.sleep(0.05)


def check_dledger_rows(completed, cluster, leader: str, unreachable: str | None = None):
    assert completed.returncode == 0, completed.stderr
    header, *rows = table(completed)
    assert header == [
        "#Group",
        "#SelfId",
        "#Addr",
        "#DLedger",
        "Addr",
        "#Role",
        "#Term",
        "#LedgerEndIndex",
        "#CommittedIndex",
    ]
    peers = cluster.peer_addrs
    assert [r[1] for r in rows] == sorted(peers)
    assert {r[0] for r in rows} == {cluster.broker_name}
    assert [r[1] for r in rows if r[4] == "LEADER"] == [leader]
    for _group, self_id, addr, peer_addr, role, *numbers in rows:
        assert peer_addr == peers[self_id]
        if self_id == unreachable:
            assert (addr, role, numbers) == ("-", UNREACHABLE, ["-", "-", "-"])
        else:
            assert addr == cluster.broker_addrs[self_id]
            assert role in ("LEADER", "FOLLOWER")
    assert len({r[5] for r in rows if r[1] != unreachable}) == 1  # one term


async def send_keyed(cluster, topic: str) -> list[str]:
    """Three messages keyed `order-42` (and one of them `vip`); their UNIQ_KEYs."""
    async with Producer(cluster.namesrv_addr, "keyed") as producer:
        return [
            (await producer.send(topic, b"order-%d" % n, keys=["order-42", *(["vip"] * n)])).msg_id
            for n in range(2)
        ] + [(await producer.send(topic, b"other", keys="order-7")).msg_id]


async def query_outputs(cluster, admin: Admin, uniq_keys: list[str], check: bool = True):
    """What queries by key and by unique key answer, through mqadmin and the client."""
    by_key = await mqadmin(
        "queryMsgByKey", "-n", cluster.namesrv_addr, "-t", "Survivor", "-k", "order-42"
    )
    by_uniq = await mqadmin(
        "queryMsgByUniqueKey", "-n", cluster.namesrv_addr, "-t", "Survivor", "-i", uniq_keys[1]
    )
    by_id = await mqadmin(
        "queryMsgById", "-n", cluster.namesrv_addr, "-t", "Survivor", "-i", uniq_keys[2]
    )
    outputs = [by_key.stdout.decode(), by_uniq.stdout.decode(), by_id.stdout.decode()]
    try:
        found = [m.body for m in await query_by_key(admin, "Survivor", "order-42")]
        vip = [m.body for m in await query_by_key(admin, "Survivor", "vip")]
        one = (await query_by_unique_key(admin, "Survivor", uniq_keys[0])).body
    except MQBrokerError:
        if check:
            raise
        return None
    if check:
        for completed in (by_key, by_uniq, by_id):
            assert completed.returncode == 0, completed.stderr
        rows = table(by_key)
        assert rows[0] == ["#Message", "ID", "#QID", "#Offset"]
        assert sorted(row[0] for row in rows[1:]) == sorted(uniq_keys[:2])
        assert "Message Body:        order-1" in outputs[1]
        assert "Keys:                [order-42 vip]" in outputs[1]
        assert "Message Body:        other" in outputs[2]
        assert (sorted(found), vip, one) == ([b"order-0", b"order-1"], [b"order-1"], b"order-0")
    return outputs, sorted(found), vip, one


@pytest.mark.processes
async def test_failover_keeps_messages_findable_and_shows_in_dledger_status(cluster):
    """Runs last: it kills the master."""
    old = await cluster.wait_master()
    async with Admin(cluster.namesrv_addr) as admin:
        await stable_members(admin)
        completed = await mqadmin("dledgerStatus", "-n", cluster.namesrv_addr)
        check_dledger_rows(completed, cluster, leader=old)

        await admin.create_topic("Survivor", 1, 1, cluster=CLUSTER)
        await wait_route(admin, "Survivor")
        msg_id = await send(cluster.broker_addrs[old], "Survivor", b"still-here", 0)
        completed = await mqadmin("queryMsgById", "-n", cluster.namesrv_addr, "-i", msg_id)
        assert completed.returncode == 0, completed.stderr
        out = completed.stdout.decode()
        assert f"OffsetID:            {msg_id}" in out
        assert f"Store Host:          {cluster.broker_addrs[old]}" in out
        assert "Message Body:        still-here" in out

        keyed = await send_keyed(cluster, "Survivor")
        before = await query_outputs(cluster, admin, keyed)

        cluster.kill(old)
        msg = await admin.query_msg_by_id(msg_id)  # from a replica, master or not yet
        assert (msg.topic, msg.body, msg.msg_id) == ("Survivor", b"still-here", msg_id)

        new = await cluster.wait_master(not_node=old)
        members = await stable_members(admin, not_leader=old)
        assert [m.self_id for m in members if m.role == UNREACHABLE] == [old]
        with trio.fail_after(20):  # until the route names the new master
            while await query_outputs(cluster, admin, keyed, check=False) != before:
                await trio.sleep(0.2)
        assert await query_outputs(cluster, admin, keyed) == before
    completed = await mqadmin("dledgerStatus", "-n", cluster.namesrv_addr, "-c", CLUSTER)
    check_dledger_rows(completed, cluster, leader=new, unreachable=old)
