"""Transactional messages: half messages, END_TRANSACTION (37), and their settled state.

RocketMQ's two-phase send (TransactionalMessageServiceImpl, EndTransactionProcessor):

- a send marked prepared (sysflag TRAN_PREPARED or property TRAN_MSG=true) is stored
  as a *half message* in RMQ_SYS_TRANS_HALF_TOPIC queue 0, its real topic and queue in
  the REAL_TOPIC / REAL_QID properties and its transaction bits cleared (`to_half`);
  consumers never see it;
- END_TRANSACTION commit writes the real message (topic and queue restored, sysflag
  COMMIT, preparedTransactionOffset = the half's offset) and an *op record* in
  RMQ_SYS_TRANS_OP_HALF_TOPIC whose body is the half's queue offset (tag "d");
  rollback writes only the op record;
- the master asks a producer of the group about halves left open too long
  (transaction_check.TransactionCheckService).

Which halves are settled is derived, on every replica, from the op queue, which
dispatch fills from the committed log (`TransactionState`); nothing about a
transaction lives only in a master's memory, so a new master settles, checks or
refuses exactly what the old one would have.

Better than RocketMQ, which commits twice when asked twice (apache/rocketmq#5574):
a second END_TRANSACTION for a settled half writes nothing. Before deciding, the
master waits until everything in its log is dispatched (an earlier END_TRANSACTION
whose append is still in flight then shows as an op record), requests for one half
are taken one at a time, and a committed real message found by the key index
(REAL_TOPIC#UNIQ_KEY with the half's offset as preparedTransactionOffset) counts as
settled too: the real message and its op record are two log entries, and a crash
between them must not let a check-back commit the transaction again. A commit of a
half already rolled back or discarded (checked too often), or a rollback of a committed
one, is answered TRANSACTION_FAILED: a discard is final here, where RocketMQ would still
deliver a late commit it had already copied to the discard topic.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest, integer, text

from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageConst, MessageExt, MessageSysFlag
from raftmq.protocol.msgid import UniqIdGenerator
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.topic_config_manager import TopicConfigManager

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # halves checked too often, discarded
TRANSACTION_TOPICS = frozenset({HALF_TOPIC, OP_TOPIC, CHECK_MAX_TOPIC})
OP_REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVETAG: the half is settled
# raftmq's: the half was checked once more (the count survives a failover). RocketMQ
# keeps the count in a re-appended copy of the half instead; its checker skips ops
# whose tag is not "d".
OP_CHECK_TAG = "c"
# raftmq's: how an op record settled its half (RocketMQ's op records do not say).
PROPERTY_TRANSACTION_END = "TRAN_END"
COMMIT, ROLLBACK, DISCARD = "COMMIT", "ROLLBACK", "DISCARD"
SETTLED = "SETTLED"  # settled long enough ago that how is no longer held
_PAST = {
    COMMIT: "committed",
    ROLLBACK: "rolled back",
    DISCARD: f"discarded (checked too often; see {CHECK_MAX_TOPIC})",
}
END_TYPES = {
    MessageSysFlag.TRANSACTION_COMMIT_TYPE: COMMIT,
    MessageSysFlag.TRANSACTION_ROLLBACK_TYPE: ROLLBACK,
}
CATCH_UP_WAIT_S = 3.0  # how long a decision waits for this node's log to be dispatched
KEY_LOOKUP_MAX = 32  # index hits read when looking for a committed real message


def is_prepared(sysflag: int, properties: dict[str, str]) -> bool:
    """A send that is the first half of a transaction (the broker routes on TRAN_MSG,
    Java's client also sets the sysflag)."""
    prepared = MessageSysFlag.get_transaction_value(sysflag)
    flagged = properties.get(MessageConst.PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"
    return flagged or prepared == MessageSysFlag.TRANSACTION_PREPARED_TYPE


def to_half(msg: MessageExt) -> MessageExt:
    """`TransactionalMessageBridge.parseHalfMessageInner`: the message as stored until
    its transaction ends."""
    msg.properties[MessageConst.PROPERTY_REAL_TOPIC] = msg.topic
    msg.properties[MessageConst.PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    msg.sysflag = MessageSysFlag.reset_transaction_value(
        msg.sysflag, MessageSysFlag.TRANSACTION_NOT_TYPE
    )
    msg.topic, msg.queue_id = HALF_TOPIC, 0
    return msg


def real_message(half: MessageExt, end_type: int) -> MessageExt:
    """`endMessageTransaction`: the half restored to its real topic and queue, with the
    transaction bits set to `end_type`. Properties stay as RocketMQ stores them
    (REAL_TOPIC, REAL_QID and TRAN_MSG included), and the same UNIQ_KEY."""
    props = half.properties
    return MessageExt(
        topic=props[MessageConst.PROPERTY_REAL_TOPIC],
        queue_id=int(props[MessageConst.PROPERTY_REAL_QUEUE_ID]),
        body=half.body,
        properties=dict(props),
        flag=half.flag,
        sysflag=MessageSysFlag.reset_transaction_value(half.sysflag, end_type),
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        store_host=half.store_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.physical_offset,
    )


@attrs.define
class TransactionState:
    """What the op queue says about the halves: settled (and how) or checked (how
    often). Read lazily and incrementally from the dispatched op queue, so every
    replica — and a restarted one, from the retained queue — holds the same state.

    Every half below `settled_below` is settled; `ended` and `checks` hold only the
    halves from there on, so memory follows the open transactions, not all of them.
    """

    settled_below: int = 0
    ended: dict[int, str] = attrs.Factory(dict)  # half queue offset -> COMMIT/ROLLBACK/DISCARD
    checks: dict[int, int] = attrs.Factory(dict)  # half queue offset -> times checked
    _op_read: int = 0  # the next op-queue offset to read

    def refresh(self, store: MessageStore) -> None:
        half = store.queue(HALF_TOPIC, 0)
        if half is not None:  # halves retention deleted can no longer be ended
            self._advance_to(half.min_offset)
        ops = store.queue(OP_TOPIC, 0)
        if ops is None:
            return
        offset = max(self._op_read, ops.min_offset)
        for phys, size, _tags in ops.entries(offset, ops.max_offset - offset):
            self._apply(store.commitlog.read(phys, size))
        self._op_read = ops.max_offset
        self._advance_to(self.settled_below)

    def _apply(self, record: bytes) -> None:
        op, _size = codec.decode(record)
        try:
            half_offset = int(op.body)
        except (TypeError, ValueError):
            log.error("op record at %d has no half offset: %r", op.physical_offset, op.body)
            return
        if half_offset < self.settled_below:
            return
        if op.tags == OP_REMOVE_TAG:
            # RocketMQ's own op records carry no TRAN_END: a settled half all the same.
            self.ended[half_offset] = op.properties.get(PROPERTY_TRANSACTION_END, COMMIT)
            self.checks.pop(half_offset, None)
        elif op.tags == OP_CHECK_TAG and half_offset not in self.ended:
            self.checks[half_offset] = self.checks.get(half_offset, 0) + 1

    def _advance_to(self, offset: int) -> None:
        below = max(self.settled_below, offset)
        while below in self.ended:
            below += 1
        if below != self.settled_below:
            self.settled_below = below
            self.ended = {k: v for k, v in self.ended.items() if k >= below}
            self.checks = {k: v for k, v in self.checks.items() if k >= below}

    def end_of(self, half_offset: int) -> str | None:
        """How the half was settled; None while it is open. A half below the ones
        held was settled, how is forgotten: SETTLED."""
        if half_offset < self.settled_below:
            return SETTLED
        return self.ended.get(half_offset)


@attrs.define
class TransactionalMessages:
    """The master's side of transactions: END_TRANSACTION, and the records the check
    service writes. `put` stores records as a send does (SendProcessor.put);
    `schedule_if_delayed` routes a committed message with a delay level."""

    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    address: BrokerAddress
    put: Callable[[list[MessageExt]], Awaitable[list[tuple[int, int]]]]
    schedule_if_delayed: Callable[[MessageExt], MessageExt]
    state: TransactionState = attrs.Factory(TransactionState)
    _busy: dict[int, trio.Lock] = attrs.field(factory=dict, init=False)
    _uniq_ids: UniqIdGenerator = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._uniq_ids = UniqIdGenerator(ip=self.address.ip)

    # ------------------------------------------------------------------ state
    async def caught_up_state(self) -> TransactionState:
        """The state once every entry now in this node's log is dispatched: on the
        master, that includes every op record an earlier decision appended."""
        store = self.store
        if not await store.dispatch_caught_up(CATCH_UP_WAIT_S):
            raise BadRequest(
                f"transaction state not settled: log dispatched to {store.dispatched_index}"
                f" of {store.server.store.end_index} after {CATCH_UP_WAIT_S} s; try again",
                ResponseCode.SYSTEM_BUSY,
            )
        self.state.refresh(store)
        return self.state

    def committed_copy(self, half: MessageExt) -> bool:
        """Whether the half's real message is stored (found by the key index)."""
        topic = half.properties.get(MessageConst.PROPERTY_REAL_TOPIC)
        uniq = half.properties.get(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if not topic or not uniq:
            return False
        records, _end_ms, _end_phy = self.store.query_message(
            topic, uniq, KEY_LOOKUP_MAX, half.store_timestamp - 1000, 2**63 - 1
        )
        for record in records:
            msg, _size = codec.decode(record, read_body=False)
            if (
                msg.prepared_transaction_offset == half.physical_offset
                and msg.topic == topic
                and MessageSysFlag.get_transaction_value(msg.sysflag)
                == MessageSysFlag.TRANSACTION_COMMIT_TYPE
            ):
                return True
        return False

    def half_at(self, commit_log_offset: int) -> MessageExt | None:
        """The half message stored at `commit_log_offset`, or None."""
        try:
            msg, _size = codec.decode(self.store.message_at(commit_log_offset))
        except (IndexError, ValueError, codec.MessageFormatError):
            return None
        if msg.topic != HALF_TOPIC or msg.physical_offset != commit_log_offset:
            return None
        return msg

    def half_by_queue_offset(self, queue_offset: int) -> MessageExt | None:
        queue = self.store.queue(HALF_TOPIC, 0)
        if queue is None or not queue.min_offset <= queue_offset < queue.max_offset:
            return None
        phys, size, _tags = queue.get(queue_offset)
        msg, _size = codec.decode(self.store.commitlog.read(phys, size))
        return msg

    def op_message(self, half_offset: int, tag: str, end: str | None = None) -> MessageExt:
        """`makeOpMessageInner`: body = the half's queue offset."""
        host = self.address.store_host
        props = {
            MessageConst.PROPERTY_TAGS: tag,
            MessageConst.PROPERTY_WAIT_STORE_MSG_OK: "true",
            MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: self._uniq_ids.next_id(),
        }
        if end is not None:
            props[PROPERTY_TRANSACTION_END] = end
        return MessageExt(
            topic=OP_TOPIC,
            body=str(half_offset).encode(),
            properties=props,
            born_timestamp=self.store.now_ms(),
            born_host=host,
            store_host=host,
        )

    async def ensure_topics(self) -> None:
        """The transaction topics exist (1 queue, as RocketMQ auto-creates them), so
        `mqadmin` and consumers of the discard topic find them."""
        for topic in (HALF_TOPIC, OP_TOPIC, CHECK_MAX_TOPIC):
            await self.topics.ensure_system_topic(topic)

    # ------------------------------------------------------------------ END_TRANSACTION
    async def end_transaction(self, request: RemotingCommand, connection: Connection):
        """END_TRANSACTION (37), usually oneway: commit or roll back a half message."""
        if not self.role.is_master:
            if request.is_oneway:
                return None
            return request.make_response(
                ResponseCode.SLAVE_NOT_AVAILABLE,
                f"not master: {self.role.broker_name} member {self.role.self_id} is a slave;"
                " END_TRANSACTION goes to the master",
            )
        group = text(request, "producerGroup")
        queue_offset = integer(request, "tranStateTableOffset")
        commit_log_offset = integer(request, "commitLogOffset")
        end_type = integer(request, "commitOrRollback")
        text(request, "msgId")  # required, as in RocketMQ's header
        from_check = request.ext_fields.get("fromTransactionCheck", "false") in ("true", "1")
        if end_type == MessageSysFlag.TRANSACTION_NOT_TYPE:
            log.info("END_TRANSACTION unknown for %d (check: %s)", commit_log_offset, from_check)
            return request.make_response(
                ResponseCode.SUCCESS, "transaction state unknown: left to the check-back"
            )
        if end_type not in END_TYPES:
            raise BadRequest(
                f"commitOrRollback {end_type} is not 0 (unknown), 8 (commit) or 12 (rollback)",
                ResponseCode.SYSTEM_ERROR,
            )
        lock = self._busy.setdefault(queue_offset, trio.Lock())
        try:
            async with lock:
                code, remark = await self._end(group, queue_offset, commit_log_offset, end_type)
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._busy.pop(queue_offset, None)
        return request.make_response(code, remark)

    async def _end(
        self, group: str, queue_offset: int, commit_log_offset: int, end_type: int
    ) -> tuple[int, str | None]:
        half = self.half_at(commit_log_offset)
        if half is None:
            return (
                ResponseCode.SYSTEM_ERROR,
                f"Find prepared transaction message failed: no half message at "
                f"commitLogOffset {commit_log_offset}",
            )
        problem = _mismatch(half, group, queue_offset, commit_log_offset)
        if problem is not None:
            return ResponseCode.SYSTEM_ERROR, problem
        state = await self.caught_up_state()
        wanted = END_TYPES[end_type]
        ended = state.end_of(queue_offset)
        if ended == SETTLED:  # how is forgotten; the real message, if any, says
            if self.store.index is None:  # messageIndexEnable=false: nothing can say
                return ResponseCode.SUCCESS, "transaction already ended"
            ended = COMMIT if self.committed_copy(half) else ROLLBACK
        elif ended is None and self.committed_copy(half):
            ended = COMMIT  # its op record was lost with a crash: write it now
            await self.put([self.op_message(queue_offset, OP_REMOVE_TAG, COMMIT)])
        if ended == wanted or (ended == DISCARD and wanted == ROLLBACK):
            return ResponseCode.SUCCESS, f"transaction already ended ({ended.lower()})"
        if ended is not None:
            return (
                ResponseCode.TRANSACTION_FAILED,
                f"the transaction of half offset {queue_offset} was already {_PAST[ended]};"
                f" {wanted.lower()} ignored",
            )
        await self.ensure_topics()
        records = [self.op_message(queue_offset, OP_REMOVE_TAG, wanted)]
        if wanted == COMMIT:
            real = self.schedule_if_delayed(real_message(half, end_type))
            real.store_host = self.address.store_host
            records.insert(0, real)
        await self.put(records)
        state.ended.setdefault(queue_offset, wanted)  # also read back from the op queue
        return ResponseCode.SUCCESS, None


def _mismatch(half: MessageExt, group: str, queue_offset: int, commit_log_offset: int):
    """`checkPrepareMessage`: what does not match the request, in RocketMQ's words."""
    if half.properties.get(MessageConst.PROPERTY_PRODUCER_GROUP) != group:
        return f"The producer group wrong: the half message belongs to another group, not {group}"
    if half.queue_offset != queue_offset:
        return (
            f"The transaction state table offset wrong: the half message's is "
            f"{half.queue_offset}, not {queue_offset}"
        )
    if half.physical_offset != commit_log_offset:
        return "The commit log offset wrong"
    return None


__all__ = [
    "CHECK_MAX_TOPIC",
    "HALF_TOPIC",
    "OP_TOPIC",
    "TRANSACTION_TOPICS",
    "TransactionState",
    "TransactionalMessages",
    "is_prepared",
    "to_half",
]
