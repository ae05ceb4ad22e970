"""Redelivery of popped messages nobody acknowledged (Apache's PopReviveService).

On the master only, every TICK_S: each non-order message in flight whose invisible
time has passed (broker.store.pop_state) is re-put to the group's retry topic
`%RETRY%<group>_<topic>` (one queue, created on first use) with reconsumeTimes + 1,
its UNIQ_KEY kept, `RETRY_TOPIC` naming its origin and `1ST_POP_TIME` set at its
first redelivery; a pop then finds it again. A message already delivered
`retryMaxTimes` + 1 times goes to `%DLQ%<group>` instead. Then one `popRevive` record
takes the batch out of flight.

The re-put comes first and the record second, two entries of the log: a master that
dies between them (or a record that fails to commit) leaves the messages in flight with
their copies already written. Re-putting them would put a second copy in the retry
topic, and two consumers could each pop one: an acknowledged message delivered again.
So each copy names the commit-log offset of the message it copies
(`POP_REVIVED_FROM`), and a revive that follows one that did not end cleanly (the
first on a new master, or the next after a failed record) looks at the last BATCH
messages of each retry or dead-letter queue it writes to and writes no copy that is
there already; only a revive writes to a retry topic, so an unrecorded batch's copies
are the last messages there. Apache
re-puts with no delay too: the wait before a redelivery is the invisible time (a
client's NACK sets it from the group's retry policy with CHANGE_MESSAGE_INVISIBLETIME).
FIFO batches are never revived here: their expiry makes the queue poppable again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest
from raftmq.dledger.server import DLedgerError

from raftmq.protocol import message as codec
from raftmq.protocol import pop as vocabulary
from raftmq.protocol.message import MessageConst

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.metawriter import MetaWriter
    from raftmq.broker.pop import PopPolling
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager

log = logging.getLogger(__name__)

TICK_S = 0.2
BATCH = 256  # messages revived per record


@attrs.define
class ReviveService:
    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    meta: MetaWriter
    put: Callable[[list[codec.MessageExt]], Awaitable[object]]  # SendProcessor.put
    address: BrokerAddress
    polling: PopPolling  # woken after a redelivery
    # the last revive on this master recorded its copies (False on a new master, or
    # after a record that failed: copies may be written that no record took out of flight)
    _clean: bool = False

    async def run(self) -> None:
        while True:
            await trio.sleep(TICK_S)
            if not self.role.is_master:
                self._clean = False
                continue
            try:
                while await self.revive_once() == BATCH:
                    pass
            except (BadRequest, DLedgerError) as exc:  # the next tick tries again
                log.warning("POP revive paused: %s", exc)

    async def revive_once(self) -> int:
        """Redeliver up to BATCH expired messages; how many were taken out of flight."""
        store = self.store
        due = store.metadata.pop.expired(store.now_ms())[:BATCH]
        if not due:
            return 0
        messages, entries, dead = [], [], 0
        written: dict[str, set[str]] = {}  # destination -> copies there (their sources)
        for (group, queue_topic, queue_id), offset, entry in due:
            entries.append([group, queue_topic, queue_id, offset, entry.pop_time_ms])
            result = store.get_message(queue_topic, queue_id, offset, 1)
            if not result.count:
                continue  # retention removed it: nothing left to redeliver
            msg, _size = codec.decode(result.body)
            origin = msg.properties.get(MessageConst.PROPERTY_RETRY_TOPIC, queue_topic)
            msg.properties[MessageConst.PROPERTY_RETRY_TOPIC] = origin
            msg.properties.setdefault(vocabulary.PROPERTY_FIRST_POP_TIME, str(entry.pop_time_ms))
            msg.properties.pop(vocabulary.PROPERTY_POP_CK, None)
            msg.reconsume_times += 1
            if msg.reconsume_times > self.groups.max_reconsume_times(group):
                msg.topic = (await self.topics.ensure_dlq(group)).topic_name
                dead += 1
            else:
                retry = vocabulary.retry_topic(group, origin)
                msg.topic = (await self.topics.ensure_system_topic(retry)).topic_name
            msg.queue_id = 0
            msg.store_host = self.address.store_host
            source = str(msg.physical_offset)
            msg.properties[vocabulary.PROPERTY_REVIVED_FROM] = source
            if not self._clean:
                if msg.topic not in written:
                    written[msg.topic] = self._copies_at_the_end(msg.topic)
                if source in written[msg.topic]:
                    continue  # written by a revive that did not record it
            messages.append(msg)
        self._clean = False
        if messages:
            await self.put(messages)
        await self.meta.write("popRevive", e=entries, dlq=dead)
        self._clean = True
        self.polling.notify()
        return len(entries)

    def _copies_at_the_end(self, topic: str) -> set[str]:
        """The sources (POP_REVIVED_FROM) of the last BATCH messages of `topic`'s queue 0."""
        queue = self.store.queue(topic, 0)
        if queue is None:
            return set()
        offset, end, sources = (
            max(queue.min_offset, queue.max_offset - BATCH),
            queue.max_offset,
            set(),
        )
        while offset < end:
            result = self.store.get_message(topic, 0, offset, end - offset)
            if result.next_begin_offset <= offset:
                break  # nothing readable left (retention moved the head)
            sources |= {
                m.properties.get(vocabulary.PROPERTY_REVIVED_FROM, "")
                for m in codec.decode_all(result.body)
            }
            offset = result.next_begin_offset
        return sources
