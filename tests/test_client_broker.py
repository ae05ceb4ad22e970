"""The client against real processes: a name server and a 3-member DLedger broker group.

One LocalCluster serves the module (booting it is most of the time); the test that
kills the master runs last. Retry delays are 1 s so a send-back returns at a test's
pace.
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio

from raftmq.client import (
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendError,
)
from raftmq.protocol.message import MessageExt
from raftmq.tools.broker_local import LocalCluster

pytestmark = pytest.mark.processes

FAST_DELAY_LEVELS = " ".join(["1s"] * 18)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(
        tmp_path_factory.mktemp("client"), extra_conf={"messageDelayLevel": FAST_DELAY_LEVELS}
    )
    trio.run(local.__aenter__)
    try:
        yield local
    finally:
        local.stop()


async def pull_all(consumer: PullConsumer, topic: str) -> list[MessageExt]:
    messages = []
    for mq in await consumer.fetch_queues(topic):
        offset = 0
        while True:
            result = await consumer.pull(mq, offset)
            if result.status is not PullStatus.FOUND:
                assert result.status is PullStatus.NO_NEW_MSG
                break
            messages += result.messages
            offset = result.next_begin_offset
    return messages


class Collector:
    """A push handler that records deliveries, fails chosen bodies once, and wakes a
    waiter when a condition on what it has seen holds."""

    def __init__(self, fail_once: set[bytes] = frozenset()) -> None:
        self.delivered: list[MessageExt] = []
        self.fail_once = set(fail_once)
        self.changed = trio.Event()

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        self.delivered += msgs
        self.changed.set()
        self.changed = trio.Event()
        return not any(m.body in self.fail_once and m.reconsume_times == 0 for m in msgs)

    async def wait_until(self, condition) -> None:
        while not condition():
            await self.changed.wait()


def push(namesrv: str, group: str, topic: str, handler) -> PushConsumer:
    return PushConsumer(
        namesrv,
        group,
        topic,
        handler,
        consume_from="CONSUME_FROM_FIRST_OFFSET",
        rebalance_interval_s=1,
        persist_interval_s=0.5,
    )


async def test_produce_then_pull_everything_back(cluster):
    topic = "ClientPull"
    await cluster.create_topic(topic, 4)
    with trio.fail_after(30):
        async with Producer(cluster.namesrv_addr) as producer:
            results = []

            async def send(i: int) -> None:
                results.append((b"%d" % i, await producer.send(topic, b"%d" % i, tags="t")))

            async with trio.open_nursery() as senders:  # pipelined on one connection
                for i in range(200):
                    senders.start_soon(send, i)
            batch = await producer.send_batch(topic, [Message(b"b%d" % i) for i in range(5)])
        async with PullConsumer(cluster.namesrv_addr, "client-pull") as consumer:
            messages = await pull_all(consumer, topic)
    by_key = {m.uniq_key: m for m in messages}
    assert len(by_key) == len(messages) == 205
    for body, result in results:
        stored = by_key[result.msg_id]
        assert stored.body == body and stored.tags == "t" and stored.topic == topic
        assert stored.msg_id == result.offset_msg_id
        assert (stored.queue_id, stored.queue_offset) == (
            result.message_queue.queue_id,
            result.queue_offset,
        )
    batch_keys = batch.msg_id.split(",")
    stored = [by_key[k] for k in batch_keys]
    assert [m.body for m in stored] == [b"b%d" % i for i in range(5)]
    assert [m.queue_offset for m in stored] == list(
        range(batch.queue_offset, batch.queue_offset + 5)
    )
    assert len({m.queue_id for m in stored}) == 1


async def test_push_group_of_two_consumes_each_message_once(cluster):
    topic, group = "ClientPush", "client-push"
    await cluster.create_topic(topic, 4)
    first, second = Collector(fail_once={b"7"}), Collector(fail_once={b"7"})
    count = 100

    def handled() -> Counter:
        ok = [m for c in (first, second) for m in c.delivered]
        return Counter(m.body for m in ok if m.body != b"7" or m.reconsume_times == 1)

    def two_of_topic(queues: frozenset[MessageQueue]) -> bool:
        return sum(mq.topic == topic for mq in queues) == 2

    with trio.fail_after(30):
        async with (
            push(cluster.namesrv_addr, group, topic, first) as a,
            push(cluster.namesrv_addr, group, topic, second) as b,
        ):
            await a.wait_for_assignment(two_of_topic)
            await b.wait_for_assignment(two_of_topic)
            async with Producer(cluster.namesrv_addr) as producer:
                for i in range(count):
                    await producer.send(topic, b"%d" % i)
            both = trio.Event()

            async def watch(collector: Collector) -> None:
                await collector.wait_until(lambda: len(handled()) == count)
                both.set()

            async with trio.open_nursery() as watchers:
                watchers.start_soon(watch, first)
                watchers.start_soon(watch, second)
                await both.wait()
                watchers.cancel_scope.cancel()
        async with PullConsumer(cluster.namesrv_addr, group) as reader:
            for mq in await reader.fetch_queues(topic):
                assert await reader.query_offset(mq) == await reader.max_offset(mq)
    assert handled() == Counter(b"%d" % i for i in range(count))  # each exactly once
    assert first.delivered and second.delivered
    (retried,) = [m for m in first.delivered + second.delivered if m.reconsume_times]
    assert (retried.body, retried.topic) == (b"7", topic)


async def test_producer_and_consumer_continue_across_a_master_kill(cluster):
    topic, group = "ClientFailover", "client-failover"
    await cluster.create_topic(topic, 4)
    collector = Collector()
    acked: dict[str, bytes] = {}  # UNIQ_KEY -> body
    unknown: set[bytes] = set()
    killed = trio.Event()
    after_kill = 0

    async def sender(worker: int, producer: Producer) -> None:
        nonlocal after_kill
        for i in range(100_000):
            body = b"%d-%d" % (worker, i)
            try:
                result = await producer.send(topic, body)
            except SendError as exc:
                assert exc.indeterminate, exc  # a refusal would mean a lost master
                unknown.add(body)
                continue
            acked[result.msg_id] = body
            after_kill += killed.is_set()

    with trio.fail_after(40):
        async with (
            push(cluster.namesrv_addr, group, topic, collector),
            Producer(cluster.namesrv_addr, send_timeout_s=10) as producer,
        ):
            async with trio.open_nursery() as senders:
                for worker in range(4):
                    senders.start_soon(sender, worker, producer)
                while len(acked) < 100:
                    await trio.sleep(0.01)
                old = await cluster.wait_master()
                cluster.kill(old)
                killed.set()
                await cluster.wait_master(not_node=old)
                while after_kill < 100:
                    await trio.sleep(0.01)
                senders.cancel_scope.cancel()
            consumed = lambda: {m.uniq_key for m in collector.delivered}  # noqa: E731
            await collector.wait_until(lambda: set(acked) <= consumed())
    bodies = {m.uniq_key: m.body for m in collector.delivered}
    assert all(bodies[key] == body for key, body in acked.items())
