"""The push consumer against a real name server and in-process broker members (through
relays that record what it sends, where a test looks): queue
order, committed offsets, rebalancing a group on NOTIFY_CONSUMER_IDS_CHANGED, and
redelivery of failed messages through the retry topic."""

from __future__ import annotations

import json
from collections import Counter

import trio

from raftmq.client import MessageQueue, Producer, PullConsumer, PushConsumer
from raftmq.protocol.message import MessageExt
from raftmq.remoting import RequestCode
from tests.helpers import client_group, relayed_group, start_namesrv

GROUP = "CG"
TOPICS = {"T": 4, f"%RETRY%{GROUP}": 1}


class Collector:
    """A handler that records what it consumed and wakes a waiter at a count."""

    def __init__(self) -> None:
        self.messages: list[MessageExt] = []
        self._waiters: list[tuple[int, trio.Event]] = []

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        self.messages += msgs
        for count, event in self._waiters:
            if len(self.messages) >= count:
                event.set()
        return True

    async def wait_for(self, count: int) -> None:
        event = trio.Event()
        self._waiters.append((count, event))
        if len(self.messages) >= count:
            event.set()
        await event.wait()


def push(namesrv: str, handler, **options) -> PushConsumer:
    options.setdefault("consume_from", "CONSUME_FROM_FIRST_OFFSET")
    options.setdefault("rebalance_interval_s", 60)  # rebalances come from notifications
    return PushConsumer(namesrv, GROUP, "T", handler, long_poll_s=5, **options)


async def committed_offsets(namesrv: str) -> dict[int, tuple[int | None, int]]:
    """queueId -> (the group's committed offset, the queue's max offset)."""
    async with PullConsumer(namesrv, GROUP) as reader:
        return {
            mq.queue_id: (await reader.query_offset(mq), await reader.max_offset(mq))
            for mq in await reader.fetch_queues("T")
        }


async def test_one_member_consumes_every_queue_in_order_and_commits(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (broker,) = await relayed_group(nursery, tmp_path, namesrv, topics=TOPICS)
    collect = Collector()
    with trio.fail_after(10):
        async with Producer(namesrv) as producer:
            for i in range(10):  # before the consumer starts: FIRST_OFFSET reads them
                await producer.send("T", b"%d" % i)
            async with push(namesrv, collect) as consumer:
                assert {mq.topic for mq in consumer.assigned_queues} == set(TOPICS)
                for i in range(10, 40):
                    await producer.send("T", b"%d" % i)
                await collect.wait_for(40)
        offsets = await committed_offsets(namesrv)
    assert sorted(int(m.body) for m in collect.messages) == list(range(40))
    beats = [json.loads(r.body) for r in broker.requests if r.code == RequestCode.HEART_BEAT]
    (data,) = next(b["consumerDataSet"] for b in beats if b["consumerDataSet"])
    assert {k: v for k, v in data.items() if k != "subscriptionDataSet"} == {
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
        "consumeType": "CONSUME_PASSIVELY",
        "groupName": GROUP,
        "messageModel": "CLUSTERING",
        "unitMode": False,
    }
    assert [s["topic"] for s in data["subscriptionDataSet"]] == ["T", f"%RETRY%{GROUP}"]
    pulls = [r for r in broker.requests if r.code == RequestCode.PULL_MESSAGE]
    assert all(r.ext_fields["sysFlag"] == "7" for r in pulls)  # commit, suspend, subscription
    assert {r.ext_fields["suspendTimeoutMillis"] for r in pulls} == {"5000"}
    for queue_id in range(4):
        in_queue = [m.queue_offset for m in collect.messages if m.queue_id == queue_id]
        assert in_queue == sorted(in_queue)
        assert offsets[queue_id][0] == offsets[queue_id][1]  # all committed at close


async def test_consume_from_last_offset_skips_the_backlog(nursery, tmp_path):
    namesrv = (await client_group(nursery, tmp_path, topics=TOPICS)).namesrv_addr
    collect = Collector()
    with trio.fail_after(10):
        async with Producer(namesrv) as producer:
            await producer.send("T", b"old")
            async with push(namesrv, collect, consume_from="LAST"):
                await producer.send("T", b"new")
                await collect.wait_for(1)
    assert [m.body for m in collect.messages] == [b"new"]


async def test_a_group_of_two_shares_the_queues_and_hands_them_over(nursery, tmp_path):
    namesrv = (await client_group(nursery, tmp_path, topics=TOPICS)).namesrv_addr
    first, second = Collector(), Collector()

    def two_of_t(queues: frozenset[MessageQueue]) -> bool:
        return sum(mq.topic == "T" for mq in queues) == 2

    with trio.fail_after(10):
        async with Producer(namesrv) as producer, push(namesrv, first) as a:
            async with push(namesrv, second) as b:
                await a.wait_for_assignment(two_of_t)  # told by the broker at once
                await b.wait_for_assignment(two_of_t)
                assert not a.assigned_queues & b.assigned_queues
                for i in range(40):
                    await producer.send("T", b"%d" % i)
                await first.wait_for(20)
                await second.wait_for(20)
            # b left: a takes every queue, from where b committed.
            await a.wait_for_assignment(lambda queues: len(queues) == 5)
            for i in range(40, 50):
                await producer.send("T", b"%d" % i)
            await first.wait_for(30)
        offsets = await committed_offsets(namesrv)
    consumed = Counter(int(m.body) for m in first.messages + second.messages)
    assert consumed == Counter(range(50))  # each exactly once
    assert all(committed == end for committed, end in offsets.values())


async def test_failed_messages_come_back_through_the_retry_topic(nursery, tmp_path):
    fast_retries = {"messageDelayLevel": " ".join(["1s"] * 18)}  # the shortest there is
    namesrv = (await client_group(nursery, tmp_path, topics=TOPICS, **fast_retries)).namesrv_addr
    seen: list[MessageExt] = []
    done = trio.Event()

    async def flaky(msgs: list[MessageExt]) -> bool:
        seen.extend(msgs)
        if msgs[0].body == b"boom" and msgs[0].reconsume_times == 0:
            raise RuntimeError("first try fails")
        if msgs[0].body == b"no" and msgs[0].reconsume_times == 0:
            return False
        if len(seen) == 5:
            done.set()
        return True

    with trio.fail_after(10):
        async with Producer(namesrv) as producer, push(namesrv, flaky):
            for body in (b"ok", b"boom", b"no"):
                await producer.send("T", body, tags="X")
            await done.wait()
    retried = [m for m in seen if m.reconsume_times == 1]
    assert sorted(m.body for m in retried) == [b"boom", b"no"]
    for msg in retried:
        assert msg.topic == "T"  # restored from RETRY_TOPIC
        assert msg.tags == "X"
        assert msg.get_property("RETRY_TOPIC") == "T"


async def test_pulls_move_to_a_new_master_at_once(nursery, tmp_path):
    """A master that hangs holds long polls; when the route names a successor, each
    queue pulls from it at once instead of waiting the poll out."""
    namesrv = await start_namesrv(nursery)
    _, (old, new) = await relayed_group(nursery, tmp_path, namesrv, topics=TOPICS, members=2)
    collect = Collector()
    hanging = trio.Event()

    async def hang(request, connection):
        hanging.set()
        await trio.sleep_forever()

    with trio.fail_after(10):
        async with push(namesrv, collect) as consumer:
            async with Producer(namesrv) as producer:
                await producer.send("T", b"wake", queue=MessageQueue("T", "broker-a", 0))
                old.answer(RequestCode.PULL_MESSAGE, hang)
                await collect.wait_for(1)
                await hanging.wait()  # queue 0 pulls again: held for good
            await new.register(namesrv, 0, TOPICS)
            await consumer.instance.routes.refresh("T")
            started = trio.current_time()
            async with Producer(namesrv) as producer:
                for i in range(4):
                    await producer.send("T", b"%d" % i, queue=MessageQueue("T", "broker-a", i))
            await collect.wait_for(5)
            assert trio.current_time() - started < 2
