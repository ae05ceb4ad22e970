"""Consumer-facing requests besides pulling: heartbeats, group membership, offsets.

HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX_OFFSET (30),
GET_MIN_OFFSET (31), SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32),
INVOKE_BROKER_TO_RESET_OFFSET (222, `mqadmin resetOffsetByTime`), CHECK_CLIENT_CONFIG
(46, Java's SQL92 consumers ask it before they start).

SQL92 subscriptions are checked when they arrive: a heartbeat with one that this
broker refuses (`enablePropertyFilter=false`: SYSTEM_ERROR; an expression that does
not compile: SUBSCRIPTION_PARSE_FAILED, the remark naming the problem and its
position) is answered with that code and recorded not at all, so the consumer never
joins the group with a subscription no pull could serve. RocketMQ accepts such a
heartbeat and only logs the compile error.

Offset policy: a group with no committed offset gets QUERY_NOT_FOUND, always, so
the client applies its own consumeFromWhere. (Java answers 0 on a young broker,
which makes CONSUME_FROM_LAST_OFFSET read from the beginning.)

A query is answered from a node that holds every acknowledged offset commit and has
applied its log to the end (`dispatch_caught_up`): a restarted broker, a new master
or a slave that had not yet applied the record, or a controller-mode slave the master
left out of the SyncStateSet (`ReplicasManager.holds_every_acknowledged_record`), once
answered an offset older than one acknowledged, and the group moved back (found by a
jepsen run). Such a node waits up to OFFSET_CATCH_UP_S for it. Then a client that
takes an error for "ask again" (RocketMQ 5's clients, by their version, and ours) gets
SYSTEM_BUSY with a remark; an older one, which takes any error for "no offset" and
would start from the queue's end, gets this node's offset, as a RocketMQ slave
answers: it re-consumes, it does not skip.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.headers import BadRequest, boolean, integer, json_body, text
from raftmq.broker.pull import subscription_filter
from raftmq.broker.store.metadata import RETRY_PREFIX

from raftmq.protocol.fastjson import queue_map_body
from raftmq.remoting import Connection, RemotingCommand, RemotingError, RequestCode, ResponseCode
from raftmq.remoting.codes import LanguageCode, MQVersion

OFFSET_CATCH_UP_S = 1.0  # how long a query waits for this node to hold every commit
VOUCH_POLL_S = 0.05

if TYPE_CHECKING:
    from raftmq.broker.clients import ClientManager
    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.sql92 import Sql92Filter
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager


@attrs.define
class ConsumerRequests:
    role: BrokerRole
    clients: ClientManager
    store: MessageStore  # queue offsets and store times
    topics: TopicConfigManager  # retry topics, created on a group's first heartbeat
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    property_filter_enabled: bool = attrs.field(kw_only=True)
    holds_every_acknowledged_record: Callable[[], bool] = attrs.field(kw_only=True)

    async def heartbeat(self, request: RemotingCommand, connection: Connection):
        data = _json_body(request, "heartbeat")
        filters = self._compile_filters(data)
        language = getattr(request.language, "name", str(request.language))
        groups = self.clients.heartbeat(
            data, connection, self.store.now_ms(), language, int(request.version), filters
        )
        if self.role.is_master:
            for group in groups:
                if self.topics.get(RETRY_PREFIX + group) is None:
                    await self.topics.ensure_retry_topic(group)  # first: it checks the name
                await self.groups.ensure(group)
        return request.make_response(ResponseCode.SUCCESS)

    def _compile_filters(self, data: dict) -> dict[str, dict[str, Sql92Filter]]:
        """group -> topic -> compiled filter of every SQL92 subscription in a heartbeat;
        BadRequest (naming the group and topic) for the first one refused."""
        filters: dict[str, dict[str, Sql92Filter]] = {}
        for consumer in data.get("consumerDataSet") or []:
            group = str(_json_object(consumer, "consumerDataSet entry").get("groupName"))
            for subscription in consumer.get("subscriptionDataSet") or []:
                _json_object(subscription, "subscriptionDataSet entry")
                topic = str(subscription.get("topic"))
                try:
                    compiled = subscription_filter(
                        subscription.get("expressionType"), subscription.get("subString"),
                        self.property_filter_enabled,
                    )  # fmt: skip
                except BadRequest as exc:
                    raise BadRequest(f"group {group}, topic {topic}: {exc}", exc.code) from None
                if compiled is not None:
                    filters.setdefault(group, {})[topic] = compiled
        return filters

    async def check_client_config(self, request: RemotingCommand, connection: Connection):
        """CHECK_CLIENT_CONFIG: would this broker serve the body's `subscriptionData`?
        SUCCESS, or the code and remark the subscription would be refused with."""
        subscription = _json_body(request, "CHECK_CLIENT_CONFIG").get("subscriptionData")
        if subscription:
            _json_object(subscription, "subscriptionData")
            subscription_filter(
                subscription.get("expressionType"), subscription.get("subString"),
                self.property_filter_enabled,
            )  # fmt: skip
        return request.make_response(ResponseCode.SUCCESS)

    async def unregister_client(self, request: RemotingCommand, connection: Connection):
        group = request.ext_fields.get("consumerGroup")
        producer_group = request.ext_fields.get("producerGroup")
        self.clients.unregister(text(request, "clientID"), group, producer_group)
        return request.make_response(ResponseCode.SUCCESS)

    async def consumer_list(self, request: RemotingCommand, connection: Connection):
        group = text(request, "consumerGroup")
        members = self.clients.members(group)
        if not members:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}"
            )
        return request.make_response(
            ResponseCode.SUCCESS, body=json_body({"consumerIdList": members})
        )

    async def query_offset(self, request: RemotingCommand, connection: Connection):
        if not await self._holds_every_commit(OFFSET_CATCH_UP_S) and _asks_again(request):
            raise BadRequest(
                f"consumer offsets: this node did not hold every acknowledged commit"
                f" within {OFFSET_CATCH_UP_S} s (its log not yet applied, or not in the"
                " SyncStateSet), so a newer commit cannot be ruled out; ask again",
                ResponseCode.SYSTEM_BUSY,
            )
        offset = self.offsets.query(
            text(request, "consumerGroup"), text(request, "topic"), integer(request, "queueId")
        )
        if offset is None:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe first")
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    async def _holds_every_commit(self, timeout_s: float) -> bool:
        """Whether this node holds and has applied every acknowledged offset commit,
        waiting up to `timeout_s` for it."""
        deadline = trio.current_time() + timeout_s
        while not self.holds_every_acknowledged_record():
            if trio.current_time() >= deadline:
                return False
            await trio.sleep(VOUCH_POLL_S)
        return await self.store.dispatch_caught_up(max(0.0, deadline - trio.current_time()))

    async def update_offset(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        offset = integer(request, "commitOffset")
        args = (text(request, "consumerGroup"), text(request, "topic"), integer(request, "queueId"))
        if offset < 0:  # ali-ons sends offset 0 as -1
            return None if request.is_oneway else request.make_response(ResponseCode.SUCCESS)
        if request.is_oneway:
            self.offsets.commit(*args, offset)
            return None
        if not await self.offsets.commit_and_wait(*args, offset):
            return self.role.not_master(request)
        return request.make_response(ResponseCode.SUCCESS)

    async def max_offset(self, request: RemotingCommand, connection: Connection):
        offset = self.store.max_offset(text(request, "topic"), integer(request, "queueId"))
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    async def min_offset(self, request: RemotingCommand, connection: Connection):
        offset = self.store.min_offset(text(request, "topic"), integer(request, "queueId"))
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    async def search_offset(self, request: RemotingCommand, connection: Connection):
        offset = self.store.search_offset(
            text(request, "topic"), integer(request, "queueId"), integer(request, "timestamp")
        )
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    async def earliest_time(self, request: RemotingCommand, connection: Connection):
        when = self.store.earliest_store_time(text(request, "topic"), integer(request, "queueId"))
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"timestamp": str(when)})

    async def reset_offset(self, request: RemotingCommand, connection: Connection):
        """Move `group`'s offsets on every queue of `topic` to the first message stored at
        or after `timestamp` (-1: the queue's end); without `isForce` an offset only
        moves back. RocketMQ's broker leaves the commit to the online consumers it tells
        (RESET_CONSUMER_CLIENT_OFFSET, 220) and refuses when none is online; here the new
        offsets are committed through the log first, so a reset works with the group
        stopped too, and the online members are then told (oneway) to restart from them.
        Answers ResetOffsetBody: the offset table, keyed by MessageQueue."""
        if not self.role.is_master:
            return self.role.not_master(request)
        topic, group = text(request, "topic"), text(request, "group")
        timestamp_ms, force = integer(request, "timestamp"), boolean(request, "isForce", True)
        config = self.topics.get(topic)
        if config is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = {}
        for queue_id in range(config.write_queue_nums):
            if timestamp_ms == -1:
                wanted = self.store.max_offset(topic, queue_id)
            else:
                wanted = self.store.search_offset(topic, queue_id, timestamp_ms)
            current = self.offsets.query(group, topic, queue_id)
            keep = not force and current is not None and wanted >= current
            table[queue_id] = current if keep else wanted
            self.offsets.commit(group, topic, queue_id, table[queue_id])
        for queue_id, offset in table.items():
            if not await self.offsets.commit_and_wait(group, topic, queue_id, offset):
                return self.role.not_master(request)
        broker_name = self.role.broker_name
        body = queue_map_body([(topic, broker_name, q, o) for q, o in table.items()])
        notice = RemotingCommand(
            RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
            ext_fields={"topic": topic, "group": group, "timestamp": str(timestamp_ms),
                        "isForce": str(force).lower()},
            body=body,
        )  # fmt: skip
        for member in list(self.clients.groups.get(group, {}).values()):
            with contextlib.suppress(RemotingError, OSError):
                member.connection.invoke_oneway(notice)
        return request.make_response(ResponseCode.SUCCESS, body=body)


def _json_body(request: RemotingCommand, what: str) -> dict:
    try:
        data = json.loads(request.body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"{what} body is not JSON: {exc}") from None
    return _json_object(data, f"{what} body")


def _json_object(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} is not a JSON object")
    return value


def _asks_again(request: RemotingCommand) -> bool:
    """Whether the client reads an error answering QUERY_CONSUMER_OFFSET as "ask
    again": RocketMQ's clients from 5.0.0 on (only QUERY_NOT_FOUND means "no offset"
    there) and raftmq's. Older Java clients and the C++ one take any error for "no
    offset" and apply consumeFromWhere (from the queue's end, by default)."""
    return request.language == LanguageCode.PYTHON or request.version >= MQVersion.V5_0_0
