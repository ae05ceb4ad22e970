"""The failover drill users run: produce and consume through a master kill, then tally.

A name server and a 3-broker DLedger group (or, with `replicas`, three controllers and
a controller-mode group of that many brokers) run as real processes. Producers send
numbered messages while a push-consumer group consumes them; mid-way the master
is killed with SIGKILL. The drill records when the new master acknowledged its
first send, lets the consumers drain, restarts the killed broker, and counts:
sent, acknowledged, not acknowledged (refused, or outcome unknown), consumed, lost
(acknowledged but never consumed: must be 0), duplicated (deliveries beyond the
first), and queue-order violations (a queue delivered out of offset order).
"""

from __future__ import annotations

import signal

import attrs
import trio

from raftmq.client import ConsumeFromWhere, Producer, PushConsumer, SendError
from raftmq.tools.broker_local import LocalCluster, LocalControllerGroup

TOPIC = "DrillTopic"
GROUP = "DrillGroup"


@attrs.define
class Tally:
    sent: int = 0
    acked: set[int] = attrs.Factory(set)
    unknown: set[int] = attrs.Factory(set)
    refused: int = 0
    consumed: dict[int, int] = attrs.Factory(dict)  # message number -> deliveries
    # Deliveries of a stored message (queue, offset) already delivered. Distinct from
    # `duplicated`, which also counts a number a producer stored twice (a retry after
    # an unknown outcome): the one consumer keeps its queues across the failover, so
    # it must never be handed the same stored message again.
    redelivered: int = 0
    order_violations: int = 0
    old_master: str = ""
    new_master: str = ""
    failover_ms: float | None = None
    committed_offsets: dict[int, int] = attrs.Factory(dict)
    max_offsets: dict[int, int] = attrs.Factory(dict)

    @property
    def lost(self) -> set[int]:
        return self.acked - set(self.consumed)

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for n in self.consumed.values())


async def run_drill(
    base_dir,
    messages: int = 2000,
    senders: int = 16,
    queues: int = 4,
    say=lambda text: None,
    *,
    group_address: bool = False,
    replicas: int | None = None,
) -> Tally:
    """The drill on a fresh group under `base_dir` (with a group address if asked:
    clients then dial the address that follows the master, LocalCluster's `group_addr`;
    with `replicas`, a controller-mode group of that many brokers)."""
    tally = Tally()
    last_offset: dict[int, int] = {}
    delivered: set[tuple[int, int]] = set()

    async def handler(msgs) -> bool:
        for msg in msgs:
            if msg.topic != TOPIC:
                continue
            number = int(msg.body.split(b":")[0])
            tally.consumed[number] = tally.consumed.get(number, 0) + 1
            position = (msg.queue_id, msg.queue_offset)
            tally.redelivered += position in delivered
            delivered.add(position)
            previous = last_offset.get(msg.queue_id, -1)
            if msg.queue_offset <= previous and tally.consumed[number] == 1:
                tally.order_violations += 1
            last_offset[msg.queue_id] = max(previous, msg.queue_offset)
        return True

    if replicas is None:
        group: LocalCluster = LocalCluster(base_dir, group_address=group_address)
    else:
        group = LocalControllerGroup(base_dir, replicas=replicas)
    async with group as cluster:
        tally.old_master = await cluster.wait_master()
        say(
            f"name server {cluster.namesrv_addr}; brokers "
            + ", ".join(f"{n}={a}" for n, a in cluster.broker_addrs.items())
        )
        say(f"master is {tally.old_master} (brokerId 0)")
        await cluster.create_topic(TOPIC, queues)
        kill_at = messages // 2
        killed = trio.Event()
        killed_at = [0.0]
        next_number = iter(range(messages))

        async def sender(producer: Producer) -> None:
            for number in next_number:
                if number == kill_at:
                    killed_at[0] = trio.current_time()
                    cluster.kill(tally.old_master, signal.SIGKILL)
                    killed.set()
                    say(f"sent {number}; killed master {tally.old_master} with SIGKILL")
                tally.sent += 1
                started_after_kill = killed.is_set()
                try:
                    await producer.send(TOPIC, b"%d:drill" % number, tags="drill")
                except SendError as exc:
                    if exc.indeterminate:
                        tally.unknown.add(number)
                    else:
                        tally.refused += 1
                    continue
                tally.acked.add(number)
                if started_after_kill and tally.failover_ms is None:
                    tally.failover_ms = (trio.current_time() - killed_at[0]) * 1000.0

        consumer = PushConsumer(
            cluster.namesrv_addr, GROUP, TOPIC, handler,
            consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            rebalance_interval_s=1.0, persist_interval_s=0.5,
        )  # fmt: skip
        async with consumer, Producer(cluster.namesrv_addr, send_timeout_s=10.0) as producer:
            async with trio.open_nursery() as nursery:
                for _ in range(senders):
                    nursery.start_soon(sender, producer)
            tally.new_master = await cluster.wait_master(not_node=tally.old_master)
            say(
                f"new master {tally.new_master}; first send acknowledged "
                f"{tally.failover_ms or float('nan'):.0f} ms after the kill"
            )
            with trio.move_on_after(30):
                while tally.lost:
                    await trio.sleep(0.05)
            await trio.sleep(1.5)  # one more offset persist round
        await cluster.restart(tally.old_master)
        say(f"restarted {tally.old_master}; it rejoins as a slave")
        master = await cluster.wait_master()
        for queue_id in range(queues):
            ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id}
            answer = await cluster.broker_call(master, 14, ext)
            tally.committed_offsets[queue_id] = int(answer.ext_fields.get("offset", -1))
            answer = await cluster.broker_call(master, 30, {"topic": TOPIC, "queueId": queue_id})
            tally.max_offsets[queue_id] = int(answer.ext_fields["offset"])
    return tally


def summary(tally: Tally) -> str:
    header = (
        f"{'sent':>8} {'acked':>8} {'unacked':>8} {'consumed':>9} {'lost':>6} "
        f"{'duplicated':>11} {'failover':>9}"
    )
    failover = f"{tally.failover_ms:.0f}ms" if tally.failover_ms is not None else "-"
    row = (
        f"{tally.sent:>8} {len(tally.acked):>8} {len(tally.unknown) + tally.refused:>8} "
        f"{len(tally.consumed):>9} {len(tally.lost):>6} {tally.duplicated:>11} {failover:>9}"
    )
    return f"{header}\n{row}"
