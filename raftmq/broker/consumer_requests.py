"""Consumer-facing requests besides pulling: heartbeats, group membership, offsets.

HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX_OFFSET (30),
GET_MIN_OFFSET (31), SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32).

Offset policy: a group with no committed offset gets QUERY_NOT_FOUND, always, so
the client applies its own consumeFromWhere. (Java answers 0 on a young broker,
which makes CONSUME_FROM_LAST_OFFSET read from the beginning.)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import attrs

from raftmq.broker.headers import BadRequest, integer, json_body, text
from raftmq.broker.store.metadata import RETRY_PREFIX
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.clients import ClientManager
    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.role import BrokerRole
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

    async def heartbeat(self, request: RemotingCommand, connection: Connection):
        try:
            data = json.loads(request.body or b"{}")
        except ValueError as exc:
            raise BadRequest(f"heartbeat body is not JSON: {exc}") from None
        language = getattr(request.language, "name", str(request.language))
        groups = self.clients.heartbeat(
            data, connection, self.store.now_ms(), language, int(request.version)
        )
        if self.role.is_master:
            for group in groups:
                if self.topics.get(RETRY_PREFIX + group) is None:
                    await self.topics.ensure_retry_topic(group)  # first: it checks the name
                await self.groups.ensure(group)
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
        offset = self.offsets.query(
            text(request, "consumerGroup"), text(request, "topic"), integer(request, "queueId")
        )
        if offset is None:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe first")
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

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
        await self.offsets.commit_and_wait(*args, offset)
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
