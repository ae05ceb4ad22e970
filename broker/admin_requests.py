"""Admin requests that change or list topics, subscription groups and the broker's
config: what `mqadmin` and the admin client ask a broker to do (its questions are
broker.admin_queries).

UPDATE_AND_CREATE_TOPIC (17, with RocketMQ 5's `attributes`: broker.topic_attributes),
DELETE_TOPIC_IN_BROKER (215), GET_TOPIC_CONFIG (351, one topic's config, which mqproxy
reads for `message.type`; any member answers), GET_ALL_TOPIC_CONFIG (21),
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), DELETE_SUBSCRIPTIONGROUP (207),
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), and GET_ALL_CONSUMER_OFFSET (43) and
GET_ALL_DELAY_OFFSET (45), which with 21 and 201 are what a classic slave's
SlaveSynchronize asks its master (`broker.slave_sync`). Changes to topics and groups
are refused on a slave; they go through the log on the master, so every replica has
them.

UPDATE_BROKER_CONFIG (25) and GET_BROKER_CONFIG (26) are per broker, as in RocketMQ:
each member answers for itself. Only the keys in `RUNTIME_KEYS` can change, and a
change lasts until the broker restarts (RocketMQ also rewrites its config file).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import attrs
from raftmq.broker.acl.permissions import TRACE_TOPIC
from raftmq.broker.config import BrokerConfig, config_properties, updated
from raftmq.broker.headers import BadRequest, boolean, integer, json_body, text
from raftmq.broker.store.metadata import (
    META_TOPIC,
    SubscriptionGroupConfig,
    TopicConfig,
)
from raftmq.broker.topic_attributes import alter_attributes
from raftmq.broker.transactions import TRANSACTION_TOPICS

from raftmq.config.properties import format_properties, parse_properties
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager


SYSTEM_TOPIC_PREFIX = "rmq_sys_"  # TopicValidator.SYSTEM_TOPIC_PREFIX


@attrs.define
class AdminRequests:
    role: BrokerRole
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    config: BrokerConfig

    async def create_topic(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        topic = text(request, "topic")
        if topic == META_TOPIC:
            raise BadRequest(f"The topic[{topic}] is conflict with system topic.")
        current = self.topics.metadata.topics.get(topic)
        attributes = {} if current is None else current.attributes
        spec = request.ext_fields.get("attributes")
        if spec:
            try:
                attributes = alter_attributes(attributes, spec, creating=current is None)
            except ValueError as exc:
                raise BadRequest(f"topic {topic}: {exc}", ResponseCode.INVALID_PARAMETER) from None
        config = TopicConfig(
            topic,
            integer(request, "readQueueNums", 8),
            integer(request, "writeQueueNums", 8),
            integer(request, "perm", 6),
            text(request, "topicFilterType", "SINGLE_TAG"),
            integer(request, "topicSysFlag", 0),
            boolean(request, "order"),
            attributes,
        )
        if not (0 < config.read_queue_nums <= 1024 and 0 < config.write_queue_nums <= 1024):
            raise BadRequest("queue numbers must be between 1 and 1024")
        await self.topics.put(config)
        return request.make_response(ResponseCode.SUCCESS)

    async def topic_config(self, request: RemotingCommand, connection: Connection):
        """GET_TOPIC_CONFIG: TopicConfigAndQueueMapping's JSON (the topic's config with
        its attributes); TOPIC_NOT_EXIST for a topic this broker does not have."""
        topic = text(request, "topic")
        config = self.topics.metadata.topics.get(topic)
        if config is None:
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic {topic} in this broker."
            )
        doc = {**config.to_json(), "attributes": dict(config.attributes)}
        return request.make_response(ResponseCode.SUCCESS, body=json_body(doc))

    async def delete_topic(self, request: RemotingCommand, connection: Connection):
        """Delete a topic through the log: every replica drops its ConsumeQueues where
        it applies the deletion (MessageStore.drop_topic). A system topic cannot go
        (TopicValidator.isSystemTopic, as RocketMQ's broker refuses it)."""
        if not self.role.is_master:
            return self.role.not_master(request)
        topic = text(request, "topic")
        if topic in self._system_topics() or topic.startswith(SYSTEM_TOPIC_PREFIX):
            raise BadRequest(f"The topic[{topic}] is conflict with system topic.")
        await self.topics.delete(topic)
        return request.make_response(ResponseCode.SUCCESS)

    async def all_consumer_offsets(self, request: RemotingCommand, connection: Connection):
        body = json_body(self.topics.metadata.offsets_wrapper())
        return request.make_response(ResponseCode.SUCCESS, body=body)

    async def all_delay_offsets(self, request: RemotingCommand, connection: Connection):
        body = json_body(self.topics.metadata.delay_offsets_wrapper())
        return request.make_response(ResponseCode.SUCCESS, body=body)

    async def system_topics(self, request: RemotingCommand, connection: Connection):
        """GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305): TopicList of the topics the broker
        keeps for itself (TopicValidator's system topics and its own built-in ones),
        which RocketMQ's tools leave out of a broker's user topics (exportMetrics)."""
        topics = self._system_topics() - {META_TOPIC}  # in no topic table a client reads
        return request.make_response(
            ResponseCode.SUCCESS, body=json_body({"topicList": sorted(topics)})
        )

    def _system_topics(self) -> set[str]:
        """TopicValidator's system topics and this broker's built-in ones (its cluster's
        and its own name among them), as RocketMQ's broker registers them."""
        return {*self.topics.metadata.builtin, *TRANSACTION_TOPICS, "BenchmarkTest", TRACE_TOPIC}

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

    async def delete_group(self, request: RemotingCommand, connection: Connection):
        if not self.role.is_master:
            return self.role.not_master(request)
        await self.groups.delete(text(request, "groupName"), boolean(request, "removeOffset"))
        return request.make_response(ResponseCode.SUCCESS)

    async def broker_config(self, request: RemotingCommand, connection: Connection):
        """The config as properties text; `version` is the metadata's dataVersion."""
        body = format_properties(config_properties(self.config)).encode()
        version = json.dumps(self.topics.metadata.data_version, separators=(",", ":"))
        return request.make_response(
            ResponseCode.SUCCESS, ext_fields={"version": version}, body=body
        )

    async def update_broker_config(self, request: RemotingCommand, connection: Connection):
        try:
            changes = parse_properties(request.body.decode("utf-8"), "UPDATE_BROKER_CONFIG")
            config = updated(self.config, changes, "UPDATE_BROKER_CONFIG")
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadRequest(str(exc), ResponseCode.SYSTEM_ERROR) from None
        self.config = config
        self.topics.auto_create_topic_enable = config.auto_create_topic_enable
        self.groups.auto_create_subscription_group = config.auto_create_subscription_group
        return request.make_response(ResponseCode.SUCCESS)
