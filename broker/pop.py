"""RocketMQ 5's POP consumption over remoting: POP_MESSAGE (200050), ACK_MESSAGE
(200051), PEEK_MESSAGE (200052), CHANGE_MESSAGE_INVISIBLETIME (200053), NOTIFICATION
(200054), POLLING_INFO (200055) and BATCH_ACK_MESSAGE (200151), with Apache's header
fields, bodies and codes.

A pop reads from the group's pop offset of each queue it is given (queueId -1: every
read queue, then the group's retry topic `%RETRY%<group>_<topic>`), appends one
checkpoint record for everything it read (broker.store.pop_state) and answers only
once that record is committed and applied here: a client never holds a message whose
checkpoint a new master lacks. A checkpoint committed but never answered (the master
died, the client gave up) costs one redelivery after invisibleTime, nothing else.

As Apache's PopMessageProcessor: with 20 % probability the retry topic is read
first, otherwise only when the normal queues did not fill the batch (never for an
order pop); retry messages are answered under their origin topic with their own
`POP_CK` extraInfo. Nothing found: the request waits up to pollTime for a message
dispatched to one of its queues, an ack of an order queue, an invisibility change or
a redelivery (POLLING_FULL past `popPollingSize` waiters on one queue or
`maxPopPollingSize` in all), and an empty answer is POLLING_TIMEOUT.

A group without a pop offset starts from its committed consumer offset (a group
moving from PULL to POP continues), else from the queue's first message
(initMode 0, MIN, and every retry topic) or its end (initMode 1, MAX). Apache starts a
MAX group at 0 when the queue's first message is still in memory; this broker has
no such notion and starts it at the end. That start is pinned by the first pop of the
queue, as Apache commits it, even when the pop finds nothing: a checkpoint of no
message moves the pop offset there. Otherwise every pop of a MAX group would start
again at the end, and it would never see a message (Apache's proxy pops with MAX).

FIFO (`order=true`): one batch per queue in flight; while any of its messages is
un-acked and invisible the queue answers nothing (checkBlock), unless the request
carries the batch's attemptId (a client retrying a pop whose answer it lost gets the
same batch). After expiry the un-acked messages of the batch are popped again, in
order, each with its consumed count grown (orderCountInfo; the client's
reconsumeTimes). The last ack of a batch frees the queue and wakes its pollers.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest, boolean, integer, text
from raftmq.broker.pull import (
    is_tag_type,
    readable_topic,
    subscription_codes,
    subscription_filter,
)

from raftmq.protocol import message as codec
from raftmq.protocol import pop as vocabulary
from raftmq.protocol.message import MessageConst
from raftmq.protocol.pop import HandleError, ReceiptHandle
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.metawriter import MetaWriter
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.stats import BrokerStats
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.store.pop_state import Key, PopState
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager

MAX_POP_MESSAGES = 32  # PopMessageProcessor refuses more
MAX_POLL_MS = 20_000  # below the 30 s clients wait for an answer
BORN_TIME_SLACK_MS = 500  # PopMessageRequestHeader.isTimeoutTooMuch
POP_FROM_RETRY_PROBABILITY = 0.2  # popFromRetryProbability: 20 %
REVIVE_QUEUE_NUM = 8  # reviveQueueNum
POP_POLLING_SIZE = 1024  # popPollingSize: waiters per queue
MAX_POP_POLLING_SIZE = 100_000  # maxPopPollingSize: waiters in all


@attrs.define
class Popped:
    """What one queue gave a pop: its records and the checkpoint to write."""

    topic: str  # the queue's topic: the origin or the retry topic
    queue_id: int
    start_offset: int
    offsets: list[int]
    next_offset: int
    records: list[bytes]
    counts: dict[int, int]  # FIFO consumed counts (empty for a normal pop)


@attrs.define
class PopPolling:
    """Long-polled POP and NOTIFICATION requests: how many wait per queue, and the
    event that pop-state changes (order acks, invisibility changes, redeliveries) set."""

    per_queue_max: int = POP_POLLING_SIZE
    total_max: int = MAX_POP_POLLING_SIZE
    waiting: Counter = attrs.Factory(Counter)
    changed: trio.Event = attrs.Factory(trio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    @contextlib.contextmanager
    def waiter(self, key: tuple[str, str, int]):
        """Counts one waiting request on `key` (topic, group, queueId) while inside."""
        self.waiting[key] += 1
        try:
            yield
        finally:
            self.waiting[key] -= 1
            if not self.waiting[key]:
                del self.waiting[key]

    def full(self, key: tuple[str, str, int]) -> bool:
        return (
            self.waiting[key] >= self.per_queue_max or sum(self.waiting.values()) >= self.total_max
        )


@attrs.define
class PopProcessor:
    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager  # where a group new to POP starts
    meta: MetaWriter  # checkpoints, acks, invisibility changes
    stats: BrokerStats
    broker_name: str = attrs.field(kw_only=True)
    property_filter_enabled: bool = attrs.field(kw_only=True)
    polling: PopPolling = attrs.Factory(PopPolling)
    _locks: dict[Key, trio.Lock] = attrs.field(factory=dict, init=False)
    _revive_counter: int = attrs.field(default=0, init=False)

    @property
    def state(self) -> PopState:
        return self.store.metadata.pop

    # ------------------------------------------------------------------ checks
    def _check_group(self, group: str) -> None:
        refusal = self.groups.refusal(group)
        if refusal is not None:
            raise BadRequest(refusal[1], refusal[0])

    def _queue_ids(self, topic: str, queue_id: int, read_queue_nums: int) -> list[int]:
        if queue_id == -1:
            return list(range(read_queue_nums))
        if not 0 <= queue_id < read_queue_nums:
            raise BadRequest(
                f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.readQueueNums:[{read_queue_nums}]",
                ResponseCode.INVALID_PARAMETER,
            )
        return [queue_id]

    def _filter(self, request: RemotingCommand):
        """(tag codes, SQL92 matcher) of the request's expType/exp."""
        expression_type = request.ext_fields.get("expType")
        expression = request.ext_fields.get("exp")
        if is_tag_type(expression_type):
            return subscription_codes(expression), None
        compiled = subscription_filter(expression_type, expression, self.property_filter_enabled)
        assert compiled is not None  # not a TAG type
        return None, compiled.matches_properties

    # ------------------------------------------------------------------ POP_MESSAGE
    async def pop(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        queue_id = integer(request, "queueId")
        max_nums = integer(request, "maxMsgNums")
        invisible_ms = integer(request, "invisibleTime")
        poll_ms = integer(request, "pollTime", 0)
        born_ms = integer(request, "bornTime", 0)
        init_mode = integer(request, "initMode", vocabulary.INIT_MODE_MIN)
        order = boolean(request, "order")
        attempt_id = request.ext_fields.get("attemptId") or ""
        if not 0 < max_nums <= MAX_POP_MESSAGES:
            raise BadRequest(
                f"the broker restrict max msg nums to (0, {MAX_POP_MESSAGES}]: maxMsgNums "
                f"{max_nums}",
                ResponseCode.INVALID_PARAMETER,
            )
        if invisible_ms <= 0 or poll_ms < 0:
            raise BadRequest(
                f"invisibleTime {invisible_ms} ms must be > 0 and pollTime {poll_ms} ms >= 0",
                ResponseCode.INVALID_PARAMETER,
            )
        now_ms = self.store.now_ms()
        if poll_ms and born_ms and now_ms - born_ms - poll_ms > BORN_TIME_SLACK_MS:
            return request.make_response(
                ResponseCode.POLLING_TIMEOUT,
                f"the broker[{self.broker_name}] pop message is timeout too much: bornTime "
                f"{born_ms} + pollTime {poll_ms} ms is {now_ms - born_ms - poll_ms} ms ago",
            )
        config = readable_topic(self.topics, topic, "popping")
        queue_ids = self._queue_ids(topic, queue_id, config.read_queue_nums)
        self._check_group(group)
        codes, matches = self._filter(request)
        await self.groups.ensure(group)
        args = (group, topic, queue_ids, max_nums, invisible_ms, init_mode, order, attempt_id)
        popped, pop_time_ms, revive_qid = await self._pop_once(*args, codes, matches)
        if not popped and poll_ms:
            key = (topic, group, queue_id)
            if self.polling.full(key):
                return request.make_response(
                    ResponseCode.POLLING_FULL,
                    f"too many pops wait on {topic} queue {queue_id} for {group}",
                )
            deadline = trio.current_time() + min(poll_ms, MAX_POLL_MS) / 1000
            with self.polling.waiter(key):
                while not popped and trio.current_time() < deadline:
                    await self._wait(group, topic, queue_ids, order, deadline)
                    if not self.role.is_master:
                        return self.role.not_master(request)
                    popped, pop_time_ms, revive_qid = await self._pop_once(*args, codes, matches)
        if not popped:
            return request.make_response(
                ResponseCode.POLLING_TIMEOUT,
                f"no new message in {topic} for {group} (pollTime {poll_ms} ms)",
            )
        return self._response(request, group, topic, popped, pop_time_ms, invisible_ms, revive_qid)

    def _response(self, request, group, topic, popped, pop_time_ms, invisible_ms, revive_qid):
        starts, offsets, orders, body = [], [], [], []
        count = rest = 0
        for p in popped:
            starts.append(vocabulary.start_offset_info(p.topic, p.queue_id, p.start_offset))
            offsets.append(vocabulary.msg_offset_info(p.topic, p.queue_id, p.offsets))
            if p.counts:
                orders.append(vocabulary.order_count_info(p.topic, p.queue_id, p.counts))
            rest += max(0, self.store.max_offset(p.topic, p.queue_id) - p.next_offset)
            count += len(p.records)
            body.extend(p.records)
        body_bytes = b"".join(body)
        self.stats.count_pull(topic, group, count, len(body_bytes))
        ext = {
            "popTime": str(pop_time_ms),
            "invisibleTime": str(invisible_ms),
            "reviveQid": str(revive_qid),
            "restNum": str(rest),
            "startOffsetInfo": vocabulary.join_infos(starts),
            "msgOffsetInfo": vocabulary.join_infos(offsets),
        }
        if orders:
            ext["orderCountInfo"] = vocabulary.join_infos(orders)
        return request.make_response(ResponseCode.SUCCESS, ext_fields=ext, body=body_bytes)

    async def _pop_once(
        self, group, topic, queue_ids, max_nums, invisible_ms, init_mode, order, attempt_id,
        codes, matches,
    ) -> tuple[list[Popped], int, int]:  # fmt: skip
        """Read what the queues give, checkpoint it (committed before this returns):
        (what each queue gave, popTime, reviveQid)."""
        now_ms = self.store.now_ms()
        if order:
            revive_qid = vocabulary.ORDER_REVIVE_QID
        else:
            revive_qid = self._revive_counter % REVIVE_QUEUE_NUM
            self._revive_counter += 1
        start = random.randrange(len(queue_ids))
        ordered = [(topic, q) for q in queue_ids[start:] + queue_ids[:start]]
        retry = vocabulary.retry_topic(group, topic)
        if not order and self.topics.get(retry) is not None:
            if random.random() < POP_FROM_RETRY_PROBABILITY:
                ordered.insert(0, (retry, 0))
            else:
                ordered.append((retry, 0))
        held: list[trio.Lock] = []
        popped: list[Popped] = []
        room = max_nums
        try:
            for queue_topic, qid in ordered:
                if room <= 0:
                    break
                key = (group, queue_topic, qid)
                lock = self._locks.setdefault(key, trio.Lock())
                try:
                    lock.acquire_nowait()
                except trio.WouldBlock:
                    continue  # another pop reads this queue now (Apache's try-lock)
                held.append(lock)
                found = self._read_queue(
                    group, topic, queue_topic, qid, room, init_mode, order, attempt_id, now_ms,
                    codes, matches,
                )  # fmt: skip
                if found is not None:
                    popped.append(found)
                    room -= len(found.records)
            if popped:
                await self.meta.write(
                    "popCk",
                    cks=[
                        {"c": group, "t": p.topic, "q": p.queue_id, "pt": now_ms,
                         "it": invisible_ms, "rq": revive_qid, "o": p.offsets,
                         "n": p.next_offset, "order": order, "a": attempt_id}
                        for p in popped
                    ],
                )  # fmt: skip
        finally:
            for lock in held:
                lock.release()
        answered = [p for p in popped if p.records]
        for p in answered:
            if p.topic != topic:
                p.records = self._as_origin(p, topic, now_ms, invisible_ms, revive_qid)
        return answered, now_ms, revive_qid

    def start_offset(self, group: str, queue_topic: str, queue_id: int, init_mode: int) -> int:
        """Where a pop of this queue reads next (see the module's docstring)."""
        state = self.state
        found = state.offsets.get((group, queue_topic, queue_id))
        if found is None:
            found = self.offsets.query(group, queue_topic, queue_id)
        if found is None:
            retry = queue_topic.startswith(vocabulary.RETRY_PREFIX)
            if init_mode == vocabulary.INIT_MODE_MIN or retry:
                found = self.store.min_offset(queue_topic, queue_id)
            else:
                found = self.store.max_offset(queue_topic, queue_id)
        return max(found, self.store.min_offset(queue_topic, queue_id))

    def _read_queue(
        self, group, topic, queue_topic, queue_id, room, init_mode, order, attempt_id, now_ms,
        codes, matches,
    ) -> Popped | None:  # fmt: skip
        key = (group, queue_topic, queue_id)
        batch = self.state.orders.get(key) if order else None
        if batch is not None:
            if batch.blocks(now_ms) and not (attempt_id and attempt_id == batch.attempt_id):
                return None
            records, offsets = [], []
            for offset in batch.pending():
                result = self.store.get_message(queue_topic, queue_id, offset, 1)
                if result.count:
                    records.append(result.body)
                    offsets.append(offset)
            counts = {o: batch.counts[o] + 1 for o in offsets}
            next_offset = self.state.offsets.get(key, batch.offsets[-1] + 1)
            start = offsets[0] if offsets else next_offset
            return Popped(queue_topic, queue_id, start, offsets, next_offset, records, counts)
        offset = self.start_offset(group, queue_topic, queue_id, init_mode)
        result = self.store.get_message(queue_topic, queue_id, offset, room, codes, matches)
        if result.next_begin_offset <= offset and not result.count:
            if key in self.state.offsets or self.offsets.query(*key) is not None:
                return None
            # a group new to this queue: its start is pinned (see the module's docstring)
            return Popped(queue_topic, queue_id, offset, [], offset, [], {})
        records = result.records if result.count else []
        offsets = [codec.decode(r, read_body=False)[0].queue_offset for r in records]
        counts = dict.fromkeys(offsets, 0) if order else {}
        return Popped(
            queue_topic, queue_id, offset, offsets, result.next_begin_offset, records, counts
        )

    def _as_origin(self, popped: Popped, topic: str, pop_time_ms, invisible_ms, revive_qid):
        """Retry-topic records re-encoded under the origin topic, each with its POP_CK."""
        records = []
        for record in popped.records:
            msg, _size = codec.decode(record)
            handle = ReceiptHandle(
                popped.start_offset, pop_time_ms, invisible_ms, revive_qid,
                vocabulary.topic_type(popped.topic), self.broker_name, popped.queue_id,
                msg.queue_offset,
            )  # fmt: skip
            msg.properties.setdefault(vocabulary.PROPERTY_POP_CK, handle.extra_info())
            msg.topic = msg.properties.get(MessageConst.PROPERTY_RETRY_TOPIC, topic)
            records.append(codec.encode(msg))
        return records

    async def _wait(self, group, topic, queue_ids, order, deadline: float) -> None:
        """Until a message arrives on one of the queues (or the retry topic), the pop
        state changes, an order batch of these queues expires, or `deadline`."""
        now_ms = self.store.now_ms()
        if order:
            expiries = [
                min(b.visible_at_ms[o] for o in b.pending())
                for q in queue_ids
                if (b := self.state.orders.get((group, topic, q))) is not None and b.pending()
            ]
            if expiries:
                deadline = min(deadline, trio.current_time() + (min(expiries) - now_ms) / 1000)
        queues = [(topic, q) for q in queue_ids]
        if not order:
            queues.append((vocabulary.retry_topic(group, topic), 0))
        changed = self.polling.changed
        async with trio.open_nursery() as nursery:

            async def one(wait: Callable) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            for queue_topic, qid in queues:
                arrival = partial(self.store.wait_arrival, queue_topic, qid, deadline)
                nursery.start_soon(one, arrival)
            nursery.start_soon(one, changed.wait)
            nursery.start_soon(one, partial(trio.sleep_until, deadline))

    # ------------------------------------------------------------------ ACK_MESSAGE
    def _handle(self, request: RemotingCommand, group: str, topic: str):
        """(queue topic, queueId, offset, handle) of an ack or change request."""
        try:
            handle = ReceiptHandle.parse(text(request, "extraInfo"))
        except HandleError as exc:
            raise BadRequest(str(exc), ResponseCode.MESSAGE_ILLEGAL) from None
        queue_id = integer(request, "queueId")
        offset = integer(request, "offset")
        readable_topic(self.topics, topic, "acking")
        queue_topic = vocabulary.queue_topic(group, topic, handle.topic_type)
        self._check_in_queue(queue_topic, queue_id, offset)
        return queue_topic, queue_id, offset, handle

    def _check_in_queue(self, queue_topic: str, queue_id: int, offset: int) -> None:
        """NO_MESSAGE unless the queue holds `offset` (AckMessageProcessor's check)."""
        low = self.store.min_offset(queue_topic, queue_id)
        high = self.store.max_offset(queue_topic, queue_id)
        if not low <= offset < high:
            raise BadRequest(
                f"offset is illegal, key:{queue_topic}@{queue_id}, offset:{offset}, "
                f"queue holds [{low}, {high})",
                ResponseCode.NO_MESSAGE,
            )

    async def ack(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        queue_topic, queue_id, offset, handle = self._handle(request, group, topic)
        await self.meta.write(
            "popAck", e=[[group, queue_topic, queue_id, offset, handle.pop_time_ms]]
        )
        if handle.is_order:
            self.polling.notify()
        return request.make_response(ResponseCode.SUCCESS)

    # ------------------------------------------------------------------ BATCH_ACK_MESSAGE
    async def batch_ack(self, request: RemotingCommand, connection: Connection):
        """BATCH_ACK_MESSAGE: body `{"brokerName", "acks": [{"c" group, "t" topic, "r"
        topic type "0"/"1"/"2", "so" batch start, "q" queueId, "rq" reviveQid, "pt"
        popTime, "it" invisibleTime, "b" offsets acked, as bits from so}]}`, all in one
        record; NO_MESSAGE (nothing acked) if any offset is outside its queue."""
        if not self.role.is_master:
            return self.role.not_master(request)
        entries, order = [], False
        try:
            acks = json.loads(request.body or b"null")["acks"]
            for ack in acks:
                group, topic = str(ack["c"]), str(ack["t"])
                queue_id, start = int(ack["q"]), int(ack["so"])
                readable_topic(self.topics, topic, "acking")
                queue_topic = vocabulary.queue_topic(group, topic, int(ack["r"]))
                order |= int(ack["rq"]) == vocabulary.ORDER_REVIVE_QID
                for index in vocabulary.decode_bitset(ack["b"]):
                    self._check_in_queue(queue_topic, queue_id, start + index)
                    entries.append([group, queue_topic, queue_id, start + index, int(ack["pt"])])
        except (ValueError, KeyError, TypeError) as exc:  # HandleError is a ValueError
            raise BadRequest(
                f"BATCH_ACK_MESSAGE body is not a batch of acks: {exc!r}",
                ResponseCode.MESSAGE_ILLEGAL,
            ) from None
        if entries:
            await self.meta.write("popAck", e=entries)
        if order:
            self.polling.notify()
        return request.make_response(ResponseCode.SUCCESS)

    # ------------------------------------------------------ CHANGE_MESSAGE_INVISIBLETIME
    async def change_invisible_time(self, request: RemotingCommand, connection: Connection):
        """The message stays in flight until now + invisibleTime, under a new popTime:
        now, or one past the old popTime when renewed within its millisecond, so that the
        old handle never equals the new one and no longer acks the message. A FIFO message
        keeps its batch's popTime (the answer's invisibleTime reaches from it), as Apache's
        order handles do. A message already acknowledged or redelivered is left as it is
        (the answer is SUCCESS all the same, as Apache's)."""
        if not self.role.is_master:
            return self.role.not_master(request)
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        invisible_ms = integer(request, "invisibleTime")
        if invisible_ms < 0:
            raise BadRequest(
                f"invisibleTime {invisible_ms} ms is negative", ResponseCode.INVALID_PARAMETER
            )
        queue_topic, queue_id, offset, handle = self._handle(request, group, topic)
        now_ms = max(self.store.now_ms(), handle.pop_time_ms + 1)
        await self.meta.write(
            "popChange", c=group, t=queue_topic, q=queue_id, o=offset,
            pt=handle.pop_time_ms, npt=now_ms, it=invisible_ms,
        )  # fmt: skip
        self.polling.notify()
        pop_time_ms = now_ms
        if handle.is_order:  # the batch keeps its popTime, which its acks must name
            pop_time_ms, invisible_ms = handle.pop_time_ms, now_ms + invisible_ms - pop_time_ms
        ext = {
            "popTime": str(pop_time_ms),
            "invisibleTime": str(invisible_ms),
            "reviveQid": str(handle.revive_qid),
        }
        return request.make_response(ResponseCode.SUCCESS, ext_fields=ext)

    # ------------------------------------------------------------------ PEEK_MESSAGE
    async def peek(self, request: RemotingCommand, connection: Connection):
        """The messages a pop would read next, without a checkpoint."""
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        queue_id = integer(request, "queueId")
        max_nums = integer(request, "maxMsgNums")
        if not 0 < max_nums <= MAX_POP_MESSAGES:
            raise BadRequest(
                f"the broker restrict max msg nums to (0, {MAX_POP_MESSAGES}]: maxMsgNums "
                f"{max_nums}",
                ResponseCode.INVALID_PARAMETER,
            )
        config = readable_topic(self.topics, topic, "peeking")
        queue_ids = self._queue_ids(topic, queue_id, config.read_queue_nums)
        self._check_group(group)
        body, room = [], max_nums
        for qid in queue_ids:
            offset = self.start_offset(group, topic, qid, vocabulary.INIT_MODE_MIN)
            result = self.store.get_message(topic, qid, offset, room)
            body.append(result.body)
            room -= result.count
            if room <= 0:
                break
        data = b"".join(body)
        if not data:
            return request.make_response(
                ResponseCode.PULL_NOT_FOUND, f"no message to peek in {topic} for {group}"
            )
        return request.make_response(ResponseCode.SUCCESS, body=data)

    # ------------------------------------------------------------------ NOTIFICATION
    def _has_message(self, group: str, topic: str, queue_ids: list[int], order: bool) -> bool:
        now_ms = self.store.now_ms()
        for qid in queue_ids:
            batch = self.state.orders.get((group, topic, qid)) if order else None
            if batch is not None:
                if not batch.blocks(now_ms):
                    return True
                continue
            offset = self.start_offset(group, topic, qid, vocabulary.INIT_MODE_MIN)
            if offset < self.store.max_offset(topic, qid):
                return True
        retry = vocabulary.retry_topic(group, topic)
        if order or self.topics.get(retry) is None:
            return False
        return self.start_offset(group, retry, 0, vocabulary.INIT_MODE_MIN) < (
            self.store.max_offset(retry, 0)
        )

    async def notification(self, request: RemotingCommand, connection: Connection):
        """Whether a pop would find a message, waiting up to pollTime for one."""
        if not self.role.is_master:
            return self.role.not_master(request)
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        queue_id = integer(request, "queueId")
        poll_ms = integer(request, "pollTime", 0)
        order = boolean(request, "order")
        config = readable_topic(self.topics, topic, "notifying")
        queue_ids = self._queue_ids(topic, queue_id, config.read_queue_nums)
        self._check_group(group)
        has = self._has_message(group, topic, queue_ids, order)
        full = False
        if not has and poll_ms > 0:
            key = (topic, group, queue_id)
            full = self.polling.full(key)
            if not full:
                deadline = trio.current_time() + min(poll_ms, MAX_POLL_MS) / 1000
                with self.polling.waiter(key):
                    while not has and trio.current_time() < deadline:
                        await self._wait(group, topic, queue_ids, order, deadline)
                        has = self._has_message(group, topic, queue_ids, order)
        ext = {"hasMsg": str(has).lower(), "pollingFull": str(full).lower()}
        return request.make_response(ResponseCode.SUCCESS, ext_fields=ext)

    # ------------------------------------------------------------------ POLLING_INFO
    async def polling_info(self, request: RemotingCommand, connection: Connection):
        """How many pops and notifications wait on the group's queue now."""
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        queue_id = integer(request, "queueId")
        readable_topic(self.topics, topic, "polling")
        number = self.polling.waiting.get((topic, group, queue_id), 0)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"pollingNum": str(number)})
