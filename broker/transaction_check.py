"""The transaction check-back: the master asks producers about halves left open.

RocketMQ's TransactionalMessageCheckService, on the master only: every
`transactionCheckInterval` ms, each half message older than `transactionTimeOut` ms
(or its CHECK_IMMUNITY_TIME_IN_SECONDS) with no op record is either

- checked: CHECK_TRANSACTION_STATE (39, oneway) to a live connection of a producer of
  its group (PGROUP), whose answer is an END_TRANSACTION like any other; or
- discarded once checked `transactionCheckMax` times: copied to
  TRANS_CHECK_MAX_TIME_TOPIC.

Where RocketMQ keeps the count in a new copy of the half appended per check, and its
progress in consumer offsets of CID_RMQ_SYS_TRANS, here each check is an op record
(tag "c") and a discard an op record too, so the whole state is the op queue
(transactions.TransactionState) and a new master goes on from where the old one
stopped: halves open at a failover are checked by the new master, and counted on.
A check names the half itself, so a late answer to an older check settles it as well.
A half whose real message is already stored (a crash fell between the commit's two
entries) gets its missing op record instead of a check.

A check with no producer of the half's group connected is not made, and not counted
(RocketMQ counts it): right after a failover the producers' heartbeats have not yet
reached the new master (the Java client's come every 30 s), and counting checks nobody
received would discard open transactions after `transactionCheckMax` runs.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest
from raftmq.broker.transactions import (
    CHECK_MAX_TOPIC,
    COMMIT,
    DISCARD,
    HALF_TOPIC,
    OP_CHECK_TAG,
    OP_REMOVE_TAG,
    TransactionalMessages,
)
from raftmq.dledger.server import DLedgerError

from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageConst, MessageExt
from raftmq.protocol.msgid import create_message_id
from raftmq.remoting import RemotingCommand, RemotingError, RequestCode

if TYPE_CHECKING:
    from raftmq.broker.clients import ClientManager

    from raftmq.remoting.connection import Connection

log = logging.getLogger(__name__)

HALVES_PER_RUN = 2000  # open halves looked at per run; the rest wait for the next


@attrs.define
class TransactionCheckService:
    transactions: TransactionalMessages
    clients: ClientManager
    check_interval_ms: int  # transactionCheckInterval
    timeout_ms: int  # transactionTimeOut
    check_max: int  # transactionCheckMax

    async def run(self) -> None:
        while True:
            await trio.sleep(self.check_interval_ms / 1000)
            if not self.transactions.role.is_master:
                continue
            try:
                await self.check_once()
            except (BadRequest, DLedgerError) as exc:  # the next run tries again
                log.warning("transaction check paused: %s", exc)

    async def check_once(self) -> int:
        """One run; returns how many halves it checked or discarded."""
        transactions = self.transactions
        state = await transactions.caught_up_state()
        queue = transactions.store.queue(HALF_TOPIC, 0)
        if queue is None:
            return 0
        now_ms = transactions.store.now_ms()
        records: list[MessageExt] = []
        checks: list[tuple[MessageExt, Connection]] = []  # each with the producer to ask
        handled = unasked = 0
        start = max(state.settled_below, queue.min_offset)
        for offset in range(start, min(queue.max_offset, start + HALVES_PER_RUN)):
            if state.end_of(offset) is not None:
                continue
            half = transactions.half_by_queue_offset(offset)
            if half is None or now_ms - half.store_timestamp < self._immunity_ms(half):
                continue
            handled += 1
            if transactions.committed_copy(half):
                records.append(transactions.op_message(offset, OP_REMOVE_TAG, COMMIT))
            elif state.checks.get(offset, 0) >= self.check_max:
                log.warning("half %d checked %d times: discarded", offset, self.check_max)
                op = transactions.op_message(offset, OP_REMOVE_TAG, DISCARD)
                records += [self._discarded(half), op]
            elif (producer := self._producer(half)) is None:
                unasked += 1  # not counted: nobody was asked
            else:
                records.append(transactions.op_message(offset, OP_CHECK_TAG))
                checks.append((half, producer))
        if unasked:
            log.info("%d open halves wait for a producer of their group to connect", unasked)
        if not records:
            return handled
        await transactions.ensure_topics()
        await transactions.put(records)
        for half, producer in checks:
            self._ask(half, producer)
        return handled

    def _immunity_ms(self, half: MessageExt) -> int:
        """CHECK_IMMUNITY_TIME_IN_SECONDS if the producer set it, else the timeout."""
        seconds = half.properties.get(MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        with contextlib.suppress(TypeError, ValueError):
            if seconds is not None and int(seconds) >= 0:
                return int(seconds) * 1000
        return self.timeout_ms

    def _discarded(self, half: MessageExt) -> MessageExt:
        """`resolveDiscardMsg`: the half, as it was, in the discard topic's queue 0."""
        return attrs.evolve(
            half, topic=CHECK_MAX_TOPIC, queue_id=0, properties=dict(half.properties)
        )

    def _producer(self, half: MessageExt) -> Connection | None:
        """A live connection of a producer of the half's group, or None."""
        group = half.properties.get(MessageConst.PROPERTY_PRODUCER_GROUP, "")
        return self.clients.producer_connection(group)

    def _ask(self, half: MessageExt, connection: Connection) -> None:
        """CHECK_TRANSACTION_STATE to `connection`, a producer of the half's group, oneway
        (asked for once a half: the client manager hands out its producers in turn)."""
        group = half.properties.get(MessageConst.PROPERTY_PRODUCER_GROUP, "")
        props = half.properties
        uniq = props.get(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        store_host = self.transactions.address.store_host
        header = {
            "tranStateTableOffset": str(half.queue_offset),
            "commitLogOffset": str(half.physical_offset),
            "msgId": uniq,
            "transactionId": uniq,
            "offsetMsgId": create_message_id(store_host, half.physical_offset),
        }
        shown = attrs.evolve(
            half,
            topic=props.get(MessageConst.PROPERTY_REAL_TOPIC, half.topic),
            queue_id=int(props.get(MessageConst.PROPERTY_REAL_QUEUE_ID, half.queue_id)),
        )
        request = RemotingCommand(
            code=RequestCode.CHECK_TRANSACTION_STATE, ext_fields=header, body=codec.encode(shown)
        )
        try:
            connection.invoke_oneway(request)
        except (RemotingError, OSError) as exc:
            log.info("check of half %d not sent to group %s: %s", half.queue_offset, group, exc)
