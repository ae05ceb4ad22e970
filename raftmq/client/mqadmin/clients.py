"""Verbs about the clients a broker serves: consumerStatus (GET_CONSUMER_RUNNING_INFO)
and getConsumerStatus (INVOKE_BROKER_TO_GET_CONSUMER_STATUS), which ask the consumers
themselves through a broker; brokerConsumeStats (GET_BROKER_CONSUME_STATS), every
group's progress on one broker; producer (GET_ALL_PRODUCER_INFO). Outputs are
RocketMQ's (`ConsumerStatusSubCommand`, `ConsumerRunningInfo.formatString`,
`GetConsumerStatusCommand`, `BrokerConsumeStatsSubCommad`, `ProducerSubCommand`)."""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

from raftmq.client.admin import Admin
from raftmq.client.errors import MQClientError
from raftmq.client.mqadmin.commands import (
    EXIT_ANSWERED_ERROR,
    format_row,
    java_bool,
    option,
    print_row,
    verb,
)
from raftmq.client.mqadmin.groups import version_desc
from raftmq.remoting import RequestCode


def _java(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _millis_text(ms: int) -> str:
    """`UtilAll.timeMillisToHumanString`: local time, yyyyMMddHHmmssSSS."""
    moment = datetime.datetime.fromtimestamp(ms / 1000)
    return f"{moment:%Y%m%d%H%M%S}{ms % 1000:03d}"


def process_queue_text(info: dict) -> str:
    """ProcessQueueInfo.toString."""
    fields = [
        f"{key}={_java(info.get(key, 0))}"
        for key in ("commitOffset", "cachedMsgMinOffset", "cachedMsgMaxOffset",
                    "cachedMsgCount", "cachedMsgSizeInMiB", "transactionMsgMinOffset",
                    "transactionMsgMaxOffset", "transactionMsgCount", "locked", "tryUnlockTimes")
    ]  # fmt: skip
    fields.append(f"lastLockTimestamp={_millis_text(int(info.get('lastLockTimestamp') or 0))}")
    fields.append(f"droped={_java(info.get('droped', False))}")
    for key in ("lastPullTimestamp", "lastConsumeTimestamp"):
        fields.append(f"{key}={_millis_text(int(info.get(key) or 0))}")
    return f"ProcessQueueInfo [{', '.join(fields)}]"


def running_info_text(info: dict) -> str:
    """ConsumerRunningInfo.formatString."""
    lines = ["#Consumer Properties#"]
    for key, value in (info.get("properties") or {}).items():
        lines.append(format_row("%-40s: %s", key, value))
    lines += ["", "", "#Consumer Subscription#"]
    subscriptions = info.get("subscriptionSet") or ()
    # a TreeSet in Java's ConsumerRunningInfo: SubscriptionData.compareTo's order
    ordered = sorted(subscriptions, key=lambda sub: f"{sub.get('topic')}@{sub.get('subString')}")
    for n, sub in enumerate(ordered, 1):
        fmt = "%03d Topic: %-40s ClassFilter: %-8s SubExpression: %s"
        class_filter = _java(bool(sub.get("classFilterMode")))
        lines.append(format_row(fmt, n, sub.get("topic"), class_filter, sub.get("subString")))
    table = info.get("mqTable") or []
    table = table if isinstance(table, list) else []  # {} when it owns no queue
    lines += ["", "", "#Consumer Offset#"]
    lines.append(format_row("%-64s  %-32s  %-4s  %-20s", "#Topic", "#Broker Name", "#QID",
                            "#Consumer Offset"))  # fmt: skip
    for mq, pq in table:
        lines.append(format_row("%-32s  %-32s  %-4d  %-20d", mq["topic"], mq["brokerName"],
                                mq["queueId"], pq.get("commitOffset", 0)))  # fmt: skip
    lines += ["", "", "#Consumer MQ Detail#"]
    lines.append(format_row("%-64s  %-32s  %-4s  %-20s", "#Topic", "#Broker Name", "#QID",
                            "#ProcessQueueInfo"))  # fmt: skip
    for mq, pq in table:
        lines.append(format_row("%-64s  %-32s  %-4d  %s", mq["topic"], mq["brokerName"],
                                mq["queueId"], process_queue_text(pq)))  # fmt: skip
    lines += ["", "", "#Consumer RT&TPS#"]
    lines.append(format_row("%-64s  %14s %14s %14s %14s %18s %25s", "#Topic", "#Pull RT",
                            "#Pull TPS", "#Consume RT", "#ConsumeOK TPS", "#ConsumeFailed TPS",
                            "#ConsumeFailedMsgsInHour"))  # fmt: skip
    for topic, status in (info.get("statusTable") or {}).items():
        keys = ("pullRT", "pullTPS", "consumeRT", "consumeOKTPS", "consumeFailedTPS")
        rates = [float(status.get(k) or 0) for k in keys]
        lines.append(format_row("%-32s  %14.2f %14.2f %14.2f %14.2f %18.2f %25d", topic,
                                *rates, int(status.get("consumeFailedMsgs") or 0)))  # fmt: skip
    text = "\n".join(lines) + "\n"
    if info.get("jstack") is not None:
        text += "\n\n#Consumer jstack#\n" + str(info["jstack"])
    return text


@verb(
    "consumerStatus",
    "Query consumer's internal data structure",
    option("-g", "consumerGroup", "consumer group name", required=True),
    option("-i", "clientId", "The consumer's client id"),
    option("-b", "brokerAddr", "broker address"),
    option("-s", "jstack", "Run jstack command in the consumer progress", action="store_true"),
)
async def consumer_status(admin: Admin, args: argparse.Namespace) -> int | None:
    """-i: one consumer's ConsumerRunningInfo. Without it: each online consumer's,
    written to `<now ms>/<clientId>` under the working directory as RocketMQ's tool
    writes it, one line each, then whether they subscribe alike. (A raftmq consumer
    has no jstack; -s is passed on for a Java one.)"""
    group = args.consumerGroup.strip()
    broker = args.brokerAddr.strip() if args.brokerAddr else None
    if args.clientId:
        info = await admin.consumer_running_info(group, args.clientId.strip(), args.jstack, broker)
        print(running_info_text(info), end="")
        return None
    connections = await admin.consumer_connection(group, broker)
    fmt = "%-10s %-40s %-20s %s"
    print_row(fmt, "#Index", "#ClientId", "#Version", "#ConsumerRunningInfoFile")
    now_ms, infos, status = int(time.time() * 1000), {}, None
    for conn in connections.get("connectionSet") or ():
        client_id = conn.get("clientId")
        try:
            info = await admin.consumer_running_info(group, client_id, args.jstack, broker)
        except MQClientError as exc:  # RocketMQ's prints the trace and goes on
            print(f"{client_id}: {exc}")
            status = EXIT_ANSWERED_ERROR
            continue
        path = Path(str(now_ms), client_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(running_info_text(info), encoding="utf-8")
        infos[client_id] = info
        version = version_desc(int(conn.get("version") or 0))
        print_row("%-10d %-40s %-20s %s", len(infos), client_id, version, path)
    if infos:
        subscriptions = {
            tuple(sorted((s.get("topic"), s.get("subString")) for s in subs))
            for subs in (info.get("subscriptionSet") or () for info in infos.values())
        }
        if len(subscriptions) == 1:
            print("\n\nSame subscription in the same group of consumer", end="")
            print("\n\nRebalance OK")
        else:
            print("\n\nWARN: Different subscription in the same group of consumer!!!", end="")
    return status


@verb(
    "getConsumerStatus",
    "get consumer status from client.",
    option("-g", "group", "set the consumer group", required=True),
    option("-t", "topic", "set the topic", required=True),
    option("-i", "originClientId", "set the consumer clientId"),
)
async def get_consumer_status(admin: Admin, args: argparse.Namespace) -> None:
    group, topic = args.group.strip(), args.topic.strip()
    client_id = (args.originClientId or "").strip()
    table = await admin.consumer_status(topic, group, client_id)
    print(
        f"get consumer status from client. group={group}, topic={topic}, originClientId={client_id}"
    )
    print_row("%-50s  %-15s  %-15s  %-20s", "#clientId", "#brokerName", "#queueId", "#offset")
    for cid, queues in sorted(table.items()):
        for mq, offset in queues:
            print_row("%-50s  %-15s  %-15d  %-20d", cid, mq["brokerName"], mq["queueId"], offset)


@verb(
    "brokerConsumeStats",
    "Fetch broker consume stats data",
    option("-b", "brokerAddr", "Broker address", required=True),
    option("-t", "timeoutMillis", "request timeout Millis", type=int, default=50000),
    option("-l", "level", "threshold of print diff", type=int, default=0),
    option("-o", "order", "order topic"),
)
async def broker_consume_stats(admin: Admin, args: argparse.Namespace) -> None:
    """Every group's lag on one broker, queue by queue (those at least -l behind and
    ever consumed: RocketMQ's tool leaves out a queue with no last consume time), then
    the broker's total."""
    ext = {"isOrder": java_bool(args.order or "false")}
    doc = await admin.broker_json(args.brokerAddr.strip(), RequestCode.GET_BROKER_CONSUME_STATS,
                                  ext, timeout_s=args.timeoutMillis / 1000)  # fmt: skip
    fmt = "%-64s  %-64s  %-32s  %-4s  %-20s  %-20s  %-20s  %s"
    print_row(fmt, "#Topic", "#Group", "#Broker Name", "#QID", "#Broker Offset",
              "#Consumer Offset", "#Diff", "#LastTime")  # fmt: skip
    for groups in doc.get("consumeStatsList") or ():
        for group, stats_of_topics in groups.items():
            for stats in stats_of_topics:
                table = stats.get("offsetTable") or []  # {} when empty, else pairs
                for mq, progress in table if isinstance(table, list) else ():
                    diff = int(progress["brokerOffset"]) - int(progress["consumerOffset"])
                    last_ms = int(progress.get("lastTimestamp") or 0)
                    if diff < args.level or last_ms <= 0:
                        continue
                    last = f"{datetime.datetime.fromtimestamp(last_ms / 1000):%Y-%m-%d %H:%M:%S}"
                    print_row("%-64s  %-64s  %-32s  %-4d  %-20d  %-20d  %-20d  %s", mq["topic"],
                              group, mq["brokerName"], mq["queueId"], progress["brokerOffset"],
                              progress["consumerOffset"], diff, last)  # fmt: skip
    print(f"\nDiff Total: {doc.get('totalDiff', 0)}")


@verb(
    "producer",
    "Query producer's instances",
    option("-b", "broker", "broker address", required=True),
)
async def producer(admin: Admin, args: argparse.Namespace) -> None:
    doc = await admin.broker_json(args.broker.strip(), RequestCode.GET_ALL_PRODUCER_INFO)
    for group, members in (doc.get("data") or {}).items():
        if not members:
            print(f"producer group ({group}) instances are empty")
            continue
        for p in members:
            print(
                f"producer group ({group}) instance : clientId={p.get('clientId')},"
                f"remoteIP={p.get('remoteIP')}, language={p.get('language')}, "
                f"version={p.get('version')}, lastUpdateTimestamp={p.get('lastUpdateTimestamp')}"
            )
