"""Real processes, classic mode (enableDLegerCommitLog=false): a name server and a
master with its slave replicating over RocketMQ's HA protocol; SYNC_MASTER's answers
with the slave gone; a master killed after an acknowledgement; a SYNC_MASTER group
started in any order, or its master restarted on another HA port, taking sends at once."""

from __future__ import annotations

import json
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest
import rocketmq.client
import trio
from raftmq.broker.registration import MASTER_ASK_S
from rocketmq.exceptions import RocketMQException

from raftmq.client import Producer
from raftmq.client.consumer import PullConsumer, Subscription, pull_request
from raftmq.client.producer import SendStatus, send_request
from raftmq.client.route import MessageQueue
from raftmq.config.address import parse_address
from raftmq.remoting import RemotingClient, RequestCode, ResponseCode
from raftmq.tools.broker_local import LOOPBACK, LocalClassicGroup, _lenient_json
from raftmq.tools.dledger_local import free_ports
from tests.helpers import commitlog_files, pull_all, send_all, stopped

pytestmark = pytest.mark.processes

FILE_BYTES = 256 * 1024  # small CommitLog files: a few hundred messages fill one


async def mqadmin(*args: str) -> subprocess.CompletedProcess:
    completed = await trio.run_process(
        [sys.executable, "-m", "raftmq.client.mqadmin", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return completed


async def all_topics(group: LocalClassicGroup, node: str) -> dict:
    response = await group.broker_call(node, RequestCode.GET_ALL_TOPIC_CONFIG)
    return json.loads(response.body)["topicConfigTable"]


async def test_a_slave_copies_the_masters_files_byte_for_byte(tmp_path):
    conf = {"mappedFileSizeCommitLog": str(FILE_BYTES)}
    async with LocalClassicGroup(tmp_path, slaves=1, extra_conf=conf) as group:
        await group.create_topic("T", queues=2)
        commit = {"consumerGroup": "G", "topic": "T", "queueId": "1", "commitOffset": "7"}
        response = await group.broker_call("n0", RequestCode.UPDATE_CONSUMER_OFFSET, commit)
        assert response.code == ResponseCode.SUCCESS
        async with Producer(group.namesrv_addr) as producer:
            results = await send_all(producer, "T", 2000)
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        await group.wait_replicated()
        master, slave = commitlog_files(group, "n0"), commitlog_files(group, "n1")
        assert len(master) >= 3  # several files, each ended by a BLANK record
        assert master == slave
        # the slave registered as brokerId 1 and learnt the master's HA address
        info = _lenient_json((await group.namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)).body)
        addrs = info["brokerAddrTable"]["broker-a"]["brokerAddrs"]
        assert addrs == {"0": group.client_addrs["n0"], "1": group.client_addrs["n1"]}
        state = await group.member_state("n1")
        assert state["haMasterAddress"] == group.ha_addrs["n0"]
        assert state["brokerRole"] == "SLAVE"
        # mqadmin haStatus, RocketMQ 5's view of the group
        end = (await group.member_state("n0"))["commitLogWriteOffset"]
        master_view = await mqadmin("haStatus", "-n", group.namesrv_addr, "-c", "DefaultCluster")
        lines = master_view.stdout.decode().splitlines()
        assert lines[1:5] == [
            f"#MasterAddr\t{group.client_addrs['n0']}",
            f"#MasterCommitLogMaxOffset\t{end}",
            "#SlaveNum\t1",
            "#InSyncSlaveNum\t1",
        ]
        slave_row = lines[6].split()
        assert (slave_row[1], slave_row[2], slave_row[4]) == (end, "0", "OK")
        slave_view = await mqadmin(
            "haStatus", "-n", group.namesrv_addr, "-b", group.broker_addrs["n1"]
        )
        assert f"#MasterAddr\t{group.ha_addrs['n0']}" in slave_view.stdout.decode()
        assert f"#CommitLogMaxOffset\t{end}" in slave_view.stdout.decode()
        # the slave built its ConsumeQueues from the replicated bytes and serves pulls
        on_master = await pull_all(group.broker_addrs["n0"], "T", 1, "broker-a")
        on_slave = await pull_all(group.broker_addrs["n1"], "T", 1, "broker-a")
        assert len(on_master) > 900
        assert [(m.msg_id, m.body) for m in on_slave] == [(m.msg_id, m.body) for m in on_master]

        # a new, empty slave starts at the start of the master's last file
        group.kill("n1")
        shutil.rmtree(group.store_dir("n1"))
        await group.restart("n1")
        await group.wait_slaves(1)
        master = commitlog_files(group, "n0")
        last = max(master)
        await group.wait_replicated()
        assert commitlog_files(group, "n1") == {last: master[last]}
        async with Producer(group.namesrv_addr) as producer:
            await send_all(producer, "T", 1000)
        await group.wait_replicated()
        master, slave = commitlog_files(group, "n0"), commitlog_files(group, "n1")
        assert min(slave) == last and len(slave) >= 2
        assert slave == {name: data for name, data in master.items() if name >= last}
        # topic T was created in the first file, which this slave never had:
        # SlaveSynchronize brings it, and the consumer offsets, from the master
        with trio.fail_after(20):
            while "T" not in (await all_topics(group, "n1")):
                await trio.sleep(0.2)
        offsets = await group.broker_call("n1", RequestCode.GET_ALL_CONSUMER_OFFSET)
        assert json.loads(offsets.body)["offsetTable"]["T@G"] == {"1": 7}


async def test_a_slave_refuses_sends_and_slow_pulls_are_sent_to_it(tmp_path):
    # every pull counts as slow: anything behind the log's end is "not in memory"
    conf = {"slaveReadEnable": "true", "accessMessageInMemoryMaxRatio": "0"}
    async with LocalClassicGroup(tmp_path, slaves=1, extra_conf=conf) as group:
        await group.create_topic("T")
        mq = MessageQueue("T", "broker-a", 0)
        request = send_request(RequestCode.SEND_MESSAGE_V2, "P", mq, b"x", "", 0)
        async with RemotingClient(group.broker_addrs["n1"]) as client:
            response = await client.invoke(request, 5.0)
        assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "messages are put to the slave" in response.remark
        # nor does it take consumer offsets, which SlaveSynchronize would overwrite
        commit = {"consumerGroup": "G", "topic": "T", "queueId": "0", "commitOffset": "1"}
        response = await group.broker_call("n1", RequestCode.UPDATE_CONSUMER_OFFSET, commit)
        assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "brokerId 1 is a SLAVE" in response.remark

        async with RemotingClient(group.broker_addrs["n0"]) as client:
            assert (await client.invoke(request, 5.0)).code == ResponseCode.SUCCESS
            subscription = Subscription("T", "*", 0)
            suggestions = []
            for offset in (0, 1):  # a message, then nothing
                pull = pull_request("G", mq, offset, 32, subscription, None, None)
                suggestions.append((await client.invoke(pull, 5.0)).ext_fields)
        # whichBrokerWhenConsumeSlowly (1) after reading behind the end, brokerId (0) at it
        assert [s["suggestWhichBrokerId"] for s in suggestions] == ["1", "0"]


async def test_sync_master_answers_11_without_its_slave_and_12_when_it_is_silent(tmp_path):
    conf = {"slaveTimeout": "1000"}
    group = LocalClassicGroup(tmp_path, slaves=1, master_role="SYNC_MASTER", extra_conf=conf)
    async with group:
        await group.create_topic("T")
        async with Producer(group.namesrv_addr, send_timeout_s=10) as producer:
            await group.wait_replicated()
            assert (await producer.send("T", b"first")).status is SendStatus.SEND_OK
            # a slave that stops answering: the master waits slaveTimeout, then says 12
            group.procs["n1"].send_signal(signal.SIGSTOP)
            try:
                started = trio.current_time()
                result = await producer.send("T", b"late")
                waited = trio.current_time() - started
            finally:
                group.procs["n1"].send_signal(signal.SIGCONT)
            assert result.status is SendStatus.FLUSH_SLAVE_TIMEOUT
            assert 1.0 <= waited < 3.0
            # no slave at all: 11 at once
            group.kill("n1")
            with trio.fail_after(10):
                while (await group.member_state("n0"))["haConnections"] != "0":
                    await trio.sleep(0.05)
            started = trio.current_time()
            result = await producer.send("T", b"alone")
            assert result.status is SendStatus.SLAVE_NOT_AVAILABLE
            assert trio.current_time() - started < 1.0  # at once, not after slaveTimeout
            # the message is stored all the same
            stored = await pull_all(group.broker_addrs["n0"], "T", result.message_queue.queue_id,
                                    "broker-a")  # fmt: skip
            assert b"alone" in [m.body for m in stored]


async def test_what_sync_master_acknowledged_is_on_the_slave_when_the_master_dies(tmp_path):
    async with LocalClassicGroup(tmp_path, slaves=1, master_role="SYNC_MASTER") as group:
        await group.create_topic("T", queues=1)
        await group.wait_replicated()
        async with Producer(group.namesrv_addr) as producer:
            results = await send_all(producer, "T", 200, size=100)
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        group.kill("n0")  # SIGKILL, right after the last acknowledgement
        on_slave = await pull_all(group.broker_addrs["n1"], "T", 0, "broker-a")
        assert [m.msg_id for m in on_slave] == [r.offset_msg_id for r in results]
        # a consumer that knows only the name server finds them there too
        async with PullConsumer(group.namesrv_addr, "G") as consumer:
            [mq] = await consumer.fetch_queues("T")
            got: list = []
            with trio.fail_after(20):
                while len(got) < len(results):
                    got += (await consumer.pull(mq, len(got))).messages
        assert [m.msg_id for m in got] == [r.offset_msg_id for r in results]


async def test_a_single_classic_broker_keeps_its_messages_across_restarts(tmp_path):
    async with LocalClassicGroup(tmp_path, slaves=0) as group:
        await group.create_topic("T", queues=1)
        async with Producer(group.namesrv_addr) as producer:
            first = await send_all(producer, "T", 50, size=50)
        await group.restart("n0")  # SIGKILL and start: an abnormal recovery
        await group.wait_master()
        async with Producer(group.namesrv_addr) as producer:
            second = await send_all(producer, "T", 50, size=50)
        assert [r.queue_offset for r in first + second] == list(range(100))
        stored = await pull_all(group.broker_addrs["n0"], "T", 0, "broker-a")
        assert [m.msg_id for m in stored] == [r.offset_msg_id for r in first + second]


async def test_a_slave_written_from_the_protocol_is_served_by_a_master_process(tmp_path):
    """What a Java slave does: connect, say nothing for a heartbeat interval, report 0
    (an empty store), read 12-byte headers and bodies, acknowledge."""
    conf = {"mappedFileSizeCommitLog": str(FILE_BYTES)}
    async with LocalClassicGroup(tmp_path, slaves=0, extra_conf=conf) as group:
        await group.create_topic("T")
        async with Producer(group.namesrv_addr) as producer:
            await send_all(producer, "T", 1000)
        files = commitlog_files(group, "n0")
        last = max(files)
        end = int((await group.member_state("n0"))["commitLogWriteOffset"])
        assert int(last) < end < int(last) + FILE_BYTES
        host, port = parse_address(group.ha_addrs["n0"])
        stream = await trio.open_tcp_stream(host, port)
        await trio.sleep(1.0)
        await stream.send_all(struct.pack(">q", 0))
        copied, buffer = bytearray(), bytearray()
        with trio.fail_after(10):
            while int(last) + len(copied) < end:
                buffer += await stream.receive_some(1 << 16)
                while len(buffer) >= 12:
                    offset, size = struct.unpack_from(">qi", buffer)
                    if len(buffer) < 12 + size:
                        break
                    assert offset == int(last) + len(copied)  # from the last file's start
                    copied += buffer[12 : 12 + size]
                    del buffer[: 12 + size]
        assert bytes(copied) == files[last][: len(copied)]
        await stream.send_all(struct.pack(">q", end))
        with trio.fail_after(5):
            while (await group.member_state("n0"))["slaveAckOffset"] != str(end):
                await trio.sleep(0.05)
        await stream.aclose()


def test_a_slave_with_broker_id_0_is_refused(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerRole=SLAVE\nbrokerId=0\nstorePathRootDir={tmp_path}\n")
    run = subprocess.run(
        [sys.executable, "-m", "raftmq.broker.cli", "-c", str(conf)],
        capture_output=True,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.decode().strip().splitlines() == [
        f"mqbroker: {conf}: brokerId=0: a SLAVE needs brokerId > 0"
    ]


def cluster_rows(completed: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """clusterList's rows by #BID (cells split on whitespace; #Cluster Name is two words
    in the header only)."""
    lines = completed.stdout.decode().splitlines()
    assert lines[0].split() == [
        "#Cluster", "Name", "#Broker", "Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)",
        "#OutTPS(LOAD)", "#PCWait(ms)", "#Hour", "#SPACE", "#FallBehind(B)",
    ]  # fmt: skip
    return {row[2]: row for row in (line.split() for line in lines[1:] if line.strip())}


async def test_cluster_list_and_broker_status_show_master_slave_and_the_slave_lag(tmp_path):
    """clusterList: master (#BID 0) and slave (#BID 1) in RocketMQ's columns, then each
    one's HA lag; with the slave stopped (SIGSTOP) while the master takes sends, the
    master's row and its brokerStatus `slaveFallBehindBytes` show the bytes not yet
    acknowledged, and both fall to 0 once the slave resumes."""
    keep_link = {"haHousekeepingInterval": "30000"}  # the master keeps the stalled slave
    async with LocalClassicGroup(tmp_path, slaves=1, extra_conf=keep_link) as group:
        await group.create_topic("Listed")
        n = ["-n", group.namesrv_addr]
        async with Producer(group.namesrv_addr) as producer:
            await send_all(producer, "Listed", 5)
            await group.wait_replicated()
            rows = cluster_rows(await mqadmin("clusterList", *n))
            assert set(rows) == {"0", "1"}
            for bid, node in (("0", "n0"), ("1", "n1")):
                row = rows[bid]
                assert row[:5] == ["DefaultCluster", "broker-a", bid, group.broker_addrs[node],
                                   "V4_9_8"]  # fmt: skip
                assert row[5].endswith("(-,-ms)") and row[6].endswith("(-,-ms)")
                assert 0.0 <= float(row[9]) <= 1.0  # #SPACE: commitLogDiskRatio
                assert row[10] == "0"

            with stopped(group.pid("n1")):
                await send_all(producer, "Listed", 20, size=500)
                stalled = cluster_rows(await mqadmin("clusterList", *n, "-c", "DefaultCluster"))
                status = await mqadmin("brokerStatus", *n, "-b", group.broker_addrs["n0"])
        assert int(stalled["0"][10]) >= 20 * 500
        assert stalled["1"][-1] == "-"  # the slave did not answer
        lines = status.stdout.decode().splitlines()
        table = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        assert table["brokerRole"] == "ASYNC_MASTER" and table["haConnections"] == "1"
        assert int(table["slaveFallBehindBytes"]) >= 20 * 500
        assert table["putTps"].count(" ") == 2  # RocketMQ's 10 s, 1 min, 10 min rates

        with trio.fail_after(20):
            while True:
                rows = cluster_rows(await mqadmin("clusterList", *n))
                if [rows[bid][-1] for bid in ("0", "1")] == ["0", "0"]:
                    break
                await trio.sleep(0.2)


async def test_a_classic_master_over_its_disk_ratio_refuses_sends(tmp_path):
    """Restarted with diskSpaceWarningLevelRatio=1 (any real disk is fuller than 1 %),
    the master's disk check marks its disk full: sends get SERVICE_NOT_AVAILABLE with
    RocketMQ's disk-full remark and nothing is stored; a topic change (a metadata
    record in the log) is refused the same way, naming the full disk."""
    async with LocalClassicGroup(tmp_path, slaves=0) as group:
        await group.create_topic("T", queues=1)
        with group.conf_path("n0").open("a") as conf:
            conf.write("diskSpaceWarningLevelRatio=1\n")
        await group.restart("n0")
        mq = MessageQueue("T", "broker-a", 0)
        request = send_request(RequestCode.SEND_MESSAGE_V2, "P", mq, b"x", "", 0)
        async with RemotingClient(group.broker_addrs["n0"]) as client:
            with trio.fail_after(10):  # the first check runs as the broker starts
                while (response := await client.invoke(request, 5.0)).code == 0:
                    await trio.sleep(0.05)
        assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE, response.remark
        assert "the broker's disk is full" in response.remark
        with pytest.raises(RuntimeError, match="the broker's disk is full"):
            await group.create_topic("U", queues=1)


# RocketMQ's registration period (the harness's brokers register every 3 s, which would
# hide a slave that waits for its next registration to hear of its master)
REGISTER_EVERY_30_S = {"registerNameServerPeriod": "30000"}
# each step's brokers are started at once, the next step once they accept connections
START_ORDERS = {
    "slave first": (("n1",), ("n0",)),
    "master first": (("n0",), ("n1",)),
    "both at once": (("n0", "n1"),),
}
FIRST_SEND_OK_S = 1.0  # after both brokers accept connections
GIVE_UP_S = 5.0  # a send loop's end when SEND_OK never comes


async def first_send_ok_s(producer: Producer, topic: str, since: float) -> tuple[float, list]:
    """Send with our client until SEND_OK: the seconds from `since` to it, and the
    statuses answered before it."""
    before = []
    while trio.current_time() - since < GIVE_UP_S:
        status = (await producer.send(topic, b"ours")).status
        if status is SendStatus.SEND_OK:
            return trio.current_time() - since, before
        before.append(status.name)
        await trio.sleep(0.01)
    return float("inf"), before


def cpp_first_send_ok_s(cpp: rocketmq.client.Producer, topic: str, since: float):
    """`first_send_ok_s` with RocketMQ's C++ client (blocking; `since` is time.monotonic's).
    Its errors (a route not found yet, say) count as answers before SEND_OK."""
    before = []
    message = rocketmq.client.Message(topic)
    message.set_body(b"cpp")
    while time.monotonic() - since < GIVE_UP_S:
        try:
            status = cpp.send_sync(message).status
        except RocketMQException as exc:
            status = f"{type(exc).__name__}: {exc}"
        if status == rocketmq.client.SendStatus.OK:
            return time.monotonic() - since, before
        before.append(str(status))
        time.sleep(0.01)
    return float("inf"), before


@pytest.mark.parametrize("order", START_ORDERS)
async def test_a_fresh_sync_master_group_takes_sends_within_a_second_in_any_start_order(
    tmp_path, order
):
    """A name server, then a SYNC_MASTER and its SLAVE in `order`, registering every 30 s
    as RocketMQ's do: a slave that registered before its master asks the name server
    again until it has a master, so both RocketMQ's C++ client and ours have a SEND_OK
    within a second of both brokers accepting connections (not SLAVE_NOT_AVAILABLE,
    11, until the slave's next registration 30 s later). The topic is created in that
    second too."""
    group = LocalClassicGroup(
        tmp_path, slaves=1, master_role="SYNC_MASTER", extra_conf=REGISTER_EVERY_30_S
    )
    cpp = rocketmq.client.Producer("CPP", timeout=3000)
    cpp.set_namesrv_addr(group.namesrv_addr)
    try:
        await group.start_namesrv()
        cpp.start()
        async with Producer(group.namesrv_addr) as producer:
            for nodes in START_ORDERS[order]:
                await group.boot(*nodes)
            both_up, both_up_monotonic = trio.current_time(), time.monotonic()
            await group.create_topic("T", queues=1)
            cpp_waited = []

            async def cpp_sends() -> None:
                cpp_waited[:] = await trio.to_thread.run_sync(
                    cpp_first_send_ok_s, cpp, "T", both_up_monotonic
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cpp_sends)
                ours_s, ours_before = await first_send_ok_s(producer, "T", both_up)
            cpp_s, cpp_before = cpp_waited
    finally:
        cpp.shutdown()
        group.stop()
    assert ours_s < FIRST_SEND_OK_S, (ours_s, ours_before)
    assert cpp_s < FIRST_SEND_OK_S, (cpp_s, cpp_before)


async def test_a_slave_finds_its_master_restarted_on_another_ha_port(tmp_path):
    """The master restarted with another haListenPort: the slave's connection breaks,
    it asks the name server again at once and then every half second (its
    registrations are 30 s apart otherwise), connects to the new port as soon as the
    master has registered it, and the SYNC_MASTER's sends are acknowledged again
    within a second of the master accepting connections."""
    group = LocalClassicGroup(
        tmp_path, slaves=1, master_role="SYNC_MASTER", extra_conf=REGISTER_EVERY_30_S
    )
    async with group, Producer(group.namesrv_addr) as producer:
        await group.create_topic("T", queues=1)
        assert (await producer.send("T", b"before")).status is SendStatus.SEND_OK
        # past the slave's last fast registration: the next is 30 s away
        await trio.sleep(2 * MASTER_ASK_S)
        [port] = free_ports(1)
        with group.conf_path("n0").open("a") as conf:
            conf.write(f"haListenPort={port}\n")
        await group.restart("n0")
        restarted = trio.current_time()
        waited_s, before = await first_send_ok_s(producer, "T", restarted)
        assert waited_s < FIRST_SEND_OK_S, (waited_s, before)
        state = await group.member_state("n1")
        assert state["masterAddr"] == state["haMasterAddress"] == f"{LOOPBACK}:{port}"
