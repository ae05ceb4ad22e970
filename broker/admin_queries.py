"""Admin queries: what `mqadmin` and the admin client ask a broker about itself.

GET_BROKER_RUNTIME_INFO (28, with the DLedger member's state: dLegerSelfId,
dLegerRole, dLegerTerm, dLegerLedgerEndIndex, dLegerCommittedIndex),
QUERY_MESSAGE (12, from the key index: by a KEYS word, or by UNIQ_KEY when
`_UNIQUE_KEY_QUERY` is "true", which only caps maxNum at 32 as RocketMQ does;
QUERY_NOT_FOUND, as RocketMQ answers, on a broker with messageIndexEnable=false, its
remark saying why),
VIEW_MESSAGE_BY_ID (33), GET_TOPIC_STATS_INFO (202), GET_CONSUME_STATS (208),
GET_CONSUMER_CONNECTION_LIST (203), GET_PRODUCER_CONNECTION_LIST (204),
QUERY_TOPIC_CONSUME_BY_WHO (300) and VIEW_BROKER_STATS_DATA (315, for `statsAll`).
Every replica answers them from what it holds.

GET_CONSUMER_RUNNING_INFO (307) and INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223) ask the
group's consumers (`consumer_running_info`, `consumer_status`).

CONSUME_MESSAGE_DIRECTLY (309, `mqadmin queryMsgById -g -d`) is passed on: the record
the msgId names goes, with the request's header and this broker's name, to the named
consumer's connection, and the consumer's answer (ConsumeMessageDirectlyResult) is the
reply. Any replica the consumer heartbeats can do it. Unlike RocketMQ's broker, which
forwards an empty body when the offset holds nothing, it answers SYSTEM_ERROR unless
the record at the offset carries that very msgId.

VIEW_BROKER_STATS_DATA knows RocketMQ's two stats `statsAll` asks for: TOPIC_PUT_NUMS
(messages of a topic stored in the last minute, hour and day, counted from the queues'
store times, so every replica agrees and a restart loses nothing) and GROUP_GET_NUMS
(`topic@group`: what the group consumed, from its offset commits to this master).

The two stats replies are maps keyed by MessageQueue, written as fastjson writes them
for Java's admin (`TopicStatsTable`, `ConsumeStats`): non-standard JSON whose keys are
objects, `{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from raftmq.broker.headers import boolean, integer, json_body, text
from raftmq.broker.store.metadata import META_TOPIC
from raftmq.broker.transactions import TRANSACTION_TOPICS

from raftmq.protocol import fastjson
from raftmq.protocol.fastjson import QueueMap, queue_map_body
from raftmq.protocol.message import MessageFormatError, decode, read_dispatch_fields
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import (
    Connection,
    RemotingCommand,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
    RequestCode,
    ResponseCode,
)

if TYPE_CHECKING:
    from raftmq.broker.clients import ClientInfo, ClientManager
    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.stats import BrokerStats
    from raftmq.broker.store.messagestore import MessageStore
    from raftmq.broker.topic_config_manager import TopicConfigManager

VERSION_DESC = "V4_9_8"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG
DEFAULT_QUERY_MAX_NUM = 32  # MessageStoreConfig.defaultQueryMaxNum
CALL_CLIENT_TIMEOUT_S = 10.0  # Broker2Client.callClient
STATS_WINDOWS_MS = {"statsMinute": 60_000, "statsHour": 3_600_000, "statsDay": 86_400_000}


def _connection(info: ClientInfo) -> dict:
    """A `Connection` of RocketMQ's connection lists."""
    return {
        "clientAddr": info.connection.remote_address,
        "clientId": info.client_id,
        "language": info.language,
        "version": info.version,
    }


@attrs.define
class AdminQueries:
    role: BrokerRole
    store: MessageStore
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    stats: BrokerStats
    clients: ClientManager
    broker_name: str = attrs.field(kw_only=True)
    broker_addr: Callable[[], str] = attrs.field(kw_only=True, default=str)  # advertised, now
    # DLedgerServer.metadata; None for a classic broker, which reports `classic_info`
    dledger_metadata: Callable[[], dict] | None = attrs.field(kw_only=True)
    classic_info: Callable[[], dict[str, str]] = attrs.field(kw_only=True, default=dict)
    ha_runtime_info: Callable[[], dict] | None = attrs.field(kw_only=True, default=None)
    # BrokerCollector.runtime_keys: the rate and disk keys
    runtime_keys: Callable[[], dict[str, str]] = attrs.field(kw_only=True, default=dict)
    # BrokerCollector.group_get_tps: (topic, group) -> messages pulled per second
    group_get_tps: Callable[[str, str], float] = attrs.field(kw_only=True)

    async def ha_status(self, request: RemotingCommand, connection: Connection):
        """GET_BROKER_HA_STATUS (907, RocketMQ 5): HARuntimeInfo; a DLedger broker has
        no classic HA to report (`mqadmin dledgerStatus` shows its replication)."""
        if self.ha_runtime_info is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                "Can not get HARuntimeInfo: this broker replicates by DLedger, not classic HA",
            )
        return request.make_response(ResponseCode.SUCCESS, body=json_body(self.ha_runtime_info()))

    async def runtime_info(self, request: RemotingCommand, connection: Connection):
        table = {
            "brokerVersionDesc": VERSION_DESC,
            "brokerName": self.broker_name,
            "brokerId": str(self.role.broker_id),
            "brokerRole": self.role.master_role if self.role.is_master else "SLAVE",
            "commitLogMaxOffset": str(self.store.physical_max),
            "dispatchBehindEntries": str(self.store.dispatch_behind()),
            **self.stats.runtime_info(),
            **self.runtime_keys(),
        }
        if self.dledger_metadata is None:
            table |= self.classic_info()
        else:
            meta = self.dledger_metadata()
            table |= {
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

    async def query_message(self, request: RemotingCommand, connection: Connection):
        """QueryMessageProcessor.queryMessage: the raw stored records concatenated."""
        max_num = integer(request, "maxNum")
        if (request.ext_fields or {}).get(UNIQUE_KEY_QUERY, "").lower() == "true":
            max_num = DEFAULT_QUERY_MAX_NUM
        records, end_ms, end_phy = self.store.query_message(
            text(request, "topic"),
            text(request, "key"),
            max_num,
            integer(request, "beginTimestamp"),
            integer(request, "endTimestamp"),
        )
        if not records:
            end_ms = end_phy = 0
        header = {"indexLastUpdateTimestamp": str(end_ms), "indexLastUpdatePhyoffset": str(end_phy)}
        if not records:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct"
                if self.store.index is not None
                else "can not find message: messageIndexEnable=false, no key index here",
                ext_fields=header,
            )
        return request.make_response(
            ResponseCode.SUCCESS, ext_fields=header, body=b"".join(records)
        )

    async def view_message(self, request: RemotingCommand, connection: Connection):
        offset = integer(request, "offset")
        try:
            record = self.store.message_at(offset)
        except (IndexError, ValueError):
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        if read_dispatch_fields(record)[5] == META_TOPIC:  # the ACL's secret keys ride in it
            return request.make_response(
                ResponseCode.NO_PERMISSION, f"the message at offset {offset} is internal"
            )
        return request.make_response(ResponseCode.SUCCESS, body=record)

    async def consume_message_directly(self, request: RemotingCommand, connection: Connection):
        """AdminBrokerProcessor.consumeMessageDirectly and callConsumer: the message to
        the consumer `clientId` of `consumerGroup`, its answer back (10 s at most)."""
        group, client_id = text(request, "consumerGroup"), text(request, "clientId")
        msg_id = text(request, "msgId")
        try:
            record = self.store.message_at(decode_message_id(msg_id).offset)
            found = decode(record, read_body=False)[0].msg_id == msg_id.upper()
        except (IndexError, ValueError, MessageFormatError):
            found = False
        if found and read_dispatch_fields(record)[5] == META_TOPIC:
            return request.make_response(
                ResponseCode.NO_PERMISSION, f"the message {msg_id} is internal"
            )
        if not found:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the msgId, {msg_id}"
            )
        ext = {**request.ext_fields, "brokerName": self.broker_name}
        forwarded = RemotingCommand(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext_fields=ext)
        forwarded.body = bytes(record)
        return await self._call_consumer(request, group, client_id, forwarded)

    async def consumer_running_info(self, request: RemotingCommand, connection: Connection):
        """GET_CONSUMER_RUNNING_INFO (307, `mqadmin consumerStatus`), passed on to the
        consumer `clientId` of `consumerGroup` as it came; its ConsumerRunningInfo back."""
        group, client_id = text(request, "consumerGroup"), text(request, "clientId")
        forwarded = RemotingCommand(
            RequestCode.GET_CONSUMER_RUNNING_INFO, ext_fields=dict(request.ext_fields)
        )
        return await self._call_consumer(request, group, client_id, forwarded)

    async def _call_consumer(
        self, request: RemotingCommand, group: str, client_id: str, forwarded: RemotingCommand
    ) -> RemotingCommand:
        """AdminBrokerProcessor.callConsumer: `forwarded` to one consumer, its answer as
        the reply to `request` (10 s at most)."""
        consumer = self.clients.consumer(group, client_id)
        if consumer is None or consumer.connection.closed:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
            )
        try:
            answer = await consumer.connection.invoke(forwarded, CALL_CLIENT_TIMEOUT_S)
        except RemotingTimeoutError as exc:
            return request.make_response(
                ResponseCode.CONSUME_MSG_TIMEOUT,
                f"consumer <{group}> <{client_id}> Timeout: {exc}",
            )
        except (RemotingConnectError, RemotingError, OSError) as exc:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"invoke consumer <{group}> <{client_id}> Exception: {exc}",
            )
        return request.make_response(answer.code, answer.remark, body=answer.body)

    async def consumer_status(self, request: RemotingCommand, connection: Connection):
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223, `mqadmin getConsumerStatus`):
        GET_CONSUMER_STATUS_FROM_CLIENT (221) to every online member of `group` (or to
        `clientAddr`, a client id, alone), each member's offsets of `topic` gathered
        into GetConsumerStatusBody's consumerTable. A member that does not answer is
        left out, as Broker2Client.getConsumeStatus leaves it."""
        group, topic = text(request, "group"), text(request, "topic")
        only = request.ext_fields.get("clientAddr") or ""
        members = self.clients.groups.get(group, {})
        if not members:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"No Any Consumer online in the consumer group: [{group}]",
            )
        table = {}
        for client_id, member in sorted(members.items()):
            if (only and client_id != only) or member.connection.closed:
                continue
            ask = RemotingCommand(
                RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
                ext_fields={"topic": topic, "group": group, "clientAddr": client_id},
            )
            try:
                answer = await member.connection.invoke(ask, CALL_CLIENT_TIMEOUT_S)
                offsets = fastjson.loads(answer.body.decode()).get("messageQueueTable") or []
                table[client_id] = QueueMap(
                    (mq["topic"], mq["brokerName"], int(mq["queueId"]), int(offset))
                    for mq, offset in (offsets if isinstance(offsets, list) else ())
                )
            except (RemotingTimeoutError, RemotingConnectError, OSError):
                continue  # gone or silent
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # an answer that is not a GetConsumerStatusBody (no status)
        if only and not table:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"The Consumer <{group}> <{only}> not online or did not answer",
            )
        body = fastjson.dumps({"consumerTable": table, "messageQueueTable": QueueMap()})
        return request.make_response(ResponseCode.SUCCESS, body=body.encode())

    async def topic_stats(self, request: RemotingCommand, connection: Connection):
        store = self.store
        topic = text(request, "topic")
        config = self.topics.get(topic)
        if config is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        entries = [
            (
                topic,
                self.broker_name,
                queue_id,
                {
                    "minOffset": store.min_offset(topic, queue_id),
                    "maxOffset": (max_offset := store.max_offset(topic, queue_id)),
                    # the store time of the queue's last message, as RocketMQ reports it
                    "lastUpdateTimestamp": max(
                        0, store.store_time_at(topic, queue_id, max_offset - 1)
                    ),
                },
            )
            for queue_id in range(max(config.read_queue_nums, config.write_queue_nums))
        ]
        return request.make_response(ResponseCode.SUCCESS, body=queue_map_body(entries))

    async def consume_stats(self, request: RemotingCommand, connection: Connection):
        group = text(request, "consumerGroup")
        only = request.ext_fields.get("topic")
        entries = []
        topics = set()
        committed = self.offsets.offsets_of_group(group)
        pop = self.store.metadata.pop
        popped = {(t, q): o for (g, t, q), o in pop.offsets.items() if g == group}
        for topic, queue_id in sorted(committed.keys() | popped.keys()):
            if only and topic != only:
                continue
            topics.add(topic)
            key = (topic, queue_id)
            if key in popped:  # a POP consumer: its pops have got this far
                consumer_offset = popped[key]
            else:
                consumer_offset = self.offsets.query(group, topic, queue_id) or committed[key]
            progress = {
                "brokerOffset": self.store.max_offset(topic, queue_id),
                "consumerOffset": consumer_offset,
                # the store time of the last message consumed (0: none, or gone)
                "lastTimestamp": max(
                    0, self.store.store_time_at(topic, queue_id, consumer_offset - 1)
                ),
            }
            if key in popped:  # raftmq's: popped and neither acknowledged nor redelivered
                progress["popInFlight"] = pop.in_flight_count(group, topic, queue_id)
            entries.append((topic, self.broker_name, queue_id, progress))
        # what the group pulled here per second over the last minute, its topics summed
        consume_tps = sum(self.group_get_tps(topic, group) for topic in sorted(topics))
        body = queue_map_body(entries, consumeTps=consume_tps)
        return request.make_response(ResponseCode.SUCCESS, body=body)

    async def broker_consume_stats(self, request: RemotingCommand, connection: Connection):
        """GET_BROKER_CONSUME_STATS (317, `mqadmin brokerConsumeStats`): ConsumeStatsList,
        for every group with offsets here and every topic it has offsets on (order
        topics only with `isOrder`), each write queue's progress; the groups' total lag.
        A group online here is shown only on the topics it subscribes to, as in
        RocketMQ."""
        only_order = boolean(request, "isOrder")
        groups: dict[str, set[str]] = {}
        for group, topic, _queue_id in self.store.metadata.offsets:
            groups.setdefault(group, set()).add(topic)
        stats_list, total_diff = [], 0
        for group, topics in sorted(groups.items()):
            members = self.clients.groups.get(group, {})
            subscribed = {str(s.get("topic")) for m in members.values() for s in m.subscriptions}
            group_stats = []
            for topic in sorted(topics):
                config = self.topics.get(topic)
                if config is None or (only_order and not config.order):
                    continue
                if subscribed and topic not in subscribed:
                    continue
                entries = []
                for queue_id in range(config.write_queue_nums):
                    broker_offset = max(0, self.store.max_offset(topic, queue_id))
                    consumer_offset = max(0, self.offsets.query(group, topic, queue_id) or 0)
                    last_ms = max(0, self.store.store_time_at(topic, queue_id, consumer_offset - 1))
                    total_diff += broker_offset - consumer_offset
                    progress = {"brokerOffset": broker_offset, "consumerOffset": consumer_offset,
                                "lastTimestamp": last_ms}  # fmt: skip
                    entries.append((topic, self.broker_name, queue_id, progress))
                group_stats.append(
                    {
                        "consumeTps": self.group_get_tps(topic, group),
                        "offsetTable": QueueMap(entries),
                    }
                )
            stats_list.append({group: group_stats})
        body = {"brokerAddr": self.broker_addr(), "consumeStatsList": stats_list,
                "totalDiff": total_diff}  # fmt: skip
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(body).encode())

    async def query_consume_queue(self, request: RemotingCommand, connection: Connection):
        """QUERY_CONSUME_QUEUE (321, `mqadmin queryCq`): `count` entries of a queue from
        `index` (physical offset, size, tags code), its bounds, and with a
        `consumerGroup` the group's subscription here (or that it is not online)."""
        topic, queue_id = text(request, "topic"), integer(request, "queueId")
        index, count = integer(request, "index"), integer(request, "count", 10)
        queue = self.store.queue(topic, queue_id)
        if queue is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"{queue_id}@{topic} is not exist!"
            )
        body: dict = {"maxQueueIndex": queue.max_offset, "minQueueIndex": queue.min_offset}
        group = request.ext_fields.get("consumerGroup")
        if group:
            members = self.clients.groups.get(group, {}).values()
            data = next(
                (s for m in members for s in m.subscriptions if s.get("topic") == topic), None
            )
            if data is None:
                body["filterData"] = f"{group}@{topic} is not online!"
            else:
                body["subscriptionData"] = data
        if not queue.min_offset <= index < queue.max_offset:
            return request.make_response(
                ResponseCode.SUCCESS,
                f"Index {index} of {queue_id}@{topic} is not exist!",
                body=fastjson.dumps(body).encode(),
            )
        body["queueData"] = [
            {"physicOffset": offset, "physicSize": size, "tagsCode": tags_code, "eval": False}
            for offset, size, tags_code in queue.entries(index, max(0, count))
        ]
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(body).encode())

    async def clean_expired_consume_queue(self, request: RemotingCommand, connection):
        """CLEAN_EXPIRED_CONSUMEQUEUE (306, `mqadmin cleanExpiredCQ`): drop from every
        queue the entries whose messages retention deleted from the log. The store does
        this itself whenever the log's beginning moves; this does it now."""
        self.store.trim_queues()
        return request.make_response(ResponseCode.SUCCESS)

    async def clean_unused_topic(self, request: RemotingCommand, connection):
        """CLEAN_UNUSED_TOPIC (316, `mqadmin cleanUnusedTopic`): drop the ConsumeQueues
        of topics this broker's topic table does not have. A deletion through the log
        drops them on every replica by itself; this is for the queues left by one
        from before it did (or by a Java master's, which a slave learns of only by
        SlaveSynchronize). Each member answers for its own store. The transaction
        topics stay whatever the table says (RocketMQ keeps its op topic so): their
        queues are the broker's own state of open transactions, not a user's topic."""
        for topic in self.store.unused_topics():
            if topic not in TRANSACTION_TOPICS:
                self.store.drop_topic(topic)
        return request.make_response(ResponseCode.SUCCESS)

    async def producer_info(self, request: RemotingCommand, connection: Connection):
        """GET_ALL_PRODUCER_INFO (328, `mqadmin producer`): ProducerTableInfo, every
        producer group's members heartbeating here."""
        data = {
            group: [
                {
                    "clientId": p.client_id,
                    "remoteIP": p.connection.remote_address,
                    "language": p.language,
                    "version": p.version,
                    "lastUpdateTimestamp": p.last_update_ms,
                }
                for _, p in sorted(members.items())
            ]
            for group, members in sorted(self.clients.producers.items())
        }
        return request.make_response(ResponseCode.SUCCESS, body=json_body({"data": data}))

    async def consumer_connections(self, request: RemotingCommand, connection: Connection):
        """ConsumerConnection: the group's members, their subscriptions and modes."""
        group = text(request, "consumerGroup")
        members = list(self.clients.groups.get(group, {}).values())
        if not members:
            return request.make_response(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        latest = max(members, key=lambda m: m.last_update_ms)
        subscriptions = {}
        for member in members:
            for sub in member.subscriptions:
                subscriptions.setdefault(str(sub.get("topic")), sub)
        body = {
            "connectionSet": [_connection(m) for m in members],
            "subscriptionTable": subscriptions,
            "consumeType": latest.consume_type,
            "messageModel": latest.message_model,
            "consumeFromWhere": latest.consume_from_where,
        }
        return request.make_response(ResponseCode.SUCCESS, body=json_body(body))

    async def producer_connections(self, request: RemotingCommand, connection: Connection):
        """ProducerConnection: the members of a producer group that heartbeat here."""
        group = text(request, "producerGroup")
        if members := self.clients.producers.get(group):
            body = json_body({"connectionSet": [_connection(m) for m in members.values()]})
            return request.make_response(ResponseCode.SUCCESS, body=body)
        remark = f"the producer group[{group}] not exist"
        return request.make_response(ResponseCode.SYSTEM_ERROR, remark)

    async def topic_consumed_by(self, request: RemotingCommand, connection: Connection):
        """GroupList: the groups online with a subscription to the topic, and those that
        committed an offset on it."""
        topic = text(request, "topic")
        groups = self.offsets.groups_of_topic(topic)
        for group, members in self.clients.groups.items():
            if any(s.get("topic") == topic for m in members.values() for s in m.subscriptions):
                groups.add(group)
        return request.make_response(
            ResponseCode.SUCCESS, body=json_body({"groupList": sorted(groups)})
        )

    async def broker_stats(self, request: RemotingCommand, connection: Connection):
        """BrokerStatsData: sum and per-second rate over the last minute, hour and day."""
        name, key = text(request, "statsName"), text(request, "statsKey")
        now_ms = self.store.now_ms()
        stats = self.stats
        if name == "TOPIC_PUT_NUMS":
            config = self.topics.get(key)
            queues = range(config.write_queue_nums) if config is not None else range(0)

            def count(window_ms: int) -> int:
                since_ms = now_ms - window_ms
                return sum(
                    self.store.max_offset(key, q) - self.store.search_offset(key, q, since_ms)
                    for q in queues
                )

            def per_call(total: int, window_ms: int) -> float:
                puts = total - stats.batched_per_minute.since(key, window_ms, now_ms)
                return total / puts if puts > 0 else 0.0
        elif name == "GROUP_GET_NUMS" and "@" in key:
            topic, _, group = key.partition("@")

            def count(window_ms: int) -> int:
                return self.offsets.consumed.since((topic, group), window_ms, now_ms)

            def per_call(_total: int, window_ms: int) -> float:
                pulls = stats.pulls_per_minute.since((topic, group), window_ms, now_ms)
                pulled = stats.pulled_per_minute.since((topic, group), window_ms, now_ms)
                return pulled / pulls if pulls else 0.0
        else:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, f"no stats {name} for {key} on this broker"
            )
        body = {}
        for field, window_ms in STATS_WINDOWS_MS.items():
            total = count(window_ms)
            body[field] = {
                "sum": total,
                "tps": total * 1000 / window_ms,
                # RocketMQ's StatsItem: the count per call (messages per put, per pull)
                "avgpt": per_call(total, window_ms),
            }
        return request.make_response(ResponseCode.SUCCESS, body=json_body(body))
