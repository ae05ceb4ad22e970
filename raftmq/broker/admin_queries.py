"""Admin queries: what `mqadmin` and the admin client ask a broker about itself.

GET_BROKER_RUNTIME_INFO (28, with the DLedger member's state: dLegerSelfId,
dLegerRole, dLegerTerm, dLegerLedgerEndIndex, dLegerCommittedIndex),
VIEW_MESSAGE_BY_ID (33), GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208).
Every replica answers them from what it holds.

Where Java serializes a map keyed by MessageQueue (which fastjson writes as
non-standard JSON with object keys), the two stats replies here carry a list of
objects under the same name, each with topic, brokerName and queueId.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from raftmq.broker.headers import integer, json_body, text
from raftmq.remoting import Connection, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.stats import BrokerStats
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.topic_config_manager import TopicConfigManager

VERSION_DESC = "V4_9_8"


@attrs.define
class AdminQueries:
    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    stats: BrokerStats
    broker_name: str = attrs.field(kw_only=True)
    dledger_metadata: Callable[[], dict] = attrs.field(kw_only=True)  # DLedgerServer.metadata

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
