"""PULL_MESSAGE (11) with long polling.

The status table is DefaultMessageStore.getMessage's, mapped to response codes as
PullMessageProcessor maps it. A pull that finds nothing new and carries the
SUSPEND flag is held until a message is dispatched to its queue or the client's
`suspendTimeoutMillis` passes (capped below the client's 30 s RPC timeout):
RocketMQ's clients re-pull at once after PULL_NOT_FOUND, so answering at once
would turn every idle consumer into a busy loop.

Slaves serve pulls too (every replica dispatches committed data), suggesting
broker 0 for the next one. With `slaveReadEnable` the suggestion
(`suggestWhichBrokerId`) is RocketMQ's: the subscription group's
`whichBrokerWhenConsumeSlowly` (default 1, a slave) when the pulled messages lie
further behind the log's end than `accessMessageInMemoryMaxRatio` percent of the
machine's memory (no longer likely in the page cache), else its `brokerId` (0).

A slave's queues end where its commit index does, which trails the master's by up
to a heartbeat, so an offset past a slave's end is one
the consumer read at the master, not a bad one: the slave holds the pull like an
idle one and then answers PULL_RETRY_IMMEDIATELY with the offset unchanged, as
RocketMQ's slave does without `offsetCheckInSlave`. Answering PULL_OFFSET_MOVED
there would move the consumer back to the slave's end, and it would receive again
what it had already consumed, typically right after a failover.

Refusals, as PullMessageProcessor words them: a topic without read permission
(the internal metadata topic has none) and a subscription group that is disabled
or, with `autoCreateSubscriptionGroup=false`, unknown.

Filters. A TAG subscription filters by the ConsumeQueue's tag hash (clients re-check
the tag). An SQL92 one (`expressionType=SQL92`, needs `enablePropertyFilter=true`)
is evaluated here over each message's properties, and only here: clients do not
re-filter. Its expression comes from the request when the sysFlag's subscription bit
is set (ali-ons, our clients), else from the group's heartbeats (Java's push
consumer); compiled expressions are cached by their text (broker.sql92). Messages
that do not match are skipped and `nextBeginOffset` moves past them; a pull that
matched none answers PULL_RETRY_IMMEDIATELY, as RocketMQ's NO_MATCHED_MESSAGE does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest, integer, text
from raftmq.broker.sql92 import Sql92Error, Sql92Filter, compile_sql92
from raftmq.broker.store.messagestore import GetResult, GetStatus
from raftmq.broker.store.metadata import PERM_READ, SubscriptionGroupConfig, TopicConfig

from raftmq.protocol.message import tags_code
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.clients import ClientManager
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


def is_tag_type(expression_type: str | None) -> bool:
    """`ExpressionType.isTagType`: clients that send no type subscribe by tag."""
    return expression_type in (None, "", "TAG")


def subscription_filter(
    expression_type: str | None, expression: str | None, property_filter_enabled: bool
) -> Sql92Filter | None:
    """The compiled filter of a subscription, None for a TAG one; BadRequest with
    RocketMQ's code when it is refused: SYSTEM_ERROR while `enablePropertyFilter` is
    false, SUBSCRIPTION_PARSE_FAILED for a type other than TAG and SQL92 or an
    expression that does not compile (the remark says what and where)."""
    if is_tag_type(expression_type):
        return None
    _check_supported(expression_type, property_filter_enabled)
    try:
        expression = str(expression or "")
        return compile_sql92(expression)
    except Sql92Error as exc:
        shown = expression if len(expression) <= 200 else expression[:197] + "..."
        raise BadRequest(
            f"invalid SQL92 expression {shown!r}: {exc}",
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
        ) from None


def _check_supported(expression_type: str | None, property_filter_enabled: bool) -> None:
    if not property_filter_enabled:
        raise BadRequest(
            f"The broker does not support consumer to filter message by {expression_type} "
            "(enablePropertyFilter=false)",
            ResponseCode.SYSTEM_ERROR,
        )
    if expression_type != "SQL92":
        raise BadRequest(
            f"expression type {expression_type!r} is not supported: TAG or SQL92",
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
        )


def readable_topic(topics: TopicConfigManager, topic: str, what: str) -> TopicConfig:
    """The topic's config; BadRequest as PullMessageProcessor words it when the topic
    does not exist (TOPIC_NOT_EXIST) or may not be read (NO_PERMISSION: the internal
    metadata topic). `what` is the verb of the remark ("pulling", "popping")."""
    config = topics.get(topic)
    if config is None:
        raise BadRequest(
            f"topic[{topic}] not exist, apply first please!", ResponseCode.TOPIC_NOT_EXIST
        )
    if not config.perm & PERM_READ:
        raise BadRequest(
            f"the topic[{topic}] {what} message is forbidden", ResponseCode.NO_PERMISSION
        )
    return config


@attrs.define
class PullProcessor:
    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager  # commits a pull carries
    stats: BrokerStats
    clients: ClientManager  # the heartbeats' subscriptions, for SQL92 pulls without one
    long_polling_enable: bool = attrs.field(kw_only=True)
    property_filter_enabled: bool = attrs.field(kw_only=True)
    slave_read_enable: bool = attrs.field(kw_only=True, default=False)
    # how far behind the log's end a pull may read before it counts as slow
    in_memory_bytes: int = attrs.field(kw_only=True, default=0)

    def suggest_broker(self, group: str, result: GetResult) -> int:
        """suggestWhichBrokerId (PullMessageProcessor): 0 unless slaveReadEnable."""
        if not self.slave_read_enable:
            return 0
        config = self.groups.metadata.groups.get(group) or SubscriptionGroupConfig(group)
        if (
            result.count
            and self.store.physical_max - result.last_physical_offset > self.in_memory_bytes
        ):
            return config.which_broker_when_consume_slowly
        return config.broker_id

    async def pull(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        role = self.role
        group = text(request, "consumerGroup")
        topic = text(request, "topic")
        queue_id = integer(request, "queueId")
        offset = integer(request, "queueOffset")
        max_nums = integer(request, "maxMsgNums", 32)
        flags = integer(request, "sysFlag", 0)
        suspend_ms = min(integer(request, "suspendTimeoutMillis", 15_000), MAX_SUSPEND_MS)
        readable_topic(self.topics, topic, "pulling")
        refusal = self.groups.refusal(group)
        if refusal is not None:
            return request.make_response(*refusal)
        codes = matches = None
        expression_type = request.ext_fields.get("expressionType")
        if is_tag_type(expression_type):
            codes = subscription_codes(request.ext_fields.get("subscription"))
        else:
            sql92 = self._filter(request, group, topic, expression_type, flags)
            matches = sql92.matches_properties
        if flags & FLAG_COMMIT_OFFSET and role.is_master:
            commit = integer(request, "commitOffset", -1)
            if commit >= 0:
                self.offsets.commit(group, topic, queue_id, commit)
        store = self.store
        result = store.get_message(topic, queue_id, offset, max_nums, codes, matches)
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
                result = store.get_message(topic, queue_id, offset, max_nums, codes, matches)
                if result.status == GetStatus.NO_MATCHED_MESSAGE:
                    break
        if result.count:
            self.stats.count_pull(topic, group, result.count, len(result.body))
        suggest = self.suggest_broker(group, result)
        if not role.is_master and result.status == GetStatus.OFFSET_OVERFLOW_BADLY:
            return self._response(
                request, result, suggest, ResponseCode.PULL_RETRY_IMMEDIATELY, offset
            )
        return self._response(request, result, suggest)

    def _filter(
        self, request: RemotingCommand, group: str, topic: str, expression_type: str, flags: int
    ) -> Sql92Filter:
        """The pull's SQL92 filter: from the request when it carries the subscription,
        else the group's newest heartbeat subscription to the topic, refused as
        PullMessageProcessor refuses it when missing or older than the request's."""
        if flags & FLAG_SUBSCRIPTION:
            found = subscription_filter(
                expression_type, request.ext_fields.get("subscription"),
                self.property_filter_enabled,
            )  # fmt: skip
            assert found is not None  # not a TAG type
            return found
        _check_supported(expression_type, self.property_filter_enabled)
        registered = self.clients.subscription(group, topic)
        if registered is None:
            raise BadRequest(
                f"the consumer's subscription not exist, group: {group}, topic: {topic}",
                ResponseCode.SUBSCRIPTION_NOT_EXIST,
            )
        version, compiled = registered
        if version < integer(request, "subVersion", 0):
            raise BadRequest(
                f"the consumer's subscription not latest, group: {group}, topic: {topic}",
                ResponseCode.SUBSCRIPTION_NOT_LATEST,
            )
        if compiled is None:
            raise BadRequest(
                f"the consumer's filter data not exist: group {group} subscribes to {topic} "
                "by TAG in its heartbeats",
                ResponseCode.FILTER_DATA_NOT_EXIST,
            )
        return compiled

    @staticmethod
    def _response(
        request: RemotingCommand,
        result: GetResult,
        suggest: int,
        code: int | None = None,
        next_begin_offset: int | None = None,
    ) -> RemotingCommand:
        """The reply for `result`; `code` and `next_begin_offset` override the status
        table's (a slave that is behind keeps the consumer where it is)."""
        if next_begin_offset is None:
            next_begin_offset = result.next_begin_offset
        ext = {
            "suggestWhichBrokerId": str(suggest),
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
            body=result.body,
        )
