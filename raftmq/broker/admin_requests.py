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
from typing import TYPE_CHECKING

from raftmq.broker.headers import BadRequest, boolean, integer, json_body, text
from raftmq.broker.store.metadata import META_TOPIC, SubscriptionGroupConfig, TopicConfig
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.controller import BrokerController

VERSION_DESC = "V4_9_8"


class AdminRequests:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    async def create_topic(self, request: RemotingCommand, connection: Connection):
        broker = self.broker
        if not broker.is_master:
            return broker.not_master(request)
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
        await broker.put_topic(config)
        return request.make_response(ResponseCode.SUCCESS)

    async def delete_topic(self, request: RemotingCommand, connection: Connection):
        broker = self.broker
        if not broker.is_master:
            return broker.not_master(request)
        await broker.meta.write("deleteTopic", topic=text(request, "topic"))
        broker.registration.register_soon()
        return request.make_response(ResponseCode.SUCCESS)

    async def all_topics(self, request: RemotingCommand, connection: Connection):
        metadata = self.broker.store.metadata
        body = {
            "topicConfigTable": {
                n: t.to_json() for n, t in metadata.topics.items() if n != META_TOPIC
            },
            "dataVersion": metadata.data_version,
        }
        return request.make_response(ResponseCode.SUCCESS, body=json_body(body))

    async def create_group(self, request: RemotingCommand, connection: Connection):
        broker = self.broker
        if not broker.is_master:
            return broker.not_master(request)
        try:
            config = SubscriptionGroupConfig.from_json(json.loads(request.body))
        except KeyError as exc:
            raise BadRequest(f"bad subscription group body: no {exc.args[0]}") from None
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"bad subscription group body: {exc}") from None
        await broker.meta.write("group", config=config.to_json())
        return request.make_response(ResponseCode.SUCCESS)

    async def all_groups(self, request: RemotingCommand, connection: Connection):
        metadata = self.broker.store.metadata
        body = {
            "subscriptionGroupTable": {n: g.to_json() for n, g in metadata.groups.items()},
            "dataVersion": metadata.data_version,
        }
        return request.make_response(ResponseCode.SUCCESS, body=json_body(body))

    async def runtime_info(self, request: RemotingCommand, connection: Connection):
        broker = self.broker
        meta = broker.dledger.metadata()
        table = {
            "brokerVersionDesc": VERSION_DESC,
            "brokerName": broker.config.broker_name,
            "brokerId": str(broker.broker_id),
            "brokerRole": "SYNC_MASTER" if broker.is_master else "SLAVE",
            "commitLogMaxOffset": str(broker.store.physical_max),
            "dispatchBehindEntries": str(broker.store.dispatch_behind()),
            "msgPutTotalTodayNow": str(broker.stats_put),
            "msgGetTotalTodayNow": str(broker.stats_got),
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
            record = self.broker.store.message_at(offset)
        except (IndexError, ValueError):
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        return request.make_response(ResponseCode.SUCCESS, body=record)

    async def topic_stats(self, request: RemotingCommand, connection: Connection):
        broker = self.broker
        topic = text(request, "topic")
        config = broker.store.metadata.topics.get(topic)
        if config is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        rows = []
        for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
            rows.append(
                {
                    "topic": topic,
                    "brokerName": broker.config.broker_name,
                    "queueId": queue_id,
                    "minOffset": broker.store.min_offset(topic, queue_id),
                    "maxOffset": broker.store.max_offset(topic, queue_id),
                    "lastUpdateTimestamp": 0,
                }
            )
        return request.make_response(ResponseCode.SUCCESS, body=json_body({"offsetTable": rows}))

    async def consume_stats(self, request: RemotingCommand, connection: Connection):
        broker = self.broker
        group = text(request, "consumerGroup")
        only = request.ext_fields.get("topic")
        rows = []
        for (topic, queue_id), offset in sorted(
            broker.store.metadata.offsets_of_group(group).items()
        ):
            if only and topic != only:
                continue
            rows.append(
                {
                    "topic": topic,
                    "brokerName": broker.config.broker_name,
                    "queueId": queue_id,
                    "brokerOffset": broker.store.max_offset(topic, queue_id),
                    "consumerOffset": broker.offsets.query(group, topic, queue_id) or offset,
                    "lastTimestamp": 0,
                }
            )
        return request.make_response(
            ResponseCode.SUCCESS, body=json_body({"offsetTable": rows, "consumeTps": 0.0})
        )
