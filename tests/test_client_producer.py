"""The producer against a real name server and in-process broker members, reached
through relays that record what it sends: what it sends, how it picks queues, how it
retries through a master change, and how it reports a failure whose outcome is unknown
(a relay answering one request code as the real broker cannot be made to)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import trio

from raftmq.client import Message, MessageQueue, Producer, SendError, SendStatus
from raftmq.protocol.message import inflate
from raftmq.remoting import RemotingClient, RequestCode, ResponseCode
from raftmq.tools.dledger_local import free_ports
from tests.helpers import queue_contents, register_request, relayed_group, start_namesrv

TOPIC = "T"


async def test_send_writes_a_v2_header_and_reports_both_ids(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    g, (broker,) = await relayed_group(nursery, tmp_path, namesrv)
    contents = queue_contents(g)
    with trio.fail_after(10):
        async with Producer(namesrv, "PG") as producer:
            result = await producer.send(
                TOPIC, b"hello", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}
            )
        assert result.status is SendStatus.SEND_OK
        (stored,) = [m for q in range(4) for m in await contents(TOPIC, q)]
        assert result.msg_id == stored.uniq_key and len(result.msg_id) == 32
        assert result.offset_msg_id == stored.msg_id
        assert result.message_queue == MessageQueue(TOPIC, "broker-a", stored.queue_id)
        assert result.queue_offset == 0
        assert stored.properties == {
            "TAGS": "TagA",
            "KEYS": "k1 k2",
            "color": "red",
            "UNIQ_KEY": result.msg_id,
            "CLUSTER": "TestCluster",  # added by the broker, as RocketMQ's does
        }
        (send,) = [r for r in broker.requests if r.code == RequestCode.SEND_MESSAGE_V2]
        f = send.ext_fields
        assert set(f) == set("abcdefghijkmn")
        assert (f["a"], f["b"], f["c"], f["d"], f["f"], f["k"], f["m"], f["n"]) == (
            "PG",
            TOPIC,
            "TBW102",
            "4",
            "0",
            "false",
            "false",
            "broker-a",
        )
        assert "WAIT\x01true\x02" in f["i"]
        # A heartbeat once the broker was known, UNREGISTER_CLIENT at close.
        codes = broker.codes()
        assert codes.index(RequestCode.HEART_BEAT) < codes.index(RequestCode.UNREGISTER_CLIENT)
        beat = json.loads(broker.requests[codes.index(RequestCode.HEART_BEAT)].body)
        assert beat["producerDataSet"] == [{"groupName": "PG"}]
        assert beat["consumerDataSet"] == []
        bye = broker.requests[codes.index(RequestCode.UNREGISTER_CLIENT)].ext_fields
        assert bye == {"clientID": beat["clientID"], "producerGroup": "PG"}


async def test_queues_are_chosen_round_robin_or_as_given(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    g, _ = await relayed_group(nursery, tmp_path, namesrv)
    contents = queue_contents(g)
    with trio.fail_after(10):
        async with Producer(namesrv) as producer:
            queues = [(await producer.send(TOPIC, b"x")).message_queue.queue_id for _ in range(8)]
            fixed = MessageQueue(TOPIC, "broker-a", 2)
            assert (await producer.send(TOPIC, b"y", queue=fixed)).message_queue == fixed
    assert queues[4:] == queues[:4] and sorted(queues[:4]) == [0, 1, 2, 3]
    assert (await contents(TOPIC, 2))[-1].body == b"y"


async def test_large_bodies_are_compressed(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    g, _ = await relayed_group(nursery, tmp_path, namesrv)
    contents = queue_contents(g)
    body = bytes(range(256)) * 20
    with trio.fail_after(10):
        async with Producer(namesrv) as producer:
            await producer.send(TOPIC, body)
            await producer.send(TOPIC, b"small")
    stored = [m for q in range(4) for m in await contents(TOPIC, q)]
    big, small = sorted(stored, key=lambda m: len(m.body), reverse=True)
    assert big.sysflag & 1 and len(big.body) < len(body)
    inflate(big)
    assert big.body == body
    assert small.sysflag == 0 and small.body == b"small"


async def test_batch_is_one_request_with_consecutive_offsets(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    g, (broker,) = await relayed_group(nursery, tmp_path, namesrv)
    contents = queue_contents(g)
    with trio.fail_after(10):
        async with Producer(namesrv) as producer:
            result = await producer.send_batch(
                TOPIC, [b"a", Message(b"b", tags="T2", keys="k"), b"c"]
            )
    (batch,) = [r for r in broker.requests if r.code == RequestCode.SEND_BATCH_MESSAGE]
    assert batch.ext_fields["m"] == "true"
    stored = await contents(TOPIC, result.message_queue.queue_id)
    assert [m.body for m in stored] == [b"a", b"b", b"c"]
    assert [m.queue_offset for m in stored] == [0, 1, 2]
    assert stored[1].tags == "T2" and stored[1].keys == "k"
    assert result.msg_id == ",".join(m.uniq_key for m in stored)
    assert result.offset_msg_id == ",".join(m.msg_id for m in stored)


async def test_concurrent_sends_share_one_connection(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (broker,) = await relayed_group(nursery, tmp_path, namesrv)
    waiting = 0
    all_in = trio.Event()
    sends = 200

    async def hold_until_all_arrive(request, connection):
        nonlocal waiting
        waiting += 1
        if waiting == sends:
            all_in.set()
        await all_in.wait()  # answers only once every send is in flight at once
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"queueOffset": "0"})

    with trio.fail_after(10):
        async with Producer(namesrv) as producer:
            await producer.send(TOPIC, b"warm up")  # route and connection
            broker.answer(RequestCode.SEND_MESSAGE_V2, hold_until_all_arrive)
            async with trio.open_nursery() as senders:
                for i in range(sends):
                    senders.start_soon(producer.send, TOPIC, b"%d" % i)
            assert len(broker.connections) == 1


async def test_send_rides_through_a_master_change(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    g, (old, new) = await relayed_group(nursery, tmp_path, namesrv, members=2)
    contents = queue_contents(g)
    refused = trio.Event()

    async def refuse(request, connection):  # deposed, still up: answers "not master"
        refused.set()
        return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "not master: slave")

    old.answer(RequestCode.SEND_MESSAGE_V2, refuse)
    with trio.fail_after(10):
        async with Producer(namesrv, send_timeout_s=5) as producer:
            async with trio.open_nursery() as inner:
                inner.start_soon(producer.send, TOPIC, b"across")
                await refused.wait()
                await trio.sleep(0.3)  # the old master keeps refusing for a while
                await new.register(namesrv, 0, {TOPIC: 4})
            started = trio.current_time()
            await producer.send(TOPIC, b"after")
            assert trio.current_time() - started < 0.5
    bodies = sorted([m.body for q in range(4) for m in await contents(TOPIC, q)])
    assert bodies == [b"across", b"after"]
    assert old.codes().count(RequestCode.SEND_MESSAGE_V2) >= 2  # retried with back-off


async def test_send_rides_through_a_killed_master(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    g, (old, new) = await relayed_group(nursery, tmp_path, namesrv, members=2)
    contents = queue_contents(g)
    with trio.fail_after(10):
        async with Producer(namesrv, send_timeout_s=5) as producer:
            await producer.send(TOPIC, b"before")
            await old.stop()

            async def elect():
                await trio.sleep(0.5)
                await new.register(namesrv, 0, {TOPIC: 4})

            nursery.start_soon(elect)
            result = await producer.send(TOPIC, b"after")
    assert result.status is SendStatus.SEND_OK
    assert sorted([m.body for q in range(4) for m in await contents(TOPIC, q)]) == [
        b"after",
        b"before",
    ]


@pytest.mark.parametrize("avoid", [False, True])
async def test_other_broker_groups_take_over_after_a_failure(nursery, tmp_path, avoid):
    """With latency fault avoidance (`send_latency_fault_enable`), the first failure
    isolates the busy group and no later send tries it."""
    namesrv = await start_namesrv(nursery)
    _, (busy,) = await relayed_group(nursery, tmp_path, namesrv, "broker-a")
    g_b, _ = await relayed_group(nursery, tmp_path, namesrv, "broker-b")
    contents_b = queue_contents(g_b)

    async def too_busy(request, connection):
        return request.make_response(ResponseCode.SYSTEM_BUSY, "busy")

    busy.answer(RequestCode.SEND_MESSAGE_V2, too_busy)
    with trio.fail_after(10):
        async with Producer(namesrv, send_latency_fault_enable=avoid) as producer:
            for _ in range(16):
                result = await producer.send(TOPIC, b"x")
                assert result.message_queue.broker_name == "broker-b"
    assert sum([len(await contents_b(TOPIC, q)) for q in range(4)]) == 16
    tried = busy.codes().count(RequestCode.SEND_MESSAGE_V2)
    if avoid:
        assert tried == 1
    else:  # round-robin still visits the busy group's queues now and then, as Java's does
        assert 2 <= tried <= 8


async def test_several_groups_all_failing_stop_after_retry_times(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (a,) = await relayed_group(nursery, tmp_path, namesrv, "broker-a")
    _, (b,) = await relayed_group(nursery, tmp_path, namesrv, "broker-b")

    async def not_master(request, connection):
        return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "not master")

    a.answer(RequestCode.SEND_MESSAGE_V2, not_master)
    b.answer(RequestCode.SEND_MESSAGE_V2, not_master)
    with trio.fail_after(10):
        async with Producer(namesrv, retry_times=2, send_timeout_s=5) as producer:
            with pytest.raises(SendError) as caught:
                await producer.send(TOPIC, b"x")
    error = caught.value
    assert (error.code, error.indeterminate, error.attempts) == (14, False, 3)
    assert Counter(a.codes() + b.codes())[RequestCode.SEND_MESSAGE_V2] == 3


@pytest.mark.parametrize(
    ("code", "indeterminate", "single_attempt"),
    [
        (ResponseCode.MESSAGE_ILLEGAL, False, True),  # refused: no retry
        (ResponseCode.SERVICE_NOT_AVAILABLE, False, False),  # refused every time
        (ResponseCode.SYSTEM_ERROR, True, False),  # e.g. a quorum-ack timeout
    ],
)
async def test_error_answers(nursery, tmp_path, code, indeterminate, single_attempt):
    namesrv = await start_namesrv(nursery)
    _, (broker,) = await relayed_group(nursery, tmp_path, namesrv)

    async def fail(request, connection):
        return request.make_response(code, "no")

    broker.answer(RequestCode.SEND_MESSAGE_V2, fail)
    with trio.fail_after(10):
        async with Producer(namesrv, send_timeout_s=0.5) as producer:
            with pytest.raises(SendError) as caught:
                await producer.send(TOPIC, b"x")
    assert (caught.value.code, caught.value.indeterminate) == (code, indeterminate)
    assert (caught.value.attempts == 1) == single_attempt


async def test_no_answer_is_an_unknown_outcome(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (broker,) = await relayed_group(nursery, tmp_path, namesrv)

    async def never(request, connection):
        await trio.sleep_forever()

    broker.answer(RequestCode.SEND_MESSAGE_V2, never)
    with trio.fail_after(10):
        async with Producer(namesrv, send_timeout_s=0.3) as producer:
            with pytest.raises(SendError) as caught:
                await producer.send(TOPIC, b"x")
    assert (caught.value.code, caught.value.indeterminate, caught.value.attempts) == (
        None,
        True,
        1,
    )


async def test_lost_connection_after_sending_is_an_unknown_outcome(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (broker,) = await relayed_group(nursery, tmp_path, namesrv)

    async def hang_up(request, connection):
        connection.close("crashed")

    broker.answer(RequestCode.SEND_MESSAGE_V2, hang_up)
    with trio.fail_after(10):
        async with Producer(namesrv, send_timeout_s=0.3) as producer:
            with pytest.raises(SendError) as caught:
                await producer.send(TOPIC, b"x")
    assert caught.value.indeterminate and caught.value.attempts >= 2


async def test_unreachable_master_and_unknown_topic_are_refusals(nursery):
    namesrv = await start_namesrv(nursery)
    with trio.fail_after(10):
        async with RemotingClient(namesrv) as link:
            dead = f"127.0.0.1:{free_ports(1)[0]}"  # registered, nothing listening
            assert (await link.invoke(register_request("broker-a", dead, 0, {TOPIC: 4}))).code == 0
            async with Producer(namesrv, send_timeout_s=0.3) as producer:
                with pytest.raises(SendError) as caught:
                    await producer.send(TOPIC, b"x")
                assert not caught.value.indeterminate and caught.value.attempts >= 2
                with pytest.raises(SendError, match="no route") as caught:
                    await producer.send("nope", b"x")
                assert (caught.value.indeterminate, caught.value.attempts) == (False, 0)


async def test_heartbeats_repeat_on_their_interval(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (broker,) = await relayed_group(nursery, tmp_path, namesrv)
    beats = 0
    three = trio.Event()

    async def count(request, connection):
        nonlocal beats
        beats += 1
        if beats == 3:
            three.set()
        return request.make_response(ResponseCode.SUCCESS)

    broker.answer(RequestCode.HEART_BEAT, count)
    with trio.fail_after(10):
        async with Producer(namesrv, heartbeat_interval_s=0.05) as producer:
            await producer.send(TOPIC, b"x")  # makes the broker known
            await three.wait()


async def test_a_hung_master_costs_one_rpc_timeout(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    g, (old, new) = await relayed_group(nursery, tmp_path, namesrv, members=2)
    contents = queue_contents(g)

    async def hang(request, connection):
        await new.register(namesrv, 0, {TOPIC: 4})  # elected while the old one hangs
        await trio.sleep_forever()

    old.answer(RequestCode.SEND_MESSAGE_V2, hang)
    with trio.fail_after(10):
        async with Producer(namesrv, send_timeout_s=5, rpc_timeout_s=0.5) as producer:
            started = trio.current_time()
            await producer.send(TOPIC, b"x")
            assert trio.current_time() - started < 1.5
    assert [m.body for q in range(4) for m in await contents(TOPIC, q)] == [b"x"]


@pytest.mark.parametrize("stored_by_old", [True, False])
async def test_a_silent_master_is_resent_to_its_successor_and_stored_once(
    nursery, tmp_path, stored_by_old
):
    """The old master goes silent with the send (having stored it, or not) while the
    route comes to name a new master: the producer sends there too after
    hedge_after_s, marked a resend, well within its 3 s request timeout, and the
    message is stored once, the mark not kept: the broker answers a resend it already
    stores with that copy."""
    namesrv = await start_namesrv(nursery)
    g, (old, new) = await relayed_group(nursery, tmp_path, namesrv, members=2)
    contents = queue_contents(g)

    async def go_silent(request, connection):
        if stored_by_old:
            await old.forward(request, connection)
        await new.register(namesrv, 0, {TOPIC: 4})  # elected while the old one is silent
        await trio.sleep_forever()

    old.answer(RequestCode.SEND_MESSAGE_V2, go_silent)
    with trio.fail_after(10):
        async with Producer(namesrv) as producer:
            started = trio.current_time()
            result = await producer.send(TOPIC, b"once")
            assert trio.current_time() - started < 1.0
    (stored,) = [m for q in range(4) for m in await contents(TOPIC, q)]
    assert stored.body == b"once" and "RAFTMQ_RESEND" not in stored.properties
    assert (result.offset_msg_id, result.queue_offset) == (stored.msg_id, stored.queue_offset)
    (resent,) = [r for r in new.requests if r.code == RequestCode.SEND_MESSAGE_V2]
    assert "RAFTMQ_RESEND\x01true\x02" in resent.ext_fields["i"]


async def test_concurrent_sends_to_a_silent_master_are_each_stored_once(nursery, tmp_path):
    """Ten sends out at once when the master goes silent, each stored there first: one
    watch of the route finds the new master for all of them, each is resent there and
    answered with its stored copy, within a second."""
    namesrv = await start_namesrv(nursery)
    g, (old, new) = await relayed_group(nursery, tmp_path, namesrv, members=2)
    contents = queue_contents(g)
    stored_by_old = []

    async def store_then_go_silent(request, connection):
        await old.forward(request, connection)
        stored_by_old.append(request)
        if len(stored_by_old) == 10:
            await new.register(namesrv, 0, {TOPIC: 4})
        await trio.sleep_forever()

    old.answer(RequestCode.SEND_MESSAGE_V2, store_then_go_silent)
    results = {}
    with trio.fail_after(10):
        async with Producer(namesrv) as producer:

            async def send(n: int) -> None:
                results[n] = await producer.send(TOPIC, b"%d" % n)

            started = trio.current_time()
            async with trio.open_nursery() as senders:
                for n in range(10):
                    senders.start_soon(send, n)
            assert trio.current_time() - started < 1.0
    stored = Counter([m.body for q in range(4) for m in await contents(TOPIC, q)])
    assert stored == Counter(b"%d" % n for n in range(10))
    resent = [r for r in new.requests if r.code == RequestCode.SEND_MESSAGE_V2]
    assert len(resent) == 10 and len(results) == 10
