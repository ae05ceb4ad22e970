"""A DLedger broker group changing its members while our producer sends: `mqadmin
addDLedgerPeer`, `removeDLedgerPeer` and `getDLedgerPeers` against real brokers, asked
of a follower (which forwards to its DLedger leader) as well as of the master."""

from __future__ import annotations

import itertools
import time

import pytest
import trio

from raftmq.client import Producer
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import NO_ANSWER, consuming_all, mqadmin

TOPIC = "Members"


def peers_of(completed) -> dict[str, str]:
    """getDLedgerPeers' table: member -> role."""
    assert completed.returncode == 0, completed.stderr
    rows = [line.split() for line in completed.stdout.decode().splitlines()[1:] if line]
    return {row[1]: row[2] for row in rows}


@pytest.mark.processes
async def test_a_member_replaced_while_sending_loses_no_acknowledged_message(tmp_path):
    """3 brokers; a 4th joins (learner, then voter); the master is removed: 0 acked
    messages lost, and the worst gap between two acknowledged sends is reported."""
    async with LocalCluster(tmp_path, nodes=3) as cluster:
        await cluster.create_topic(TOPIC)
        master = await cluster.wait_master()
        follower = next(n for n in cluster.ids if n != master)
        acked: set[bytes] = set()
        ack_times_s: list[float] = []
        async with Producer(cluster.namesrv_addr, "members", send_timeout_s=3.0) as producer:

            async def send_all_along() -> None:
                for index in itertools.count():
                    try:
                        await producer.send(TOPIC, f"m{index}".encode())
                    except NO_ANSWER:
                        continue
                    acked.add(f"m{index}".encode())
                    ack_times_s.append(time.monotonic())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_all_along)
                await trio.sleep(1.0)
                joined = await cluster.join("n3")
                via = cluster.broker_addrs[follower]  # forwarded to the DLedger leader
                added = await mqadmin(
                    "addDLedgerPeer", "-n", cluster.namesrv_addr, "-b", via, "-m", joined
                )
                assert peers_of(added) == dict.fromkeys(["n0", "n1", "n2", "n3"], "voter")
                removed = await mqadmin(
                    "removeDLedgerPeer", "-n", cluster.namesrv_addr, "-b", via, "-m", master
                )
                assert master not in peers_of(removed)
                new_master = await cluster.wait_master(timeout_s=15.0, not_node=master)
                assert new_master != master
                await trio.sleep(1.5)
                nursery.cancel_scope.cancel()
        shown = peers_of(
            await mqadmin(
                "getDLedgerPeers", "-n", cluster.namesrv_addr, "-b", cluster.broker_addrs["n3"]
            )
        )
        assert sorted(shown) == sorted(n for n in cluster.ids if n != master)
        bad = await mqadmin("addDLedgerPeer", "-n", cluster.namesrv_addr, "-b", via, "-m", "n9")
        assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1, bad.stderr
        cluster.kill(master)  # removed: it takes no part any more

        worst_gap_s = max(b - a for a, b in itertools.pairwise(ack_times_s))
        print(f"acked {len(acked)}, worst gap between acks {worst_gap_s * 1000:.0f} ms")
        async with consuming_all(cluster.namesrv_addr, "members-reader", TOPIC, acked):
            pass  # every acknowledged message was consumed
        assert len(acked) > 100
        assert worst_gap_s < 2.0, worst_gap_s
