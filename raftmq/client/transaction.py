"""`TransactionProducer`: RocketMQ's two-phase send (Java's `TransactionMQProducer`).

`send_in_transaction` sends a half message (TRAN_MSG=true, PGROUP, sysflag prepared;
any delay level dropped), which consumers do not see; runs the local transaction
with the send's result; and ends the transaction on the broker with its answer:
COMMIT_MESSAGE delivers the message, ROLLBACK_MESSAGE drops it, UNKNOW leaves it to
the check-back. For a transaction left open (UNKNOW, a crash, an END_TRANSACTION
lost with a failed master) the broker's master later sends CHECK_TRANSACTION_STATE
over this producer's connection; `check` answers from the application's own record
of the transaction, and the answer goes back as END_TRANSACTION.

Where it differs from Java's client:

- END_TRANSACTION is two-way and retried at the group's current master until
  `send_timeout_s` (Java sends it oneway once): across a failover the decision
  reaches the new master instead of waiting for a check-back.
- The producer heartbeats every member of the broker group, not only the master, so
  a member that becomes master already knows whom to ask about open transactions.
- A local transaction that raises counts as UNKNOW (as in Java) and the exception is
  logged; a send that is stored but not SEND_OK (a flush or slave timeout) is rolled
  back, as Java does.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import attrs
import trio

from raftmq.client.errors import MQBrokerError, RouteNotFoundError
from raftmq.client.instance import backoff_delays
from raftmq.client.producer import Producer, SendResult, SendStatus
from raftmq.client.route import MessageQueue
from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageConst, MessageExt, MessageSysFlag
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import Connection, RemotingCommand, RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import RequestCode, ResponseCode

__all__ = ["LocalTransactionState", "TransactionProducer", "TransactionSendResult"]

log = logging.getLogger(__name__)

_CALL_ERRORS = (MQBrokerError, RouteNotFoundError, RemotingConnectError, RemotingTimeoutError)


class LocalTransactionState(enum.Enum):
    """`LocalTransactionState`, valued by END_TRANSACTION's commitOrRollback."""

    COMMIT_MESSAGE = MessageSysFlag.TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
    UNKNOW = MessageSysFlag.TRANSACTION_NOT_TYPE  # sic, Java's name


StateOrAwaitable = LocalTransactionState | Awaitable[LocalTransactionState]
LocalTransaction = Callable[[SendResult], StateOrAwaitable]
CheckListener = Callable[[MessageExt], StateOrAwaitable]


@attrs.frozen
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState


async def _call(callback: Callable, argument) -> LocalTransactionState:
    """A sync or async callback's state; one that raises or answers something else is
    UNKNOW (logged)."""
    try:
        state = callback(argument)
        if inspect.isawaitable(state):
            state = await state
    except Exception:
        log.exception("transaction callback %r failed: state unknown", callback)
        return LocalTransactionState.UNKNOW
    if not isinstance(state, LocalTransactionState):
        log.error("transaction callback %r answered %r: state unknown", callback, state)
        return LocalTransactionState.UNKNOW
    return state


class TransactionProducer(Producer):
    """`async with TransactionProducer(namesrv, "group", check=check, topics=["T"]) as p:
    result = await p.send_in_transaction("T", b"x", local_transaction)`.

    `check(message)` gets the half message (its real topic, properties and
    `uniq_key`, the msgId `send_in_transaction` returned) and answers its state.
    """

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        group: str,
        *,
        check: CheckListener,
        topics: Iterable[str] = (),
        **options,
    ) -> None:
        super().__init__(namesrv_addr, group, **options)
        self.check = check
        self.topics = tuple(topics)
        self.instance.heartbeat_replicas = True
        self.instance.handlers[RequestCode.CHECK_TRANSACTION_STATE] = self._on_check

    async def __aenter__(self) -> TransactionProducer:
        """Open, and look up the routes of `topics`: their brokers learn of this producer
        (its heartbeat follows) before its first send, so an application that restarts
        answers the check-backs of transactions its previous run left open."""
        await super().__aenter__()
        for topic in self.topics:
            try:
                await self.instance.routes.get(topic)
            except RouteNotFoundError as exc:
                log.warning("transaction producer %s: %s", self.group, exc)
        return self

    async def send_in_transaction(
        self,
        topic: str,
        body: bytes,
        local_transaction: LocalTransaction,
        tags: str | None = None,
        keys: str | Iterable[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue: MessageQueue | None = None,
    ) -> TransactionSendResult:
        """Send a half message (to `queue` if given), run
        `local_transaction(send_result)`, end the transaction with its state. Raises
        SendError if the half message is not stored (the local transaction does not
        run then)."""
        props = self._properties(tags, keys, properties)
        props.pop(MessageConst.PROPERTY_DELAY_TIME_LEVEL, None)
        props[MessageConst.PROPERTY_TRANSACTION_PREPARED] = "true"
        props[MessageConst.PROPERTY_PRODUCER_GROUP] = self.group
        sent = await self.send_with_properties(
            topic, body, props, queue, MessageSysFlag.TRANSACTION_PREPARED_TYPE
        )
        if sent.status is SendStatus.SEND_OK:
            state = await _call(local_transaction, sent)
        else:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        if state is not LocalTransactionState.UNKNOW:
            await self.end(sent, state)
        return TransactionSendResult(sent, state)

    async def end(self, sent: SendResult, state: LocalTransactionState) -> None:
        """END_TRANSACTION for the half `sent` at the master (also for a half sent earlier,
        by this producer or another of its group, whose send result was kept); a failure
        is logged and left to the check-back."""
        mq = sent.message_queue
        header = {
            "producerGroup": self.group,
            "tranStateTableOffset": str(sent.queue_offset),
            "commitLogOffset": str(decode_message_id(sent.offset_msg_id).offset),
            "commitOrRollback": str(state.value),
            "fromTransactionCheck": "false",
            "msgId": sent.msg_id,
            "bname": mq.broker_name,
        }
        deadline = trio.current_time() + self.send_timeout_s
        delays = backoff_delays()
        while True:
            request = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=dict(header))
            remaining = deadline - trio.current_time()
            try:
                response = await self.instance.call_broker(
                    mq.topic, mq.broker_name, request, max(remaining, 0.001)
                )
            except _CALL_ERRORS as exc:
                log.warning("END_TRANSACTION for %s lost (the check-back decides): %s", mq, exc)
                return
            # A stale route named a member that is now a slave: ask the new master.
            if response.code != ResponseCode.SLAVE_NOT_AVAILABLE or remaining <= 0:
                break
            self.instance.routes.invalidate(mq.topic)
            await trio.sleep(min(next(delays), max(remaining, 0)))
        if response.code != ResponseCode.SUCCESS:
            code, remark = response.code, response.remark
            log.warning("END_TRANSACTION for %s answered %d: %s", sent.msg_id, code, remark)

    async def _on_check(self, request: RemotingCommand, connection: Connection) -> None:
        """CHECK_TRANSACTION_STATE: ask `check`, answer on the connection it came by."""
        ext = request.ext_fields
        try:
            msg, _size = codec.decode(request.body)
        except codec.MessageFormatError as exc:
            log.warning("CHECK_TRANSACTION_STATE with a bad message: %s", exc)
            return
        state = await _call(self.check, msg)
        if state is LocalTransactionState.UNKNOW:
            return
        header = {
            "producerGroup": self.group,
            "tranStateTableOffset": ext.get("tranStateTableOffset", ""),
            "commitLogOffset": ext.get("commitLogOffset", ""),
            "commitOrRollback": str(state.value),
            "fromTransactionCheck": "true",
            "msgId": msg.uniq_key or ext.get("msgId", ""),
        }
        if ext.get("transactionId"):
            header["transactionId"] = ext["transactionId"]
        answer = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=header)
        try:
            response = await connection.invoke(answer, self.instance.rpc_timeout_s)
        except (RemotingConnectError, RemotingTimeoutError) as exc:
            log.info("answer to a transaction check not delivered: %s", exc)
            return
        if response.code != ResponseCode.SUCCESS:
            log.info("answer to a transaction check: %d %s", response.code, response.remark)
