"""Admin requests: what `mqadmin` and the admin client ask a broker.

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_ALL_TOPIC_CONFIG
(21), UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), GET_ALL_SUBSCRIPTIONGROUP_CONFIG
(201), GET_BROKER_RUNTIME_INFO (28, with the DLedger member's state:
dLegerSelfId, dLegerRole, dLegerTerm, dLegerLedgerEndIndex, dLegerCommittedIndex),
VIEW_MESSAGE_BY_ID (33), GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208).

Where Java serializes a map keyed by MessageQueue (which fastjson writes as
non-standard JSON with object keys), the two stats replies here carry a list of
objects under the same name, each with topic, brokerName and queueId.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from raftmq.broker.headers import BadRequest, boolean, integer, json_body, text
from raftmq.broker.store.metadata import META_TOPIC, SubscriptionGroupConfig, TopicConfig
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.stats import BrokerStats
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
    from raftmq.broker.topic_config_manager import TopicConfigManager

VERSION_DESC = "V4_9_8"


class AdminRequests:
    def __init__(
        self,
        role: BrokerRole,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        stats: BrokerStats,
        *,
        broker_name: str,
        dledger_metadata: Callable[[], dict],
    ) -> None:
        self.role = role
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.stats = stats
        self.broker_name = broker_name
        self.dledger_metadata = dledger_metadata  # the DLedger member's state (DLedgerServer)

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

    async def runtime_info(self, request: RemotingCommand, connection: Connection):
        meta = self.dledger_metadata()
        table = {
            "brokerVersionDesc": VERSION_DESC,
            "brokerName": self.broker_name,
            "brokerId": str(self.role.broker_id),
            "brokerRole": "SYNC_MASTER" if self.role.is_master else "SLAVE",
            "commitLogMaxOffset": str(self.store.physical_max),
            "dispatchBehindEntries": str(self.store.dispatch_behind()),
            "msgPutTotalTodayNow": str(self.stats.put_messages),
            "msgGetTotalTodayNow": str(self.stats.got_messages),
            "dLegerGroup": meta["group"],
            "dLegerSelfId": meta["selfId"],
            "dLegerRole": meta["role"],
            "dLegerTerm": str(meta["term"]),
            "dLegerLeaderId": str(meta["leaderId"] or ""),
            "dLegerLedgerEndIndex": str(meta["ledgerEndIndex"]),
            "dLegerCommittedIndex": str(meta["committedIndex"]),
            "dLegerPeers": ";".join(f"{k}-{v}" for k, v in meta["peers"].items()),
        }
        return request.make_response(ResponseCode.SUCCESS, body=json_body({"table": table}))

    async def view_message(self, request: RemotingCommand, connection: Connection):
        offset = integer(request, "offset")
        try:
            record = self.store.message_at(offset)
        except (IndexError, ValueError):
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        return request.make_response(ResponseCode.SUCCESS, body=record)

    async def topic_stats(self, request: RemotingCommand, connection: Connection):
        store = self.store
        topic = text(request, "topic")
        config = self.topics.get(topic)
        if config is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        rows = []
        for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
            rows.append(
                {
                    "topic": topic,
                    "brokerName": self.broker_name,
                    "queueId": queue_id,
                    "minOffset": store.min_offset(topic, queue_id),
                    "maxOffset": store.max_offset(topic, queue_id),
                    "lastUpdateTimestamp": 0,
                }
            )
        return request.make_response(ResponseCode.SUCCESS, body=json_body({"offsetTable": rows}))

    async def consume_stats(self, request: RemotingCommand, connection: Connection):
        group = text(request, "consumerGroup")
        only = request.ext_fields.get("topic")
        rows = []
        for (topic, queue_id), offset in sorted(self.offsets.offsets_of_group(group).items()):
            if only and topic != only:
                continue
            rows.append(
                {
                    "topic": topic,
                    "brokerName": self.broker_name,
                    "queueId": queue_id,
                    "brokerOffset": self.store.max_offset(topic, queue_id),
                    "consumerOffset": self.offsets.query(group, topic, queue_id) or offset,
                    "lastTimestamp": 0,
                }
            )
        return request.make_response(
            ResponseCode.SUCCESS, body=json_body({"offsetTable": rows, "consumeTps": 0.0})
        )
