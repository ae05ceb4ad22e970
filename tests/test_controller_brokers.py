"""Brokers in controller mode as real processes over real TCP (`LocalControllerGroup`):
a name server, three controllers and a group of 2 or 3 brokers started with RocketMQ's
quick-start settings (brokerId=-1, brokerRole=SLAVE, allAckInSyncStateSet=true). The
master is SIGKILLed under our producer: nothing acknowledged is lost, the new master
acknowledges within a second, and the old master, restarted, rejoins as a slave whose
CommitLog ends byte-identical to the master's."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from functools import partial

import pytest
import rocketmq.client
import trio
from raftmq.broker.replicas_manager import CONTROLLERS_REFRESH_S
from rocketmq.exceptions import RocketMQException

from raftmq.client import Producer
from raftmq.client.errors import SendError
from raftmq.client.producer import SendStatus, send_request
from raftmq.client.route import MessageQueue
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.remoting.codes import LanguageCode, MQVersion
from raftmq.tools.broker_drill import run_drill
from raftmq.tools.broker_local import LocalControllerGroup
from tests.helpers import commitlog_files, mqadmin, pull_all, send_all
from tests.test_classic_processes import GIVE_UP_S, first_send_ok_s
from tests.test_console import console, ok

pytestmark = pytest.mark.processes

CPP_SEND_TIMEOUT_S = 0.5
FIRST_SEND_OK_S = 1.0  # the target: a killed master's group acknowledges again within
#: controllerHeartBeatTimeoutMills and brokerHeartbeatInterval for a silent master
#: replaced within FIRST_SEND_OK_S (RocketMQ's defaults, 10 s and 1 s, take ten)
FAST_FAILOVER = {"controllerHeartBeatTimeoutMills": "600", "brokerHeartbeatInterval": "100"}
#: what the test allows a paused master's group: the target, and room for a loaded machine
PAUSED_FIRST_SEND_OK_S = 2 * FIRST_SEND_OK_S


async def master_and_slave(group: LocalControllerGroup) -> tuple[str, str]:
    """A 2-replica group's master and slave, both in the SyncStateSet, and topic T (one
    queue) created."""
    master = await group.wait_in_sync(2)
    await group.create_topic("T", queues=1)
    [slave] = [n for n in group.ids if n != master]
    return master, slave


async def first_ack_s(producer: Producer, topic: str, since: float) -> tuple[float, list]:
    """`first_send_ok_s`, with a send that fails (no master in the route yet) counted
    among the answers before the first SEND_OK."""
    refused: list = []
    while trio.current_time() - since < GIVE_UP_S:
        try:
            waited_s, before = await first_send_ok_s(producer, topic, since)
            return waited_s, refused + before
        except SendError as exc:
            refused.append(str(exc))
            await trio.sleep(0.01)
    return float("inf"), refused


async def _serves_and_keeps(group: LocalControllerGroup, count: int = 100) -> None:
    """The group reaches a master with both brokers in sync, acknowledges `count` sends
    to topic T (one queue), and holds every one of them."""
    master = await group.wait_in_sync(2, timeout_s=60)
    await group.create_topic("T", queues=1)
    async with Producer(group.namesrv_addr) as producer:
        sent = await send_all(producer, "T", count, size=100)
    assert {r.status for r in sent} == {SendStatus.SEND_OK}
    stored = {m.msg_id for m in await pull_all(group.broker_addrs[master], "T", 0, "broker-a")}
    assert {r.offset_msg_id for r in sent} <= stored, "an acknowledged message is lost"


@pytest.mark.parametrize("order", ["brokers-first", "all-at-once"])
async def test_a_group_started_in_either_order_elects_a_master(tmp_path, order):
    """The brokers started 2 s before any controller (they retry until one answers), or
    the brokers and controllers started at the same moment: either way one broker
    becomes master with the other in sync, and nothing acknowledged is lost."""
    group = LocalControllerGroup(tmp_path, replicas=2)
    try:
        await group.start_namesrv()
        if order == "brokers-first":
            await group.boot(*group.ids)
            await trio.sleep(2.0)
            await group.start_controllers(*group.CONTROLLERS)
        else:
            for name in group.CONTROLLERS:
                group.start_controller(name)
            await group.boot(*group.ids)
        await _serves_and_keeps(group)
    finally:
        group.stop()


async def test_controllers_restarted_under_running_brokers_change_nothing(tmp_path):
    """With the group serving: the controller leader restarted, then all three at once.
    The same master serves afterwards, both brokers in sync, and nothing acknowledged
    before, between or after is lost."""
    async with LocalControllerGroup(tmp_path, replicas=2) as group:
        master = await group.wait_in_sync(2)
        await _serves_and_keeps(group, 50)
        asked = await mqadmin("getControllerMetaData", "-a", group.controller_addrs["c0"])
        [leader] = re.findall(r"#ControllerLeaderId\t(\S+)", asked.stdout.decode())
        await group.restart(leader)
        await _serves_and_keeps(group, 50)
        for name in group.CONTROLLERS:
            group.kill(name)
        await group.start_controllers(*group.CONTROLLERS)
        await _serves_and_keeps(group, 50)
        assert await group.wait_master() == master


async def test_cluster_list_and_the_console_show_epochs_and_the_sync_state_set(tmp_path):
    """`mqadmin clusterList` adds #Epoch(InSync) for a cluster with controller-mode
    groups: each member's epoch, and the master's SyncStateSet; the console's group view
    carries the same."""
    async with LocalControllerGroup(tmp_path, replicas=2) as group:
        _, slave = await master_and_slave(group)
        async with Producer(group.namesrv_addr) as producer:
            await send_all(producer, "T", 1)
        await group.wait_replicated()
        slave_id = (await group.member_state(slave))["brokerId"]
        listed = await mqadmin("clusterList", "-n", group.namesrv_addr)
        lines = listed.stdout.decode().splitlines()
        assert listed.returncode == 0 and lines[0].split()[-1] == "#Epoch(InSync)", lines
        rows = {row[2]: row for row in (line.split() for line in lines[1:])}
        assert rows["0"][-1] == "1(1,2)", rows
        assert rows[slave_id][-1] == "1", rows
        async with console(group.namesrv_addr) as client:
            [view] = (await ok(await client.get("/api/cluster")))["groups"]
        assert view["syncStateSet"] == [1, 2]
        assert [m["masterEpoch"] for m in view["members"]] == [1, 1]


@pytest.mark.parametrize("replicas", [2, 3])
async def test_a_killed_master_is_replaced_within_a_second_and_rejoins_as_slave(tmp_path, replicas):
    """With three replicas a controller is killed first, not their leader: two
    controllers are enough. (A new controller leader waits out the brokers' heartbeat
    timeout before it elects, so a leader's kill would cost that, as measured apart.)"""
    async with LocalControllerGroup(tmp_path, replicas=replicas) as group:
        old = await group.wait_in_sync(replicas)
        await group.create_topic("T", queues=1)
        if replicas == 3:
            async with RemotingClient(group.controller_addrs["c1"]) as client:
                answer = await client.invoke(
                    RemotingCommand(RequestCode.CONTROLLER_GET_METADATA_INFO), 5.0
                )
            leader = answer.ext_fields["controllerLeaderId"]
            group.kill(next(c for c in ("c0", "c2") if c != leader))  # c1 is asked below
        async with Producer(group.namesrv_addr) as producer:
            before = await send_all(producer, "T", 200, size=100)
            assert {r.status for r in before} == {SendStatus.SEND_OK}
            group.kill(old)  # SIGKILL, right after the last acknowledgement
            killed = trio.current_time()
            waited_s, refused = await first_ack_s(producer, "T", killed)
            print(f"{replicas} replicas: first SEND_OK {waited_s:.3f} s after the kill")
            after = await send_all(producer, "T", 20, size=100)
        new = await group.wait_master(not_node=old)
        # the topic as created (1 queue) came with the CommitLog: it was not auto-created
        topics = json.loads((await group.broker_call(new, RequestCode.GET_ALL_TOPIC_CONFIG)).body)
        assert topics["topicConfigTable"]["T"]["writeQueueNums"] == 1
        acked = [r.offset_msg_id for r in before + after]
        stored = [m.msg_id for m in await pull_all(group.broker_addrs[new], "T", 0, "broker-a")]
        assert set(acked) <= set(stored), "an acknowledged message is lost"
        assert waited_s < FIRST_SEND_OK_S, (waited_s, refused)

        await group.restart(old)
        assert await group.wait_in_sync(replicas) == new
        state = await group.member_state(old)
        assert state["brokerId"] != "0" and state["masterEpoch"] == "2", state
        await group.wait_replicated()
        assert commitlog_files(group, old) == commitlog_files(group, new)

        sync = await mqadmin(
            "getSyncStateSet", "-a", group.controller_addrs["c1"], "-b", "broker-a"
        )
        text = sync.stdout.decode()
        assert sync.returncode == 0 and "#MasterEpoch\t2" in text, text
        assert f"#SyncStateSetNums\t{replicas}" in text, text
        epochs = await mqadmin("getBrokerEpoch", "-n", group.namesrv_addr, "-b", "broker-a")
        text = epochs.stdout.decode()
        assert epochs.returncode == 0, epochs.stderr
        end = (await group.member_state(new))["commitLogWriteOffset"]
        assert text.count("#Epoch: EpochEntry{epoch=1, startOffset=0, endOffset=") == replicas
        assert text.count(f", endOffset={end}}}") == replicas, text  # the last ends at max
        assert text.count("#Epoch: EpochEntry{epoch=2, startOffset=") == replicas, text


async def test_a_master_cut_off_from_the_controllers_stops_acknowledging_before_its_timeout(
    tmp_path,
):
    """Every controller paused (SIGSTOP): the master refuses sends once its lease is
    over, controllerHeartBeatTimeoutMills (3 s here) minus the margin after the last
    controller answer, so before any controller could take it for dead; resumed, it
    takes sends again. RocketMQ's master keeps acknowledging (#7017)."""
    timeout_s = 3.0
    conf = {"controllerHeartBeatTimeoutMills": str(int(timeout_s * 1000))}
    async with LocalControllerGroup(tmp_path, replicas=2, extra_conf=conf) as group:
        await group.wait_in_sync(2)
        await group.create_topic("T", queues=1)
        async with Producer(group.namesrv_addr, send_timeout_s=1.0) as producer:
            assert (await producer.send("T", b"before")).status is SendStatus.SEND_OK
            for name in group.CONTROLLERS:
                os.kill(group.pid(name), signal.SIGSTOP)
            paused = trio.current_time()
            try:
                while trio.current_time() - paused < 2 * timeout_s:
                    try:
                        await producer.send("T", b"during")
                    except SendError as exc:
                        refused_s, why = trio.current_time() - paused, str(exc)
                        break
                    await trio.sleep(0.05)
                else:
                    pytest.fail(f"sends still acknowledged {2 * timeout_s} s after the pause")
            finally:
                for name in group.CONTROLLERS:
                    os.kill(group.pid(name), signal.SIGCONT)
            print(f"refused {refused_s:.2f} s after the controllers' pause: {why}")
            assert refused_s < timeout_s, why
            assert "lost the controller" in why, why
            resumed = trio.current_time()
            waited_s, refused = await first_ack_s(producer, "T", resumed)
            assert waited_s < GIVE_UP_S, refused


async def test_the_failover_drill_on_a_controller_mode_group(tmp_path):
    """The users' drill (produce and consume through a master kill, then tally) on two
    replicas: nothing acknowledged is lost or delivered twice from the same queue
    position, and consumer offsets survive the switch."""
    tally = await run_drill(tmp_path, messages=400, senders=4, queues=4, replicas=2)
    print(f"controller-mode drill: first ack {tally.failover_ms:.0f} ms after the kill")
    assert tally.new_master and tally.new_master != tally.old_master
    assert not tally.lost, f"acknowledged but never consumed: {sorted(tally.lost)[:20]}"
    assert tally.order_violations == 0 and tally.redelivered == 0
    assert tally.committed_offsets == tally.max_offsets


async def test_the_old_master_cuts_what_it_alone_held_when_it_rejoins(tmp_path):
    """The slave paused (SIGSTOP): 24 MiB of sends are stored on the master, more than
    the sockets between them buffer, and answered FLUSH_SLAVE_TIMEOUT (not acknowledged
    with allAckInSyncStateSet; the master keeps the paused slave in its SyncStateSet for
    haHousekeepingInterval, 20 s here). The master is killed and the slave resumed: it copies
    what its socket held and is elected from the SyncStateSet without the rest. The
    old master restarted cuts its tail off (its epoch 1 ends where the slave's copy
    does) and its CommitLog ends byte-identical to the new master's."""
    # the master keeps the paused slave's connection (and so its SyncStateSet) throughout
    keep = {"haHousekeepingInterval": "20000"}
    async with LocalControllerGroup(tmp_path, replicas=2, extra_conf=keep) as group:
        old, slave = await master_and_slave(group)
        async with Producer(group.namesrv_addr, send_timeout_s=10.0) as producer:
            acked = await send_all(producer, "T", 20, size=100)
            assert {r.status for r in acked} == {SendStatus.SEND_OK}
            os.kill(group.pid(slave), signal.SIGSTOP)
            try:
                mq = MessageQueue("T", "broker-a", 0)
                codes = []

                async def send_large(client: RemotingClient, n: int) -> None:
                    body = b"%02d" % n + os.urandom(1 << 20)  # not compressible
                    request = send_request(RequestCode.SEND_MESSAGE_V2, "P", mq, body, "", 0)
                    codes.append((await client.invoke(request, 10.0)).code)

                client = RemotingClient(group.broker_addrs[old])
                async with client, trio.open_nursery() as nursery:
                    for n in range(24):
                        nursery.start_soon(send_large, client, n)
                assert codes == [ResponseCode.FLUSH_SLAVE_TIMEOUT] * 24, codes
                held = int((await group.member_state(old))["commitLogWriteOffset"])
                group.kill(old)
            finally:
                os.kill(group.pid(slave), signal.SIGCONT)
        assert await group.wait_master(not_node=old) == slave
        copied = int((await group.member_state(slave))["commitLogWriteOffset"])
        print(f"the old master held {held} bytes, the slave copied {copied}")
        assert copied < held, "the slave copied everything: nothing for the old master to cut"
        await group.restart(old)
        assert await group.wait_in_sync(2) == slave
        await group.wait_replicated()
        assert commitlog_files(group, old) == commitlog_files(group, slave)
        stored = [m.msg_id for m in await pull_all(group.broker_addrs[slave], "T", 0, "broker-a")]
        assert stored[: len(acked)] == [r.offset_msg_id for r in acked]


def cpp_send_until(cpp: rocketmq.client.Producer, stop: threading.Event, acked: list, failed: list):
    """RocketMQ's C++ client sending numbered messages until `stop`: (number, the time
    the send ended) of each SEND_OK, and the time of each failure (time.monotonic)."""
    n = 0
    while not stop.is_set():
        message = rocketmq.client.Message("T")
        message.set_body(b"cpp-%06d" % n)
        try:
            ok = cpp.send_sync(message).status == rocketmq.client.SendStatus.OK
        except RocketMQException:
            ok = False
        (acked.append((n, time.monotonic())) if ok else failed.append(time.monotonic()))
        n += 1
        time.sleep(0.01)


async def test_the_cpp_client_across_a_master_kill(tmp_path):
    """RocketMQ's C++ client (PyPI `rocketmq`) sends throughout a master's SIGKILL:
    nothing it had acknowledged is lost, and it has a SEND_OK again within a second of
    its send timeout (0.5 s here: a send caught by the kill may wait for it). A classic
    group's new master has another address, and this client asks the name server only
    at its route poll (3 s after its start, then every 30 s): it keeps the group
    address (`groupAddress`), which the new master serves once elected (0.02-0.50 s
    after the kill, 2026-11-29)."""
    async with LocalControllerGroup(tmp_path, replicas=2, group_address=True) as group:
        old = await group.wait_in_sync(2)
        await group.create_topic("T", queues=1)
        cpp = rocketmq.client.Producer("CPP", timeout=int(CPP_SEND_TIMEOUT_S * 1000))
        cpp.set_namesrv_addr(group.namesrv_addr)
        cpp.start()
        stop, acked, failed = threading.Event(), [], []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(trio.to_thread.run_sync, cpp_send_until, cpp, stop, acked, failed)
                )
                with trio.fail_after(30):
                    while len(acked) < 100:
                        await trio.sleep(0.05)
                group.kill(old)
                killed = time.monotonic()
                with trio.fail_after(60):
                    while not any(t > killed for _, t in acked):
                        await trio.sleep(0.05)
                await trio.sleep(0.5)
                stop.set()
        finally:
            stop.set()
            cpp.shutdown()
        new = await group.wait_master(not_node=old)
        first_s = min(t for _, t in acked if t > killed) - killed
        print(f"C++ client: first SEND_OK {first_s:.2f} s after the kill, {len(failed)} failed")
        stored = {m.body for m in await pull_all(group.broker_addrs[new], "T", 0, "broker-a")}
        lost = [n for n, _ in acked if b"cpp-%06d" % n not in stored]
        assert not lost, f"acknowledged to the C++ client and lost: {lost[:10]}"
        assert first_s < CPP_SEND_TIMEOUT_S + 1.0


async def test_a_paused_master_is_replaced_and_acknowledges_nothing_when_it_resumes(tmp_path):
    """The master paused (SIGSTOP) with the keys docs/controller.md gives for a silent
    master replaced within a second (FAST_FAILOVER): the controller elects the slave
    once the master's heartbeats lapse, and sends are acknowledged there. Resumed, the
    old master's lease is over: it refuses the sends still sent to it, then follows
    the new master as a slave."""
    conf = FAST_FAILOVER
    async with LocalControllerGroup(tmp_path, replicas=2, extra_conf=conf) as group:
        old, slave = await master_and_slave(group)
        async with Producer(group.namesrv_addr, send_timeout_s=15.0) as producer:
            before = await send_all(producer, "T", 50, size=100)
            os.kill(group.pid(old), signal.SIGSTOP)
            paused = trio.current_time()
            try:
                after = await producer.send("T", b"after the pause")
                waited_s = trio.current_time() - paused
                print(f"paused master: first SEND_OK {waited_s:.2f} s later")
                assert after.status is SendStatus.SEND_OK
                assert waited_s < PAUSED_FIRST_SEND_OK_S
                assert await group.wait_master(not_node=old) == slave
            finally:
                os.kill(group.pid(old), signal.SIGCONT)
            mq = MessageQueue("T", "broker-a", 0)
            request = send_request(RequestCode.SEND_MESSAGE_V2, "P", mq, b"stale", "", 0)
            async with RemotingClient(group.broker_addrs[old]) as client:
                answer = await client.invoke(request, 5.0)
            assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE, (answer.code, answer.remark)
            assert await group.wait_in_sync(2) == slave
        stored = [m.msg_id for m in await pull_all(group.broker_addrs[slave], "T", 0, "broker-a")]
        assert stored == [r.offset_msg_id for r in before] + [after.offset_msg_id]


async def dledger_cli(*args: str) -> str:
    """`dledger ARGS` as a process; its output (it must exit 0)."""
    done = await trio.run_process(
        [sys.executable, "-m", "raftmq.dledger.cli", *args],
        capture_stdout=True, capture_stderr=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_every_controller_replaced_while_brokers_run_and_fail_over(tmp_path):
    """The controllers are a DLedger group whose members change as any other's: each of
    c0, c1 and c2 is replaced in turn by a new controller (started with joinAsLearner,
    added and the old one removed, with `dledger addPeer`/`removePeer` on the peer port
    the first time and `mqadmin addControllerPeer`/`removeControllerPeer` asked of a
    controller the other two, the old one then stopped). The brokers, configured with
    the old three only, follow the group (the leader's CONTROLLER_GET_METADATA_INFO
    names the members in force), and a master killed afterwards is replaced by an
    election only the new controllers can make."""
    async with LocalControllerGroup(tmp_path, replicas=2) as group:
        old_master = await group.wait_in_sync(2)
        bad = await mqadmin("addControllerPeer", "-a", group.controller_addrs["c0"], "-m", "c9")
        assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1, bad
        assert b"expected id-host:port" in bad.stderr
        for new, old in (("c3", "c0"), ("c4", "c1"), ("c5", "c2")):
            joined = await group.join_controller(new)
            peers = ";".join(f"{c}-{a}" for c, a in group.controller_addrs.items() if c != new)
            asked = group.controller_addrs[old]  # the one leaving forwards its own removal
            if new == "c3":
                await dledger_cli("addPeer", "--group", "group1", "--peers", peers, "-m", joined)
            else:
                added = await mqadmin("addControllerPeer", "-a", asked, "-m", joined)
                assert added.returncode == 0, added.stderr
                assert re.search(rf"{new}\s+voter\s", added.stdout.decode()), added.stdout
            # as an operator must: let the brokers learn of the new controller (a refresh)
            # before the old one goes, or a group replaced faster has none they know
            await trio.sleep(CONTROLLERS_REFRESH_S + 1)
            if new == "c3":
                await dledger_cli("removePeer", "--group", "group1", "--peers", peers, "-m", old)
            else:
                removed = await mqadmin("removeControllerPeer", "-a", asked, "-m", old)
                assert removed.returncode == 0, removed.stderr
                assert old.encode() not in removed.stdout, removed.stdout
            group.kill(old)
            del group.controller_addrs[old]
        shown = await mqadmin("getControllerPeers", "-a", group.controller_addrs["c5"])
        assert shown.returncode == 0, shown.stderr
        rows = [line.split() for line in shown.stdout.decode().splitlines()[1:]]
        assert sorted((row[1], row[2]) for row in rows) == [
            ("c3", "voter"), ("c4", "voter"), ("c5", "voter")
        ], shown.stdout  # fmt: skip
        await group.create_topic("T", queues=1)
        async with Producer(group.namesrv_addr) as producer:
            before = await send_all(producer, "T", 20, size=100)
            group.kill(old_master)
            killed = trio.current_time()
            waited_s, refused = await first_ack_s(producer, "T", killed)
            print(f"new controllers: first SEND_OK {waited_s:.3f} s after the master's kill")
        new_master = await group.wait_master(not_node=old_master)
        stored = [
            m.msg_id for m in await pull_all(group.broker_addrs[new_master], "T", 0, "broker-a")
        ]
        assert {r.offset_msg_id for r in before} <= set(stored)
        assert waited_s < FIRST_SEND_OK_S, (waited_s, refused)


async def _query_offset(address: str, ext: dict, language: LanguageCode, version: int):
    async with RemotingClient(address) as client:
        request = RemotingCommand(
            code=RequestCode.QUERY_CONSUMER_OFFSET,
            language=language,
            version=version,
            ext_fields=ext,
        )
        return await client.invoke(request, 5.0)


async def test_a_slave_left_out_of_the_sync_state_set_does_not_move_a_group_back(tmp_path):
    """An offset committed while the slave was down (the master acknowledged it alone,
    its SyncStateSet shrunk to itself), then the master killed and the slave restarted:
    the slave holds only the older offset. A jepsen run saw such a slave answer it, and the
    group moved back. Now it answers clients that ask again on an error (ours, RocketMQ
    5's by version) SYSTEM_BUSY, naming why; older ones, which take any error for "no
    offset" and would skip to the queue's end, its own offset, as a RocketMQ slave does.
    The old master back, the committed offset is answered."""
    async with LocalControllerGroup(tmp_path, replicas=2) as group:
        master, slave = await master_and_slave(group)
        ext = {"consumerGroup": "CG", "topic": "T", "queueId": 0}
        first = await group.broker_call(
            master, RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": 3}
        )
        assert first.code == ResponseCode.SUCCESS, first.remark
        with trio.fail_after(15):  # the slave applies it once the master's confirmOffset comes
            while (
                await group.broker_call(slave, RequestCode.QUERY_CONSUMER_OFFSET, ext)
            ).ext_fields.get("offset") != "3":
                await trio.sleep(0.1)
        group.kill(slave, signal.SIGTERM)  # its checkpoints saved: it applies offset 3 again
        assert await group.wait_in_sync(1) == master
        second = await group.broker_call(
            master, RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": 7}
        )
        assert second.code == ResponseCode.SUCCESS, second.remark
        group.kill(master)
        await group.restart(slave)
        address = group.broker_addrs[slave]
        for language, version in (
            (LanguageCode.PYTHON, MQVersion.V4_9_8),
            (LanguageCode.JAVA, MQVersion.V5_0_0),
        ):
            answer = await _query_offset(address, ext, language, version)
            assert answer.code == ResponseCode.SYSTEM_BUSY, (language, answer)
            assert "not in the SyncStateSet" in answer.remark, answer.remark
        older = await _query_offset(address, ext, LanguageCode.CPP, MQVersion.V4_9_8)
        assert (older.code, older.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "3")
        await group.restart(master)
        assert await group.wait_in_sync(2) == master
        for node in (master, slave):
            answer = await group.broker_call(node, RequestCode.QUERY_CONSUMER_OFFSET, ext)
            assert (answer.code, answer.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "7")
