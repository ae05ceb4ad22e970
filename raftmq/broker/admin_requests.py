"""Admin requests that change or list topics and subscription groups: what `mqadmin`
and the admin client ask a broker to do (its questions are broker.admin_queries).

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_ALL_TOPIC_CONFIG
(21), UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) and GET_ALL_SUBSCRIPTIONGROUP_CONFIG
(201). Changes are refused on a slave; they go through the log on the master.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import attrs

from raftmq.broker.headers import BadRequest, boolean, integer, json_body, text
from raftmq.broker.store.metadata import META_TOPIC, SubscriptionGroupConfig, TopicConfig
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager


@attrs.define
class AdminRequests:
    role: BrokerRole
    topics: TopicConfigManager
    groups: SubscriptionGroupManager

    async def create_topic(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        topic = text(request, "topic")
        if topic == META_TOPIC:
            raise BadRequest(f"The topic[{topic}] is conflict with system topic.")
        config = TopicConfig(
            topic,
            integer(request, "readQueueNums", 8),
            integer(request, "writeQueueNums", 8),
            integer(request, "perm", 6),
            text(request, "topicFilterType", "SINGLE_TAG"),
            integer(request, "topicSysFlag", 0),
            boolean(request, "order"),
        )
        if not (0 < config.read_queue_nums <= 1024 and 0 < config.write_queue_nums <= 1024):
            raise BadRequest("queue numbers must be between 1 and 1024")
        await self.topics.put(config)
        return request.make_response(ResponseCode.SUCCESS)

    async def delete_topic(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        await self.topics.delete(text(request, "topic"))
        return request.make_response(ResponseCode.SUCCESS)

    async def all_topics(self, request: RemotingCommand, connection: Connection):
        body = json_body(self.topics.serialize_wrapper())
        return request.make_response(ResponseCode.SUCCESS, body=body)

    async def create_group(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        try:
            config = SubscriptionGroupConfig.from_json(json.loads(request.body))
        except KeyError as exc:
            raise BadRequest(f"bad subscription group body: no {exc.args[0]}") from None
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"bad subscription group body: {exc}") from None
        await self.groups.put(config)
        return request.make_response(ResponseCode.SUCCESS)

    async def all_groups(self, request: RemotingCommand, connection: Connection):
        body = json_body(self.groups.serialize_wrapper())
        return request.make_response(ResponseCode.SUCCESS, body=body)
