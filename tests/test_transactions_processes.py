"""Transactions across a master kill, with real processes: a name server and a
3-member DLedger broker group. Transactions committed, rolled back and left to the
check-back, some before and some after the kill: consumers see exactly the committed
ones, once each."""

from __future__ import annotations

from collections import Counter

import pytest
import trio

from raftmq.client import LocalTransactionState, PullConsumer, PullStatus, TransactionProducer
from raftmq.tools.broker_local import LocalCluster

pytestmark = pytest.mark.processes

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
TOPIC = "TxOrders"
# Long enough that the check-back of what was sent before the kill falls to the new master.
CONF = {"transactionTimeOut": "3000", "transactionCheckInterval": "500"}


async def everything(consumer: PullConsumer) -> Counter:
    """How often each body is stored in the topic, read from offset 0 of every queue."""
    seen: Counter = Counter()
    for mq in await consumer.fetch_queues(TOPIC):
        offset = 0
        while True:
            result = await consumer.pull(mq, offset)
            if result.status is not PullStatus.FOUND:
                break
            seen.update(m.body for m in result.messages)
            offset = result.next_begin_offset
    return seen


async def test_transactions_across_a_master_kill(tmp_path):
    checked: list[bytes] = []

    def check(msg) -> LocalTransactionState:
        checked.append(msg.body)
        return COMMIT if msg.body.startswith(b"commit") else ROLLBACK

    async def round_of(producer: TransactionProducer, tag: str) -> set[bytes]:
        """Four kinds of transaction, three each; returns the bodies to be committed."""
        committed = set()
        for n in range(3):
            for decision, local in (
                ("commit-direct", COMMIT),
                ("rollback-direct", ROLLBACK),
                ("commit-check", UNKNOW),
                ("rollback-check", UNKNOW),
            ):
                body = f"{decision}-{tag}-{n}".encode()
                result = await producer.send_in_transaction(TOPIC, body, lambda _r, s=local: s)
                assert result.local_state is local
                if decision.startswith("commit"):
                    committed.add(body)
        return committed

    async with LocalCluster(tmp_path, extra_conf=CONF) as cluster:
        await cluster.create_topic(TOPIC, 2)
        with trio.fail_after(60):
            async with (
                TransactionProducer(
                    cluster.namesrv_addr,
                    "PG_TX",
                    check=check,
                    send_timeout_s=10,
                    poll_name_server_interval_s=1,
                ) as producer,
                PullConsumer(cluster.namesrv_addr, "CG_TX") as consumer,
            ):
                expected = await round_of(producer, "before")
                old = await cluster.wait_master()
                cluster.kill(old)
                await cluster.wait_master(not_node=old)
                expected |= await round_of(producer, "after")
                while set(await everything(consumer)) != expected:
                    await trio.sleep(0.2)
                await trio.sleep(2)  # more check runs: nothing else may appear
                seen = await everything(consumer)
    assert set(seen) == expected
    assert all(count == 1 for count in seen.values()), seen
    asked = {body.rsplit(b"-", 2)[0] for body in checked}
    assert asked == {b"commit-check", b"rollback-check"}  # only the open ones were asked
    assert {b for b in checked if b"-before-" in b}  # ...including those open at the kill
