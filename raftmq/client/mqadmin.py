"""`mqadmin`: RocketMQ's admin command line, for a raftmq cluster.

    mqadmin                                  the command list
    mqadmin help <command>                   one command's flags
    mqadmin clusterList -n 127.0.0.1:9876
    mqadmin updateTopic -n ... -c RaftCluster -t Orders -r 4 -w 4
    mqadmin dledgerStatus -n ...

Command names, flags and table layouts are RocketMQ 4.9's (`MQAdminStartup` and its
SubCommands), so an operator's scripts and habits carry over; `dledgerStatus` is
ours: one row per member of every DLedger group, unreachable members included.
`-n` falls back to the NAMESRV_ADDR environment variable, as RocketMQ's does.

Unlike RocketMQ's, which prints a stack trace and exits 0 whatever happened, the exit
status says what went wrong: 0 done, 1 a server answered with an error (printed with
its code and remark), 2 a usage error, 3 nothing that could answer was reached, 130
interrupted (Ctrl-C); each failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time
import zlib
from collections.abc import Awaitable, Callable

import attrs
import trio

from raftmq.client.admin import DLQ_PREFIX, RETRY_PREFIX, Admin, UnreachableError
from raftmq.client.consumer import PullConsumer, PullStatus
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.instance import parse_namesrv_addrs
from raftmq.client.producer import Producer
from raftmq.client.route import MessageQueue, TopicRouteData
from raftmq.protocol.message import MessageExt, MessageSysFlag
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import ResponseCode

__all__ = ["COMMANDS", "main"]

EXIT_OK, EXIT_ANSWERED_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


class UsageError(Exception):
    """Flags that parse but do not make a request (both -b and -c, a bad msgId)."""


Run = Callable[[Admin, argparse.Namespace], Awaitable[int | None]]


@attrs.frozen
class Command:
    name: str
    desc: str
    options: tuple[tuple, ...]  # (flag, long name, help, add_argument kwargs)
    run: Run

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"mqadmin {self.name}", description=self.desc)
        parser.add_argument(
            "-n", "--namesrvAddr", help="Name server address list, eg: 192.168.0.1:9876;..."
        )
        for flag, name, help_text, kwargs in self.options:
            parser.add_argument(flag, f"--{name}", dest=name, help=help_text, **kwargs)
        return parser


COMMANDS: dict[str, Command] = {}


def _command(name: str, desc: str, *options: tuple) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        COMMANDS[name] = Command(name, desc, options, run)
        return run

    return register


def _opt(flag: str, name: str, help_text: str, **kwargs) -> tuple:
    return (flag, name, help_text, kwargs)


def _row(fmt: str, *values) -> None:
    """One line of a table; the formats are RocketMQ's printf formats, which Python's
    % operator reads the same way."""
    print(fmt % values)


def _human_ms(ms: int) -> str:
    """`UtilAll.timeMillisToHumanString2`: local time, `yyyy-MM-dd HH:mm:ss,SSS`."""
    moment = datetime.datetime.fromtimestamp(ms / 1000)
    return f"{moment:%Y-%m-%d %H:%M:%S},{ms % 1000:03d}"


def _perm_string(perm: int) -> str:
    """`PermName.perm2String`: R, W and X (inherit) or '-'."""
    return "".join(c if perm & bit else "-" for c, bit in (("R", 4), ("W", 2), ("X", 1)))


# ---------------------------------------------------------------------- topics


@_command(
    "updateTopic",
    "Update or create topic",
    _opt("-b", "brokerAddr", "create topic to which broker"),
    _opt("-c", "clusterName", "create topic to which cluster"),
    _opt("-t", "topic", "topic name", required=True),
    _opt("-r", "readQueueNums", "set read queue nums", type=int, default=8),
    _opt("-w", "writeQueueNums", "set write queue nums", type=int, default=8),
    _opt("-p", "perm", "set topic's permission(2|4|6), intro[2:W 4:R; 6:RW]", type=int, default=6),
    _opt("-o", "order", "set topic's order(true|false)", default="false"),
)
async def update_topic(admin: Admin, args: argparse.Namespace) -> None:
    order = _java_bool(args.order)
    topic = args.topic.strip()
    targets = await admin.create_topic(
        topic, args.readQueueNums, args.writeQueueNums, args.perm, order=order, **_targets(args)
    )
    for address in targets:
        print(f"create topic to {address} success.")
    print(
        f"TopicConfig [topicName={topic}, readQueueNums={args.readQueueNums}, "
        f"writeQueueNums={args.writeQueueNums}, perm={_perm_string(args.perm)}, "
        f"topicFilterType=SINGLE_TAG, topicSysFlag=0, order={str(order).lower()}]"
    )


def _route_json(route: TopicRouteData) -> dict:
    """The TopicRouteData body, as the name server wrote it."""
    return {
        "brokerDatas": [
            {
                "brokerAddrs": {str(i): a for i, a in sorted(b.addrs.items())},
                "brokerName": b.broker_name,
                "cluster": b.cluster,
            }
            for _, b in sorted(route.brokers.items())
        ],
        "filterServerTable": {},
        "queueDatas": [
            {
                "brokerName": q.broker_name,
                "perm": q.perm,
                "readQueueNums": q.read_queue_nums,
                "topicSysFlag": q.topic_sys_flag,
                "writeQueueNums": q.write_queue_nums,
            }
            for q in route.queue_datas
        ],
    }


@_command(
    "topicRoute", "Examine topic route info", _opt("-t", "topic", "topic name", required=True)
)
async def topic_route(admin: Admin, args: argparse.Namespace) -> None:
    route = await admin.topic_route(args.topic.strip())
    print(json.dumps(_route_json(route), indent=4))


@_command(
    "topicStatus", "Examine topic Status info", _opt("-t", "topic", "topic name", required=True)
)
async def topic_status(admin: Admin, args: argparse.Namespace) -> None:
    fmt = "%-32s  %-4s  %-20s  %-20s    %s"
    _row(fmt, "#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated")
    for row in await admin.topic_status(args.topic.strip()):
        updated = _human_ms(row.last_update_ms) if row.last_update_ms > 0 else ""
        _row(fmt, row.broker_name, row.queue_id, row.min_offset, row.max_offset, updated)


@_command(
    "topicList",
    "Fetch all topic list from name server",
    _opt("-c", "clusterModel", "print the cluster of each topic", action="store_true"),
)
async def topic_list(admin: Admin, args: argparse.Namespace) -> None:
    topics = await admin.topic_list()
    if not args.clusterModel:
        for topic in topics:
            print(topic)
        return
    info = await admin.cluster_info()
    fmt = "%-20s  %-48s  %-48s"
    _row(fmt, "#Cluster Name", "#Topic", "#Consumer Group")
    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        route = await admin.topic_route(topic)
        names = sorted(route.brokers)
        cluster = (info.cluster_of(names[0]) if names else None) or ""
        _row(fmt, cluster, topic, "")


@_command(
    "deleteTopic",
    "Delete topic from broker and NameServer.",
    _opt("-t", "topic", "topic name", required=True),
    _opt("-c", "clusterName", "delete topic from which cluster", required=True),
)
async def delete_topic(admin: Admin, args: argparse.Namespace) -> None:
    await _delete_topic(admin, args.topic.strip(), args.clusterName.strip())


async def _delete_topic(admin: Admin, topic: str, cluster: str) -> None:
    await admin.delete_topic(topic, cluster)
    print(f"delete topic [{topic}] from cluster [{cluster}] success.")
    print(f"delete topic [{topic}] from NameServer success.")


# ---------------------------------------------------------------------- brokers


@_command(
    "clusterList",
    "List all of clusters",
    _opt("-c", "clusterName", "only this cluster"),
)
async def cluster_list(admin: Admin, args: argparse.Namespace) -> None:
    """RocketMQ's columns up to #Version; the totals are messages put and got since
    the broker started (msgPutTotalTodayNow, msgGetTotalTodayNow)."""
    info = await admin.cluster_info()
    fmt = "%-16s  %-22s  %-4s  %-22s %-16s %14s %14s"
    _row(fmt, "#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTotal", "#OutTotal")
    clusters = sorted(info.clusters) if args.clusterName is None else [args.clusterName]
    for cluster in clusters:
        for broker in info.broker_datas(cluster):
            tables = await admin.runtime_tables(broker.addrs)
            for broker_id, address in sorted(broker.addrs.items()):
                table = tables.get(broker_id) or {}
                _row(
                    fmt,
                    cluster,
                    broker.broker_name,
                    broker_id,
                    address,
                    table.get("brokerVersionDesc", ""),
                    table.get("msgPutTotalTodayNow", ""),
                    table.get("msgGetTotalTodayNow", ""),
                )


@_command(
    "brokerStatus",
    "Fetch broker runtime status data",
    _opt("-b", "brokerAddr", "Broker address"),
    _opt("-c", "clusterName", "which cluster"),
)
async def broker_status(admin: Admin, args: argparse.Namespace) -> None:
    if args.brokerAddr is not None:
        for key, value in sorted((await admin.broker_status(args.brokerAddr.strip())).items()):
            _row("%-32s: %s", key, value)
        return
    if args.clusterName is None:
        raise UsageError("give -b (a broker) or -c (a cluster)")
    for broker in (await admin.cluster_info()).broker_datas(args.clusterName):
        tables = await admin.runtime_tables(broker.addrs)
        for broker_id, address in sorted(broker.addrs.items()):
            for key, value in sorted((tables.get(broker_id) or {}).items()):
                _row("%-24s %-32s: %s", address, key, value)


@_command(
    "dledgerStatus",
    "Show every DLedger member: role, term, log end and commit index",
    _opt("-c", "clusterName", "only this cluster"),
)
async def dledger_status(admin: Admin, args: argparse.Namespace) -> int:
    members = await admin.dledger_status(args.clusterName)
    fmt = "%-16s  %-8s  %-22s  %-22s  %-11s  %-6s  %-16s  %s"
    _row(
        fmt,
        "#Group",
        "#SelfId",
        "#Addr",
        "#DLedger Addr",
        "#Role",
        "#Term",
        "#LedgerEndIndex",
        "#CommittedIndex",
    )
    for m in members:
        numbers = (m.term, m.ledger_end_index, m.committed_index)
        _row(
            fmt,
            m.group,
            m.self_id,
            m.addr or "-",
            m.peer_addr or "-",
            m.role,
            *("-" if n is None else n for n in numbers),
        )
    if members and not any(m.reachable for m in members):
        return EXIT_UNREACHABLE
    return EXIT_OK


def _targets(args: argparse.Namespace) -> dict:
    """-b or -c, exactly one, as Admin's keyword arguments."""
    if (args.brokerAddr is None) == (args.clusterName is None):
        raise UsageError("give either -b (a broker) or -c (a cluster)")
    if args.brokerAddr is not None:
        return {"broker_addr": args.brokerAddr.strip()}
    return {"cluster": args.clusterName.strip()}


@_command(
    "getBrokerConfig",
    "Get broker config by cluster or special broker.",
    _opt("-b", "brokerAddr", "get which broker"),
    _opt("-c", "clusterName", "get which cluster"),
)
async def get_broker_config(admin: Admin, args: argparse.Namespace) -> None:
    target = _targets(args)
    if "broker_addr" in target:
        await _print_config(
            admin, f"============{target['broker_addr']}============", target["broker_addr"]
        )
        return
    for broker in (await admin.cluster_info()).broker_datas(target["cluster"]):
        master = broker.master
        if master is not None:
            await _print_config(admin, f"============Master: {master}============", master)
        for address in broker.addresses():
            if address != master:
                label = f"============My Master: {master}=====Slave: {address}============"
                await _print_config(admin, label, address)


async def _print_config(admin: Admin, label: str, address: str) -> None:
    print(label)
    for key, value in (await admin.broker_config(address)).items():
        _row("%-50s=  %s", key, value)
    print()


@_command(
    "updateBrokerConfig",
    "Update broker's config",
    _opt("-b", "brokerAddr", "update which broker"),
    _opt("-c", "clusterName", "update which cluster"),
    _opt("-k", "key", "config key", required=True),
    _opt("-v", "value", "config value", required=True),
)
async def update_broker_config(admin: Admin, args: argparse.Namespace) -> None:
    key, value = args.key.strip(), args.value.strip()
    for address in await admin.update_broker_config(key, value, **_targets(args)):
        print(f"update broker config success, {address}")


@_command(
    "clusterRT",
    "List All clusters Message Send RT.",
    _opt("-a", "amount", "message amount | default 100", type=int, default=100),
    _opt("-s", "size", "message size | default 128 Byte", type=int, default=128),
    _opt("-c", "cluster", "cluster name | default display all cluster"),
    _opt("-p", "printLog", "print as tlog | default false", default="false"),
    _opt("-m", "machineRoom", "machine room name | default noname", default="noname"),
    _opt("-i", "interval", "print interval | default 10 seconds", type=float, default=10.0),
    _opt("-r", "rounds", "stop after this many rounds | default 0, never (raftmq's)",
         type=int, default=0),
)  # fmt: skip
async def cluster_rt(admin: Admin, args: argparse.Namespace) -> None:
    """CLusterSendMsgRTCommand: every interval, `amount` sends of `size` bytes to each
    broker group's own topic (named after the group); the mean time of all but the
    first, in ms."""
    if args.amount < 2:
        raise UsageError("-a: at least 2 messages (the first is not timed)")
    info = await admin.cluster_info()
    clusters = [args.cluster.strip()] if args.cluster else sorted(info.clusters)
    as_tlog = _java_bool(args.printLog)
    if not as_tlog:
        _row("%-24s  %-24s  %-4s  %-8s  %-8s", "#Cluster Name", "#Broker Name", "#RT",
             "#successCount", "#failCount")  # fmt: skip
    body = b"a" * args.size
    rounds = 0
    async with Producer(admin.namesrv_addrs, str(int(time.time() * 1000))) as producer:
        while True:
            for cluster in clusters:
                if cluster not in info.clusters:
                    print(f"cluster [{cluster}] not exist")
                    break
                for broker_name in info.clusters[cluster]:
                    elapsed_s, sent, failed = 0.0, 0, 0
                    for n in range(args.amount):
                        start = time.monotonic()
                        try:
                            await producer.send(broker_name, body)
                            sent += 1
                        except MQClientError:
                            failed += 1
                        if n:
                            elapsed_s += time.monotonic() - start
                    rt_ms = elapsed_s * 1000 / (args.amount - 1)
                    if as_tlog:
                        now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
                        print(f"{now}|{args.machineRoom}|{cluster}|{broker_name}|{rt_ms:.0f}")
                    else:
                        _row("%-24s  %-24s  %-8s  %-16s  %-16s", cluster, broker_name,
                             f"{rt_ms:.2f}", sent, failed)  # fmt: skip
            rounds += 1
            if rounds == args.rounds:
                return
            await trio.sleep(args.interval)


# ---------------------------------------------------------------------- consumers, messages


@_command(
    "consumerProgress",
    "Query consumers's progress, speed",
    _opt("-g", "groupName", "consumer group name", required=True),
)
async def consumer_progress(admin: Admin, args: argparse.Namespace) -> None:
    stats = await admin.consumer_progress(args.groupName.strip())
    fmt = "%-32s  %-32s  %-4s  %-20s  %-20s  %-20s %-20s  %s"
    _row(
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
        last = _human_ms(q.last_timestamp_ms) if q.last_timestamp_ms > 0 else ""
        _row(
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


def _java_bool(text: str) -> bool:
    """Boolean.parseBoolean: "true" in any case is true, anything else false."""
    return text.strip().lower() == "true"


@_command(
    "updateSubGroup",
    "Update or create subscription group",
    _opt("-b", "brokerAddr", "create subscription group to which broker"),
    _opt("-c", "clusterName", "create subscription group to which cluster"),
    _opt("-g", "groupName", "consumer group name", required=True),
    _opt("-s", "consumeEnable", "consume enable"),
    _opt("-m", "consumeFromMinEnable", "from min offset"),
    _opt("-d", "consumeBroadcastEnable", "broadcast"),
    _opt("-q", "retryQueueNums", "retry queue nums", type=int),
    _opt("-r", "retryMaxTimes", "retry max times", type=int),
    _opt("-i", "brokerId", "consumer from which broker id", type=int),
    _opt("-w", "whichBrokerWhenConsumeSlowly", "which broker id when consume slowly", type=int),
    _opt("-a", "notifyConsumerIdsChanged", "notify consumerId changed"),
)
async def update_sub_group(admin: Admin, args: argparse.Namespace) -> None:
    """The config starts from SubscriptionGroupConfig's defaults with broadcast and
    from-min off, as UpdateSubGroupSubCommand's does; each flag given overrides."""
    target = _targets(args)
    config = {
        "groupName": args.groupName.strip(),
        "consumeEnable": True,
        "consumeFromMinEnable": False,
        "consumeBroadcastEnable": False,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }
    for flag, key in (
        ("consumeEnable", "consumeEnable"),
        ("consumeFromMinEnable", "consumeFromMinEnable"),
        ("consumeBroadcastEnable", "consumeBroadcastEnable"),
        ("notifyConsumerIdsChanged", "notifyConsumerIdsChangedEnable"),
    ):
        if getattr(args, flag) is not None:
            config[key] = _java_bool(getattr(args, flag))
    for key in ("retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    retry_route = None
    if config["retryQueueNums"] != 1:
        try:
            retry_route = await admin.topic_route(RETRY_PREFIX + config["groupName"])
        except MQBrokerError as exc:
            print(f"get subscription retry topic route info null: {exc.remark}")
    targets = await admin.create_subscription_group(config, **target)
    for address in targets:
        print(f"create subscription group to {address} success.")
    if retry_route is not None:
        await _resize_retry_topic(admin, retry_route, config["retryQueueNums"], targets)
    fields = ", ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in config.items()
    )
    print(f"SubscriptionGroupConfig [{fields}]")


async def _resize_retry_topic(
    admin: Admin, route: TopicRouteData, queues: int, targets: list[str]
) -> None:
    """The group's retry topic gets `queues` queues on the brokers written to, as
    UpdateSubGroupSubCommand does for a -q other than the default."""
    for queue_data in route.queue_datas:
        master = route.master(queue_data.broker_name)
        if master in targets and queue_data.write_queue_nums != queues:
            await admin.create_topic(
                route.topic, queues, queues, queue_data.perm, broker_addr=master
            )


@_command(
    "deleteSubGroup",
    "Delete subscription group from broker.",
    _opt("-b", "brokerAddr", "delete subscription group from which broker"),
    _opt("-c", "clusterName", "delete subscription group from which cluster"),
    _opt("-g", "groupName", "subscription group name", required=True),
)
async def delete_sub_group(admin: Admin, args: argparse.Namespace) -> None:
    """With -c the group's retry and dead-letter topics go too, as RocketMQ's does."""
    group, target = args.groupName.strip(), _targets(args)
    for address in await admin.delete_subscription_group(group, **target):
        if "cluster" in target:
            print(
                f"delete subscription group [{group}] from broker [{address}] "
                f"in cluster [{target['cluster']}] success."
            )
        else:
            print(f"delete subscription group [{group}] from broker [{address}] success.")
    if "cluster" in target:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            await _delete_topic(admin, prefix + group, target["cluster"])


def _version_desc(version: int) -> str:
    """MQVersion.getVersionDesc for 4.x and 5.x: from V4_0_0_SNAPSHOT (212) on, every
    release follows its snapshot. Older numbers (ali-ons sends 121) are shown as they are."""
    if version < 212:
        return str(version)
    n, release = divmod(version - 212, 2)
    name = f"V{4 + n // 100}_{n % 100 // 10}_{n % 10}"
    return name if release else f"{name}_SNAPSHOT"


@_command(
    "consumerConnection",
    "Query consumer's socket connection, client version and subscription",
    _opt("-g", "consumerGroup", "consumer group name", required=True),
)
async def consumer_connection(admin: Admin, args: argparse.Namespace) -> None:
    """ConsumerConnectionSubCommand's lines (with the line break it leaves out after
    "Below is subscription:")."""
    doc = await admin.consumer_connection(args.consumerGroup.strip())
    for n, conn in enumerate(doc.get("connectionSet") or (), 1):
        _row(
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
        _row("%03d  Topic: %-40s SubExpression: %s", n, sub.get("topic"), sub.get("subString"))
    print(f"ConsumeType: {doc.get('consumeType')}")
    print(f"MessageModel: {doc.get('messageModel')}")
    print(f"ConsumeFromWhere: {doc.get('consumeFromWhere')}")


@_command(
    "producerConnection",
    "Query producer's socket connection and client version",
    _opt("-g", "producerGroup", "producer group name", required=True),
    _opt("-t", "topic", "topic name", required=True),
)
async def producer_connection(admin: Admin, args: argparse.Namespace) -> None:
    doc = await admin.producer_connection(args.producerGroup.strip(), args.topic.strip())
    for n, conn in enumerate(doc.get("connectionSet") or (), 1):
        _row(
            "%04d  %-32s %-22s %-8s %s",
            n,
            conn.get("clientId"),
            conn.get("clientAddr"),
            conn.get("language"),
            _version_desc(int(conn.get("version") or 0)),
        )


def _timestamp_ms(text: str) -> int:
    """`now` (-1: the queue's end), epoch milliseconds, or local time as
    `yyyy-MM-dd#HH:mm:ss:SSS` (UtilAll.YYYY_MM_DD_HH_MM_SS_SSS)."""
    if text == "now":
        return -1
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%d#%H:%M:%S:%f")
    except ValueError:
        raise UsageError(
            f"-s {text!r}: expected now, epoch milliseconds or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None
    return int(moment.timestamp() * 1000)


@_command(
    "resetOffsetByTime",
    "Reset consumer offset by timestamp(without client restart).",
    _opt("-g", "group", "set the consumer group", required=True),
    _opt("-t", "topic", "set the topic", required=True),
    _opt("-s", "timestamp", "set the timestamp[now|currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]",
         required=True),
    _opt("-f", "force", "set the force rollback by timestamp switch[true|false]"),
    _opt("-c", "cplus", "reset c++ client offset (accepted; every client is reset alike)",
         action="store_true"),
)  # fmt: skip
async def reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> None:
    group, topic, text = args.group.strip(), args.topic.strip(), args.timestamp.strip()
    timestamp_ms = _timestamp_ms(text)
    force = True if args.force is None else _java_bool(args.force)
    rows = await admin.reset_offset_by_time(group, topic, timestamp_ms, force)
    print(
        f"rollback consumer offset by specified group[{group}], topic[{topic}], "
        f"force[{str(force).lower()}], timestamp(string)[{text}], timestamp(long)[{timestamp_ms}]"
    )
    _row("%-40s  %-40s  %-40s", "#brokerName", "#queueId", "#offset")
    for broker_name, queue_id, offset in rows:
        _row("%-40s  %-40d  %-40d", broker_name, queue_id, offset)


def _body_text(msg: MessageExt) -> str:
    body = msg.body or b""
    if msg.sysflag & MessageSysFlag.COMPRESSED_FLAG:
        with contextlib.suppress(zlib.error):  # else shown as stored
            body = zlib.decompress(body)
    return body.decode("utf-8", errors="replace")


def _print_message(msg: MessageExt) -> None:
    """QueryMsgByIdSubCommand.printMsg's fields, with the body inline instead of in a
    file under /tmp."""
    properties = ", ".join(f"{k}={v}" for k, v in sorted(msg.properties.items()))
    for label, value in (
        ("OffsetID:", msg.msg_id),
        ("Topic:", msg.topic),
        ("Tags:", f"[{msg.tags or ''}]"),
        ("Keys:", f"[{msg.keys or ''}]"),
        ("Queue ID:", msg.queue_id),
        ("Queue Offset:", msg.queue_offset),
        ("CommitLog Offset:", msg.physical_offset),
        ("Reconsume Times:", msg.reconsume_times),
        ("Born Timestamp:", _human_ms(msg.born_timestamp)),
        ("Store Timestamp:", _human_ms(msg.store_timestamp)),
        ("Born Host:", "{}:{}".format(*msg.born_host)),
        ("Store Host:", "{}:{}".format(*msg.store_host)),
        ("System Flag:", msg.sysflag),
        ("Properties:", f"{{{properties}}}"),
        ("Message Body:", _body_text(msg)),
    ):
        _row("%-20s %s", label, value)


@_command(
    "queryMsgById",
    "Query Message by Id",
    _opt("-i", "msgId", "Message Id (offset msgIds, comma separated)", required=True),
)
async def query_msg_by_id(admin: Admin, args: argparse.Namespace) -> None:
    for n, msg_id in enumerate(i.strip() for i in args.msgId.split(",") if i.strip()):
        try:
            msg = await admin.query_msg_by_id(msg_id)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if n:
            print()
        _print_message(msg)


def _mq_text(mq: MessageQueue) -> str:
    """MessageQueue.toString."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


@_command(
    "sendMessage",
    "Send a message",
    _opt("-t", "topic", "Topic name", required=True),
    _opt("-p", "body", "UTF-8 string format of the message body", required=True),
    _opt("-k", "key", "Message keys"),
    _opt("-c", "tags", "Message tags"),
    _opt("-b", "broker", "Send message to target broker"),
    _opt("-i", "qid", "Send message to target queue", type=int),
)
async def send_message(admin: Admin, args: argparse.Namespace) -> None:
    topic = args.topic.strip()
    if args.qid is not None and args.broker is None:
        raise UsageError("Broker name must be set if the queue is chosen!")
    queue = None if args.qid is None else MessageQueue(topic, args.broker.strip(), args.qid)
    group = str(int(time.time() * 1000))  # as SendMessageCommand names its producer
    async with Producer(admin.namesrv_addrs, group) as producer:
        result = await producer.send(
            topic,
            args.body.strip().encode("utf-8"),
            tags=args.tags and args.tags.strip(),
            keys=args.key and args.key.strip(),
            queue=queue,
        )
    fmt = "%-32s  %-4s  %-20s    %s"
    _row(fmt, "#Broker Name", "#QID", "#Send Result", "#MsgId")
    mq = result.message_queue
    _row(fmt, mq.broker_name, mq.queue_id, result.status.name, result.msg_id)


def _message_line(msg: MessageExt, broker_name: str) -> str:
    """PrintMessageByQueueCommand.printMessage's line; MessageExt's toString shortened
    to the fields an operator looks for."""
    store_host = "{}:{}".format(*msg.store_host)
    described = (
        f"MessageExt [brokerName={broker_name}, queueId={msg.queue_id}, "
        f"queueOffset={msg.queue_offset}, storeTimestamp={msg.store_timestamp}, "
        f"storeHost={store_host}, msgId={msg.msg_id}, commitLogOffset={msg.physical_offset}, "
        f"reconsumeTimes={msg.reconsume_times}, topic={msg.topic}, tags={msg.tags}, "
        f"keys={msg.keys}]"
    )
    return f"MSGID: {msg.uniq_key or msg.msg_id} {described} BODY: {_body_text(msg)}"


@_command(
    "consumeMessage",
    "Consume message",
    _opt("-t", "topic", "Topic name", required=True),
    _opt("-b", "brokerName", "Broker name"),
    _opt("-i", "queueId", "Queue Id", type=int),
    _opt("-o", "offset", "Queue offset", type=int),
    _opt("-g", "consumerGroup", "Consumer group name"),
    _opt("-s", "beginTimestamp", "Begin timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    _opt("-e", "endTimestamp", "End timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    _opt("-c", "MessageNumber", "Number of message to be consumed", type=int, default=128),
)
async def consume_message(admin: Admin, args: argparse.Namespace) -> None:
    """ConsumeMessageCommand: pull (never commit) up to -c messages, queue by queue, or
    from one queue (-b, -i) and offset (-o), between two store times (-s, -e)."""
    if args.MessageNumber <= 0:
        raise UsageError("please input a positive messageNumber!")
    if args.queueId is not None and args.brokerName is None:
        raise UsageError("Please set the brokerName before queueId!")
    if args.offset is not None and args.queueId is None:
        raise UsageError("please set queueId before offset!")
    topic = args.topic.strip()
    begin_ms = _timestamp_ms(args.beginTimestamp.strip()) if args.beginTimestamp else 0
    end_ms = _timestamp_ms(args.endTimestamp.strip()) if args.endTimestamp else 0
    group = (args.consumerGroup or "TOOLS_CONSUMER").strip()
    async with PullConsumer(admin.namesrv_addrs, group) as consumer:

        async def span(mq: MessageQueue) -> tuple[int, int]:
            low, high = await consumer.min_offset(mq), await consumer.max_offset(mq)
            if begin_ms > 0:
                low = await consumer.search_offset(mq, begin_ms)
            if end_ms > 0:
                high = await consumer.search_offset(mq, end_ms)
            return low, high

        count = args.MessageNumber
        if args.queueId is None:
            for mq in await consumer.fetch_queues(topic):
                if count == 0:
                    return
                low, high = await span(mq)
                if high - low > count:
                    print(f"The older {count} message of the {mq.queue_id} queue will be provided")
                    high, count = low + count - 1, 0
                else:
                    count -= high - low + 1
                await _print_queue(consumer, mq, low, high)
            return
        mq = MessageQueue(topic, args.brokerName.strip(), args.queueId)
        low, high = await span(mq)
        offset = args.offset or 0
        if offset > high:
            print(f"{_mq_text(mq)} no matched msg, offset={offset}")
            return
        low = max(low, offset)
        if high - low > count:
            print(f"The oldler {count} message will be provided")
            high = low + count - 1
        await _print_queue(consumer, mq, low, high)


async def _print_queue(consumer: PullConsumer, mq: MessageQueue, low: int, high: int) -> None:
    """Messages [low, high] of `mq`, a pull at a time, until the queue has no more."""
    offset = low
    while offset <= high:
        result = await consumer.pull(mq, offset, min(32, high - offset + 1))
        offset = result.next_begin_offset
        if result.status is PullStatus.FOUND:
            print("Consume ok")
            for msg in result.messages:
                print(_message_line(msg, mq.broker_name))
        elif result.status is PullStatus.NO_MATCHED_MSG:
            print(f"{_mq_text(mq)} no matched msg. status={result.status.name}, offset={offset}")
        else:
            status = result.status.name
            print(f"{_mq_text(mq)} print msg finished. status={status}, offset={offset}")
            return


# ---------------------------------------------------------------------- entry point


def _print_commands() -> None:
    print("The most commonly used mqadmin commands are:")
    for command in COMMANDS.values():
        _row("   %-20s %s", command.name, command.desc)
    print("\nSee 'mqadmin help <command>' for more information on a specific command.")


def _find(name: str) -> Command | None:
    """Command names match regardless of case, as MQAdminStartup's do."""
    return next((c for n, c in COMMANDS.items() if n.lower() == name.lower()), None)


def _failure(command: Command, exc: Exception) -> int:
    """Print why `command` failed; the exit status for it."""
    if isinstance(exc, MQBrokerError):
        try:
            name = f" ({ResponseCode(exc.code).name})"
        except ValueError:
            name = ""
        reason = f"{exc.broker} answered code {exc.code}{name}: {exc.remark}"
        status = EXIT_ANSWERED_ERROR
    elif isinstance(exc, UnreachableError | RemotingConnectError | RemotingTimeoutError):
        reason, status = str(exc), EXIT_UNREACHABLE
    else:
        reason, status = str(exc), EXIT_ANSWERED_ERROR
    print(f"mqadmin {command.name} failed: {reason}", file=sys.stderr)
    return status


_HELP = ("help", "-h", "--help")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0] in _HELP and len(argv) == 1):
        _print_commands()
        return EXIT_OK
    if argv[0] in _HELP and len(argv) == 2:
        command = _find(argv[1])
        if command is None:
            print(f"The sub command {argv[1]} not exist.", file=sys.stderr)
            return EXIT_USAGE
        command.parser().print_help()
        return EXIT_OK
    command = _find(argv[0])
    if command is None:
        print(f"The sub command {argv[0]} not exist.", file=sys.stderr)
        return EXIT_USAGE
    parser = command.parser()
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as exc:  # argparse: 2 for bad flags, 0 for -h
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    namesrv = args.namesrvAddr or os.environ.get("NAMESRV_ADDR")
    if not namesrv:
        parser.print_usage(sys.stderr)
        print("mqadmin: no name server: give -n or set NAMESRV_ADDR", file=sys.stderr)
        return EXIT_USAGE
    try:
        parse_namesrv_addrs(namesrv)
    except ValueError as exc:
        print(f"mqadmin: -n {namesrv!r}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        async with Admin(namesrv) as admin:
            return await command.run(admin, args) or EXIT_OK

    try:
        return trio.run(run)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"mqadmin {command.name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (MQClientError, RemotingConnectError, RemotingTimeoutError) as exc:
        return _failure(command, exc)
    except KeyboardInterrupt:  # clusterRT runs until interrupted, as RocketMQ's does
        print(f"mqadmin {command.name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
