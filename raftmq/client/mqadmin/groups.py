"""Consumer and producer group verbs: consumerProgress, popStatus, updateSubGroup,
deleteSubGroup, getConsumerConfig, consumerConnection, producerConnection,
resetOffsetByTime, skipAccumulatedMessage, cloneGroupOffset, statsAll."""

from __future__ import annotations

import argparse
import contextlib
import json

from raftmq.client.admin import DLQ_PREFIX, RETRY_PREFIX, Admin, UnreachableError
from raftmq.client.errors import MQBrokerError, MQClientError
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
    option("-g", "groupName", "consumer group name; without it, every group in one line each"),
    option("-s", "showClientIP", "Show Client IP per Queue"),
)
async def consumer_progress(admin: Admin, args: argparse.Namespace) -> None:
    """One group's queues (-g), or every group in a line each. `#Client IP` is the
    queue's consumer's with -s true (N/A for a queue no online consumer holds), else
    NA (RocketMQ's leaves the column out)."""
    if args.groupName is None:
        await every_group_progress(admin)
        return
    group = args.groupName.strip()
    stats = await admin.consumer_progress(group)
    show_ip = args.showClientIP is not None and java_bool(args.showClientIP)
    clients = await queue_clients(admin, group) if show_ip else {}
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
            clients.get((q.topic, q.broker_name, q.queue_id), "N/A") if show_ip else "NA",
            q.diff,
            last,
        )
    print()
    print(f"Consume TPS: {stats.consume_tps}")
    print(f"Diff Total: {stats.diff_total}")


async def queue_clients(admin: Admin, group: str) -> dict[tuple[str, str, int], str]:
    """(topic, brokerName, queueId) -> the IP of the online consumer of `group` the
    queue is allocated to (its clientId's part before `@`), from each consumer's
    running info, as RocketMQ's getMessageQueueAllocationResult; a consumer that does
    not answer is passed over, and a group not online has none."""
    clients: dict[tuple[str, str, int], str] = {}
    with contextlib.suppress(MQClientError):
        members = (await admin.consumer_connection(group)).get("connectionSet") or ()
        for member in members:
            client_id = str(member.get("clientId") or "")
            with contextlib.suppress(MQClientError):
                table = (await admin.consumer_running_info(group, client_id)).get("mqTable")
                for mq, _info in table if isinstance(table, list) else ():
                    key = (mq["topic"], mq["brokerName"], int(mq["queueId"]))
                    clients[key] = client_id.split("@")[0]
    return clients


async def every_group_progress(admin: Admin) -> None:
    """ConsumerProgressSubCommand without -g: each consumer group (one per %RETRY% topic)
    with its online clients (count, lowest version, PULL or PUSH, the push model) or
    OFFLINE, its consume TPS and its total lag; most clients first, then most lag."""
    rows = []
    for topic in await admin.topic_list():
        if not topic.startswith(RETRY_PREFIX):
            continue
        group = topic[len(RETRY_PREFIX) :]
        tps = diff = 0
        with contextlib.suppress(MQBrokerError):  # RocketMQ's tool logs and goes on
            stats = await admin.consumer_progress(group)
            tps, diff = int(stats.consume_tps), stats.diff_total
        connections: dict = {}
        with contextlib.suppress(MQBrokerError):  # no client online: CONSUMER_NOT_ONLINE
            connections = await admin.consumer_connection(group)
        clients = connections.get("connectionSet") or ()
        versions = [int(c.get("version") or 0) for c in clients]
        push = connections.get("consumeType") == "CONSUME_PASSIVELY"
        rows.append((
            -len(clients), -diff, group, version_desc(min(versions)) if clients else "OFFLINE",
            ("PUSH" if push else "PULL") if clients else "",
            connections.get("messageModel", "") if clients and push else "", tps,
        ))  # fmt: skip
    fmt = "%-64s  %-6s  %-24s %-5s  %-14s  %-7s  %s"
    print_row(fmt, "#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff Total")
    for count, diff, group, version, kind, model, tps in sorted(rows):
        print_row(fmt, group, -count, version, kind, model, tps, -diff)


@verb(
    "popStatus",
    "Show a POP consumer group's state: per queue, how far its pops got and how many "
    "messages are in flight",
    option("-g", "groupName", "consumer group name", required=True),
    option("-t", "topic", "topic name (every topic the group pops when absent)"),
)
async def pop_status(admin: Admin, args: argparse.Namespace) -> None:
    """raftmq's verb (Apache's mqadmin has none): GET_CONSUME_STATS rows of the queues
    the group pops, with the messages popped and neither acknowledged nor redelivered
    (retry topics included, as their own rows), and their sum."""
    stats = await admin.consumer_progress(args.groupName.strip(), args.topic)
    fmt = "%-32s  %-32s  %-4s  %-14s  %-14s  %-10s"
    print_row(fmt, "#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Pop Offset", "#InFlight")
    total = 0
    for q in stats.queues:
        if q.pop_in_flight is None:
            continue
        total += q.pop_in_flight
        print_row(
            fmt, q.topic, q.broker_name, q.queue_id, q.broker_offset, q.consumer_offset,
            q.pop_in_flight,
        )  # fmt: skip
    print()
    print(f"In Flight Total: {total}")


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
    option("-o", "consumeMessageOrderly", "consume message orderly"),
    option(
        "-p",
        "groupRetryPolicy",
        "the json string of retry policy ( exp: "
        '{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":5000,"max":7200000,'
        '"multiplier":2}} {"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,5000]}} )',
    ),
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
        ("consumeMessageOrderly", "consumeMessageOrderly"),
    ):
        if getattr(args, flag) is not None:
            config[key] = java_bool(getattr(args, flag))
    for key in ("retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if args.groupRetryPolicy is not None:
        config["groupRetryPolicy"] = retry_policy(args.groupRetryPolicy)
    for address in await write_sub_group(admin, config, target):
        print(f"create subscription group to {address} success.")
    fields = ", ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in config.items()
    )
    print(f"SubscriptionGroupConfig [{fields}]")


def retry_policy(text: str) -> dict:
    """`-p`'s JSON, checked as GroupRetryPolicy reads it: SystemExit naming the fault."""
    try:
        policy = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"groupRetryPolicy is not JSON: {exc}") from None
    kind = policy.get("type") if isinstance(policy, dict) else None
    if kind not in ("CUSTOMIZED", "EXPONENTIAL"):
        raise SystemExit(f"groupRetryPolicy type must be CUSTOMIZED or EXPONENTIAL: {text}")
    return policy


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
    option("-r", "removeOffset", "remove offset"),
)
async def delete_sub_group(admin: Admin, args: argparse.Namespace) -> None:
    group, target = args.groupName.strip(), target_kwargs(args)
    remove_offset = args.removeOffset is not None and java_bool(args.removeOffset)
    targets, topics = await remove_sub_group(admin, group, target, remove_offset)
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


async def remove_sub_group(
    admin: Admin, group: str, target: dict, remove_offset: bool = False
) -> tuple[list[str], list[str]]:
    """Delete the group (`target` as in write_sub_group), and its committed offsets
    with `remove_offset`: (the brokers written to, the topics deleted). With a cluster
    the group's retry and dead-letter topics go too, as RocketMQ's deleteSubGroup does."""
    targets = await admin.delete_subscription_group(group, remove_offset=remove_offset, **target)
    topics = []
    if "cluster" in target:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            await admin.delete_topic(prefix + group, target["cluster"])
            topics.append(prefix + group)
    return targets, topics


def version_desc(version: int) -> str:
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
    option("-b", "brokerAddr", "broker address"),
)
async def consumer_connection(admin: Admin, args: argparse.Namespace) -> None:
    """ConsumerConnectionSubCommand's lines (with the line break it leaves out after
    "Below is subscription:")."""
    broker = args.brokerAddr.strip() if args.brokerAddr else None
    doc = await admin.consumer_connection(args.consumerGroup.strip(), broker)
    for n, conn in enumerate(doc.get("connectionSet") or (), 1):
        print_row(
            "%03d  %-32s %-22s %-8s %s",
            n,
            conn.get("clientId"),
            conn.get("clientAddr"),
            conn.get("language"),
            version_desc(int(conn.get("version") or 0)),
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
            version_desc(int(conn.get("version") or 0)),
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
    _print_reset(rows)


def _print_reset(rows: list[tuple[str, int, int]]) -> None:
    print_row("%-40s  %-40s  %-40s", "#brokerName", "#queueId", "#offset")
    for broker_name, queue_id, offset in rows:
        print_row("%-40s  %-40d  %-40d", broker_name, queue_id, offset)


@verb(
    "skipAccumulatedMessage",
    "Skip all messages that are accumulated (not consumed) currently",
    option("-g", "group", "set the consumer group", required=True),
    option("-t", "topic", "set the topic", required=True),
    option("-f", "force", "set the force rollback by timestamp switch[true|false]"),
)
async def skip_accumulated_message(admin: Admin, args: argparse.Namespace) -> None:
    """resetOffsetByTime to the queues' ends (-1), running consumers told as well."""
    force = True if args.force is None else java_bool(args.force)
    _print_reset(
        await admin.reset_offset_by_time(args.group.strip(), args.topic.strip(), -1, force)
    )


@verb(
    "cloneGroupOffset",
    "clone offset from other group.",
    option("-s", "srcGroup", "set source consumer group", required=True),
    option("-d", "destGroup", "set destination consumer group", required=True),
    option("-t", "topic", "set the topic", required=True),
    option(
        "-o", "offline", "the group or the topic is offline (accepted, as RocketMQ's ignores it)"
    ),
)
async def clone_group_offset(admin: Admin, args: argparse.Namespace) -> None:
    """The source group's committed offsets of the topic's queues become the
    destination group's, on each queue's master (UPDATE_CONSUMER_OFFSET), so the
    destination group consumes from where the source got. RocketMQ's tool copies the
    source group's offsets of every topic it consumes, -t naming only the route it
    looks the brokers up in; ours copies the offsets of -t's queues."""
    src, dest, topic = args.srcGroup.strip(), args.destGroup.strip(), args.topic.strip()
    route = await admin.topic_route(topic)
    for queue in (await admin.consumer_progress(src, topic)).queues:
        master = route.master(queue.broker_name)
        if master is None:
            raise UnreachableError(f"no master registered for {queue.broker_name}")
        if queue.consumer_offset >= 0:
            await admin.update_consume_offset(
                master, dest, topic, queue.queue_id, queue.consumer_offset
            )
    print(f"clone group offset success. srcGroup[{src}], destGroup=[{dest}], topic[{topic}]")


@verb(
    "getConsumerConfig",
    "get consumer config by subscription group name!",
    option("-g", "groupName", "subscription group name", required=True),
)
async def get_consumer_config(admin: Admin, args: argparse.Namespace) -> None:
    """The group's SubscriptionGroupConfig on each broker group that has it (asked of
    its master, else another member), field by field."""
    group = args.groupName.strip()
    info = await admin.cluster_info()
    for broker in info.broker_datas():
        address = next(iter(broker.addresses()), None)
        if address is None:
            continue
        config = (await admin.subscription_groups(address)).get(group)
        if config is None:
            continue
        print(
            f"============================={info.cluster_of(broker.broker_name)}:"
            f"{broker.broker_name}============================="
        )
        for key, value in config.items():
            print_row("%s%-40s=  %s", "", key, _java_text(value))


def _java_text(value) -> str:
    """A field as Java's toString shows it: booleans lower case, null as nothing."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def day_sum(stats: dict) -> int:
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
        day += day_sum(stats)
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
