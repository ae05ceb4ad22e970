"""Queue locks for orderly consumers: LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42).

A consumer with an orderly listener (Java's MessageListenerOrderly) consumes a
queue only while it holds the queue's lock at the master, so that two members of
a group never work on one queue at once during a rebalance. It locks the queues
it was assigned every 20 s and unlocks those it gives up. The rules are
RocketMQ's RebalanceLockManager: a lock belongs to one client id of a group; it
lapses 60 s after its holder last locked it (a crashed consumer frees its queues
without unlocking); locking again renews it; only the holder can unlock.

Locks live in the master's memory, as in RocketMQ: after a failover the new
master has none, and the consumers take them again at their next lock round (a
consumer that fails to lock pauses its queue and retries).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from raftmq.broker.headers import BadRequest, json_body

from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.role import BrokerRole

LOCK_MAX_LIVE_MS = 60_000  # rocketmq.broker.rebalance.lockMaxLiveTime

Queue = tuple[str, str, int]  # topic, brokerName, queueId


class QueueLocks:
    def __init__(self, now_ms, max_live_ms: int = LOCK_MAX_LIVE_MS) -> None:
        self._now_ms = now_ms
        self._max_live_ms = max_live_ms
        self._held: dict[str, dict[Queue, tuple[str, int]]] = {}  # group -> queue -> holder

    def lock(self, group: str, queues: list[Queue], client_id: str) -> list[Queue]:
        """Lock or renew `queues` for `client_id`; returns those it now holds."""
        now_ms = self._now_ms()
        held = self._held.setdefault(group, {})
        granted = []
        for queue in queues:
            holder = held.get(queue)
            if holder is None or holder[0] == client_id or now_ms - holder[1] > self._max_live_ms:
                held[queue] = (client_id, now_ms)
                granted.append(queue)
        return granted

    def unlock(self, group: str, queues: list[Queue], client_id: str) -> None:
        held = self._held.get(group, {})
        for queue in queues:
            holder = held.get(queue)
            if holder is not None and holder[0] == client_id:
                del held[queue]

    def clear(self) -> None:
        """Forget every lock (this node stopped being the master)."""
        self._held.clear()


def _batch(request: RemotingCommand) -> tuple[str, str, list[Queue]]:
    """(group, client id, queues) of a Lock/UnlockBatchRequestBody."""
    try:
        body = json.loads(request.body)
        queues = [(str(q["topic"]), str(q["brokerName"]), int(q["queueId"])) for q in body["mqSet"]]
        return str(body["consumerGroup"]), str(body["clientId"]), queues
    except KeyError as exc:
        raise BadRequest(f"bad lock body: no {exc.args[0]}") from None
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"bad lock body: {exc}") from None


class LockRequests:
    def __init__(self, role: BrokerRole, locks: QueueLocks) -> None:
        self.role = role
        self.locks = locks

    async def lock(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        group, client_id, queues = _batch(request)
        granted = self.locks.lock(group, queues, client_id)
        body = {"lockOKMQSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in granted]}
        return request.make_response(ResponseCode.SUCCESS, body=json_body(body))

    async def unlock(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        group, client_id, queues = _batch(request)
        self.locks.unlock(group, queues, client_id)
        return request.make_response(ResponseCode.SUCCESS)
