"""Classic master/slave HA with Apache RocketMQ's own 4.9 Java broker as the partner.

raftmq says its classic CommitLog and HA protocol are RocketMQ's byte for byte; here
RocketMQ's BrokerStartup (rocketmq-broker 4.9.7, bench/java_brokers.py) is the other
member of a classic group, as real processes over TCP:

- a Java SYNC_MASTER with a raftmq SLAVE: the slave's CommitLog files come out
  identical to the master's through a restart of the Java master under load, and the
  slave serves every acknowledged message from its own ConsumeQueues;
- a raftmq SYNC_MASTER with a Java SLAVE: the same files, and the master acknowledges
  a send only once the Java slave has it (a stopped Java slave gets
  FLUSH_SLAVE_TIMEOUT, RocketMQ's answer, never SEND_OK), and serves the Java slave's
  topic sync on RocketMQ's VIP channel (`fastListenPort`, listenPort - 2).
"""

from __future__ import annotations

import pytest
import trio

from bench.java_brokers import MixedClassicGroup
from raftmq.client import Producer
from raftmq.client.producer import SendStatus
from tests.helpers import commitlog_files, pull_all, send_all, stopped

pytestmark = [pytest.mark.processes, pytest.mark.requires("rocketmq-java"), pytest.mark.untimed]

FILE_BYTES = 1 << 20  # small CommitLog files (mappedFileSizeCommitLog): several fill up


async def caught_up(group: MixedClassicGroup, timeout_s: float = 30.0) -> None:
    """Until the slave's CommitLog ends where the master's does (both report
    commitLogMaxOffset, Java's broker and ours)."""
    with trio.fail_after(timeout_s):
        while len({(await group.member_state(n))["commitLogMaxOffset"] for n in group.ids}) > 1:
            await trio.sleep(0.2)


def same_files(group: MixedClassicGroup) -> None:
    """The two members' CommitLog files are the same bytes. A Java broker maps its next
    file before it needs it (AllocateMappedFileService): a file only one side has must
    be empty."""
    master, slave = commitlog_files(group, "n0"), commitlog_files(group, "n1")
    both = set(master) & set(slave)
    assert len(both) >= 2, (sorted(master), sorted(slave))  # a file ended by a BLANK record
    assert {name: master[name] for name in both} == {name: slave[name] for name in both}
    for name, data in {**master, **slave}.items():
        assert name in both or not any(data), f"{name} is on one side only and not empty"


async def test_a_raftmq_slave_copies_a_java_sync_master_byte_for_byte(tmp_path):
    conf = {"mappedFileSizeCommitLog": str(FILE_BYTES)}
    group = MixedClassicGroup(tmp_path, java={"n0"}, master_role="SYNC_MASTER", extra_conf=conf)
    async with group:
        await group.create_topic("Mixed", queues=2)
        async with Producer(group.namesrv_addr, send_timeout_s=20) as producer:
            first = await send_all(producer, "Mixed", 1500)
            group.kill("n0")  # SIGKILL the Java master, then start it again on its store
            await group.restart("n0")
            await group.wait_slaves(1)
            second = await send_all(producer, "Mixed", 1500)
        results = first + second
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        await caught_up(group)
        same_files(group)
        with trio.fail_after(30):  # the slave syncs topics from the master every 10 s
            while "Mixed" not in await group.topics("n1"):
                await trio.sleep(0.5)
        on_slave = []
        for queue_id in (0, 1):
            on_slave += await pull_all(group.broker_addrs["n1"], "Mixed", queue_id, "broker-a")
        assert sorted(m.msg_id for m in on_slave) == sorted(r.offset_msg_id for r in results)


async def test_a_raftmq_sync_master_acks_only_what_its_java_slave_has(tmp_path):
    conf = {"mappedFileSizeCommitLog": str(FILE_BYTES), "slaveTimeout": "1000"}
    group = MixedClassicGroup(tmp_path, java={"n1"}, master_role="SYNC_MASTER", extra_conf=conf)
    async with group:
        await group.create_topic("Mixed", queues=2)
        async with Producer(group.namesrv_addr, send_timeout_s=20) as producer:
            # a Java slave reports its offset first haSendHeartbeatInterval (5 s) after
            # it connects; until then it cannot acknowledge: SLAVE_NOT_AVAILABLE
            with trio.fail_after(20):
                while (await producer.send("Mixed", b"probe")).status is not SendStatus.SEND_OK:
                    await trio.sleep(0.2)
            results = await send_all(producer, "Mixed", 3000)
            assert {r.status for r in results} == {SendStatus.SEND_OK}
            await caught_up(group)
            same_files(group)
            with stopped(group.procs["n1"].pid):  # the Java slave stops answering
                late = await producer.send("Mixed", b"while the slave is stopped")
            assert late.status is SendStatus.FLUSH_SLAVE_TIMEOUT
            with trio.fail_after(20):  # the slave resumes: acknowledged again
                while (await producer.send("Mixed", b"after")).status is not SendStatus.SEND_OK:
                    await trio.sleep(0.2)
        await caught_up(group)
        same_files(group)
        # the Java slave syncs topics from its master's VIP channel (fastListenPort),
        # every 10 s
        with trio.fail_after(30):
            while "Mixed" not in await group.topics("n1"):
                await trio.sleep(0.5)
