"""The transactions workload (`--workload transactions`) and its checks.

Producers run transactions through our TransactionProducer: each sends a unique value
as a half message to a random queue, then decides at random to commit or roll back,
either at once (END_TRANSACTION) or by leaving it open (UNKNOW) for the broker's
check-back to ask. The check listener answers as an application would, from its own
record: the decision for the half the send acknowledged, ROLLBACK for any other half
of the value (a retried send's earlier attempt) or for a value whose send failed (its
local transaction never ran), UNKNOW while the send is still under way. Consumers are
the queue workload's.

So a value must be delivered exactly when its half was acknowledged and the decision
was commit; everything else must never be delivered. The history records that
directly: a send completes `ok` for a committed transaction, `fail` for one rolled
back or whose half send failed (`error` says which), so the queue checks that apply
read it as they read plain sends — `lost` is a committed transaction missing,
`aborted_reads` anything delivered that must not be, `duplicated` a value stored
twice — and `rolled_back_delivered` singles out the rolled-back ones. Checks that
need the acknowledged offset (the real message is written at commit, later) or FIFO
order (a check-back commits out of order) are left out.

Before the drain the runner waits (`settle`) until every committed transaction is
in the log: those left to the check-back, or whose END_TRANSACTION was lost with a
killed master, are settled by the new master's check-back, which needs the producers
still connected.
"""

from __future__ import annotations

import dataclasses

import trio

from jepsen.checker import CHECKS, Facts, check_availability, first_sightings, info, verdict
from jepsen.workload import PRODUCER_GROUP, QUEUES, SEND_TIMEOUT_S, TOPIC, Workload, wait_stored
from raftmq.client.errors import SendError
from raftmq.client.transaction import LocalTransactionState, TransactionProducer
from raftmq.protocol.message import MessageExt
from raftmq.protocol.msgid import decode_message_id

SETTLE_TIMEOUT_S = 60.0
# Broker settings for the run: check open transactions within a couple of seconds.
BROKER_CONF = {"transactionTimeOut": "1000", "transactionCheckInterval": "500"}
SENDING = "sending"  # a value's send is under way
FAILED = "failed"  # a value's half send raised: its local transaction never ran
ANSWERS = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
}


class TransactionWorkload(Workload):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # value -> SENDING, FAILED, or (acknowledged half's offset, decision)
        self.halves: dict[str, str | tuple[int, str]] = {}
        self.committed: set[str] = set()

    # ------------------------------------------------------------------ producers
    async def produce(self) -> None:
        producer = TransactionProducer(
            self.namesrv_addr,
            PRODUCER_GROUP,
            check=self._check,
            topics=[TOPIC],
            send_timeout_s=SEND_TIMEOUT_S,
            rpc_timeout_s=SEND_TIMEOUT_S,
            poll_name_server_interval_s=1.0,
        )
        async with producer:
            async with trio.open_nursery() as nursery:
                for _ in range(self.producers):
                    nursery.start_soon(self._producer, producer)
            self.sends_done.set()
            await trio.sleep_forever()  # answering check-backs until the run ends

    def _operation(self, process: int, seq: int) -> dict:
        op = super()._operation(process, seq)
        op["value"] = f"t{op['value']}"
        op["decision"] = self.rng.choice(("commit", "rollback"))
        op["via"] = self.rng.choice(("end", "check"))
        return op

    async def _perform(self, producer: TransactionProducer, op: dict) -> tuple[str, dict]:
        return await self._transaction(producer, **op)

    async def _transaction(self, producer, value: str, key: int, decision: str, via: str):
        self.halves[value] = SENDING

        def local(sent) -> LocalTransactionState:
            self.halves[value] = (decode_message_id(sent.offset_msg_id).offset, decision)
            return ANSWERS[decision] if via == "end" else LocalTransactionState.UNKNOW

        try:
            result = await producer.send_in_transaction(
                TOPIC, value.encode(), local, queue=self.queue(key)
            )
        except SendError as exc:
            self.halves[value] = FAILED
            return "fail", {"error": f"half not acknowledged: {exc}"}
        if self.halves[value] == SENDING:  # stored, but not SEND_OK: rolled back
            self.halves[value] = FAILED
            return "fail", {"error": f"half stored late ({result.send_result.status.name})"}
        if decision == "rollback":
            return "fail", {"error": "rolled back", "msg_id": result.send_result.msg_id}
        self.committed.add(value)
        return "ok", {"msg_id": result.send_result.msg_id}

    def _check(self, msg: MessageExt) -> LocalTransactionState:
        """The application's answer from its own record of the transaction."""
        state = self.halves.get(msg.body.decode(errors="replace"), FAILED)
        if state == SENDING:
            return LocalTransactionState.UNKNOW
        if state == FAILED or state[0] != msg.physical_offset:
            return LocalTransactionState.ROLLBACK_MESSAGE
        return ANSWERS[state[1]]

    # ------------------------------------------------------------------ drain
    async def settle(self, master_address: str) -> bool:
        """Until every committed transaction is in the master's log (or the timeout)."""
        queues = [self.queue(queue_id) for queue_id in range(QUEUES)]
        return await wait_stored(master_address, queues, self.committed, SETTLE_TIMEOUT_S)


def check_rolled_back_delivered(facts: Facts) -> dict:
    """Transactions rolled back (at once or by the check-back) yet seen anywhere."""
    rolled_back = {
        pair.invoke["value"] for pair in facts.sends if pair.invoke.get("decision") == "rollback"
    }
    return verdict(first_sightings(facts, rolled_back.__contains__))


def check_settled_by_check_back(facts: Facts) -> dict:
    """Committed transactions left open by the producer and committed by the check-back
    (informational: shows the check-back ran)."""
    values = [
        value
        for value, pair in facts.acked.items()
        if pair.invoke.get("via") == "check" and value in facts.final_values
    ]
    return info(len(values), values)


def check_commit_availability(facts: Facts) -> dict:
    """The queue workload's availability over the transactions meant to commit: a
    rollback ends `fail` by design, not because the group was unavailable."""
    commits = [pair for pair in facts.sends if pair.invoke.get("decision") == "commit"]
    return check_availability(dataclasses.replace(facts, sends=commits))


TRANSACTION_CHECKS = {
    **{
        name: CHECKS[name]
        for name in (
            "counts",
            "lost",
            "unexpected",
            "aborted_reads",
            "recovered",
            "duplicated",
            "redelivered",
            "nonmonotonic_poll",
            "poll_skip",
            "consumer_offsets_monotonic",
            "replica_agreement",
            "latency",
        )
    },
    "availability": check_commit_availability,
    "rolled_back_delivered": check_rolled_back_delivered,
    "settled_by_check_back": check_settled_by_check_back,
}
