"""Timer messages (RocketMQ 5): delivery at any time, fired by the master, recallable.

A send carrying `TIMER_DELIVER_MS` (absolute ms), `TIMER_DELAY_SEC` or `TIMER_DELAY_MS`
(relative) is turned into a timer message as RocketMQ's HookUtils.transformTimerMessage
turns it (`to_timer`): its due time rounded down to `timerPrecisionMs` (an exact
multiple one precision lower) in `TIMER_OUT_MS`, its topic and queue kept in `REAL_TOPIC`
and `REAL_QID`, stored in `TIMER_TOPIC` queue 0. A due time not in the future is stored
as a plain message; one more than `timerMaxDelaySec` away is refused. A message with a
delay level takes the 4.x schedule path instead (broker.schedule), its TIMER_*
properties dropped.

Every replica files committed timer messages in the timer wheel by due time
(broker.store.timerwheel). The master alone fires (`TimerService`): a message due at
TIMER_OUT_MS = T goes out once the clock reads T + precision, so never before the
time asked for and normally less than one precision after it; it is stored again in
its real topic and queue with `TIMER_DEQUEUE_MS` added (`TIMER_DELIVER_MS`,
`TIMER_OUT_MS` and UNIQ_KEY kept). The firing progress is replicated metadata; a new
master resumes from the last progress committed, so what was fired after it and
before the failover is delivered again (a duplicate), and nothing is lost.

RecallMessage (RECALL_MESSAGE, 370): the send's answer carries `recallHandle`, the
URL-safe Base64 of "v1 <topic> <brokerName> <TIMER_OUT_MS + 1> <UNIQ_KEY>"; recalling
stores a tombstone through the same path (`TIMER_DEL_UNIQKEY`), due with the message,
and the master delivers neither.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest, text
from raftmq.broker.store.metadata import RETRY_PREFIX
from raftmq.broker.store.timerwheel import TIMER_TOPIC, Entry
from raftmq.dledger.server import DLedgerError

from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageConst, MessageExt
from raftmq.protocol.recall import RecallHandle, recall_handle
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.metawriter import MetaWriter
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.topic_config_manager import TopicConfigManager

log = logging.getLogger(__name__)

TICK_S = 0.1  # the longest the master sleeps between looks at the heap
BATCH = 64  # messages delivered per put
FIRED_AT_ONCE = 4096  # taken from the heap per round: a backlog goes out in rounds
RECALL_TAG = "_RECALL_TAG_"  # a recall tombstone's tag (RecallMessageProcessor)
# What a send must carry to be a timer message (any one of them).
TIMER_PROPERTIES = (
    MessageConst.PROPERTY_TIMER_DELIVER_MS,
    MessageConst.PROPERTY_TIMER_DELAY_SEC,
    MessageConst.PROPERTY_TIMER_DELAY_MS,
)
# SendMessageProcessor's remarks for WHEEL_TIMER_NOT_ENABLE and WHEEL_TIMER_MSG_ILLEGAL.
NOT_ENABLED_REMARK = "accurate timer message is not enabled, timerWheelEnable is false"
ILLEGAL_REMARK = (
    "timer message illegal, the delay time should not be bigger than the max delay {}ms;"
    " or if set del msg, the del msg should be valid"
)


@attrs.frozen
class TimerConfig:
    """The broker's timer keys: `timerWheelEnable`, `timerPrecisionMs`, `timerMaxDelaySec`."""

    enabled: bool = True
    precision_ms: int = 1000
    max_delay_s: int = 259_200  # 3 days


def due_time(deliver_ms: int, precision_ms: int) -> int:
    """TIMER_OUT_MS for a delivery at `deliver_ms`: rounded down to the precision, an
    exact multiple one precision lower (HookUtils), so that firing at due + precision
    is never before `deliver_ms` and less than one precision after it."""
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms - deliver_ms % precision_ms


def fire_time(due_ms: int, precision_ms: int) -> int:
    """When the master delivers a message due at `due_ms` (TimerMessageStore processes
    a slot once the clock has passed it)."""
    return due_ms + precision_ms


def delete_key(topic: str, uniq_key: str) -> str:
    """TimerMessageStore.buildDeleteKey: what a recall tombstone names."""
    return f"{topic}+{uniq_key}"


def is_timer(properties: dict[str, str]) -> bool:
    return any(name in properties for name in TIMER_PROPERTIES)


def to_timer(msg: MessageExt, now_ms: int, config: TimerConfig) -> bool:
    """Turn a send into a timer message in place (transformTimerMessage); False when it
    stays as it is (no timer property, already one, or due by now). BadRequest
    (MESSAGE_ILLEGAL) for a delay past the maximum or a property that is no number,
    and when timers are disabled."""
    props = msg.properties
    if (
        not is_timer(props)
        or MessageConst.PROPERTY_TIMER_OUT_MS in props
        or msg.topic == TIMER_TOPIC
    ):
        return False
    if not config.enabled:
        raise BadRequest(NOT_ENABLED_REMARK, ResponseCode.MESSAGE_ILLEGAL)
    illegal = BadRequest(
        ILLEGAL_REMARK.format(config.max_delay_s * 1000), ResponseCode.MESSAGE_ILLEGAL
    )
    try:
        if MessageConst.PROPERTY_TIMER_DELAY_SEC in props:
            deliver_ms = now_ms + int(props[MessageConst.PROPERTY_TIMER_DELAY_SEC]) * 1000
        elif MessageConst.PROPERTY_TIMER_DELAY_MS in props:
            deliver_ms = now_ms + int(props[MessageConst.PROPERTY_TIMER_DELAY_MS])
        else:
            deliver_ms = int(props[MessageConst.PROPERTY_TIMER_DELIVER_MS])
    except ValueError:
        raise illegal from None
    if deliver_ms <= now_ms:
        if MessageConst.PROPERTY_TIMER_DEL_UNIQKEY in props:
            raise illegal  # a recall after its message is due
        return False
    if deliver_ms - now_ms > config.max_delay_s * 1000:
        raise illegal
    props[MessageConst.PROPERTY_TIMER_OUT_MS] = str(due_time(deliver_ms, config.precision_ms))
    props[MessageConst.PROPERTY_REAL_TOPIC] = msg.topic
    props[MessageConst.PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    msg.topic, msg.queue_id = TIMER_TOPIC, 0
    return True


def drop_timer_properties(props: dict[str, str]) -> None:
    """A delay-level message is scheduled by its level alone (HookUtils)."""
    for name in TIMER_PROPERTIES:
        props.pop(name, None)


# ---------------------------------------------------------------------- recall
def recall_handle_of(msg: MessageExt, broker_name: str) -> str | None:
    """The handle a send's answer carries for a timer message (none on a retry topic,
    nor without a UNIQ_KEY to name it by)."""
    props = msg.properties
    topic = props.get(MessageConst.PROPERTY_REAL_TOPIC, "")
    uniq_key = msg.uniq_key
    if msg.topic != TIMER_TOPIC or not uniq_key or topic.startswith(RETRY_PREFIX):
        return None
    return recall_handle(
        topic, broker_name, int(props[MessageConst.PROPERTY_TIMER_OUT_MS]), uniq_key
    )


# ---------------------------------------------------------------------- firing
@attrs.define
class TimerService:
    """The master's firing loop over the store's timer wheel. `put` stores messages as
    a send does (SendProcessor.put)."""

    role: BrokerRole
    store: MessageStore
    meta: MetaWriter  # the replicated progress
    put: Callable[[list[MessageExt]], Awaitable[object]]
    address: BrokerAddress
    config: TimerConfig
    firing: bool = attrs.field(default=False, init=False)
    delivered: int = attrs.field(default=0, init=False)  # since start, this broker
    recalled: int = attrs.field(default=0, init=False)
    lateness_ms: int = attrs.field(default=0, init=False)  # the last delivery's worst
    # delete keys of recalls being stored: a message they name waits for them
    recalling: set[str] = attrs.field(factory=set, init=False)
    _progress: tuple[int, int] = attrs.field(default=(-1, 0), init=False)  # this term's

    def reset(self) -> None:
        """A new master fires from the replicated progress."""
        self._progress = self.store.metadata.timer_progress
        self.store.timers.start_firing(self.store.now_ms(), self._progress)
        self.firing = True

    async def until_filed(self, physical_offset: int) -> None:
        """Until the timer message at `physical_offset` is in this replica's wheel."""
        store = self.store
        while store.timers.position <= physical_offset:
            await store.wait_dispatch(TICK_S)

    def _stop(self) -> None:
        self.store.timers.stop_firing()
        self.firing = False

    async def run(self) -> None:
        wheel = self.store.timers
        while True:
            await trio.sleep(self._sleep_s())
            wheel.forget_fired(self.store.metadata.timer_progress)
            if not self.role.is_master:
                if self.firing:
                    self._stop()
                continue
            if not self.firing:
                continue  # until Promotion resets it
            try:
                await self.fire_due()
            except (BadRequest, DLedgerError) as exc:  # not master any more, a full disk
                log.warning("timer delivery paused: %s", exc)

    def _sleep_s(self) -> float:
        """Until the next message is due, at most TICK_S."""
        due_ms = self.store.timers.next_due_ms() if self.firing else None
        if due_ms is None:
            return TICK_S
        wait_ms = fire_time(due_ms, self.config.precision_ms) - self.store.now_ms()
        return min(TICK_S, max(wait_ms, 1) / 1000)

    async def fire_due(self) -> None:
        """Deliver what is due now and record the progress once it is stored."""
        wheel, now_ms = self.store.timers, self.store.now_ms()
        wheel.advance(now_ms, self._progress)
        taken, drained_ms = wheel.due(now_ms - self.config.precision_ms, FIRED_AT_ONCE)
        if not taken:
            return
        position = wheel.position  # every record before it is in the heap or a bucket
        deleted = set()
        records = []
        for entry in taken:
            msg = self._read(entry)
            if msg is None:
                continue
            key = msg.properties.get(MessageConst.PROPERTY_TIMER_DEL_UNIQKEY)
            if key is not None:
                deleted.add(key)
            else:
                records.append(msg)
        keys = [delete_key(m.topic, m.uniq_key or "") for m in records]
        if self.recalling.intersection(keys):
            wheel.put_back(taken)  # a recall of one of them is being stored: wait for it
            return
        out = [m for m, key in zip(records, keys, strict=True) if key not in deleted]
        self.recalled += len(records) - len(out)
        try:
            for start in range(0, len(out), BATCH):
                await self.put(out[start : start + BATCH])
        except BaseException:
            wheel.put_back(taken)  # all again: a duplicate rather than a loss
            raise
        self.delivered += len(out)
        if out:
            self.lateness_ms = max(now_ms - self._asked_ms(m) for m in out)
        self._progress = (max(self._progress[0], drained_ms), max(self._progress[1], position))
        if self.role.is_master:
            await self.meta.write("timer", firedMs=self._progress[0], position=self._progress[1])

    def _asked_ms(self, msg: MessageExt) -> int:
        """When the sender asked for delivery: TIMER_DELIVER_MS, or for a relative
        delay the earliest time its due time allows."""
        props = msg.properties
        try:  # the sender's, which relative delays leave as it was (or unset)
            return int(props[MessageConst.PROPERTY_TIMER_DELIVER_MS])
        except (KeyError, ValueError):
            due_ms = int(props[MessageConst.PROPERTY_TIMER_OUT_MS])  # the broker's own
            return fire_time(due_ms, self.config.precision_ms) - self.config.precision_ms + 1

    def _read(self, entry: Entry) -> MessageExt | None:
        """The message a wheel entry points at, back in its real topic and queue; None
        for one the log no longer holds (retention) or that does not decode."""
        due_ms, physical_offset, size = entry
        try:
            msg, _size = codec.decode(self.store.commitlog.read(physical_offset, size))
        except (IndexError, codec.MessageFormatError) as exc:
            log.error("timer message at %d (due %d) unreadable: %s", physical_offset, due_ms, exc)
            return None
        props = msg.properties
        if MessageConst.PROPERTY_TIMER_DEL_UNIQKEY in props:
            return msg
        msg.topic = props.pop(MessageConst.PROPERTY_REAL_TOPIC, msg.topic)
        msg.queue_id = int(props.pop(MessageConst.PROPERTY_REAL_QUEUE_ID, msg.queue_id))
        props[MessageConst.PROPERTY_TIMER_DEQUEUE_MS] = str(self.store.now_ms())
        msg.store_host = self.address.store_host
        return msg

    def status(self) -> dict[str, int]:
        """What `mqadmin timerStatus` and the metrics show."""
        wheel, progress = self.store.timers, self.store.metadata.timer_progress
        return {
            "timerBacklog": wheel.pending(progress),
            "timerInMemory": wheel.in_memory,
            "timerBuckets": len(wheel.counts),
            "timerFiredMs": progress[0],
            "timerFiredPosition": progress[1],
            "timerDelivered": self.delivered,
            "timerRecalled": self.recalled,
            "timerLatenessMs": self.lateness_ms,
            "timerPrecisionMs": self.config.precision_ms,
        }


# ---------------------------------------------------------------------- recall
@attrs.define
class RecallProcessor:
    """RECALL_MESSAGE (370): header topic, recallHandle, producerGroup; the answer's
    msgId is the recalled UNIQ_KEY (RecallMessageProcessor)."""

    role: BrokerRole
    topics: TopicConfigManager
    to_timer: Callable[[MessageExt], bool]
    put: Callable[[list[MessageExt]], Awaitable[list[tuple[int, int]]]]
    address: BrokerAddress
    service: TimerService  # holds a message back while its recall is being stored
    broker_name: str
    config: TimerConfig
    now_ms: Callable[[], int]

    async def recall(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        if not self.role.is_master:
            return request.make_response(
                ResponseCode.SLAVE_NOT_AVAILABLE, "recall failed, broker service not available"
            )
        topic = text(request, "topic")
        if self.topics.get(topic) is None:
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist"
            )
        try:
            handle = RecallHandle.parse(text(request, "recallHandle"))
        except ValueError as exc:
            return request.make_response(
                ResponseCode.ILLEGAL_OPERATION, f"recall failed, handle is illegal: {exc}"
            )
        if handle.topic != topic:
            return request.make_response(
                ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match"
            )
        if handle.broker_name != self.broker_name:
            return request.make_response(
                ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available"
            )
        time_left_ms = handle.timestamp_ms - self.now_ms()
        if time_left_ms <= 0 or time_left_ms >= self.config.max_delay_s * 1000:
            return request.make_response(
                ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid"
            )
        tombstone = MessageExt(
            topic=topic,
            body=b"0",
            queue_id=0,
            born_timestamp=self.now_ms(),
            born_host=self.address.store_host,
            store_host=self.address.store_host,
        )
        props = tombstone.properties
        props[MessageConst.PROPERTY_TAGS] = RECALL_TAG
        props[MessageConst.PROPERTY_TIMER_DELIVER_MS] = str(handle.timestamp_ms)
        props[MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = handle.uniq_key
        props[MessageConst.PROPERTY_TIMER_DEL_UNIQKEY] = delete_key(topic, handle.uniq_key)
        if not self.to_timer(tombstone):
            return request.make_response(
                ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid"
            )
        key = props[MessageConst.PROPERTY_TIMER_DEL_UNIQKEY]
        self.service.recalling.add(key)
        try:
            [(physical_offset, _queue_offset)] = await self.put([tombstone])
            await self.service.until_filed(physical_offset)
        finally:
            self.service.recalling.discard(key)
        return request.make_response(
            ResponseCode.SUCCESS, None, ext_fields={"msgId": handle.uniq_key}
        )
