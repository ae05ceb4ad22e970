"""POP consumption (RocketMQ 5) against brokers in this loop, through raftmq.client.pop:
pop, ack, invisibility changes, long polling, redelivery through the retry topic and
the DLQ, FIFO batches, refusals, and the state a new master continues from."""

from __future__ import annotations

import json
import re

import attrs
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from raftmq.broker.store.pop_state import PopState
from raftmq.dledger.codes import Code
from raftmq.dledger.server import DLedgerError

from raftmq.client import pop as client
from raftmq.client.admin import Admin
from raftmq.client.connections import ConnectionPool
from raftmq.client.errors import MQBrokerError
from raftmq.client.mqadmin.commands import COMMANDS
from raftmq.protocol import pop as vocabulary
from raftmq.protocol.message import MessageConst, properties_to_string
from raftmq.protocol.pop import ReceiptHandle
from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import client_group, create_topic, group, wait_for

BROKER = "broker-a"


async def subscription_group(g, name: str, **fields) -> None:
    body = json.dumps({"groupName": name, **fields}).encode()
    response = await g.call(g.master(), RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)
    assert response.code == ResponseCode.SUCCESS, response.remark


async def send_all(g, topic: str, bodies: list[bytes], queue_id: int = 0) -> None:
    for body in bodies:
        response = await g.send(g.master(), topic, body, queue_id)
        assert response.code == ResponseCode.SUCCESS, response.remark


async def pop(pool, g, topic="T", group_name="G", **kwargs) -> client.PopResult:
    return await client.pop(pool, g.master().address, BROKER, group_name, topic, **kwargs)


async def test_popped_messages_stay_away_until_their_invisible_time_then_only_the_unacked_return(
    nursery, tmp_path
):
    """A pop hides what it returns; acks remove it for good; what was not acked comes
    back through %RETRY%G_T under its origin topic, with reconsumeTimes 1, its UNIQ_KEY
    and the first pop's time."""
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    await send_all(g, "T", [b"m0", b"m1", b"m2"])
    async with ConnectionPool() as pool:
        first = await pop(pool, g, invisible_ms=1000)
        assert first.status == client.FOUND
        assert [m.message.body for m in first.messages] == [b"m0", b"m1", b"m2"]
        assert [m.reconsume_times for m in first.messages] == [0, 0, 0]
        assert all(m.handle.broker_name == BROKER for m in first.messages)
        assert (await pop(pool, g, invisible_ms=1000)).status == client.NO_NEW_MSG
        for popped in first.messages[:2]:
            await client.ack(pool, g.master().address, "G", "T", popped.handle)
        again = await pop(pool, g, invisible_ms=60_000, poll_ms=5000)
        [back] = again.messages
        assert back.message.body == b"m2"
        assert back.message.topic == "T"
        assert back.reconsume_times == 1
        assert back.handle.topic_type == 1  # read from the V1 retry topic
        assert back.handle.commit_log_offset == back.message.physical_offset > 0
        assert (
            first.messages[0].handle.commit_log_offset == first.messages[0].message.physical_offset
        )
        original = first.messages[2].message
        assert back.message.uniq_key == original.uniq_key
        assert back.message.properties["1ST_POP_TIME"] == str(first.pop_time_ms)
        assert back.message.properties[MessageConst.PROPERTY_RETRY_TOPIC] == "T"
        await client.ack(pool, g.master().address, "G", "T", back.handle)
        await trio.sleep(0.3)
        assert g.master().store.metadata.pop.in_flight_count("G") == 0


async def test_a_batch_ack_acks_the_handles_it_names_and_no_other(nursery, tmp_path):
    g = await client_group(nursery, tmp_path, topics={"T": 2})
    await send_all(g, "T", [b"a0", b"a1", b"a2"], queue_id=0)
    await send_all(g, "T", [b"b0", b"b1"], queue_id=1)
    address = g.master().address
    async with ConnectionPool() as pool:
        popped = (await pop(pool, g)).messages
        kept = next(m for m in popped if m.message.body == b"a1")
        acked = [m.handle for m in popped if m is not kept]
        await client.batch_ack(pool, address, BROKER, "G", "T", acked)
        state = g.master().store.metadata.pop
        assert state.in_flight_by_queue() == {("G", "T", 0): 1}
        assert list(state.inflight[("G", "T", 0)]) == [kept.handle.queue_offset]
        with pytest.raises(MQBrokerError) as refused:  # past the queue's end: nothing acked
            late = attrs.evolve(kept.handle, queue_offset=7)
            await client.batch_ack(pool, address, BROKER, "G", "T", [kept.handle, late])
        assert refused.value.code == ResponseCode.NO_MESSAGE
        assert state.in_flight_count() == 1
    for body in (b"{}", b"[1]", b'{"acks": [{"c": "G"}]}', b"x"):
        response = await g.call(g.master(), RequestCode.BATCH_ACK_MESSAGE, {}, body)
        assert response.code == ResponseCode.MESSAGE_ILLEGAL, response.remark
        assert "not a batch of acks" in response.remark


@pytest.mark.parametrize("indexes", [[], [0], [7, 8], [0, 3, 31, 64]])
def test_batch_ack_bitsets_are_javas_bitset_bytes_in_base64(indexes):
    encoded = vocabulary.encode_bitset(indexes)
    assert vocabulary.decode_bitset(encoded) == indexes
    assert vocabulary.encode_bitset([0, 9]) == "AQI="  # BitSet {0, 9}.toByteArray() = [1, 2]


async def test_a_changed_invisible_time_moves_the_redelivery_and_retires_the_old_handle(
    nursery, tmp_path, monkeypatch
):
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    await send_all(g, "T", [b"m0"])
    address = g.master().address
    async with ConnectionPool() as pool:
        store = g.master().store
        frozen_ms = store.now_ms()
        monkeypatch.setattr(store, "now_ms", lambda: frozen_ms)  # pop and renewal in one ms
        [popped] = (await pop(pool, g, invisible_ms=60_000)).messages
        renewed = await client.change_invisible_time(pool, address, "G", "T", popped.handle, 60_000)
        monkeypatch.undo()
        assert renewed.pop_time_ms > popped.handle.pop_time_ms  # a handle of its own
        assert renewed.queue_offset == popped.handle.queue_offset
        await client.ack(pool, address, "G", "T", popped.handle)  # stale: acks nothing
        assert g.master().store.metadata.pop.in_flight_count("G", "T") == 1
        await trio.sleep(0.3)  # a revive check has seen the message due in a minute
        nack = await client.change_invisible_time(pool, address, "G", "T", renewed, 0)
        [back] = (await pop(pool, g, invisible_ms=60_000, poll_ms=5000)).messages
        assert back.message.body == b"m0" and back.reconsume_times == 1
        await client.ack(pool, address, "G", "T", nack)  # retired by the redelivery
        await client.ack(pool, address, "G", "T", back.handle)
        assert g.master().store.metadata.pop.in_flight_count("G") == 0


async def test_concurrent_pops_never_hand_out_one_message_twice(nursery, tmp_path):
    g = await client_group(nursery, tmp_path, topics={"T": 2})
    await send_all(g, "T", [b"%d" % n for n in range(10)], queue_id=0)
    await send_all(g, "T", [b"%d" % n for n in range(10, 20)], queue_id=1)
    bodies = []
    async with ConnectionPool() as pool:

        async def one_pop():
            bodies.extend(m.message.body for m in (await pop(pool, g, max_nums=3)).messages)

        for _ in range(10):  # a pop skips a queue another holds: several rounds
            async with trio.open_nursery() as pops:
                for _ in range(6):
                    pops.start_soon(one_pop)
            if len(bodies) >= 20:
                break
    assert sorted(bodies) == sorted(b"%d" % n for n in range(20))


async def test_a_long_poll_is_answered_when_a_message_arrives(nursery, tmp_path):
    g = await client_group(nursery, tmp_path, topics={"T": 2})
    async with ConnectionPool() as pool:
        found = []

        async def poll():
            found.append(await pop(pool, g, poll_ms=10_000))

        nursery.start_soon(poll)
        await wait_for(lambda: sum(g.master().pop.polling.waiting.values()) == 1)
        assert await client.polling_info(pool, g.master().address, "G", "T") == 1
        started = trio.current_time()
        await send_all(g, "T", [b"late"], queue_id=1)
        await wait_for(lambda: found)
        assert trio.current_time() - started < 2.0
        assert [m.message.body for m in found[0].messages] == [b"late"]
        assert not g.master().pop.polling.waiting


async def test_an_empty_long_poll_ends_after_its_poll_time(nursery, tmp_path):
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    async with ConnectionPool() as pool:
        started = trio.current_time()
        assert (await pop(pool, g, poll_ms=300)).status == client.NO_NEW_MSG
        assert 0.25 < trio.current_time() - started < 2.0
        assert not await client.notification(pool, g.master().address, "G", "T", -1, 200)
        await send_all(g, "T", [b"m"])
        assert await client.notification(pool, g.master().address, "G", "T", -1, 200)


async def test_a_group_popping_from_the_end_keeps_the_start_its_first_pop_found(nursery, tmp_path):
    """initMode MAX (Apache's proxy pops so): a group new to an empty queue starts at its
    end, and a message sent after that first pop is the next pop's, though the group has
    neither committed nor popped anything. (It started again at the new end each pop.)"""
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    await send_all(g, "T", [b"before"])
    async with ConnectionPool() as pool:
        first = await pop(pool, g, init_mode=vocabulary.INIT_MODE_MAX)
        assert first.status == client.NO_NEW_MSG
        await send_all(g, "T", [b"after"])
        second = await pop(pool, g, init_mode=vocabulary.INIT_MODE_MAX)
        assert [m.message.body for m in second.messages] == [b"after"]
        # another MAX group starts at the end as well, a MIN one at the first message
        other = await pop(pool, g, group_name="G2", init_mode=vocabulary.INIT_MODE_MAX)
        assert other.status == client.NO_NEW_MSG
        assert [m.message.body for m in (await pop(pool, g, group_name="G3")).messages] == [
            b"before",
            b"after",
        ]


async def test_a_long_poll_past_the_waiters_limit_is_answered_polling_full(nursery, tmp_path):
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    g.master().pop.polling.per_queue_max = 0
    async with ConnectionPool() as pool:
        assert (await pop(pool, g, poll_ms=5000)).status == client.POLLING_FULL
        assert (await pop(pool, g)).status == client.NO_NEW_MSG  # no poll, no waiter


async def test_a_message_never_acked_goes_to_the_dlq_after_retry_max_times(nursery, tmp_path):
    """retryMaxTimes 2: three deliveries (reconsumeTimes 0, 1, 2), then %DLQ%G."""
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    await subscription_group(g, "G", retryMaxTimes=2)
    await send_all(g, "T", [b"poison"])
    seen = []
    async with ConnectionPool() as pool:
        for _ in range(3):
            result = await pop(pool, g, invisible_ms=200, poll_ms=5000)
            seen += [m.reconsume_times for m in result.messages]
        await wait_for(lambda: g.master().store.max_offset("%DLQ%G", 0) == 1)
        assert (await pop(pool, g, invisible_ms=200, poll_ms=500)).status == client.NO_NEW_MSG
    assert seen == [0, 1, 2]
    state = g.master().store.metadata.pop
    assert (state.revived, state.dead_lettered, state.in_flight_count()) == (3, 1, 0)


async def test_a_fifo_queue_has_one_batch_in_flight_redelivered_in_order(nursery, tmp_path):
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    await send_all(g, "T", [b"a", b"b", b"c"])
    address = g.master().address
    async with ConnectionPool() as pool:
        first = await pop(pool, g, max_nums=2, invisible_ms=400, order=True, attempt_id="x1")
        assert first.revive_qid == 999
        assert [m.message.body for m in first.messages] == [b"a", b"b"]
        assert (await pop(pool, g, order=True)).status == client.NO_NEW_MSG  # checkBlock
        same = await pop(pool, g, max_nums=2, invisible_ms=400, order=True, attempt_id="x1")
        assert [m.message.body for m in same.messages] == [b"a", b"b"]
        await client.ack(pool, address, "G", "T", same.messages[0].handle)
        assert (await pop(pool, g, order=True)).status == client.NO_NEW_MSG
        handle = same.messages[1].handle
        renewed = await client.change_invisible_time(pool, address, "G", "T", handle, 300)
        assert renewed.pop_time_ms == handle.pop_time_ms  # a FIFO batch keeps its popTime
        again = await pop(pool, g, max_nums=2, order=True, poll_ms=5000)  # after expiry
        assert [m.message.body for m in again.messages] == [b"b"]
        assert [m.reconsume_times for m in again.messages] == [2]
        started = trio.current_time()
        waiting = []

        async def next_batch():
            waiting.append(await pop(pool, g, max_nums=2, order=True, poll_ms=5000))

        nursery.start_soon(next_batch)
        await wait_for(lambda: sum(g.master().pop.polling.waiting.values()) == 1)
        await client.ack(pool, address, "G", "T", again.messages[0].handle)
        await wait_for(lambda: waiting)
        assert trio.current_time() - started < 0.4  # woken by the ack, not the expiry
        assert [m.message.body for m in waiting[0].messages] == [b"c"]
        assert [m.reconsume_times for m in waiting[0].messages] == [0]
    assert g.master().store.max_offset("%RETRY%G_T", 0) == 0  # FIFO never retries there


async def test_a_fifo_queue_moves_past_messages_its_filter_skips(nursery, tmp_path):
    """A FIFO read that finds only messages the filter skips moves the pop offset past
    them and leaves no batch behind: the next matching message is popped."""
    g = await client_group(nursery, tmp_path, topics={"T": 1})

    async def send(body: bytes, tag: str) -> None:
        response = await g.send(g.master(), "T", body, 0, properties_to_string({"TAGS": tag}))
        assert response.code == ResponseCode.SUCCESS

    await send(b"b0", "B")
    await send(b"b1", "B")
    address = g.master().address
    async with ConnectionPool() as pool:
        assert (await pop(pool, g, order=True, filter_expression="A")).status == client.NO_NEW_MSG
        await send(b"a2", "A")
        [found] = (await pop(pool, g, order=True, filter_expression="A")).messages
        assert found.message.body == b"a2"
        await client.ack(pool, address, "G", "T", found.handle)
    assert g.master().store.metadata.pop.orders == {}


@pytest.mark.parametrize(
    ("fields", "code", "remark"),
    [
        ({"maxMsgNums": "33"}, ResponseCode.INVALID_PARAMETER, "max msg nums"),
        ({"queueId": "7"}, ResponseCode.INVALID_PARAMETER, "queueId[7] is illegal"),
        ({"invisibleTime": "0"}, ResponseCode.INVALID_PARAMETER, "invisibleTime 0"),
        ({"topic": "Nope"}, ResponseCode.TOPIC_NOT_EXIST, "topic[Nope] not exist"),
        ({"topic": "RMQ_SYS_RAFTMQ_META"}, ResponseCode.NO_PERMISSION, "forbidden"),
        ({"consumerGroup": "Unknown"}, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, "Unknown"),
        ({"maxMsgNums": "x"}, ResponseCode.MESSAGE_ILLEGAL, "<maxMsgNums> is not a number"),
        ({"expType": "SQL92", "exp": "a >"}, ResponseCode.SYSTEM_ERROR, "enablePropertyFilter"),
        ({"bornTime": "1", "pollTime": "10"}, ResponseCode.POLLING_TIMEOUT, "too much"),
    ],
)
async def test_a_bad_pop_is_answered_with_its_code_and_remark(
    nursery, tmp_path, fields, code, remark
):
    g = await client_group(nursery, tmp_path, topics={"T": 1}, autoCreateSubscriptionGroup="false")
    await subscription_group(g, "G")
    ext = {
        "consumerGroup": "G", "topic": "T", "queueId": "-1", "maxMsgNums": "4",
        "invisibleTime": "1000", "pollTime": "0", "bornTime": "0", **fields,
    }  # fmt: skip
    response = await g.call(g.master(), RequestCode.POP_MESSAGE, ext)
    assert response.code == code, response.remark
    assert remark in response.remark
    assert g.master().is_master  # and it goes on serving


@pytest.mark.parametrize(
    ("fields", "code", "remark"),
    [
        ({"extraInfo": "1 2 3"}, ResponseCode.MESSAGE_ILLEGAL, "3 fields"),
        ({"extraInfo": "0 x 1 1 0 b 0 0"}, ResponseCode.MESSAGE_ILLEGAL, "not a number"),
        ({"offset": "5"}, ResponseCode.NO_MESSAGE, "offset is illegal"),
        ({"topic": "Nope"}, ResponseCode.TOPIC_NOT_EXIST, "Nope"),
        ({"offset": None}, ResponseCode.MESSAGE_ILLEGAL, "<offset> is null"),
    ],
)
async def test_a_bad_ack_is_answered_with_its_code_and_remark(
    nursery, tmp_path, fields, code, remark
):
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    await send_all(g, "T", [b"m"])
    handle = ReceiptHandle(0, 1, 1000, 0, 0, BROKER, 0, 0)
    ext = {
        "consumerGroup": "G", "topic": "T", "queueId": "0", "offset": "0",
        "extraInfo": handle.extra_info(), **fields,
    }  # fmt: skip
    ext = {k: v for k, v in ext.items() if v is not None}
    for code_sent in (RequestCode.ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME):
        response = await g.call(g.master(), code_sent, {**ext, "invisibleTime": "10"})
        assert response.code == code, response.remark
        assert remark in response.remark


@pytest.mark.slow  # a three-member group and an election
async def test_a_new_master_redelivers_what_was_not_acked_and_never_what_was(nursery, tmp_path):
    """Pops, acks and an invisibility change on the first master; it crashes; the next
    one redelivers the un-acked message after its invisible time, keeps the FIFO batch
    blocked, and redelivers none of the acked."""
    g = await group(nursery, tmp_path, brokerName=BROKER)
    await create_topic(g, "T", 1)
    await create_topic(g, "F", 1)
    await send_all(g, "T", [b"acked", b"lost", b"renewed"])
    await send_all(g, "F", [b"f0", b"f1"])
    old = g.master()
    async with ConnectionPool() as pool:
        acked, _lost, renewed = (await pop(pool, g, invisible_ms=1500)).messages
        await client.ack(pool, old.address, "G", "T", acked.handle)
        await client.change_invisible_time(pool, old.address, "G", "T", renewed.handle, 60_000)
        fifo = await pop(pool, g, "F", max_nums=1, invisible_ms=60_000, order=True)
        assert [m.message.body for m in fifo.messages] == [b"f0"]
    async with ConnectionPool() as pool:
        with pytest.raises(MQBrokerError) as refused:  # POP is the master's
            await client.pop(pool, g.slaves()[0].address, BROKER, "G", "T")
    assert refused.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "not master" in refused.value.remark
    before = old.store.metadata.pop.to_json()
    g.crash(next(n for n, b in g.brokers.items() if b is old))
    new = await g.wait_master()
    assert new.store.metadata.pop.to_json() == before
    async with ConnectionPool() as pool:
        again = await pop(pool, g, invisible_ms=60_000, poll_ms=5000)
        assert [(m.message.body, m.reconsume_times) for m in again.messages] == [(b"lost", 1)]
        assert (await pop(pool, g, "F", order=True)).status == client.NO_NEW_MSG
        assert (await pop(pool, g, poll_ms=500)).status == client.NO_NEW_MSG


def restarted_after(records: list, cut: int) -> PopState:
    """The state of a replica that applied `records[:cut]`, restarted from its snapshot
    (through JSON, as the file holds it), then applied the rest."""
    first = PopState()
    for op, record in records[:cut]:
        first.apply(op, record)
    restarted = PopState()
    restarted.load(json.loads(json.dumps(first.to_json())))
    for op, record in records[cut:]:
        restarted.apply(op, record)
    return restarted


def test_pop_state_snapshot_continues_as_the_records_would():
    """A replica restarted from a snapshot and then applying the rest of the records
    holds what one that applied them all holds."""
    records = [
        ("popCk", {"cks": [{"c": "G", "t": "T", "q": 0, "pt": 10, "it": 5, "rq": 1,
                            "o": [0, 1, 2], "n": 3}]}),
        ("popCk", {"cks": [{"c": "G", "t": "F", "q": 0, "pt": 11, "it": 9, "rq": 999,
                            "o": [0, 1], "n": 2, "order": True, "a": "x"}]}),
        ("popAck", {"e": [["G", "T", 0, 1, 10], ["G", "F", 0, 0, 11], ["G", "T", 0, 2, 9]]}),
        ("popChange", {"c": "G", "t": "T", "q": 0, "o": 2, "pt": 10, "npt": 20, "it": 7}),
        ("popChange", {"c": "G", "t": "F", "q": 0, "o": 1, "pt": 11, "npt": 30, "it": 1}),
        ("popRevive", {"e": [["G", "T", 0, 0, 10], ["G", "T", 0, 2, 10]], "dlq": 0}),
        ("popCk", {"cks": [{"c": "G", "t": "F", "q": 0, "pt": 40, "it": 9, "rq": 999,
                            "o": [1], "n": 2, "order": True, "a": ""}]}),
    ]  # fmt: skip
    whole = PopState()
    for op, record in records:
        whole.apply(op, record)
    assert whole.in_flight_count() == 2  # offset 2 (renewed) and F's offset 1
    assert whole.expired(26) == [] and [o for _k, o, _e in whole.expired(27)] == [2]
    assert whole.orders[("G", "F", 0)].counts == {1: 1}
    for cut in range(len(records) + 1):
        assert restarted_after(records, cut).to_json() == whole.to_json()


async def test_a_classic_master_pops_and_redelivers_as_well(nursery, tmp_path):
    g = await client_group(nursery, tmp_path, topics={"T": 1}, enableDLegerCommitLog="false")
    assert g.master().classic is not None
    await send_all(g, "T", [b"m0", b"m1"])
    async with ConnectionPool() as pool:
        first = await pop(pool, g, invisible_ms=300)
        await client.ack(pool, g.master().address, "G", "T", first.messages[0].handle)
        [back] = (await pop(pool, g, invisible_ms=60_000, poll_ms=5000)).messages
    assert (back.message.body, back.reconsume_times) == (b"m1", 1)


async def test_pop_state_is_shown_by_mqadmin_pop_status_and_the_metrics(nursery, tmp_path, capsys):
    g = await client_group(nursery, tmp_path, topics={"T": 2})
    await send_all(g, "T", [b"m0", b"m1", b"m2"])
    async with ConnectionPool() as pool:
        popped = (await pop(pool, g)).messages
        await client.ack(pool, g.master().address, "G", "T", popped[0].handle)
    args = COMMANDS["popStatus"].parser().parse_args(["-g", "G", "-t", "T"])
    async with Admin(g.namesrv_addr) as admin:
        await COMMANDS["popStatus"].run(admin, args)
    printed = capsys.readouterr().out
    assert re.search(r"^T\s+broker-a\s+0\s+3\s+3\s+2\s*$", printed, re.MULTILINE), printed
    assert "In Flight Total: 2" in printed
    exposition = generate_latest(g.master().registry).decode()
    labels = 'broker="broker-a",cluster="TestCluster",group="G",topic="T"'
    assert f"rocketmq_pop_inflight_messages{{{labels}}} 2.0" in exposition
    assert 'rocketmq_pop_revived_messages{broker="broker-a",cluster="TestCluster"} 0.0' in (
        exposition
    )


QUEUES = [("G", "T", 0), ("G", "T", 1), ("H", "T", 0)]


@st.composite
def pop_records(draw):
    """A sequence of POP records as masters write them, stale handles included."""
    records, pop_times = [], [0]
    for _ in range(draw(st.integers(1, 25))):
        group, topic, queue_id = draw(st.sampled_from(QUEUES))
        offset = draw(st.integers(0, 5))
        pt = draw(st.sampled_from(pop_times))
        kind = draw(st.sampled_from(["ck", "order", "ack", "change", "revive"]))
        if kind in ("ck", "order"):
            new_pt = max(pop_times) + 1
            pop_times.append(new_pt)
            offsets = sorted(draw(st.sets(st.integers(0, 5), max_size=3)))
            check = {"c": group, "t": topic, "q": queue_id, "pt": new_pt, "it": 10, "rq": 1,
                     "o": offsets, "n": max(offsets, default=5) + 1,
                     "order": kind == "order"}  # fmt: skip
            records.append(("popCk", {"cks": [check]}))
        elif kind == "ack":
            records.append(("popAck", {"e": [[group, topic, queue_id, offset, pt]]}))
        elif kind == "change":
            new_pt = max(pop_times) + 1
            pop_times.append(new_pt)
            change = {"c": group, "t": topic, "q": queue_id, "o": offset, "pt": pt,
                      "npt": new_pt, "it": 5}  # fmt: skip
            records.append(("popChange", change))
        else:
            records.append(("popRevive", {"e": [[group, topic, queue_id, offset, pt]], "dlq": 0}))
    return records


MIXED_MODES = [  # a queue popped both ways: the ack names the non-order pop's popTime
    ("popCk", {"cks": [{"c": "G", "t": "T", "q": 0, "pt": 1, "it": 10, "rq": 1, "o": [0],
                        "n": 1}]}),
    ("popCk", {"cks": [{"c": "G", "t": "T", "q": 0, "pt": 2, "it": 10, "rq": 999, "o": [0],
                        "n": 1, "order": True}]}),
    ("popAck", {"e": [["G", "T", 0, 0, 1]]}),
]  # fmt: skip


EMPTY_ORDER_READ = [  # a FIFO read whose messages the filter skipped
    ("popCk", {"cks": [{"c": "G", "t": "T", "q": 0, "pt": 1, "it": 10, "rq": 999, "o": [],
                        "n": 3, "order": True}]}),
]  # fmt: skip


@given(pop_records(), st.integers(0, 25))
@example(MIXED_MODES, 1).via("an order batch took a non-order pop's ack")
@example(EMPTY_ORDER_READ, 0).via("a FIFO read that found nothing left an empty batch")
def test_pop_state_applies_acks_for_good_and_restarts_from_any_snapshot(records, cut):
    """Whatever the records: an ack or redelivery naming an entry's popTime takes it
    out of flight, pop offsets never move back, the counts add up, and a replica that
    restarts from a snapshot taken anywhere ends where one that applied every record
    does."""
    state = PopState()
    for step, (op, record) in enumerate(records):
        before = dict(state.offsets)
        state.apply(op, record)
        assert all(state.offsets[k] >= o for k, o in before.items())
        if op in ("popAck", "popRevive"):
            [[group, topic, queue_id, offset, pt]] = record["e"]
            entry = state.inflight.get((group, topic, queue_id), {}).get(offset)
            assert entry is None or entry.pop_time_ms != pt
        for batch in state.orders.values():
            assert batch.pending(), "a batch whose every message is acked is gone"
        assert all(state.inflight.values()), "a queue with nothing in flight is gone"
        now_ms = step + 8  # popTimes count up by one a pop, invisibleTimes are 5 and 10
        every = [(k, o, e) for k, es in state.inflight.items() for o, e in es.items()]
        assert sorted(state.expired(now_ms), key=repr) == sorted(
            [(k, o, e) for k, o, e in every if e.visible_at_ms <= now_ms], key=repr
        )
    assert state.in_flight_count() == sum(state.in_flight_by_queue().values())
    assert restarted_after(records, min(cut, len(records))).to_json() == state.to_json()


async def test_update_sub_group_sets_the_5x_fields_pop_reads(nursery, tmp_path):
    """mqadmin updateSubGroup -o (consumeMessageOrderly), -r (retryMaxTimes) and -p
    (groupRetryPolicy, Apache's JSON, checked before it is sent)."""
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    exponential = {"initial": 5000, "max": 7200000, "multiplier": 2}
    policy = {"type": "EXPONENTIAL", "exponentialRetryPolicy": exponential}
    command = COMMANDS["updateSubGroup"]
    flags = ["-b", g.master().address, "-g", "G", "-o", "true", "-r", "3"]
    async with Admin(g.namesrv_addr) as admin:
        await command.run(admin, command.parser().parse_args([*flags, "-p", json.dumps(policy)]))
        config = g.master().store.metadata.groups["G"]
        assert (config.consume_message_orderly, config.retry_max_times) == (True, 3)
        assert config.group_retry_policy == policy
        for bad, error in (("{", "not JSON"), ('{"type": "LINEAR"}', "CUSTOMIZED or EXPONENTIAL")):
            with pytest.raises(SystemExit, match=error):
                await command.run(admin, command.parser().parse_args([*flags, "-p", bad]))
    assert g.master().store.metadata.groups["G"].group_retry_policy == policy


# A well-formed request of each POP code, which the drawn fields then override.
POP_REQUESTS = {
    RequestCode.POP_MESSAGE: {"maxMsgNums": "4", "invisibleTime": "60000"},
    RequestCode.ACK_MESSAGE: {"extraInfo": "0 1 60000 0 0 broker-a 0 0", "offset": "0"},
    RequestCode.PEEK_MESSAGE: {"maxMsgNums": "4"},
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: {
        "extraInfo": "0 1 60000 0 0 broker-a 0 0", "offset": "0", "invisibleTime": "10",
    },
    RequestCode.NOTIFICATION: {},
    RequestCode.POLLING_INFO: {},
    RequestCode.BATCH_ACK_MESSAGE: {},
}  # fmt: skip
POP_FIELDS = (
    "consumerGroup", "topic", "queueId", "maxMsgNums", "invisibleTime", "bornTime",
    "initMode", "expType", "exp", "order", "attemptId", "extraInfo", "offset",
)  # fmt: skip
BATCH_BODIES = st.one_of(
    st.binary(max_size=40),
    st.builds(
        lambda ack: json.dumps({"acks": [ack]}).encode(),
        st.dictionaries(
            st.sampled_from(["c", "t", "r", "so", "q", "rq", "pt", "it", "b"]),
            st.one_of(st.integers(-5, 2**40), st.sampled_from(["G", "T", "AQI=", "0", "=="])),
        ),
    ),
)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(POP_REQUESTS)),
            st.dictionaries(
                st.sampled_from(POP_FIELDS),
                st.one_of(
                    st.sampled_from(["G", "T", "-1", "0", "1", "true", "SQL92", "a >"]),
                    st.integers(-(2**63), 2**64).map(str),
                    st.text(max_size=10),
                    st.lists(st.integers(-1, 2**40), min_size=1, max_size=10).map(
                        lambda numbers: " ".join(map(str, numbers))
                    ),
                ),
                max_size=3,
            ),
            BATCH_BODIES,
        ),
        min_size=20,
        max_size=20,
    )
)
@settings(max_examples=5, deadline=None)
def test_hostile_pop_requests_get_answers_and_leave_the_broker_serving(tmp_path_factory, requests):
    """Well-formed POP requests with any fields replaced and any batch-ack body: each
    gets a response code with a remark, never a processor failure (SYSTEM_ERROR naming
    an exception), and the broker goes on popping."""

    async def run():
        async with trio.open_nursery() as nursery:
            g = await client_group(nursery, tmp_path_factory.mktemp("hostile"), topics={"T": 2})
            await send_all(g, "T", [b"m0"])
            for code, fields, body in requests:
                base = {"consumerGroup": "G", "topic": "T", "queueId": "0"}
                ext = {**base, **POP_REQUESTS[code], **fields, "pollTime": "0"}
                response = await g.call(g.master(), code, ext, body)
                assert response.remark or response.code == ResponseCode.SUCCESS
                if response.code == ResponseCode.SYSTEM_ERROR:
                    assert "enablePropertyFilter" in response.remark, response.remark
            async with ConnectionPool() as pool:
                await pop(pool, g)  # still serving (FOUND or NO_NEW_MSG)
            nursery.cancel_scope.cancel()

    trio.run(run)


class _RecordFailsOnce:
    """The revive's metadata writer, whose first popRevive record does not commit (as when
    the master dies between writing the copies and recording them)."""

    def __init__(self, meta) -> None:
        self.meta = meta
        self.failed = False

    async def write(self, op: str, **fields) -> None:
        if op == "popRevive" and not self.failed:
            self.failed = True
            raise DLedgerError(Code.WAIT_QUORUM_ACK_TIMEOUT, "the record did not commit")
        await self.meta.write(op, **fields)


async def test_a_revive_that_was_not_recorded_is_not_copied_again(nursery, tmp_path):
    """Revive writes a message's copy to the retry topic, then the record taking it out
    of flight. When the record does not commit, the next revive finds the copy already
    written and writes none: one copy, so one consumer gets the message, and once it
    acknowledges it nobody gets it again (with two copies, a second consumer popped the
    other after the ack: jepsen's popped_after_ack)."""
    g = await client_group(nursery, tmp_path, topics={"T": 1})
    await send_all(g, "T", [b"m0"])
    broker = g.master()
    broker.revive.meta = failing = _RecordFailsOnce(broker.revive.meta)
    async with ConnectionPool() as pool:
        [first] = (await pop(pool, g, invisible_ms=1000)).messages
        await wait_for(lambda: failing.failed, timeout_s=10)
        await wait_for(lambda: broker.store.metadata.pop.in_flight_count("G") == 0, timeout_s=10)
        retry = vocabulary.retry_topic("G", "T")
        assert broker.store.max_offset(retry, 0) == 1, "the unrecorded copy was written again"
        [back] = (await pop(pool, g, invisible_ms=60_000, poll_ms=5000)).messages
        assert back.message.body == b"m0" and back.reconsume_times == 1
        assert back.message.properties[vocabulary.PROPERTY_REVIVED_FROM] == str(
            first.message.physical_offset
        )
        await client.ack(pool, broker.address, "G", "T", back.handle)
        assert (await pop(pool, g, invisible_ms=60_000, poll_ms=1500)).messages == []
