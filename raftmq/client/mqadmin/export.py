"""Export verbs: exportMetadata, exportConfigs, exportMetrics — a cluster's topics,
subscription groups, broker settings and figures written to JSON files, as RocketMQ's
ExportMetadataCommand, ExportConfigsCommand and ExportMetricsCommand write them
(fastjson's pretty form: tab-indented, no blank after a colon), for moving a cluster's
metadata to another one or sizing it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from raftmq.client.admin import DLQ_PREFIX, RETRY_PREFIX, Admin, is_broker_topic
from raftmq.client.errors import MQClientError
from raftmq.client.mqadmin.brokers import first_rate
from raftmq.client.mqadmin.commands import UsageError, option, target_kwargs, verb
from raftmq.client.mqadmin.groups import day_sum, version_desc
from raftmq.client.running_info import CLIENT_VERSION

DEFAULT_EXPORT_DIR = "/tmp/rocketmq/export"
# TopicValidator's: the topics whose puts exportMetrics counts apart from the others'
TRANSACTION_HALF_TOPIC, SCHEDULE_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX"
# MixAll's groups a broker or the tools use themselves (getUserSubscriptionGroup drops them)
SYSTEM_GROUPS = frozenset(
    {"DEFAULT_CONSUMER", "DEFAULT_PRODUCER", "TOOLS_CONSUMER", "FILTERSRV_CONSUMER",
     "__MONITOR_CONSUMER", "CLIENT_INNER_PRODUCER", "SELF_TEST_P_GROUP", "SELF_TEST_C_GROUP",
     "CID_ONS-HTTP-PROXY", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL",
     "CID_RMQ_SYS_TRANS"}
)  # fmt: skip
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"  # MixAll.isSysConsumerGroup
# the keys ExportConfigsCommand keeps of each master's config
EXPORTED_BROKER_KEYS = (
    "brokerClusterName", "brokerId", "brokerName", "brokerRole", "fileReservedTime",
    "filterServerNums", "flushDiskType", "maxMessageSize", "messageDelayLevel",
    "msgTraceTopicName", "slaveReadEnable", "traceOn", "traceTopicEnable", "useTLS",
    "autoCreateTopicEnable", "autoCreateSubscriptionGroup",
)  # fmt: skip


def _cluster_export_options(file_name: str) -> tuple[tuple, tuple]:
    """-c (required) and -f, as ExportConfigsCommand and ExportMetricsCommand take them."""
    return (
        option("-c", "clusterName", "choose a cluster to export", required=True),
        option("-f", "filePath", f"export {file_name} path | default {DEFAULT_EXPORT_DIR}",
               default=DEFAULT_EXPORT_DIR),
    )  # fmt: skip


def _write(directory: str, name: str, doc: dict) -> str:
    path = Path(directory, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent="\t", separators=(",", ":")), encoding="utf-8")
    return str(path)


async def _user_topics(admin: Admin, address: str, special: bool) -> dict[str, dict]:
    """getUserTopicConfig: the broker's topics but its own (system topics), and but
    the groups' retry and dead-letter topics unless `special`."""
    info = await admin.cluster_info()
    return {
        topic: config
        for topic, config in (await admin.topic_configs(address)).items()
        if not is_broker_topic(topic, info)
        and (special or not topic.startswith((RETRY_PREFIX, DLQ_PREFIX)))
    }


async def _user_groups(admin: Admin, address: str) -> dict[str, dict]:
    """getUserSubscriptionGroup: the broker's subscription groups but the system ones."""
    return {
        group: config
        for group, config in (await admin.subscription_groups(address)).items()
        if group not in SYSTEM_GROUPS and not group.startswith(SYSTEM_GROUP_PREFIX)
    }


@verb(
    "exportMetadata",
    "export metadata",
    option("-c", "clusterName", "choose a cluster to export"),
    option("-b", "brokerAddr", "choose a broker to export"),
    option("-f", "filePath", f"export metadata.json path | default {DEFAULT_EXPORT_DIR}",
           default=DEFAULT_EXPORT_DIR),
    option("-t", "topic", "only export topic metadata", action="store_true"),
    option("-g", "subscriptionGroup", "only export subscriptionGroup metadata",
           action="store_true"),
    option("-s", "specialTopic", "need retryTopic and dlqTopic", action="store_true"),
)  # fmt: skip
async def export_metadata(admin: Admin, args: argparse.Namespace) -> None:
    """-b: one broker's topics (topic.json, with -t) or groups (subscriptionGroup.json,
    with -g). -c: every master's, merged (a topic's queues, a group's retry queues
    summed over the groups), into metadata.json, or topic.json / subscriptionGroup.json
    with -t / -g, with the time of the export."""
    target, directory = target_kwargs(args), args.filePath.strip()
    if "broker_addr" in target:
        address = target["broker_addr"]
        if args.topic:
            topics = await _user_topics(admin, address, args.specialTopic)
            path = _write(directory, "topic.json", {"topicConfigTable": topics})
        elif args.subscriptionGroup:
            groups = await _user_groups(admin, address)
            path = _write(directory, "subscriptionGroup.json", {"subscriptionGroupTable": groups})
        else:
            raise UsageError("with -b, give -t (topics) or -g (subscription groups)")
        print(f"export {path} success")
        return
    topics: dict[str, dict] = {}
    groups: dict[str, dict] = {}
    for address in await admin.cluster_masters(target["cluster"]):
        for topic, config in (await _user_topics(admin, address, args.specialTopic)).items():
            if topic in topics:
                for key in ("readQueueNums", "writeQueueNums"):
                    config[key] = int(config.get(key) or 0) + int(topics[topic].get(key) or 0)
            topics[topic] = config
        for group, config in (await _user_groups(admin, address)).items():
            if group in groups:
                config["retryQueueNums"] = int(config.get("retryQueueNums") or 0) + int(
                    groups[group].get("retryQueueNums") or 0
                )
            groups[group] = config
    if args.topic:
        name, doc = "topic.json", {"topicConfigTable": topics}
    elif args.subscriptionGroup:
        name, doc = "subscriptionGroup.json", {"subscriptionGroupTable": groups}
    else:
        name, doc = "metadata.json", {"topicConfigTable": topics, "subscriptionGroupTable": groups}
    doc["exportTime"] = int(time.time() * 1000)
    print(f"export {_write(directory, name, doc)} success")


@verb(
    "exportConfigs",
    "export configs",
    *_cluster_export_options("configs.json"),
)
async def export_configs(admin: Admin, args: argparse.Namespace) -> None:
    """configs.json: each master's main settings by broker name, and the cluster's
    size (name servers, masters, slaves). Keys a raftmq broker does not have are left
    out (RocketMQ's tool fails on a broker without one)."""
    cluster = args.clusterName.strip()
    configs, masters, slaves = {}, 0, 0
    for broker in (await admin.cluster_info()).broker_datas(cluster):
        if broker.master is None:
            continue
        masters += 1
        slaves += len(broker.addrs) - 1
        config = await admin.broker_config(broker.master)
        configs[broker.broker_name] = {k: config[k] for k in EXPORTED_BROKER_KEYS if k in config}
    doc = {
        "brokerConfigs": configs,
        "clusterScale": {
            "namesrvSize": len(admin.namesrv_addrs),
            "masterBrokerSize": masters,
            "slaveBrokerSize": slaves,
        },
    }
    print(f"export {_write(args.filePath.strip(), 'configs.json', doc)} success")


async def _topic_puts(admin: Admin, address: str, topic: str) -> tuple[float, int]:
    """VIEW_BROKER_STATS_DATA's TOPIC_PUT_NUMS for `topic`: the last minute's rate and
    the day's count (StatsAllSubCommand.compute24HourSum); zeros when the broker has
    no such figures, as RocketMQ's tool takes a refusal."""
    try:
        stats = await admin.broker_stats(address, "TOPIC_PUT_NUMS", topic)
    except MQClientError:
        return 0.0, 0
    return float((stats.get("statsMinute") or {}).get("tps") or 0.0), day_sum(stats)


async def _client_versions(admin: Admin, groups: dict[str, dict]) -> list[str]:
    """`<language>%<version>` of every consumer online in `groups` (a group with none
    online is passed over, as RocketMQ's tool does)."""
    seen = set()
    for group in groups:
        try:
            connection = await admin.consumer_connection(group)
        except MQClientError:
            continue
        for member in connection.get("connectionSet") or ():
            seen.add(f"{member.get('language')}%{version_desc(int(member.get('version') or 0))}")
    return sorted(seen)


async def _evaluate_report(admin: Admin, address: str, totals: dict[str, dict]) -> dict:
    """One master's runtimeEnv, runtimeQuota and runtimeVersion, its figures added to
    `totals` (totalTps, totalOneDayNum)."""
    table = await admin.broker_status(address)
    config = await admin.broker_config(address)
    groups = await _user_groups(admin, address)
    topics = await _user_topics(admin, address, special=False)
    trans_tps, trans_day = await _topic_puts(admin, address, TRANSACTION_HALF_TOPIC)
    schedule_tps, schedule_day = await _topic_puts(admin, address, SCHEDULE_TOPIC)
    tps = {
        "normalInTps": first_rate(table, "putTps"),
        "normalOutTps": first_rate(table, "getTransferedTps"),
        "transInTps": trans_tps,
        "scheduleInTps": schedule_tps,
    }

    def since(key: str) -> int:
        """Today's morning total less yesterday's: the messages of yesterday."""
        return int(table.get(f"{key}TodayMorning") or 0) - int(
            table.get(f"{key}YesterdayMorning") or 0
        )

    one_day = {
        "normalOneDayInNum": since("msgPutTotal"),
        "normalOneDayOutNum": since("msgGetTotal"),
        "transOneDayInNum": trans_day,
        "scheduleOneDayInNum": schedule_day,
    }
    total_tps, total_day = totals["totalTps"], totals["totalOneDayNum"]
    for key, value in tps.items():
        total = "total" + key[0].upper() + key[1:]
        total_tps[total] += value
    for key, value in one_day.items():
        total_day[key] += value
    env = {
        "cpuNum": config.get("clientCallbackExecutorThreads"),
        "totalMemKBytes": table.get("totalMemKBytes"),
    }
    return {
        # RocketMQ's tool reads the CPU count from clientCallbackExecutorThreads, which a
        # raftmq broker does not have (no client callback pool); fastjson leaves out a
        # key whose value is null, and so does this
        "runtimeEnv": {key: value for key, value in env.items() if value is not None},
        "runtimeQuota": {
            "diskRatio": {
                "commitLogDiskRatio": table.get("commitLogDiskRatio"),
                "consumeQueueDiskRatio": table.get("consumeQueueDiskRatio"),
            },
            "tps": tps,
            "oneDayNum": one_day,
            "messageAverageSize": table.get("putMessageAverageSize"),
            "topicSize": len(topics),
            "groupSize": len(groups),
        },
        "runtimeVersion": {
            "rocketmqVersion": CLIENT_VERSION,
            "clientInfo": await _client_versions(admin, groups),
        },
    }


@verb(
    "exportMetrics",
    "export metrics",
    *_cluster_export_options("metrics.json"),
)
async def export_metrics(admin: Admin, args: argparse.Namespace) -> None:
    """metrics.json: each master's figures by broker name (evaluateReport) and their
    sums over the cluster (totalData), as ExportMetricsCommand writes them; as
    RocketMQ's, it prints no line break."""
    totals: dict[str, dict] = {
        "totalTps": dict.fromkeys(
            ("totalNormalInTps", "totalNormalOutTps", "totalTransInTps", "totalScheduleInTps"),
            0.0,
        ),
        "totalOneDayNum": dict.fromkeys(
            ("normalOneDayInNum", "normalOneDayOutNum", "transOneDayInNum", "scheduleOneDayInNum"),
            0,
        ),
    }
    report = {}
    for broker in (await admin.cluster_info()).broker_datas(args.clusterName.strip()):
        if broker.master is not None:
            report[broker.broker_name] = await _evaluate_report(admin, broker.master, totals)
    doc = {"evaluateReport": report, "totalData": totals}
    print(f"export {_write(args.filePath.strip(), 'metrics.json', doc)} success", end="")
