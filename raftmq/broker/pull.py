"""PULL_MESSAGE (11) with long polling.

The status table is DefaultMessageStore.getMessage's, mapped to response codes as
PullMessageProcessor maps it. A pull that finds nothing new and carries the
SUSPEND flag is held until a message is dispatched to its queue or the client's
`suspendTimeoutMillis` passes (capped below the client's 30 s RPC timeout):
RocketMQ's clients re-pull at once after PULL_NOT_FOUND, so answering at once
would turn every idle consumer into a busy loop.

Slaves serve pulls too (every replica dispatches committed data), suggesting
broker 0 for the next one. A slave's queues end where its commit index does, which
trails the master's by up to a heartbeat, so an offset past a slave's end is one
the consumer read at the master, not a bad one: the slave holds the pull like an
idle one and then answers PULL_RETRY_IMMEDIATELY with the offset unchanged, as
RocketMQ's slave does without `offsetCheckInSlave`. Answering PULL_OFFSET_MOVED
there would move the consumer back to the slave's end, and it would receive again
what it had already consumed, typically right after a failover.

Refusals, as PullMessageProcessor words them: a topic without read permission
(the internal metadata topic has none) and a subscription group that is disabled
or, with `autoCreateSubscriptionGroup=false`, unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from raftmq.broker.headers import integer, text
from raftmq.broker.store.messagestore import GetResult, GetStatus
from raftmq.broker.store.metadata import PERM_READ
from raftmq.protocol.message import tags_code
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.stats import BrokerStats
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager

FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FLAG_SUBSCRIPTION = 1, 2, 4
MAX_SUSPEND_MS = 20_000  # below the 30 s the clients wait for a pull response

_CODES = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.NO_MESSAGE_IN_QUEUE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


def subscription_codes(expression: str | None) -> frozenset[int] | None:
    """Tag hash codes of a TAG subscription ("TagA || TagB"); None means everything."""
    if not expression or expression.strip() in ("*", ""):
        return None
    tags = [t.strip() for t in expression.split("||") if t.strip()]
    return None if not tags or "*" in tags else frozenset(tags_code(t) for t in tags)


@attrs.define
class PullProcessor:
    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager  # commits a pull carries
    stats: BrokerStats
    long_polling_enable: bool = attrs.field(kw_only=True)

    async def pull(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        role = self.role
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        queue_id = integer(request, "queueId")
        offset = integer(request, "queueOffset")
        max_nums = integer(request, "maxMsgNums", 32)
        flags = integer(request, "sysFlag", 0)
        suspend_ms = min(integer(request, "suspendTimeoutMillis", 15_000), MAX_SUSPEND_MS)
        config = self.topics.get(topic)
        if config is None:
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please!",
            )
        if not config.perm & PERM_READ:
            return request.make_response(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
            )
        refusal = self.groups.refusal(group)
        if refusal is not None:
            return request.make_response(*refusal)
        codes = None
        if request.ext_fields.get("expressionType", "TAG") == "TAG":
            codes = subscription_codes(request.ext_fields.get("subscription"))
        if flags & FLAG_COMMIT_OFFSET and role.is_master:
            commit = integer(request, "commitOffset", -1)
            if commit >= 0:
                self.offsets.commit(group, topic, queue_id, commit)
        store = self.store
        result = store.get_message(topic, queue_id, offset, max_nums, codes)
        behind = not role.is_master and result.status == GetStatus.OFFSET_OVERFLOW_BADLY
        idle = result.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)
        if (
            (idle or behind)
            and flags & FLAG_SUSPEND
            and self.long_polling_enable
            and offset >= result.max_offset
        ):
            deadline = trio.current_time() + suspend_ms / 1000.0
            while trio.current_time() < deadline and result.status != GetStatus.FOUND:
                await store.wait_arrival(topic, queue_id, deadline)
                result = store.get_message(topic, queue_id, offset, max_nums, codes)
                if result.status == GetStatus.NO_MATCHED_MESSAGE:
                    break
        if result.records:
            self.stats.count_pull(topic, group, result.records)
        if not role.is_master and result.status == GetStatus.OFFSET_OVERFLOW_BADLY:
            return self._response(request, result, ResponseCode.PULL_RETRY_IMMEDIATELY, offset)
        return self._response(request, result)

    @staticmethod
    def _response(
        request: RemotingCommand,
        result: GetResult,
        code: int | None = None,
        next_begin_offset: int | None = None,
    ) -> RemotingCommand:
        """The reply for `result`; `code` and `next_begin_offset` override the status
        table's (a slave that is behind keeps the consumer where it is)."""
        if next_begin_offset is None:
            next_begin_offset = result.next_begin_offset
        ext = {
            "suggestWhichBrokerId": "0",
            "nextBeginOffset": str(next_begin_offset),
            "minOffset": str(result.min_offset),
            "maxOffset": str(result.max_offset),
        }
        if code is None:
            code = _CODES[result.status]
        return request.make_response(
            code,
            None if code == ResponseCode.SUCCESS else result.status,
            ext_fields=ext,
            body=b"".join(result.records),
        )
