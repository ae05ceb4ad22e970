"""Transactional messages against a one-member in-process broker: the client's
TransactionProducer, END_TRANSACTION (37), the check-back (39) and its discard."""

from __future__ import annotations

import time

import pytest
import trio
from raftmq.broker.transactions import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC

from raftmq.client import LocalTransactionState, TransactionProducer
from raftmq.protocol.headers import send_header_v2
from raftmq.protocol.message import MessageConst, MessageSysFlag, properties_to_string
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import create_topic, group, stored, wait_for

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
FAST_CHECKS = {"transactionTimeOut": "100", "transactionCheckInterval": "100"}


def answering(state: LocalTransactionState, seen: list):
    def callback(argument):
        seen.append(argument)
        return state

    return callback


async def one_member(nursery, tmp_path, **conf):
    g = await group(nursery, tmp_path, nodes=1, **conf)
    await create_topic(g, "Orders", 2)
    return g


@pytest.mark.parametrize("index", ["true", "false"])  # messageIndexEnable: not needed
async def test_commit_delivers_the_message_once_and_rollback_delivers_nothing(
    nursery, tmp_path, index
):
    g = await one_member(nursery, tmp_path, messageIndexEnable=index)
    checks: list = []
    async with TransactionProducer(
        g.namesrv_addr, "PG_TX", check=answering(COMMIT, checks)
    ) as producer:
        ran: list = []
        committed = await producer.send_in_transaction(
            "Orders", b"order-1", answering(COMMIT, ran), keys="k1"
        )
        assert committed.local_state is COMMIT
        assert ran == [committed.send_result]  # the local transaction saw the half's result
        rolled_back = await producer.send_in_transaction(
            "Orders", b"order-2", answering(ROLLBACK, ran)
        )
        assert rolled_back.local_state is ROLLBACK
    await wait_for(lambda: g.master().store.max_offset(OP_TOPIC, 0) == 2)
    delivered = await stored(g, "Orders", 2)
    assert [m.body for m in delivered] == [b"order-1"]
    real = delivered[0]
    sent = committed.send_result
    assert real.uniq_key == sent.msg_id
    assert real.queue_id == sent.message_queue.queue_id
    assert MessageSysFlag.get_transaction_value(real.sysflag) == (
        MessageSysFlag.TRANSACTION_COMMIT_TYPE
    )
    assert real.prepared_transaction_offset == decode_message_id(sent.offset_msg_id).offset
    assert real.get_property(MessageConst.PROPERTY_REAL_TOPIC) == "Orders"  # as RocketMQ keeps it
    halves = await stored(g, HALF_TOPIC)
    assert [(h.body, h.queue_offset) for h in halves] == [(b"order-1", 0), (b"order-2", 1)]
    assert all(h.get_property(MessageConst.PROPERTY_PRODUCER_GROUP) == "PG_TX" for h in halves)
    assert all(h.sysflag & MessageSysFlag.TRANSACTION_ROLLBACK_TYPE == 0 for h in halves)
    ops = await stored(g, OP_TOPIC)
    assert [(o.body, o.tags) for o in ops] == [(b"0", "d"), (b"1", "d")]
    assert checks == []  # nothing was left open


async def test_unknown_is_checked_back_and_committed(nursery, tmp_path):
    g = await one_member(nursery, tmp_path, **FAST_CHECKS)
    checks: list = []
    async with TransactionProducer(
        g.namesrv_addr, "PG_TX", check=answering(COMMIT, checks)
    ) as producer:
        result = await producer.send_in_transaction(
            "Orders", b"later", answering(UNKNOW, []), tags="T"
        )
        assert result.local_state is UNKNOW
        assert await stored(g, "Orders", 2) == []
        await wait_for(lambda: len(checks) >= 1)
        await wait_for(lambda: g.master().store.max_offset("Orders", 0) +
                       g.master().store.max_offset("Orders", 1) == 1)  # fmt: skip
    [asked] = checks[:1]
    assert asked.topic == "Orders"  # the check shows the real topic and queue
    assert asked.queue_id == result.send_result.message_queue.queue_id
    assert asked.uniq_key == result.send_result.msg_id
    assert asked.body == b"later" and asked.tags == "T"
    await trio.sleep(0.4)  # more check runs: a settled half is not checked again
    assert len(checks) == 1
    assert [m.body for m in await stored(g, "Orders", 2)] == [b"later"]


async def test_checked_too_often_is_discarded(nursery, tmp_path):
    g = await one_member(nursery, tmp_path, transactionCheckMax="2", **FAST_CHECKS)
    checks: list = []
    async with TransactionProducer(
        g.namesrv_addr, "PG_TX", check=answering(UNKNOW, checks)
    ) as producer:
        await producer.send_in_transaction("Orders", b"never", answering(UNKNOW, []))
        await wait_for(lambda: g.master().store.max_offset(CHECK_MAX_TOPIC, 0) == 1)
        await trio.sleep(0.4)
    assert len(checks) == 2  # transactionCheckMax checks, then the discard
    [discarded] = await stored(g, CHECK_MAX_TOPIC)
    assert discarded.body == b"never"
    assert discarded.get_property(MessageConst.PROPERTY_REAL_TOPIC) == "Orders"
    assert await stored(g, "Orders", 2) == []
    ops = await stored(g, OP_TOPIC)
    assert [o.tags for o in ops] == ["c", "c", "d"]


async def test_a_half_nobody_can_be_asked_about_waits_for_a_producer(nursery, tmp_path):
    """A check with no producer of the group connected is not made, so not counted: the
    half is not discarded however long it waits (RocketMQ counts it and discards after
    transactionCheckMax runs; right after a failover, before the producers' heartbeats
    reach the new master — the Java client's come every 30 s — that loses transactions).
    The first producer of the group to connect is asked."""
    g = await one_member(nursery, tmp_path, transactionCheckMax="2", **FAST_CHECKS)
    async with TransactionProducer(
        g.namesrv_addr, "PG_TX", check=answering(UNKNOW, [])
    ) as producer:
        await producer.send_in_transaction("Orders", b"open", answering(UNKNOW, []))
    await trio.sleep(1.0)  # ten check runs with nobody to ask
    assert g.master().store.max_offset(CHECK_MAX_TOPIC, 0) == 0, "discarded unasked"
    assert await stored(g, OP_TOPIC) == []
    checks: list = []
    async with TransactionProducer(
        g.namesrv_addr, "PG_TX", check=answering(COMMIT, checks)
    ) as producer:  # a producer heartbeats the brokers it has routes to: it sends first
        await producer.send_in_transaction("Orders", b"next", answering(COMMIT, []))
        await wait_for(lambda: g.master().store.max_offset("Orders", 0) +
                       g.master().store.max_offset("Orders", 1) == 2)  # fmt: skip
    assert [c.body for c in checks] == [b"open"]
    assert sorted(m.body for m in await stored(g, "Orders", 2)) == [b"next", b"open"]


async def test_reject_transaction_message_refuses_half_messages(nursery, tmp_path):
    g = await one_member(nursery, tmp_path, rejectTransactionMessage="true")
    props = properties_to_string({MessageConst.PROPERTY_TRANSACTION_PREPARED: "true"})
    response = await g.send(g.master(), "Orders", b"x", props=props)
    assert response.code == ResponseCode.NO_PERMISSION
    assert response.remark == "the broker[127.0.0.1] sending transaction message is forbidden"
    plain = await g.send(g.master(), "Orders", b"y")  # other sends are not affected
    assert plain.code == ResponseCode.SUCCESS


async def end(g, offset: int, queue_offset: int, kind: int, group_name: str = "PG_TX"):
    ext = {
        "producerGroup": group_name,
        "tranStateTableOffset": queue_offset,
        "commitLogOffset": offset,
        "commitOrRollback": kind,
        "msgId": "X",
    }
    return await g.call(g.master(), RequestCode.END_TRANSACTION, ext)


async def test_end_transaction_refusals_and_idempotent_commit(nursery, tmp_path):
    g = await one_member(nursery, tmp_path)
    born_ms = int(time.time() * 1000)
    props = properties_to_string(
        {
            MessageConst.PROPERTY_TRANSACTION_PREPARED: "true",
            MessageConst.PROPERTY_PRODUCER_GROUP: "PG_TX",
            MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "0A" * 16,
        }
    )
    ext = send_header_v2(
        "PG_TX", "Orders", 1, born_timestamp_ms=born_ms, properties=props, sys_flag=4
    )
    sent = await g.call(g.master(), RequestCode.SEND_MESSAGE_V2, ext, b"half")
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    assert sent.ext_fields["queueId"] == "1"  # the queue asked for, not the half topic's
    offset = decode_message_id(sent.ext_fields["msgId"]).offset
    queue_offset = int(sent.ext_fields["queueOffset"])

    unknown = await end(g, 12345, 0, 8)
    assert unknown.code == ResponseCode.SYSTEM_ERROR
    assert unknown.remark == (
        "Find prepared transaction message failed: no half message at commitLogOffset 12345"
    )
    wrong_group = await end(g, offset, queue_offset, 8, "OTHER")
    assert wrong_group.code == ResponseCode.SYSTEM_ERROR
    assert wrong_group.remark.startswith("The producer group wrong")
    wrong_queue_offset = await end(g, offset, queue_offset + 5, 8)
    assert wrong_queue_offset.remark.startswith("The transaction state table offset wrong")
    bad_kind = await end(g, offset, queue_offset, 5)
    assert bad_kind.code == ResponseCode.SYSTEM_ERROR
    assert "commitOrRollback 5" in bad_kind.remark

    answers = []

    async def commit() -> None:
        answers.append(await end(g, offset, queue_offset, 8))

    async with trio.open_nursery() as both:  # two commits at once: one real message
        both.start_soon(commit)
        both.start_soon(commit)
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 2
    again = await end(g, offset, queue_offset, 8)
    assert (again.code, again.remark) == (
        ResponseCode.SUCCESS,
        "transaction already ended (commit)",
    )
    late_rollback = await end(g, offset, queue_offset, 12)
    assert late_rollback.code == ResponseCode.TRANSACTION_FAILED
    assert "already committed" in late_rollback.remark
    assert [m.body for m in await stored(g, "Orders", 2)] == [b"half"]
    assert len(await stored(g, OP_TOPIC)) == 1

    refused = await g.send(g.master(), HALF_TOPIC, b"x")  # the broker's own topics
    assert refused.code == ResponseCode.NO_PERMISSION


async def test_a_repeated_end_without_the_key_index_writes_nothing(nursery, tmp_path):
    """messageIndexEnable=false: how a settled half ended is not looked up, so a
    repeated END_TRANSACTION, either kind, is answered SUCCESS and writes nothing."""
    g = await one_member(nursery, tmp_path, messageIndexEnable="false")
    props = properties_to_string(
        {
            MessageConst.PROPERTY_TRANSACTION_PREPARED: "true",
            MessageConst.PROPERTY_PRODUCER_GROUP: "PG_TX",
            MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "0B" * 16,
        }
    )
    born_ms = int(time.time() * 1000)
    ext = send_header_v2(
        "PG_TX", "Orders", 0, born_timestamp_ms=born_ms, properties=props, sys_flag=4
    )
    sent = await g.call(g.master(), RequestCode.SEND_MESSAGE_V2, ext, b"half")
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    offset = decode_message_id(sent.ext_fields["msgId"]).offset
    queue_offset = int(sent.ext_fields["queueOffset"])
    assert (await end(g, offset, queue_offset, 8)).code == ResponseCode.SUCCESS
    await wait_for(lambda: g.master().store.max_offset(OP_TOPIC, 0) == 1)
    for kind in (8, 12):
        again = await end(g, offset, queue_offset, kind)
        assert (again.code, again.remark) == (ResponseCode.SUCCESS, "transaction already ended")
    assert [m.body for m in await stored(g, "Orders", 2)] == [b"half"]
    assert len(await stored(g, OP_TOPIC)) == 1


async def test_settled_state_survives_a_restart(nursery, tmp_path):
    """The state is read back from the op queue: after a restart a commit is not written
    again, and a half left open is still checked."""
    # Checks count while no producer is there to ask (RocketMQ's rule): allow plenty.
    g = await one_member(nursery, tmp_path, transactionCheckMax="1000", **FAST_CHECKS)
    answers = {b"done": COMMIT, b"open": UNKNOW}
    async with TransactionProducer(
        g.namesrv_addr, "PG_TX", check=answering(UNKNOW, [])
    ) as producer:
        done = await producer.send_in_transaction("Orders", b"done", answering(COMMIT, []))
        await producer.send_in_transaction("Orders", b"open", lambda r: answers[b"open"])
    g.crash("n0")
    await g.start_member("n0")
    await g.wait_master()
    sent = done.send_result
    offset = decode_message_id(sent.offset_msg_id).offset
    again = await end(g, offset, sent.queue_offset, 8)
    assert again.code == ResponseCode.SUCCESS
    assert again.remark == "transaction already ended (commit)"
    checks: list = []
    async with TransactionProducer(  # a restarted application: it has not sent yet
        g.namesrv_addr, "PG_TX", check=answering(COMMIT, checks), topics=["Orders"]
    ):
        await wait_for(lambda: len(checks) >= 1, timeout_s=10)
        await wait_for(lambda: g.master().store.max_offset("Orders", 0) +
                       g.master().store.max_offset("Orders", 1) == 2)  # fmt: skip
    assert [m.body for m in checks] == [b"open"]
    assert sorted(m.body for m in await stored(g, "Orders", 2)) == [b"done", b"open"]


async def test_a_retry_carrying_tran_msg_is_an_ordinary_message(nursery, tmp_path):
    """Clients before 4.6.1 resend a failed transactional message to the retry topic
    with TRAN_MSG still set: it is delivered, not turned into a half message."""
    g = await one_member(nursery, tmp_path)
    props = properties_to_string({MessageConst.PROPERTY_TRANSACTION_PREPARED: "true"})
    born_ms = int(time.time() * 1000)
    ext = send_header_v2(
        "PG", "%RETRY%CG", 0, born_timestamp_ms=born_ms, properties=props, sys_flag=4
    )
    response = await g.call(g.master(), RequestCode.SEND_MESSAGE_V2, ext, b"retried")
    assert response.code == ResponseCode.SUCCESS, response.remark
    [retried] = await stored(g, "%RETRY%CG")
    assert retried.body == b"retried" and retried.sysflag & 0xC == 0
    assert await stored(g, HALF_TOPIC) == []


async def test_every_replica_derives_the_same_state_and_slaves_refuse(nursery, tmp_path):
    g = await group(nursery, tmp_path)  # three members
    await create_topic(g, "Orders", 2)
    async with TransactionProducer(g.namesrv_addr, "PG_TX", check=answering(UNKNOW, [])) as p:
        for body, state in ((b"c", COMMIT), (b"r", ROLLBACK), (b"u", UNKNOW)):
            await p.send_in_transaction("Orders", body, answering(state, []))
    end_index = g.master().dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end_index for b in g.brokers.values()))
    states = []
    for broker in g.brokers.values():
        broker.transactions.state.refresh(broker.store)
        state = broker.transactions.state
        states.append((state.settled_below, dict(state.ended), dict(state.checks)))
    assert states == [(2, {}, {})] * 3  # halves 0 and 1 settled, 2 open, on every replica
    slave = g.slaves()[0]
    ext = {"producerGroup": "PG_TX", "tranStateTableOffset": 2, "commitLogOffset": 0,
           "commitOrRollback": 8, "msgId": "X"}  # fmt: skip
    refused = await g.call(slave, RequestCode.END_TRANSACTION, ext)
    assert refused.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert "END_TRANSACTION goes to the master" in refused.remark
