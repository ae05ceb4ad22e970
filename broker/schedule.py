"""Delayed delivery: the schedule topic's queues, moved to their real topics when due.

As in RocketMQ's ScheduleMessageService, a message with delay level L is stored in
SCHEDULE_TOPIC_XXXX queue L-1, its ConsumeQueue tags code holding the delivery
time; the master walks each level's queue in order and re-appends every message
that is due to its real topic and queue. Progress per level is replicated
metadata, so a new master resumes where the old one stopped (a message moved just
before a failover may be delivered twice; none is lost).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest
from raftmq.broker.store.metadata import SCHEDULE_TOPIC
from raftmq.dledger.server import DLedgerError

from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageConst

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.metawriter import MetaWriter
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.store.messagestore import MessageStore

log = logging.getLogger(__name__)

TICK_S = 0.1
BATCH = 64
# What delivery retries at the next tick: the store refused the put (not the master any
# more, a full disk, too many pending appends, a quorum timeout: SendProcessor.put's
# BadRequest), or retention removed a record between two batches (IndexError; the queue
# is trimmed past it at the next tick).
RETRIED = (BadRequest, IndexError)


@attrs.define
class ScheduleService:
    """`put` stores messages as a send does (SendProcessor.put), on the master."""

    role: BrokerRole
    store: MessageStore
    meta: MetaWriter  # the replicated progress
    put: Callable[[list[codec.MessageExt]], Awaitable[object]]
    address: BrokerAddress
    # level -> next schedule-queue offset (this term)
    _progress: dict[int, int] = attrs.field(factory=dict, init=False)

    def reset(self) -> None:
        """A new master starts from the replicated progress."""
        self._progress = dict(self.store.metadata.delay_offsets)

    async def run(self) -> None:
        while True:
            await trio.sleep(TICK_S)
            if not self.role.is_master:
                continue
            moved = {}
            for level in range(1, len(self.store.delay_levels_ms) + 1):
                try:
                    new = await self._deliver_due(level)
                except RETRIED as exc:  # a broken invariant (AssertionError) stops the broker
                    log.warning("delayed delivery for level %d paused: %s", level, exc)
                    break
                if new is not None:
                    moved[str(level)] = new
            if moved and self.role.is_master:
                try:
                    await self.meta.write("delay", entries=moved)
                except DLedgerError as exc:
                    log.warning("delay progress not committed: %s", exc)

    async def _deliver_due(self, level: int) -> int | None:
        store = self.store
        queue = store.queue(SCHEDULE_TOPIC, level - 1)
        if queue is None:
            return None
        start = offset = max(self._progress.get(level, 0), queue.min_offset)
        now_ms = store.now_ms()
        while offset < queue.max_offset:
            due = []
            for phys, size, deliver_at in queue.entries(offset, BATCH):
                if deliver_at > now_ms:
                    break
                due.append(self._restore(store.commitlog.read(phys, size)))
            if not due:
                break
            await self.put(due)
            offset += len(due)
            self._progress[level] = offset
        return offset if offset != start else None

    def _restore(self, record: bytes) -> codec.MessageExt:
        msg, _size = codec.decode(record)
        props = msg.properties
        msg.topic = props.pop(MessageConst.PROPERTY_REAL_TOPIC, msg.topic)
        msg.queue_id = int(props.pop(MessageConst.PROPERTY_REAL_QUEUE_ID, msg.queue_id))
        props.pop(MessageConst.PROPERTY_DELAY_TIME_LEVEL, None)
        msg.store_host = self.address.store_host
        return msg
