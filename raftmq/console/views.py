"""What the console's pages show, as JSON documents built from `Admin` calls.

Every number comes from the same calls `mqadmin` makes (clusterList and
dledgerStatus for the cluster, topicStatus and statsAll for topics, consumerProgress
for groups, the queryMsgBy* verbs for messages), so the page and the command line
never disagree. The documents are plain dicts of JSON types; the page renders them.
"""

from __future__ import annotations

import trio

from raftmq.client.admin import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    UNREACHABLE,
    Admin,
    ClusterInfo,
    UnreachableError,
    fall_behind_bytes,
    group_members,
    is_broker_topic,
    is_classic,
    table_number,
)
from raftmq.client.errors import MQClientError
from raftmq.client.mqadmin.groups import rates
from raftmq.client.mqadmin.main import failure_reason
from raftmq.client.mqadmin.messages import body_text
from raftmq.client.route import MASTER_ID, BrokerData
from raftmq.client.trace import TraceRecord
from raftmq.protocol.message import MessageExt
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError

LOOKUPS_AT_ONCE = 8  # topics or groups asked about concurrently
_NO_ANSWER = (MQClientError, RemotingConnectError, RemotingTimeoutError)


def is_system_topic(topic: str, info: ClusterInfo) -> bool:
    """RocketMQ's system topics, and the groups' retry and dead-letter topics."""
    return topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) or is_broker_topic(topic, info)


async def _gather(items, lookup) -> list:
    """`[await lookup(item) for item in items]`, a few at a time."""
    results: list = [None] * len(items)
    limiter = trio.CapacityLimiter(LOOKUPS_AT_ONCE)

    async def one(index: int, item) -> None:
        async with limiter:
            results[index] = await lookup(item)

    async with trio.open_nursery() as nursery:
        for index, item in enumerate(items):
            nursery.start_soon(one, index, item)
    return results


# ---------------------------------------------------------------------- the cluster


async def cluster_view(admin: Admin) -> dict:
    """Every broker group: its members as dledgerStatus shows them (role, term, ledger
    end and committed index, unreachable ones included), their clusterList columns,
    the master the name servers route to and the leader the members report; a
    classic group's members as master and slaves with the slaves' HA lag."""
    info = await admin.cluster_info()
    groups = await _gather(info.broker_datas(), lambda broker: _group_view(admin, broker))
    return {
        "namesrv": ";".join(admin.namesrv_addrs),
        "clusters": {name: list(brokers) for name, brokers in sorted(info.clusters.items())},
        "groups": groups,
    }


async def _group_view(admin: Admin, broker: BrokerData) -> dict:
    tables = await admin.runtime_tables(broker.addrs)
    if any(is_classic(table) for table in tables.values()):
        return _classic_group_view(broker, tables)
    ids = {address: broker_id for broker_id, address in broker.addrs.items()}
    members = []
    for m in group_members(broker, tables):
        broker_id = ids.get(m.addr)
        table = tables.get(broker_id) or {}
        members.append(
            {
                "selfId": m.self_id,
                "addr": m.addr,
                "peerAddr": m.peer_addr,
                "brokerId": broker_id,
                "role": m.role,
                "term": m.term,
                "ledgerEndIndex": m.ledger_end_index,
                "committedIndex": m.committed_index,
                "version": table.get("brokerVersionDesc"),
                "inTotal": table.get("msgPutTotalTodayNow"),
                "outTotal": table.get("msgGetTotalTodayNow"),
                **_timer_fields(table),
            }
        )
    master = next((m for m in members if m["addr"] is not None and m["brokerId"] == 0), None)
    leader = next((m["selfId"] for m in members if m["role"] == "LEADER"), None)
    return {
        "brokerName": broker.broker_name,
        "cluster": broker.cluster,
        "replication": "dledger",
        "master": None if master is None else {"selfId": master["selfId"], "addr": master["addr"]},
        "leader": leader,
        "members": members,
    }


def _classic_group_view(broker: BrokerData, tables: dict[int, dict | None]) -> dict:
    """A classic master/slave group: each registered member's brokerRole and CommitLog
    end, and how far the slaves are behind (`fall_behind_bytes`)."""
    members = []
    for broker_id, address in sorted(broker.addrs.items()):
        table = tables.get(broker_id)
        known = table or {}
        members.append(
            {
                "brokerId": broker_id,
                "addr": address,
                "role": UNREACHABLE if table is None else known.get("brokerRole", "?"),
                "commitLogMaxOffset": table_number(known, "commitLogMaxOffset"),
                "slaveFallBehindBytes": fall_behind_bytes(broker_id, tables),
                "haConnections": table_number(known, "haConnections"),
                "haMasterAddr": known.get("masterAddr"),
                "masterEpoch": table_number(known, "masterEpoch"),  # controller mode only
                "version": known.get("brokerVersionDesc"),
                "inTotal": known.get("msgPutTotalTodayNow"),
                "outTotal": known.get("msgGetTotalTodayNow"),
                **_timer_fields(known),
            }
        )
    master = broker.addrs.get(MASTER_ID)
    in_sync = (tables.get(MASTER_ID) or {}).get("syncStateSet")
    return {
        "brokerName": broker.broker_name,
        "cluster": broker.cluster,
        "replication": "classic",
        "master": None if master is None else {"brokerId": MASTER_ID, "addr": master},
        # controller mode: the brokerIds the master counts in sync (its SyncStateSet)
        "syncStateSet": None if in_sync is None else [int(i) for i in in_sync.split(",") if i],
        "members": members,
    }


def _timer_fields(table: dict) -> dict:
    """A member's timer messages as `mqadmin timerStatus` shows them: the backlog (filed,
    not yet fired), how many the master holds in memory, how late its last delivery was."""
    return {
        "timerBacklog": table_number(table, "timerBacklog"),
        "timerInMemory": table_number(table, "timerInMemory"),
        "timerLatenessMs": table_number(table, "timerLatenessMs"),
    }


# ---------------------------------------------------------------------- topics


async def topics_view(admin: Admin, include_system: bool = False) -> dict:
    """Every topic the name servers know (system ones only when asked for) with its
    queues' offsets and put rate; a topic that cannot be read carries its error."""
    info = await admin.cluster_info()
    names = [t for t in await admin.topic_list() if include_system or not is_system_topic(t, info)]
    topics = await _gather(names, lambda topic: _topic_view(admin, info, topic))
    return {"clusters": sorted(info.clusters), "topics": topics}


async def _topic_view(admin: Admin, info: ClusterInfo, topic: str) -> dict:
    view: dict = {"topic": topic, "system": is_system_topic(topic, info)}
    try:
        route = await admin.topic_route(topic)
        queues = await admin.topic_status(topic)
        masters = await admin.route_masters(topic)
        put_tps, put_day = await rates(admin, masters, "TOPIC_PUT_NUMS", topic)
    except _NO_ANSWER as exc:
        return {**view, "error": failure_reason(exc)[0]}
    return {
        **view,
        "brokers": [
            {
                "brokerName": q.broker_name,
                "readQueueNums": q.read_queue_nums,
                "writeQueueNums": q.write_queue_nums,
                "perm": q.perm,
            }
            for q in route.queue_datas
        ],
        "queues": [
            {
                "brokerName": q.broker_name,
                "queueId": q.queue_id,
                "minOffset": q.min_offset,
                "maxOffset": q.max_offset,
                "lastUpdateMs": q.last_update_ms,
            }
            for q in queues
        ],
        "messages": sum(q.max_offset - q.min_offset for q in queues),
        "putTps": round(put_tps, 2),
        "putLastDay": put_day,
    }


# ---------------------------------------------------------------------- consumer groups


async def groups_view(admin: Admin) -> dict:
    """Every subscription group the brokers hold, with consumerProgress's rows (lag per
    queue) and consume rate; a group whose progress cannot be read carries its error."""
    info = await admin.cluster_info()
    configs: dict[str, dict] = {}
    for broker in info.broker_datas():
        configs.update(await _subscription_groups(admin, broker))
    names = sorted(configs)
    groups = await _gather(names, lambda group: _group_progress(admin, group, configs[group]))
    return {"clusters": sorted(info.clusters), "groups": groups}


async def _subscription_groups(admin: Admin, broker: BrokerData) -> dict[str, dict]:
    """The group's subscription configs from its first member that answers: every
    member holds the same replicated table."""
    reasons = []
    for address in broker.addresses():
        try:
            return await admin.subscription_groups(address)
        except (RemotingConnectError, RemotingTimeoutError) as exc:
            reasons.append(f"{address}: {exc}")
    raise UnreachableError(f"no member of {broker.broker_name} answered: {'; '.join(reasons)}")


async def _group_progress(admin: Admin, group: str, config: dict) -> dict:
    view = {"group": group, "config": config}
    try:
        stats = await admin.consumer_progress(group)
    except _NO_ANSWER as exc:
        return {**view, "error": failure_reason(exc)[0]}
    return {
        **view,
        "consumeTps": round(stats.consume_tps, 2),
        "diffTotal": stats.diff_total,
        # popped, not yet acknowledged (RocketMQ 5's POP consumers; `mqadmin popStatus`)
        "popInFlight": sum(q.pop_in_flight or 0 for q in stats.queues),
        "queues": [
            {
                "topic": q.topic,
                "brokerName": q.broker_name,
                "queueId": q.queue_id,
                "brokerOffset": q.broker_offset,
                "consumerOffset": q.consumer_offset,
                "diff": q.diff,
                "lastTimestampMs": q.last_timestamp_ms,
                "popInFlight": q.pop_in_flight,
            }
            for q in stats.queues
        ],
    }


# ---------------------------------------------------------------------- messages


def message_json(msg: MessageExt, broker_name: str | None = None) -> dict:
    """queryMsgById's fields, the body as text."""
    return {
        "msgId": msg.msg_id,
        "uniqKey": msg.uniq_key,
        "topic": msg.topic,
        "brokerName": broker_name,
        "tags": msg.tags,
        "keys": msg.keys,
        "queueId": msg.queue_id,
        "queueOffset": msg.queue_offset,
        "commitLogOffset": msg.physical_offset,
        "reconsumeTimes": msg.reconsume_times,
        "bornTimestampMs": msg.born_timestamp,
        "storeTimestampMs": msg.store_timestamp,
        "bornHost": "{}:{}".format(*msg.born_host),
        "storeHost": "{}:{}".format(*msg.store_host),
        "sysFlag": msg.sysflag,
        "properties": dict(sorted(msg.properties.items())),
        "body": body_text(msg),
    }


def trace_json(record: TraceRecord) -> dict:
    """One trace record's fields (queryMsgTraceById's columns and the rest)."""
    return {
        "type": record.type.value,
        "group": record.group,
        "clientHost": record.client_host,
        "timestampMs": record.timestamp_ms,
        "costMs": record.cost_ms,
        "success": record.success,
        "topic": record.topic,
        "tags": record.tags,
        "keys": record.keys,
        "storeHost": record.store_host,
        "offsetMsgId": record.offset_msg_id,
        "requestId": record.request_id,
        "retryTimes": record.retry_times,
    }
