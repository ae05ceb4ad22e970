"""Sending: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and
CONSUMER_SEND_MSG_BACK (36), with RocketMQ's retry, delay and dead-letter rules.

A transactional send (prepared) is stored as a half message (broker.transactions),
or refused with NO_PERMISSION when `rejectTransactionMessage` is set.

A message is serialized here as a CommitLog record and appended through DLedger;
the answer goes back once a quorum has it on disk. (On a classic CommitLog,
`store.classic_commitlog`, a message stored but not flushed or replicated in time
is answered 10, 11 or 12, as RocketMQ answers it.) DLedger's refusals map as
RocketMQ's DLedgerCommitLog maps them: not the leader → SERVICE_NOT_AVAILABLE
(the client retries, and refreshes its route), a full disk (DISK_FULL) →
SERVICE_NOT_AVAILABLE with RocketMQ's remark and how full each store directory's
filesystem is, a quorum-ack timeout → SYSTEM_ERROR with a remark saying the
outcome is unknown, a full pending queue → SYSTEM_BUSY.
"""

from __future__ import annotations

import logging
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
from raftmq.broker.headers import BadRequest, boolean, integer, send_header, text
from raftmq.broker.send_encoding import (
    SEND_FIELDS,
    SEND_RECORD,
    SEND_RESPONSES,
    SEND_VALUES,
    sent_message,
)
from raftmq.broker.store.classic_commitlog import PutStatus
from raftmq.broker.store.metadata import DLQ_PREFIX, PERM_WRITE, RETRY_PREFIX, SCHEDULE_TOPIC
from raftmq.broker.store.timerwheel import TIMER_TOPIC
from raftmq.broker.timer import (
    TimerConfig,
    drop_timer_properties,
    is_timer,
    recall_handle_of,
    to_timer,
)
from raftmq.broker.transactions import HALF_TOPIC, TRANSACTION_TOPICS, is_prepared, to_half
from raftmq.dledger.codes import Code

from raftmq.config.address import parse_address
from raftmq.disk.filesystem import used_ratio
from raftmq.hotpath import compiled_or
from raftmq.protocol import message as codec
from raftmq.protocol.message import PROPERTY_RESEND, MessageConst, MessageExt, MessageSysFlag
from raftmq.protocol.msgid import create_message_id, pack_host
from raftmq.remoting import (
    FLAG_ONEWAY,
    Connection,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from raftmq.remoting.codec import RAW_REQUEST, as_command, raw_command
from raftmq.transport.awaited import Awaited

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.stats import BrokerStats
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager

log = logging.getLogger(__name__)

# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET: the broker's own topics. A client's
# message in the schedule or timer topic would be delivered to whatever topic and queue
# its properties name, past every check a send makes.
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {SCHEDULE_TOPIC, TIMER_TOPIC, "OFFSET_MOVED_EVENT", *TRANSACTION_TOPICS}
)
# A delayed message goes to the schedule topic (schedule_if_delayed): not an inline send.
_DELAY_PROPERTY = MessageConst.PROPERTY_DELAY_TIME_LEVEL + codec.NAME_VALUE_SEPARATOR
# A timer message (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS) goes to the timer
# topic (broker.timer): not an inline send. Any property naming TIMER_ takes `send`.
_TIMER_PROPERTY = "TIMER_"
# A transactional message becomes a half message (is_prepared): not an inline send.
_TRANSACTION_PROPERTY = MessageConst.PROPERTY_TRANSACTION_PREPARED + codec.NAME_VALUE_SEPARATOR
# A producer's resend may already be stored (`stored_copy`): not an inline send.
_RESEND_PROPERTY = PROPERTY_RESEND + codec.NAME_VALUE_SEPARATOR
# What makes a send leave the inline path for `send` (`plain_record`): (topics no client
# sends to, the retry topics' prefix, properties `send` handles, the write permission
# bit, the record encoder's error)
INLINE_RULES = (
    NOT_ALLOWED_SEND_TOPICS,
    RETRY_PREFIX,
    (_DELAY_PROPERTY, _TIMER_PROPERTY, _TRANSACTION_PROPERTY, _RESEND_PROPERTY),
    PERM_WRITE,
    codec.MessageFormatError,
)
# How far back a resend's earlier copy is looked for, by store time: far past any
# client's send timeout (RocketMQ's clients: 3 s).
RESEND_LOOKBACK_MS = 600_000
# How long a resend waits for the appends before it to be dispatched (so that the
# key index holds an earlier copy) before it is refused with SYSTEM_BUSY.
RESEND_CATCH_UP_S = 1.0
RESEND_LOOKUP_MAX = 32  # index hits read (hash collisions included)
_BROKER_TRANSACTION_TYPES = (
    MessageSysFlag.TRANSACTION_COMMIT_TYPE,
    MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
)
_JSON = SerializeType.JSON  # a raw request's header (remoting.codec.plain_request)
_BATCH_ITEM = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLen
_NOT_LEADER = {
    Code.NOT_LEADER,
    Code.LEADER_TRANSFERRING,
    Code.TERM_CHANGED,
    Code.INCONSISTENT_LEADER,
    Code.LEADER_NOT_READY,
}
# SendMessageProcessor's remark for SERVICE_NOT_AVAILABLE, which a full disk leads to.
DISK_FULL_REMARK = (
    "service not available now. It may be caused by one of the following reasons: "
    "the broker's disk is full [{}], messages are put to the slave, message store "
    "has been shut down, etc."
)


def decode_batch(body: bytes) -> list[tuple[int, bytes, dict[str, str]]]:
    """A SEND_BATCH_MESSAGE body: (flag, body, properties) per message (MessageDecoder.decodes
    of the client's encodeMessage); BadRequest on malformed bytes."""
    items = []
    pos = 0
    try:
        while pos < len(body):
            total, _magic, _crc, flag, body_len = _BATCH_ITEM.unpack_from(body, pos)
            start = pos + _BATCH_ITEM.size
            payload = body[start : start + body_len]
            (props_len,) = struct.unpack_from(">h", body, start + body_len)
            props = body[start + body_len + 2 : start + body_len + 2 + props_len]
            if total <= 0 or len(payload) != body_len or len(props) != props_len:
                raise ValueError("truncated")
            items.append((flag, payload, codec.string_to_properties(props.decode())))
            pos += total
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(
            f"bad batch body at byte {pos}: {exc}", ResponseCode.MESSAGE_ILLEGAL
        ) from None
    if not items:
        raise BadRequest("empty batch", ResponseCode.MESSAGE_ILLEGAL)
    return items


def disk_util(commitlog_dir: Path, store_root: Path) -> str:
    """RocketMQ's diskUtil(): the share in use of the filesystems holding the CommitLog,
    the ConsumeQueues and the index (a directory not made yet counts as its parent)."""

    def ratio(path: Path) -> float:
        while not path.exists() and path != path.parent:
            path = path.parent
        return used_ratio(path)

    return "CL: {:5.2f} CQ: {:5.2f} INDEX: {:5.2f}".format(
        ratio(commitlog_dir), ratio(store_root / "consumequeue"), ratio(store_root / "index")
    )


def _append_failure(code: Code | PutStatus, disk: Callable[[], str]) -> tuple[int, str]:
    """(response code, remark) for an append DLedger did not acknowledge; `disk` says
    how full the store's disks are, for a DISK_FULL. (A classic CommitLog refuses
    only a record larger than its files.)"""
    if code is Code.DISK_FULL:
        return ResponseCode.SERVICE_NOT_AVAILABLE, DISK_FULL_REMARK.format(disk())
    if code is PutStatus.MESSAGE_ILLEGAL:
        return (
            ResponseCode.MESSAGE_ILLEGAL,
            "the message is larger than a CommitLog file (mappedFileSizeCommitLog)",
        )
    if code is PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH:
        return ResponseCode.SYSTEM_ERROR, "in-sync replicas not enough"
    if code is PutStatus.FENCED:
        return ResponseCode.SERVICE_NOT_AVAILABLE, (
            "not master: its epoch is over, or it has lost the controller (a newer master"
            " may be elected)"
        )
    if code in _NOT_LEADER:
        return ResponseCode.SERVICE_NOT_AVAILABLE, f"not master: {code.name}; refresh the route"
    if code is Code.LEADER_PENDING_FULL:
        return ResponseCode.SYSTEM_BUSY, "[PC_SYNCHRONIZED]broker busy, too many pending appends"
    if code is Code.WAIT_QUORUM_ACK_TIMEOUT:
        return (
            ResponseCode.SYSTEM_ERROR,
            "quorum ack timeout: the message may or may not be stored",
        )
    return ResponseCode.SYSTEM_ERROR, f"append failed: {code.name}"


def plain_record(
    fields: tuple,
    body: bytes,
    topics: dict,
    stamps: tuple[int, bytes, bytes],
    cluster: str,
    max_message_size: int,
    rules: tuple,
) -> tuple[int, bytes] | None:
    """(queue id, CommitLog record) of a send whose header says `fields` (send_fields)
    to a topic of `topics` (name: TopicConfig), stamped with `stamps` (now, the
    producer's address, ours); None to leave it to `send`, which explains a refusal.
    `rules` are INLINE_RULES, passed in because the compiled twin of `take_raw_sends`
    imports nothing of raftmq's."""
    not_allowed, retry_prefix, properties_for_send, perm_write, format_error = rules
    topic, queue_id, flag, sysflag, born_ms, reconsume, properties, batch = fields
    config = topics.get(topic)
    sysflag &= ~MessageSysFlag.MULTI_TAGS_FLAG
    if (
        config is None
        or topic.startswith(retry_prefix)
        or batch
        or type(properties) is not str
        or any(name in properties for name in properties_for_send)
        or len(body) > max_message_size
        or MessageSysFlag.get_transaction_value(sysflag) != MessageSysFlag.TRANSACTION_NOT_TYPE
        or topic in not_allowed
        or not config.perm & perm_write
    ):
        return None
    write_queues = config.write_queue_nums
    if queue_id < 0:
        queue_id = random.randrange(write_queues)
    elif queue_id >= max(write_queues, config.read_queue_nums):
        return None
    try:
        record = SEND_RECORD(
            *stamps, cluster, topic, queue_id, flag, sysflag, born_ms, reconsume, properties, body
        )
    except format_error:
        return None
    return queue_id, record


def take_raw_sends(
    requests: list,
    start: int,
    topics: dict,
    stamps: tuple[int, bytes, bytes],
    cluster: str,
    max_message_size: int,
    rules: tuple,
) -> tuple[list[tuple], list[bytes], list, int]:
    """The raw sends of `requests[start:]` (`plain_record` each) up to the first request
    that is not a raw send whose values read (`send_values`): (what the completion
    answers for each taken, their records, the raw requests left to `send`, the
    position of the first request not looked at, len(requests) if none). Compiled
    where the build allows: it is the one step of `send_inline` run once per send."""
    taken, records, left = [], [], []
    for pos in range(start, len(requests)):
        request = requests[pos]
        if type(request) is not RAW_REQUEST:
            return taken, records, left, pos
        fields = SEND_VALUES(request.values)
        if fields is None:
            return taken, records, left, pos
        placed = plain_record(
            fields, request.body, topics, stamps, cluster, max_message_size, rules
        )
        if placed is None:
            left.append(request)
        else:
            # its code stands for it: the completion holds no received bytes
            taken.append((request.code, placed[0], request.opaque, _JSON, request.flag))
            records.append(placed[1])
    return taken, records, left, len(requests)


TAKE_RAW_SENDS = compiled_or("take_raw_sends", take_raw_sends)


def _answerable(request: RemotingCommand | int, opaque: int, flag: int) -> RemotingCommand:
    """The request to answer: a raw one (its code) as a command with what a response and
    `Connection.respond` read of it (opaque, flag, code; a JSON header)."""
    if type(request) is int:
        return RemotingCommand(code=request, opaque=opaque, flag=flag, serialize_type=_JSON)
    return request


class _InlineAnswer:
    """The completion of a batch of inline sends: every response in one write, once.

    `taken` holds (command, or a raw request's code; queue id, opaque, serialize type,
    flag). Called by the CommitLog when the append commits or fails; `failed` when
    the append path raised after the records were handed to it, which answers
    SYSTEM_ERROR (the messages may or may not be stored) unless the completion
    already ran. Whichever comes first answers; the other finds `answered` set.
    Until then the connection counts the answers as owed (`Connection.finish` waits
    for them).
    """

    __slots__ = ("answered", "connection", "sender", "taken")

    def __init__(self, sender: SendProcessor, taken: list[tuple], connection: Connection) -> None:
        self.sender = sender
        self.taken = taken
        self.connection = connection
        self.answered = False
        connection.answers_owed += 1

    def failed(self, exc: Exception) -> None:
        """The append path raised once the records were handed to it (they may be in the
        log, and may still commit): answer them, unless the completion already has."""
        log.error("the append of %d inline sends failed", len(self.taken), exc_info=exc)
        if self.answered:
            return
        self._refuse(
            ResponseCode.SYSTEM_ERROR,
            f"the append failed after the message reached the store ({type(exc).__name__}: "
            f"{exc}): it may or may not be stored",
        )

    def _settle(self) -> None:
        self.answered = True
        self.connection.answers_owed -= 1

    def _refuse(self, code: int, remark: str) -> None:
        self._settle()
        connection = self.connection
        for request, _queue_id, opaque, _type, flag in self.taken:
            request = _answerable(request, opaque, flag)
            connection.respond(request, request.make_response(code, remark))

    def __call__(self, code: Code | PutStatus, results) -> None:
        if self.answered:  # `failed` answered them: the append path raised after them
            return
        sender, taken, connection = self.sender, self.taken, self.connection
        if results is None:
            self._refuse(*_append_failure(code, sender.disk_util))
            return
        self._settle()
        assert len(results) == len(taken), (len(results), len(taken))
        if isinstance(code, PutStatus):  # stored, but not flushed or replicated in time
            for (request, queue_id, opaque, _type, flag), placed in zip(
                taken, results, strict=True
            ):
                request = _answerable(request, opaque, flag)
                response = sender._response(request, queue_id, [placed], int(code))
                if not request.flag & FLAG_ONEWAY:
                    connection.respond(request, response)
            return
        sender.stats.put_messages += len(results)
        answers = [
            (opaque, serialize_type, queue_id, queue_offset, physical_offset)
            for (_, queue_id, opaque, serialize_type, flag), (
                physical_offset,
                queue_offset,
            ) in zip(taken, results, strict=True)
            if not flag & FLAG_ONEWAY
        ]
        if answers:
            connection.send_encoded(SEND_RESPONSES(answers, sender.address.store_host_bytes))


@attrs.define
class SendProcessor:
    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    groups: SubscriptionGroupManager  # their retry limits
    address: BrokerAddress
    stats: BrokerStats
    cluster_name: str = attrs.field(kw_only=True)
    broker_name: str = attrs.field(kw_only=True)
    max_message_size: int = attrs.field(kw_only=True)
    reject_transaction_message: bool = attrs.field(kw_only=True, default=False)
    timer: TimerConfig = attrs.field(kw_only=True, factory=TimerConfig)

    async def send(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        if not self.role.is_master:
            return self.role.not_master(request)
        send_header(request)
        topic = text(request, "topic")
        config = await self.topics.for_send(
            topic, text(request, "defaultTopic", ""), integer(request, "defaultTopicQueueNums", 4)
        )
        self._check_writable(config)
        queue_id = self._queue_id(config, integer(request, "queueId", -1))
        if topic.startswith(RETRY_PREFIX):
            default_max = self.groups.max_reconsume_times(topic)
            max_times = integer(request, "maxReconsumeTimes", default_max)
            if integer(request, "reconsumeTimes", 0) > max_times:  # to the DLQ past the limit
                dlq = await self.topics.ensure_dlq(topic[len(RETRY_PREFIX) :])
                topic, queue_id = dlq.topic_name, 0
        messages = self._messages(request, connection, topic, queue_id)
        if messages[0].topic == HALF_TOPIC:
            await self.topics.ensure_system_topic(HALF_TOPIC)
        stored = None
        if len(messages) == 1 and messages[0].properties.pop(PROPERTY_RESEND, None) is not None:
            stored = await self.stored_copy(messages[0])
        if stored is not None:  # answered as the earlier copy's send would have been
            messages = [stored]
            code, results = ResponseCode.SUCCESS, [(stored.physical_offset, stored.queue_offset)]
            queue_id = stored.queue_id
            response = self._response(request, queue_id, results, code, stored.store_host)
        else:
            code, results = await self._put(messages)
            if len(results) > 1:  # a batch: one put of many messages (TOPIC_PUT_NUMS's avgpt)
                self.stats.batched_per_minute.add(topic, len(results) - 1, self.store.now_ms())
            response = self._response(request, queue_id, results, code)
        handle = recall_handle_of(messages[0], self.broker_name)
        if handle is not None:  # SendMessageResponseHeader.recallHandle
            response.ext_fields["recallHandle"] = handle
        return response

    def send_inline(self, requests: list, connection: Connection) -> list[RemotingCommand]:
        """The send route's batch branch (`remoting.Route`): the common sends of one
        read — one message each, to an existing topic, on the master — without a task:
        their records go to DLedger as one append, and one completion answers them all
        in one write. Returns the rest (anything unusual or wrong), which take `send`,
        the branch that explains errors. Everything is built
        before the append is queued, so a failure before it leaves every request to
        `send`; once queued, a request has reached the store and is never run again:
        whatever fails after, it is answered once (`_InlineAnswer`).

        A request may come raw (`remoting.codec.plain_request`, with the values of
        SEND_VALUE_NAMES): its record is built from those, and it is decoded only if
        it is left to `send` (or its header needs reading whole)."""
        if not self.role.is_master:
            return [as_command(r) for r in requests]
        left = []
        taken = []
        records = []
        # now, the producer's address, ours
        stamps = (
            self.store.now_ms(),
            pack_host(parse_address(connection.remote_address)),
            self.address.store_host_bytes,
        )
        topics, cluster, size = self.topics.by_name, self.cluster_name, self.max_message_size
        pos = 0
        while pos < len(requests):
            raw_taken, raw_records, raw_left, pos = TAKE_RAW_SENDS(
                requests, pos, topics, stamps, cluster, size, INLINE_RULES
            )
            taken += raw_taken
            records += raw_records
            left += [raw_command(request) for request in raw_left]  # read whole: the same
            if pos == len(requests):
                break
            request = as_command(requests[pos])  # decoded, or raw with an unusual header
            pos += 1
            fields = SEND_FIELDS(request.ext_fields)
            placed = None
            if fields is not None:
                placed = plain_record(
                    fields, request.body, topics, stamps, cluster, size, INLINE_RULES
                )
            if placed is None:
                left.append(request)
            else:
                queue_id, record = placed
                taken.append(
                    (request, queue_id, request.opaque, request.serialize_type, request.flag)
                )
                records.append(record)
        if records:
            answer = _InlineAnswer(self, taken, connection)
            try:
                self.store.commitlog.put_nowait(records, answer)
            except Exception as exc:  # maybe stored: answered, never re-run
                answer.failed(exc)
                if isinstance(exc, AssertionError):
                    raise  # a broken invariant is not this batch's failure to swallow
        return left

    def disk_util(self) -> str:
        root = self.store.root
        return disk_util(getattr(self.store.server.store, "base_dir", root), root)

    @staticmethod
    def _check_writable(config) -> None:
        """BadRequest (NO_PERMISSION) unless clients may send to the topic."""
        topic = config.topic_name
        if topic in NOT_ALLOWED_SEND_TOPICS:
            raise BadRequest(
                f"Sending message to topic[{topic}] is forbidden.", ResponseCode.NO_PERMISSION
            )
        if not config.perm & PERM_WRITE:
            raise BadRequest(
                f"the topic[{topic}] sending message is forbidden", ResponseCode.NO_PERMISSION
            )

    @staticmethod
    def _queue_id(config, queue_id: int) -> int:
        """The queue a send goes to: `queue_id`, or any of the topic's (-1)."""
        topic = config.topic_name
        if queue_id < 0:
            return random.randrange(config.write_queue_nums)
        if queue_id >= max(config.write_queue_nums, config.read_queue_nums):
            raise BadRequest(
                f"request queueId[{queue_id}] is illegal, topic {topic} has "
                f"{config.write_queue_nums} write queues"
            )
        return queue_id

    def _messages(
        self, request: RemotingCommand, connection: Connection, topic: str, queue_id: int
    ) -> list[MessageExt]:
        if request.code == RequestCode.SEND_BATCH_MESSAGE or boolean(request, "batch"):
            items = decode_batch(request.body)
            if any(is_timer(props) for _flag, _body, props in items):
                raise BadRequest(
                    "timer messages cannot be sent in a batch: send each on its own",
                    ResponseCode.MESSAGE_ILLEGAL,
                )
        else:
            props = codec.string_to_properties(text(request, "properties", ""))
            items = [(integer(request, "flag", 0), request.body, props)]
        sysflag = integer(request, "sysFlag", 0) & ~MessageSysFlag.MULTI_TAGS_FLAG
        if MessageSysFlag.get_transaction_value(sysflag) in _BROKER_TRANSACTION_TYPES:
            raise BadRequest(
                f"sysFlag {sysflag}: commit (8) and rollback (12) are written by the broker;"
                " a client sends 0 or prepared (4)"
            )
        prepared = any(is_prepared(sysflag, props) for _flag, _body, props in items)
        if prepared and topic.startswith(RETRY_PREFIX):
            # A consumer's retry of a committed transactional message still carries
            # TRAN_MSG (clients before 4.6.1): an ordinary message, as in RocketMQ.
            prepared = False
            sysflag = MessageSysFlag.reset_transaction_value(
                sysflag, MessageSysFlag.TRANSACTION_NOT_TYPE
            )
        if prepared:
            self._check_transactional(len(items))
        born = parse_address(connection.remote_address)  # the producer: the born host
        born_timestamp = integer(request, "bornTimestamp", 0)
        reconsume = integer(request, "reconsumeTimes", 0)
        messages = []
        for flag, body, properties in items:
            if len(body) > self.max_message_size:
                raise BadRequest(
                    f"message body size {len(body)} exceeds maxMessageSize {self.max_message_size}",
                    ResponseCode.MESSAGE_ILLEGAL,
                )
            msg = sent_message(
                self.cluster_name,
                properties,
                topic=topic,
                body=body,
                queue_id=queue_id,
                flag=flag,
                sysflag=sysflag,
                born_timestamp=born_timestamp,
                born_host=born,
                store_host=self.address.store_host,
                reconsume_times=reconsume,
            )
            messages.append(to_half(msg) if prepared else self.schedule_if_delayed(msg))
        return messages

    def _check_transactional(self, count: int) -> None:
        """BadRequest unless a transactional send may be stored as a half message."""
        if self.reject_transaction_message:
            raise BadRequest(
                f"the broker[{self.address.ip}] sending transaction message is forbidden",
                ResponseCode.NO_PERMISSION,
            )
        if count > 1:
            raise BadRequest("batch messages cannot be transactional", ResponseCode.MESSAGE_ILLEGAL)

    def _response(
        self,
        request: RemotingCommand,
        queue_id: int,
        results,
        code: int = ResponseCode.SUCCESS,
        store_host: tuple[str, int] | None = None,
    ) -> RemotingCommand:
        """A stored send's answer: SUCCESS, or a classic store's FLUSH_DISK_TIMEOUT (10),
        SLAVE_NOT_AVAILABLE (11) or FLUSH_SLAVE_TIMEOUT (12), which carry the same
        headers and which clients count as sent (SendMessageProcessor). Its msgIds name
        `store_host` (the one the records hold: this broker's, unless an earlier
        master stored them)."""
        self.stats.put_messages += len(results)
        store_host = store_host or self.address.store_host
        ext = {
            "msgId": ",".join(create_message_id(store_host, p) for p, _q in results),
            "queueId": str(queue_id),
            "queueOffset": str(results[0][1]),
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        }
        return request.make_response(code, None, ext_fields=ext)

    def schedule_if_delayed(self, msg: MessageExt) -> MessageExt:
        """A message with a delay level goes to the schedule topic first (RocketMQ's
        CommitLog.putMessage), its real topic and queue kept in properties, and a timer
        message to the timer topic (broker.timer); BadRequest for a timer message the
        broker refuses."""
        if msg.topic.startswith(DLQ_PREFIX):
            return msg
        # a recall's tombstone names the message it cancels: only RECALL_MESSAGE sets it
        msg.properties.pop(MessageConst.PROPERTY_TIMER_DEL_UNIQKEY, None)
        level = msg.delay_time_level
        if level <= 0:
            to_timer(msg, self.store.now_ms(), self.timer)
            return msg
        drop_timer_properties(msg.properties)
        level = min(level, len(self.store.delay_levels_ms))
        msg.properties[MessageConst.PROPERTY_REAL_TOPIC] = msg.topic
        msg.properties[MessageConst.PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
        msg.topic, msg.queue_id = SCHEDULE_TOPIC, level - 1
        return msg

    def _records(self, messages: list[MessageExt]) -> list[bytes]:
        now_ms = self.store.now_ms()
        records = []
        for msg in messages:
            msg.store_timestamp = now_ms
            try:
                records.append(codec.encode(msg))
            except codec.MessageFormatError as exc:
                raise BadRequest(str(exc), ResponseCode.MESSAGE_ILLEGAL) from None
        return records

    async def put(self, messages: list[MessageExt]) -> list[tuple[int, int]]:
        """Store messages; (physical offset, queue offset) of each."""
        return (await self._put(messages))[1]

    async def _put(self, messages: list[MessageExt]) -> tuple[int, list[tuple[int, int]]]:
        """Store messages: the response code (SUCCESS, or a classic store's 10, 11 or 12:
        stored all the same) and (physical offset, queue offset) of each; BadRequest
        with the refusal's code when they are not stored."""
        records = self._records(messages)
        awaited = Awaited()
        self.store.commitlog.put_nowait(records, awaited)
        code, placed = await awaited.result()
        if placed is None:
            response_code, remark = _append_failure(code, self.disk_util)
            raise BadRequest(remark, response_code)
        return (int(code) if isinstance(code, PutStatus) else ResponseCode.SUCCESS), placed

    async def stored_copy(self, msg: MessageExt) -> MessageExt | None:
        """The copy this node stores of a producer's resend (its topic and UNIQ_KEY), if
        any: what makes a resend after a master change idempotent. An earlier attempt
        that reached the old master and a quorum is in this node's log (a new master
        holds every committed entry, and commits its predecessor's tail before it
        serves), dispatched into the key index before any send here is taken; one
        appended to this master is waited for. BadRequest (SYSTEM_BUSY) when this
        node's log is not dispatched within RESEND_CATCH_UP_S: storing then might store
        the message twice."""
        uniq_key = msg.uniq_key
        store = self.store
        if not uniq_key or store.index is None:
            return None
        if not await store.dispatch_caught_up(RESEND_CATCH_UP_S):
            raise BadRequest(
                f"resend of {uniq_key}: the log is not dispatched to its end within"
                f" {RESEND_CATCH_UP_S} s, so an earlier copy cannot be ruled out; try again",
                ResponseCode.SYSTEM_BUSY,
            )
        now_ms = store.now_ms()
        records, _end_ms, _end_phy = store.query_message(
            msg.topic, uniq_key, RESEND_LOOKUP_MAX, now_ms - RESEND_LOOKBACK_MS, 2**63 - 1
        )
        for record in records:
            copy, _size = codec.decode(record, read_body=False)
            if copy.topic == msg.topic and copy.uniq_key == uniq_key:
                log.info("resend of %s answered with its stored copy", uniq_key)
                return copy
        return None

    async def send_back(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """CONSUMER_SEND_MSG_BACK: a message the consumer failed goes to %RETRY%group
        after a delay, or to %DLQ%group once it has been retried too often."""
        if not self.role.is_master:
            return self.role.not_master(request)
        offset = integer(request, "offset")
        group = text(request, "group")
        delay_level = integer(request, "delayLevel", 0)
        try:
            msg, _size = codec.decode(self.store.message_at(offset))
        except (IndexError, codec.MessageFormatError):
            raise BadRequest(f"look message by offset failed, {offset}") from None
        retry_topic = msg.get_property(MessageConst.PROPERTY_RETRY_TOPIC)
        if retry_topic is None:
            msg.put_property(MessageConst.PROPERTY_RETRY_TOPIC, msg.topic)
        max_times = integer(request, "maxReconsumeTimes", self.groups.max_reconsume_times(group))
        if msg.reconsume_times >= max_times or delay_level < 0:
            dlq = await self.topics.ensure_dlq(group)
            msg.topic, msg.queue_id = dlq.topic_name, 0
        else:
            retry = await self.topics.ensure_retry_topic(group)
            msg.topic, msg.queue_id = retry.topic_name, random.randrange(retry.write_queue_nums)
            level = delay_level if delay_level > 0 else 3 + msg.reconsume_times
            msg.properties[MessageConst.PROPERTY_DELAY_TIME_LEVEL] = str(level)
        origin = msg.get_property(MessageConst.PROPERTY_ORIGIN_MESSAGE_ID) or text(
            request, "originMsgId", msg.msg_id
        )
        msg.put_property(MessageConst.PROPERTY_ORIGIN_MESSAGE_ID, origin)
        msg.reconsume_times += 1
        msg.store_host = self.address.store_host
        msg.sysflag = msg.sysflag & ~MessageSysFlag.MULTI_TAGS_FLAG
        await self.put([self.schedule_if_delayed(msg)])
        return request.make_response(ResponseCode.SUCCESS)
