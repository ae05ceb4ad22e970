"""Real processes: POP consumers (normal and FIFO) on a 3-broker DLedger group whose
master is killed with SIGKILL mid-stream, then popping at the new master; one message
in ten is left un-acked at first, for a master to redeliver."""

from __future__ import annotations

import signal
import time

import attrs
import pytest
import trio

from raftmq.client import MessageQueue, Producer, SendError
from raftmq.client import pop as client
from raftmq.client.connections import ConnectionPool
from raftmq.protocol.pop import ReceiptHandle
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import NO_ANSWER

pytestmark = pytest.mark.processes

GROUP = "PopDrillGroup"
NORMAL, FIFO = "PopDrill", "PopDrillFifo"
MESSAGES = 300  # per topic
INVISIBLE_MS = 3000
ACK_MARGIN_MS = 200  # an ack answered this long before expiry retired the message


@attrs.define
class PopTally:
    acked_sends: dict[str, set[int]] = attrs.Factory(lambda: {NORMAL: set(), FIFO: set()})
    delivered: dict[str, set[int]] = attrs.Factory(lambda: {NORMAL: set(), FIFO: set()})
    # numbers whose ack was answered while they were still invisible: never again, with
    # the queue positions (queueId, offset) of the copies acked (None: a retry-topic copy)
    retired: dict[str, dict[int, set]] = attrs.Factory(lambda: {NORMAL: {}, FIFO: {}})
    # where each number is stored in its topic's queues: a producer's resend after an
    # unknown outcome stores a number twice, and its second copy is a new message
    stored_at: dict[str, dict[int, set]] = attrs.Factory(lambda: {NORMAL: {}, FIFO: {}})
    popped_after_ack: list[tuple[str, int]] = attrs.Factory(list)
    # FIFO: per queue, the numbers acknowledged, in the order acknowledged
    fifo_acked: dict[int, list[int]] = attrs.Factory(dict)
    pops_at_new_master: int = 0
    redelivered: set[int] = attrs.Factory(set)  # NORMAL numbers popped again, as planned

    def popped(self, topic: str, number: int, handle: ReceiptHandle) -> tuple | None:
        """Record a delivery; its queue position, None for a copy from the retry topic."""
        position = (handle.queue_id, handle.queue_offset) if handle.topic_type == 0 else None
        if position is not None:
            self.stored_at[topic].setdefault(number, set()).add(position)
        acked = self.retired[topic].get(number)
        copies = len(self.stored_at[topic].get(number, ()))
        # the acked copy again, or (from the retry topic) a number stored only once
        if acked is not None and (position in acked if position else copies < 2):
            self.popped_after_ack.append((topic, number))
        self.delivered[topic].add(number)
        return position

    def lost(self, topic: str) -> set[int]:
        return self.acked_sends[topic] - self.delivered[topic]

    def not_redelivered(self) -> set[int]:
        """Numbers left un-acked on purpose (`skipped`) that have not come back."""
        return {n for n in self.acked_sends[NORMAL] if skipped(n)} - self.redelivered


def skipped(number: int) -> bool:
    """The consumer leaves these un-acked at their first delivery: the master (the old
    one or the new) must redeliver them after their invisible time."""
    return number % 10 == 5


async def test_pop_consumers_lose_nothing_and_see_no_committed_ack_again_across_a_master_kill(
    tmp_path,
):
    tally = PopTally()
    async with LocalCluster(tmp_path, nodes=3) as cluster, ConnectionPool() as pool:
        old_master = await cluster.wait_master()
        await cluster.create_topic(NORMAL, 4)
        await cluster.create_topic(FIFO, 2)
        master = {"address": await cluster.master_address(), "killed": False}
        done = trio.Event()

        async def consume(topic: str, order: bool) -> None:
            while not done.is_set():
                address = master["address"]
                try:
                    result = await client.pop(
                        pool, address, cluster.broker_name, GROUP, topic, max_nums=8,
                        invisible_ms=INVISIBLE_MS, poll_ms=500, order=order,
                    )  # fmt: skip
                except NO_ANSWER:
                    await trio.sleep(0.05)
                    master["address"] = await cluster.master_address() or address
                    continue
                if master["killed"] and result.messages:
                    tally.pops_at_new_master += 1
                for popped in result.messages:
                    number = int(popped.message.body)
                    position = tally.popped(topic, number, popped.handle)
                    if not order and skipped(number):
                        if popped.reconsume_times == 0:
                            continue
                        tally.redelivered.add(number)
                    try:
                        await client.ack(pool, address, GROUP, topic, popped.handle)
                    except NO_ANSWER:
                        break  # the rest of the batch comes back after its invisible time
                    if time.time() * 1000 < popped.handle.visible_at_ms - ACK_MARGIN_MS:
                        tally.retired[topic].setdefault(number, set()).add(position)
                    if order:
                        tally.fifo_acked.setdefault(popped.handle.queue_id, []).append(number)

        async def send(producer: Producer, topic: str, queues: int) -> None:
            for number in range(MESSAGES):
                if topic == NORMAL and number == MESSAGES // 3:
                    cluster.kill(old_master, signal.SIGKILL)
                    new = await cluster.wait_master(not_node=old_master)
                    master["address"], master["killed"] = cluster.client_addrs[new], True
                queue = MessageQueue(topic, cluster.broker_name, number % queues)
                try:
                    await producer.send(topic, b"%d" % number, queue=queue)
                except SendError:
                    continue
                tally.acked_sends[topic].add(number)

        producer = Producer(cluster.namesrv_addr, send_timeout_s=10.0)
        async with producer, trio.open_nursery() as nursery:
            nursery.start_soon(consume, NORMAL, False)
            nursery.start_soon(consume, FIFO, True)
            async with trio.open_nursery() as senders:
                senders.start_soon(send, producer, NORMAL, 4)
                senders.start_soon(send, producer, FIFO, 2)
            with trio.move_on_after(60):
                while tally.lost(NORMAL) or tally.lost(FIFO) or tally.not_redelivered():
                    await trio.sleep(0.1)
            await trio.sleep(INVISIBLE_MS / 1000 + 1)  # a redelivery would show by now
            done.set()
    print(
        f"sends acknowledged {len(tally.acked_sends[NORMAL])}+{len(tally.acked_sends[FIFO])}, "
        f"retired {len(tally.retired[NORMAL])}+{len(tally.retired[FIFO])}, "
        f"pops at the new master {tally.pops_at_new_master}, numbers stored twice "
        f"{sum(len(p) > 1 for t in (NORMAL, FIFO) for p in tally.stored_at[t].values())}"
    )
    assert len(tally.acked_sends[NORMAL]) >= MESSAGES * 0.9
    assert not tally.lost(NORMAL), sorted(tally.lost(NORMAL))[:20]
    assert not tally.lost(FIFO), sorted(tally.lost(FIFO))[:20]
    assert tally.popped_after_ack == []
    assert not tally.not_redelivered(), sorted(tally.not_redelivered())
    assert tally.pops_at_new_master > 0
    for queue_id, numbers in tally.fifo_acked.items():
        # one sender per queue, in order: a queue's order is the send order (a resend
        # after an unknown outcome repeats a number next to itself)
        assert numbers == sorted(numbers), (queue_id, numbers)
        assert {n % 2 for n in numbers} == {queue_id}
