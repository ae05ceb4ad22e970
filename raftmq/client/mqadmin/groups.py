"""Consumer and producer group verbs: consumerProgress, updateSubGroup, deleteSubGroup,
consumerConnection, producerConnection, resetOffsetByTime, statsAll."""

from __future__ import annotations

import argparse
import contextlib

from raftmq.client.admin import DLQ_PREFIX, RETRY_PREFIX, Admin
from raftmq.client.errors import MQBrokerError
from raftmq.client.mqadmin.commands import (
    broker_or_cluster,
    human_ms,
    java_bool,
    option,
    parse_timestamp_ms,
    print_row,
    target_kwargs,
    verb,
)
from raftmq.client.mqadmin.topics import report_topic_deleted
from raftmq.client.route import TopicRouteData


@verb(
    "consumerProgress",
    "Query consumers's progress, speed",
    option("-g", "groupName", "consumer group name", required=True),
)
async def consumer_progress(admin: Admin, args: argparse.Namespace) -> None:
    stats = await admin.consumer_progress(args.groupName.strip())
    fmt = "%-32s  %-32s  %-4s  %-20s  %-20s  %-20s %-20s  %s"
    print_row(
        fmt,
        "#Topic",
        "#Broker Name",
        "#QID",
        "#Broker Offset",
        "#Consumer Offset",
        "#Client IP",
        "#Diff",
        "#LastTime",
    )
    for q in stats.queues:
        last = human_ms(q.last_timestamp_ms) if q.last_timestamp_ms > 0 else ""
        print_row(
            fmt,
            q.topic,
            q.broker_name,
            q.queue_id,
            q.broker_offset,
            q.consumer_offset,
            "NA",
            q.diff,
            last,
        )
    print()
    print(f"Consume TPS: {stats.consume_tps}")
    print(f"Diff Total: {stats.diff_total}")


# SubscriptionGroupConfig's defaults with broadcast and from-min off, as
# UpdateSubGroupSubCommand starts from.
SUB_GROUP_DEFAULTS = {
    "consumeEnable": True,
    "consumeFromMinEnable": False,
    "consumeBroadcastEnable": False,
    "retryQueueNums": 1,
    "retryMaxTimes": 16,
    "brokerId": 0,
    "whichBrokerWhenConsumeSlowly": 1,
    "notifyConsumerIdsChangedEnable": True,
}


@verb(
    "updateSubGroup",
    "Update or create subscription group",
    *broker_or_cluster(
        "create subscription group to which broker", "create subscription group to which cluster"
    ),
    option("-g", "groupName", "consumer group name", required=True),
    option("-s", "consumeEnable", "consume enable"),
    option("-m", "consumeFromMinEnable", "from min offset"),
    option("-d", "consumeBroadcastEnable", "broadcast"),
    option("-q", "retryQueueNums", "retry queue nums", type=int),
    option("-r", "retryMaxTimes", "retry max times", type=int),
    option("-i", "brokerId", "consumer from which broker id", type=int),
    option("-w", "whichBrokerWhenConsumeSlowly", "which broker id when consume slowly", type=int),
    option("-a", "notifyConsumerIdsChanged", "notify consumerId changed"),
)
async def update_sub_group(admin: Admin, args: argparse.Namespace) -> None:
    """The config starts from SUB_GROUP_DEFAULTS; each flag given overrides."""
    target = target_kwargs(args)
    config = {"groupName": args.groupName.strip(), **SUB_GROUP_DEFAULTS}
    for flag, key in (
        ("consumeEnable", "consumeEnable"),
        ("consumeFromMinEnable", "consumeFromMinEnable"),
        ("consumeBroadcastEnable", "consumeBroadcastEnable"),
        ("notifyConsumerIdsChanged", "notifyConsumerIdsChangedEnable"),
    ):
        if getattr(args, flag) is not None:
            config[key] = java_bool(getattr(args, flag))
    for key in ("retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    for address in await write_sub_group(admin, config, target):
        print(f"create subscription group to {address} success.")
    fields = ", ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in config.items()
    )
    print(f"SubscriptionGroupConfig [{fields}]")


async def write_sub_group(admin: Admin, config: dict, target: dict) -> list[str]:
    """Create or update the group (`target`: Admin's cluster or broker_addr keyword)
    with `config`; the addresses written to. A retryQueueNums other than 1 resizes the
    group's retry topic on those brokers, as UpdateSubGroupSubCommand does (a group
    without a retry topic yet gets one of that size when it is first needed)."""
    retry_route = None
    if config["retryQueueNums"] != 1:
        with contextlib.suppress(MQBrokerError):
            retry_route = await admin.topic_route(RETRY_PREFIX + config["groupName"])
    targets = await admin.create_subscription_group(config, **target)
    if retry_route is not None:
        await _resize_retry_topic(admin, retry_route, config["retryQueueNums"], targets)
    return targets


async def _resize_retry_topic(
    admin: Admin, route: TopicRouteData, queues: int, targets: list[str]
) -> None:
    """The group's retry topic gets `queues` queues on the brokers written to."""
    for queue_data in route.queue_datas:
        master = route.master(queue_data.broker_name)
        if master in targets and queue_data.write_queue_nums != queues:
            await admin.create_topic(
                route.topic, queues, queues, queue_data.perm, broker_addr=master
            )


@verb(
    "deleteSubGroup",
    "Delete subscription group from broker.",
    *broker_or_cluster(
        "delete subscription group from which broker",
        "delete subscription group from which cluster",
    ),
    option("-g", "groupName", "subscription group name", required=True),
)
async def delete_sub_group(admin: Admin, args: argparse.Namespace) -> None:
    group, target = args.groupName.strip(), target_kwargs(args)
    targets, topics = await remove_sub_group(admin, group, target)
    for address in targets:
        if "cluster" in target:
            print(
                f"delete subscription group [{group}] from broker [{address}] "
                f"in cluster [{target['cluster']}] success."
            )
        else:
            print(f"delete subscription group [{group}] from broker [{address}] success.")
    for topic in topics:
        report_topic_deleted(topic, target["cluster"])


async def remove_sub_group(admin: Admin, group: str, target: dict) -> tuple[list[str], list[str]]:
    """Delete the group (`target` as in write_sub_group): (the brokers written to, the
    topics deleted). With a cluster the group's retry and dead-letter topics go too,
    as RocketMQ's deleteSubGroup does."""
    targets = await admin.delete_subscription_group(group, **target)
    topics = []
    if "cluster" in target:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            await admin.delete_topic(prefix + group, target["cluster"])
            topics.append(prefix + group)
    return targets, topics


def _version_desc(version: int) -> str:
    """MQVersion.getVersionDesc for 4.x and 5.x: from V4_0_0_SNAPSHOT (212) on, every
    release follows its snapshot. Older numbers (ali-ons sends 121) are shown as they are."""
    if version < 212:
        return str(version)
    n, release = divmod(version - 212, 2)
    name = f"V{4 + n // 100}_{n % 100 // 10}_{n % 10}"
    return name if release else f"{name}_SNAPSHOT"


@verb(
    "consumerConnection",
    "Query consumer's socket connection, client version and subscription",
    option("-g", "consumerGroup", "consumer group name", required=True),
)
async def consumer_connection(admin: Admin, args: argparse.Namespace) -> None:
    """ConsumerConnectionSubCommand's lines (with the line break it leaves out after
    "Below is subscription:")."""
    doc = await admin.consumer_connection(args.consumerGroup.strip())
    for n, conn in enumerate(doc.get("connectionSet") or (), 1):
        print_row(
            "%03d  %-32s %-22s %-8s %s",
            n,
            conn.get("clientId"),
            conn.get("clientAddr"),
            conn.get("language"),
            _version_desc(int(conn.get("version") or 0)),
        )
    print()
    print("Below is subscription:")
    for n, sub in enumerate((doc.get("subscriptionTable") or {}).values(), 1):
        print_row("%03d  Topic: %-40s SubExpression: %s", n, sub.get("topic"), sub.get("subString"))
    print(f"ConsumeType: {doc.get('consumeType')}")
    print(f"MessageModel: {doc.get('messageModel')}")
    print(f"ConsumeFromWhere: {doc.get('consumeFromWhere')}")


@verb(
    "producerConnection",
    "Query producer's socket connection and client version",
    option("-g", "producerGroup", "producer group name", required=True),
    option("-t", "topic", "topic name", required=True),
)
async def producer_connection(admin: Admin, args: argparse.Namespace) -> None:
    doc = await admin.producer_connection(args.producerGroup.strip(), args.topic.strip())
    for n, conn in enumerate(doc.get("connectionSet") or (), 1):
        print_row(
            "%04d  %-32s %-22s %-8s %s",
            n,
            conn.get("clientId"),
            conn.get("clientAddr"),
            conn.get("language"),
            _version_desc(int(conn.get("version") or 0)),
        )


@verb(
    "resetOffsetByTime",
    "Reset consumer offset by timestamp(without client restart).",
    option("-g", "group", "set the consumer group", required=True),
    option("-t", "topic", "set the topic", required=True),
    option("-s", "timestamp", "set the timestamp[now|currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]",
         required=True),
    option("-f", "force", "set the force rollback by timestamp switch[true|false]"),
    option("-c", "cplus", "reset c++ client offset (accepted; every client is reset alike)",
         action="store_true"),
)  # fmt: skip
async def reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> None:
    group, topic, text = args.group.strip(), args.topic.strip(), args.timestamp.strip()
    timestamp_ms = parse_timestamp_ms(text)
    force = True if args.force is None else java_bool(args.force)
    rows = await admin.reset_offset_by_time(group, topic, timestamp_ms, force)
    print(
        f"rollback consumer offset by specified group[{group}], topic[{topic}], "
        f"force[{str(force).lower()}], timestamp(string)[{text}], timestamp(long)[{timestamp_ms}]"
    )
    print_row("%-40s  %-40s  %-40s", "#brokerName", "#queueId", "#offset")
    for broker_name, queue_id, offset in rows:
        print_row("%-40s  %-40d  %-40d", broker_name, queue_id, offset)


def _day_sum(stats: dict) -> int:
    """StatsAllSubCommand.compute24HourSum: the day's sum, else the hour's, else the minute's."""
    for window in ("statsDay", "statsHour", "statsMinute"):
        total = int((stats.get(window) or {}).get("sum") or 0)
        if total:
            return total
    return 0


async def rates(admin: Admin, masters: list[str], name: str, key: str) -> tuple[float, int]:
    """(per-second rate over the last minute, messages in the last day) summed over the
    masters; a master without the stats counts nothing, as in RocketMQ."""
    tps, day = 0.0, 0
    for address in masters:
        try:
            stats = await admin.broker_stats(address, name, key)
        except MQBrokerError:
            continue
        tps += float((stats.get("statsMinute") or {}).get("tps") or 0)
        day += _day_sum(stats)
    return tps, day


@verb(
    "statsAll",
    "Topic and Consumer tps stats",
    option("-a", "activeTopic", "print active topic only", action="store_true"),
    option("-t", "topic", "print select topic only"),
)
async def stats_all(admin: Admin, args: argparse.Namespace) -> None:
    """StatsAllSubCommand's table. OutTPS and OutMsg24Hour count what each group
    consumed (its committed offsets' advances), where RocketMQ counts what it pulled."""
    print_row("%-32s  %-32s %12s %11s %11s %14s %14s", "#Topic", "#Consumer Group",
              "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour")  # fmt: skip
    only = (args.topic or "").strip()
    for topic in await admin.topic_list():
        if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) or (only and topic != only):
            continue
        try:
            await _print_topic_stats(admin, topic, args.activeTopic)
        except MQBrokerError:  # gone since the list was read, or no broker serves it
            continue


async def _print_topic_stats(admin: Admin, topic: str, active_only: bool) -> None:
    masters = await admin.route_masters(topic)
    in_tps, in_day = await rates(admin, masters, "TOPIC_PUT_NUMS", topic)
    groups = await admin.topic_consumed_by(topic)
    if not groups:
        if not active_only or in_day > 0:
            print_row("%-64s  %-32s %12d %11.2f %11s %14d %14s", topic, "", 0, in_tps, "",
                      in_day, "NO_CONSUMER")  # fmt: skip
        return
    for group in groups:
        out_tps, out_day = await rates(admin, masters, "GROUP_GET_NUMS", f"{topic}@{group}")
        backlog = max(0, (await admin.consumer_progress(group, topic)).diff_total)
        if not active_only or in_day > 0 or out_day > 0:
            print_row("%-64s  %-64s %12d %11.2f %11.2f %14d %14d", topic, group, backlog,
                      in_tps, out_tps, in_day, out_day)  # fmt: skip
