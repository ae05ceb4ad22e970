"""Real processes: a classic master/slave group upgraded in place to a DLedger group
(RocketMQ's procedure: stop, copy the master's store to a third node, switch the
configs, start), every old message still there at its offset and queue offset,
and a node over other old files refused."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from raftmq.client import Producer
from raftmq.client.admin import Admin
from raftmq.client.consumer import Subscription, pull_request, pull_result
from raftmq.client.producer import SendStatus
from raftmq.client.route import MessageQueue
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import RemotingClient, RequestCode, ResponseCode
from raftmq.tools.broker_local import LOCAL_SEGMENT_BYTES, LocalClassicGroup, LocalCluster
from tests.helpers import mqadmin

pytestmark = [pytest.mark.processes, pytest.mark.untimed]

TOPIC, GROUP, QUEUES = "UpT", "UpG", 2


async def pull_all(address: str, queue_id: int) -> list:
    """(queue offset, body) of every message of one queue, pulled from `address`."""
    mq = MessageQueue(TOPIC, "broker-a", queue_id)
    messages, offset = [], 0
    async with RemotingClient(address) as client:
        while True:
            subscription = Subscription(TOPIC, "*", 0)
            request = pull_request("Reader", mq, offset, 32, subscription, None, None)
            result = pull_result(await client.invoke(request, 5.0), offset, subscription, "x")
            if not result.messages:
                return messages
            messages += [(m.queue_offset, m.body) for m in result.messages]
            offset = result.next_begin_offset


def body(n: int) -> bytes:
    return f"m{n:04d}".encode().ljust(200, b".")


async def send(namesrv: str, first: int, count: int) -> list:
    """(body, SendResult) of each message sent."""
    async with Producer(namesrv) as producer:
        sent = [
            (body(n), await producer.send(TOPIC, body(n), queue=None))
            for n in range(first, first + count)
        ]
    assert {r.status for _b, r in sent} == {SendStatus.SEND_OK}
    return sent


def by_queue(sent: list) -> dict[int, list]:
    """{queue id: [(queue offset, body), ...]} of the messages sent."""
    queues = {q: [] for q in range(QUEUES)}
    for sent_body, result in sent:
        queues[result.message_queue.queue_id].append((result.queue_offset, sent_body))
    return queues


async def pulled(cluster: LocalCluster, node: str) -> dict[int, list]:
    """{queue id: [(queue offset, body), ...]} of every message pulled from `node`."""
    return {q: await pull_all(cluster.broker_addrs[node], q) for q in range(QUEUES)}


async def verify(cluster: LocalCluster, node: str, sent: list) -> None:
    """Every sent message by its offset msgId and by pull from `node`, at the queue
    offset it was sent to; the consumer offset and subscription group are there."""
    async with Admin(cluster.namesrv_addr) as admin:
        for sent_body, result in sent:
            msg = await admin.query_msg_by_id(result.offset_msg_id)
            assert (msg.queue_offset, msg.body) == (result.queue_offset, sent_body)
    assert await pulled(cluster, node) == by_queue(sent)
    query = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "1"}
    response = await cluster.broker_call(node, RequestCode.QUERY_CONSUMER_OFFSET, query)
    assert (response.code, response.ext_fields["offset"]) == (ResponseCode.SUCCESS, "7")
    groups = await cluster.broker_call(node, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert GROUP.encode() in groups.body


async def test_a_classic_group_upgraded_in_place_keeps_every_message(tmp_path):
    async with LocalClassicGroup(tmp_path, slaves=1, master_role="SYNC_MASTER") as classic:
        await classic.create_topic(TOPIC, queues=QUEUES)
        done = await mqadmin(
            "updateSubGroup", "-n", classic.namesrv_addr, "-c", "DefaultCluster", "-g", GROUP
        )
        assert done.returncode == 0, done.stderr
        commit = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "1", "commitOffset": "7"}
        response = await classic.broker_call("n0", RequestCode.UPDATE_CONSUMER_OFFSET, commit)
        assert response.code == ResponseCode.SUCCESS
        sent = await send(classic.namesrv_addr, 0, 60)
        await classic.wait_replicated()
    # stopped; n2 gets a copy of the master's store, the configs switch to DLedger
    async with classic.upgraded(nodes=3) as cluster:
        leader = await cluster.wait_master()
        await cluster.wait_caught_up()
        await verify(cluster, leader, sent)
        more = await send(cluster.namesrv_addr, 60, 40)
        old_max = {}
        for _b, r in sent:
            queue_id = r.message_queue.queue_id
            old_max[queue_id] = max(old_max.get(queue_id, -1), r.queue_offset)
        for _b, result in more:  # queue offsets continue after the old ones
            assert result.queue_offset > old_max[result.message_queue.queue_id]
        # new entries start at the divide: the old end rounded up to a file boundary
        old_end = max(decode_message_id(r.offset_msg_id).offset for _b, r in sent)
        divide = old_end - old_end % LOCAL_SEGMENT_BYTES + LOCAL_SEGMENT_BYTES
        first_new = min(decode_message_id(r.offset_msg_id).offset for _b, r in more)
        # entry 0 is the first leader's NOOP (48 bytes), a message is 48 bytes into its entry
        assert divide + 48 + 48 <= first_new
        for node in cluster.ids:
            data = cluster.store_dir(node) / f"dledger-{node}" / "data"
            assert sorted(p.name for p in data.iterdir())[0] == f"{divide:020d}"
        sent += more
        await cluster.wait_caught_up()
        cluster.kill(leader)
        new_leader = await cluster.wait_master(not_node=leader, timeout_s=30)
        await verify(cluster, new_leader, sent)
        sent += await send(cluster.namesrv_addr, 100, 10)
        await verify(cluster, new_leader, sent)


async def test_the_classic_commitlog_is_where_storepathcommitlog_says(tmp_path):
    """RocketMQ keeps the classic CommitLog in `storePathCommitLog`; the key was accepted
    and ignored, the files going to storePathRootDir/commitlog. A classic broker now
    writes them there and reads them back after a restart, and once the store is
    upgraded to DLedger its old messages are read from there too."""
    elsewhere = tmp_path / "disk2" / "commitlog"
    conf = {"storePathCommitLog": str(elsewhere)}
    async with LocalClassicGroup(tmp_path / "group", slaves=0, extra_conf=conf) as classic:
        await classic.create_topic(TOPIC, queues=QUEUES)
        sent = await send(classic.namesrv_addr, 0, 30)
        assert [p.name for p in elsewhere.iterdir()] == [f"{0:020d}"]
        assert not (classic.store_dir("n0") / "commitlog").exists()
        await classic.restart("n0")
        assert await pulled(classic, "n0") == by_queue(sent)
        sent += await send(classic.namesrv_addr, 30, 10)  # after the old ones, same file
        assert [p.name for p in elsewhere.iterdir()] == [f"{0:020d}"]
    async with classic.upgraded(nodes=1) as cluster:
        await cluster.wait_master()
        assert await pulled(cluster, "n0") == by_queue(sent)
        sent += await send(cluster.namesrv_addr, 40, 10)
        assert await pulled(cluster, "n0") == by_queue(sent)
    assert b"storePathCommitLog: in DLedger mode" in (cluster.base_dir / "n0.log").read_bytes()


async def test_a_node_over_other_old_files_is_refused(tmp_path):
    async with LocalClassicGroup(tmp_path, slaves=1) as classic:
        await classic.create_topic(TOPIC, queues=QUEUES)
        sent = await send(classic.namesrv_addr, 0, 20)
        await classic.wait_replicated()
    cluster = classic.upgraded(nodes=3)
    # n2's copy of the master's store differs in the last byte of the last message
    last = max(decode_message_id(r.offset_msg_id).offset for _b, r in sent)
    path = sorted((cluster.store_dir("n2") / "commitlog").iterdir())[-1]
    with open(path, "r+b") as f:
        f.seek(last % LOCAL_SEGMENT_BYTES)
        size = int.from_bytes(f.read(4), "big")
        f.seek(last % LOCAL_SEGMENT_BYTES + size - 1)
        f.write(b"?")
    try:
        await cluster.start_namesrv()
        for node in ("n0", "n1"):
            cluster.start_broker(node)
        leader = await cluster.wait_master(timeout_s=30)
        cluster.start_broker("n2")
        with trio.fail_after(30):
            while cluster.procs["n2"].poll() is None:
                await trio.sleep(0.1)
        assert cluster.procs["n2"].returncode == 5
        last_line = (tmp_path / "n2.log").read_text().strip().splitlines()[-1]
        assert last_line == (
            "mqbroker: the leader's log begins at offset 67108864 as this node's does, but "
            "after another last message: its old commitlog files differ from the leader's "
            "(copy the leader's store here)"
        )
        # the others carry on: the group writes with n2 gone
        assert await cluster.wait_master() == leader
        await send(cluster.namesrv_addr, 20, 5)
    finally:
        cluster.stop()


async def start_tool(tmp_path, name: str, *args: str) -> tuple[subprocess.Popen, str]:
    """`python -m raftmq.tools.broker_local ARGS --dir tmp_path`, once it serves; and the
    name server it prints."""
    out = tmp_path.parent / f"{name}.out"
    with open(out, "wb") as sink:
        command = [sys.executable, "-m", "raftmq.tools.broker_local", *args, "--dir", str(tmp_path)]
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    with trio.fail_after(60):
        while b"Ctrl-C stops" not in out.read_bytes():
            assert proc.poll() is None, out.read_text()
            await trio.sleep(0.1)
    return proc, out.read_text().split()[2].rstrip(",")


async def stop_tool(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    with trio.fail_after(30):
        while proc.poll() is None:
            await trio.sleep(0.1)
    assert proc.returncode == 130


async def test_the_local_tool_upgrades_the_classic_group_it_ran(tmp_path):
    store = tmp_path / "group"
    proc, namesrv = await start_tool(store, "classic", "--classic", "--role", "SYNC_MASTER")
    try:
        done = await mqadmin("updateTopic", "-n", namesrv, "-c", "DefaultCluster", "-t", TOPIC)
        assert done.returncode == 0, done.stderr
        sent = await send(namesrv, 0, 10)
    finally:
        await stop_tool(proc)
    proc, upgraded_namesrv = await start_tool(store, "upgraded", "--upgrade")
    try:
        assert upgraded_namesrv == namesrv
        async with Admin(namesrv) as admin:
            for sent_body, result in sent:
                assert (await admin.query_msg_by_id(result.offset_msg_id)).body == sent_body
        assert len(await send(namesrv, 10, 5)) == 5
    finally:
        await stop_tool(proc)
    command = [sys.executable, "-m", "raftmq.tools.broker_local", "--upgrade", "--dir", str(store)]
    again = await trio.run_process(command, capture_stderr=True, check=False)
    assert again.returncode == 2
    assert b"no stopped classic group there" in again.stderr
