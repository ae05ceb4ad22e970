"""Queue locks for orderly consumers (LOCK_BATCH_MQ 41, UNLOCK_BATCH_MQ 42)."""

from __future__ import annotations

import json

from raftmq.broker.locks import QueueLocks

from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import group

Q0, Q1 = ("T", "broker-t", 0), ("T", "broker-t", 1)


def test_a_lock_has_one_holder_until_it_lapses_or_is_released():
    clock = [0]
    locks = QueueLocks(lambda: clock[0], max_live_ms=60_000)
    assert locks.lock("G", [Q0, Q1], "a") == [Q0, Q1]
    assert locks.lock("G", [Q0, Q1], "b") == []  # held by a
    assert locks.lock("other", [Q0], "b") == [Q0]  # locks are per group
    clock[0] = 50_000
    assert locks.lock("G", [Q0], "a") == [Q0]  # renewed at 50 s
    clock[0] = 70_000
    assert locks.lock("G", [Q0, Q1], "b") == [Q1]  # Q1 lapsed at 60 s, Q0 holds until 110 s
    locks.unlock("G", [Q0], "b")  # not b's to release
    assert locks.lock("G", [Q0], "b") == []
    locks.unlock("G", [Q0], "a")
    assert locks.lock("G", [Q0], "b") == [Q0]


def _body(client_id: str, *queue_ids: int) -> bytes:
    mqs = [{"topic": "T", "brokerName": "broker-t", "queueId": q} for q in queue_ids]
    return json.dumps({"consumerGroup": "G", "clientId": client_id, "mqSet": mqs}).encode()


async def test_orderly_consumers_lock_and_unlock_queues_at_the_master(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    master = g.master()
    first = await g.call(master, RequestCode.LOCK_BATCH_MQ, body=_body("c1", 0, 1))
    assert first.code == ResponseCode.SUCCESS
    assert [q["queueId"] for q in json.loads(first.body)["lockOKMQSet"]] == [0, 1]
    second = await g.call(master, RequestCode.LOCK_BATCH_MQ, body=_body("c2", 1, 2))
    assert [q["queueId"] for q in json.loads(second.body)["lockOKMQSet"]] == [2]
    released = await g.call(master, RequestCode.UNLOCK_BATCH_MQ, body=_body("c1", 1))
    assert released.code == ResponseCode.SUCCESS
    third = await g.call(master, RequestCode.LOCK_BATCH_MQ, body=_body("c2", 1))
    assert [q["queueId"] for q in json.loads(third.body)["lockOKMQSet"]] == [1]
    slave = await g.call(g.slaves()[0], RequestCode.LOCK_BATCH_MQ, body=_body("c1", 0))
    assert slave.code == ResponseCode.SERVICE_NOT_AVAILABLE
    bad = await g.call(master, RequestCode.LOCK_BATCH_MQ, body=b'{"clientId": "c1"}')
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and bad.remark == "bad lock body: no mqSet"
