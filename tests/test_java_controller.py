"""Controller mode with Apache RocketMQ 5.3's own Java broker and controllers as peers.

raftmq says its controller-mode brokers speak RocketMQ 5's controller requests, its
AutoSwitch HA protocol and its epoch file byte for byte. Here a 2-replica group has one
raftmq broker and one RocketMQ 5.3 BrokerStartup (rocketmq-broker 5.3.3,
`bench.java_brokers.MixedControllerGroup`), both from RocketMQ's quick-start keys
(brokerId=-1, brokerRole=SLAVE, allAckInSyncStateSet=true), under three controllers that
are raftmq's, or RocketMQ's own ControllerStartup: real processes over TCP.

Whichever broker the controllers make master first, the test has each kind serve as
master with the other as its slave: the master is SIGKILLed, the slave is elected, and
the old master, restarted, rejoins as the new master's slave. Throughout:

- the master acknowledges a send only once its slave of the other kind has it (the
  slave stopped, a send is answered FLUSH_SLAVE_TIMEOUT, not SEND_OK);
- the two CommitLogs end the same bytes, file for file, and so do the epoch files;
- both brokers serve every acknowledged message from their own ConsumeQueues.
"""

from __future__ import annotations

import pytest
import trio

from bench.java_brokers import MixedControllerGroup
from raftmq.client import Producer
from raftmq.client.admin import Admin
from raftmq.client.producer import SendStatus
from tests.helpers import pull_all, send_all, stopped
from tests.test_java_ha import FILE_BYTES, same_files

pytestmark = [pytest.mark.processes, pytest.mark.requires("rocketmq-java"), pytest.mark.untimed]

QUEUES = 2


async def stored_msg_ids(group: MixedControllerGroup, node: str) -> list[str]:
    """The offset msgIds `node` serves from topic T's ConsumeQueues."""
    pulled = []
    for queue_id in range(QUEUES):
        pulled += await pull_all(group.broker_addrs[node], "T", queue_id, group.broker_name)
    return sorted(m.msg_id for m in pulled)


async def refused_while_stopped(group: MixedControllerGroup, producer: Producer, slave: str):
    """A send while `slave` is SIGSTOPped: its master must not acknowledge it. The
    slave is first seen in the controllers' SyncStateSet and in the master's own (its
    HARuntimeInfo, as `mqadmin haStatus` shows it): a slave dropped from the set (a
    reconnect on a loaded machine) is one the master rightly no longer waits for, and a
    RocketMQ 5.3 master whose AlterSyncStateSet reply was lost counts acks against its
    old set until its next read of the controller's (RocketMQ #5663; raftmq's counts
    the union until it knows, docs/controller.md)."""
    master = await group.wait_in_sync(2)
    await master_counts_in_sync(group, master, 1)
    before = await diagnosis(group, master)
    with stopped(group.procs[slave].pid):
        result = await producer.send("T", b"while the slave is stopped")
        if result.status is not SendStatus.FLUSH_SLAVE_TIMEOUT:
            print("before the stop:", before)
            print("after the send:", await diagnosis(group, master))
        assert result.status is SendStatus.FLUSH_SLAVE_TIMEOUT, result
        return result


async def master_counts_in_sync(
    group: MixedControllerGroup, master: str, slaves: int, timeout_s: float = 30.0
) -> None:
    """Wait until `master`'s own HARuntimeInfo counts `slaves` slaves in sync."""
    async with Admin([group.namesrv_addr]) as admin:
        with trio.fail_after(timeout_s):
            while (await admin.ha_status(group.broker_addrs[master])).get(
                "inSyncSlaveNums"
            ) != slaves:
                await trio.sleep(0.1)


async def diagnosis(group: MixedControllerGroup, master: str) -> dict:
    """What a failure prints: the controllers' view of the group, and the master's own
    (its HARuntimeInfo, which RocketMQ 5.3's broker answers too)."""
    kind = "java" if master in group.java else "raftmq"
    async with Admin([group.namesrv_addr]) as admin:
        ha = await admin.ha_status(group.broker_addrs[master])
    return {"master": f"{master} ({kind})", "controllers": await group.sync_state(), "ha": ha}


@pytest.mark.parametrize("controllers", ["raftmq", "java"])
async def test_a_java_broker_and_a_raftmq_broker_fail_over_to_each_other(tmp_path, controllers):
    conf = {"mappedFileSizeCommitLog": str(FILE_BYTES), "slaveTimeout": "1000"}
    group = MixedControllerGroup(
        tmp_path,
        java={"n1"},
        java_controllers=controllers == "java",
        replicas=2,
        extra_conf=conf,
    )
    async with group:
        first = await group.wait_in_sync(2)
        [second] = [n for n in group.ids if n != first]
        await group.create_topic("T", queues=QUEUES)
        async with Producer(group.namesrv_addr, send_timeout_s=20) as producer:
            sent = await send_all(producer, "T", 1500)
            late = [await refused_while_stopped(group, producer, second)]

            group.kill(first)  # the other kind is elected from the SyncStateSet
            assert await group.wait_in_sync(1) == second
            sent += await send_all(producer, "T", 1500)
            await group.restart(first)  # and the old master rejoins as its slave
            assert await group.wait_in_sync(2) == second
            sent += await send_all(producer, "T", 500)
            late.append(await refused_while_stopped(group, producer, first))

        assert {r.status for r in sent} == {SendStatus.SEND_OK}
        await group.wait_caught_up()
        same_files(group)
        epochs = [(group.store_dir(n) / "epochFileCheckpoint").read_bytes() for n in group.ids]
        assert epochs[0] == epochs[1]
        acknowledged = {r.offset_msg_id for r in sent}
        for node in group.ids:
            stored = await stored_msg_ids(group, node)
            assert len(stored) == len(set(stored)), f"{node} serves a message twice"
            # the sends answered FLUSH_SLAVE_TIMEOUT were stored by the master all the same
            assert set(stored) - acknowledged <= {r.offset_msg_id for r in late}
            assert acknowledged <= set(stored), f"{node} lost acknowledged messages"
