"""Cluster and broker verbs: clusterList, brokerStatus, dledgerStatus, haStatus,
timerStatus, getBrokerConfig, updateBrokerConfig, clusterRT, sendMsgStatus,
cleanExpiredCQ, cleanUnusedTopic."""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import trio

from raftmq.client.admin import Admin, fall_behind_bytes
from raftmq.client.errors import MQClientError
from raftmq.client.mqadmin.commands import (
    EXIT_ANSWERED_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    UsageError,
    broker_or_cluster,
    human_ms,
    java_bool,
    option,
    print_row,
    target_kwargs,
    verb,
)
from raftmq.client.producer import Producer, SendResult
from raftmq.client.route import MASTER_ID
from raftmq.remoting import RequestCode

CLUSTER_LIST_FORMAT = "%-16s  %-22s  %-4s  %-22s %-16s %19s %19s %10s %5s %6s  %s"
MORE_STATS_FORMAT = "%-16s  %-32s %14s %14s %14s %14s"  # clusterList -m


def first_rate(table: dict, key: str) -> float:
    """The 10 s figure of a putTps-style value ("10s 60s 600s"), 0 when absent."""
    try:
        return float(table[key].split()[0])
    except (KeyError, IndexError, ValueError):
        return 0.0


def _load(table: dict, rate_key: str, pool: str) -> str:
    """#InTPS(LOAD) / #OutTPS(LOAD): the rate, then the pool's queue size and its head's
    wait, which a raftmq broker does not have (no thread pools): `-`."""
    size = table.get(f"{pool}ThreadPoolQueueSize", "-")
    wait = table.get(f"{pool}ThreadPoolQueueHeadWaitTimeMills", "-")
    return f"{first_rate(table, rate_key):9.2f}({size},{wait}ms)"


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def day_totals(table: dict) -> tuple[int, int, int, int]:
    """clusterList -m: messages stored and pulled yesterday and today (since local
    midnight), from the broker's totals now and at the last two midnights."""

    def count(key: str) -> int:
        return int(table.get(key) or 0)

    def day(kind: str, since: str, until: str) -> int:
        return count(f"msg{kind}Total{until}") - count(f"msg{kind}Total{since}")

    return (
        day("Put", "YesterdayMorning", "TodayMorning"),
        day("Get", "YesterdayMorning", "TodayMorning"),
        day("Put", "TodayMorning", "TodayNow"),
        day("Get", "TodayMorning", "TodayNow"),
    )


@verb(
    "clusterList",
    "List all of clusters",
    option("-c", "clusterName", "only this cluster"),
    option("-m", "moreStats", "messages in and out yesterday and today", action="store_true"),
    option("-i", "interval", "specify intervals numbers, it is in seconds", type=int),
)
async def cluster_list(admin: Admin, args: argparse.Namespace) -> None:
    """The table once, or with -i every that many seconds until interrupted (exit
    130), each time read anew, as RocketMQ's."""
    if args.interval is not None and args.interval < 0:
        raise UsageError(f"-i {args.interval}: the interval is a number of seconds, 0 or more")
    await _print_cluster_list(admin, args)
    while args.interval is not None:
        sys.stdout.flush()  # each table as it is printed, to a pipe too
        await trio.sleep(args.interval)
        await _print_cluster_list(admin, args)


async def _print_cluster_list(admin: Admin, args: argparse.Namespace) -> None:
    """RocketMQ's ClusterListSubCommand columns, then raftmq's #FallBehind(B): a classic
    member's HA lag (`fall_behind_bytes`; `-` for a DLedger member: see dledgerStatus).
    #PCWait(ms) and #Hour read keys only a Java broker reports (pageCacheLockTimeMills,
    earliestMessageTimeStamp): `-` for a raftmq one. With -m, RocketMQ's other table:
    each member's messages in and out yesterday and today (`day_totals`)."""
    info = await admin.cluster_info()
    clusters = sorted(info.clusters) if args.clusterName is None else [args.clusterName]
    if args.moreStats:
        print_row(MORE_STATS_FORMAT, "#Cluster Name", "#Broker Name", "#InTotalYest",
                  "#OutTotalYest", "#InTotalToday", "#OutTotalToday")  # fmt: skip
        for cluster in clusters:
            for broker in info.broker_datas(cluster):
                tables = await admin.runtime_tables(broker.addrs)
                for broker_id in sorted(broker.addrs):
                    totals = day_totals(tables.get(broker_id) or {})
                    print_row(MORE_STATS_FORMAT, cluster, broker.broker_name, *totals)
        return
    groups = [
        (cluster, broker, await admin.runtime_tables(broker.addrs))
        for cluster in clusters
        for broker in info.broker_datas(cluster)
    ]
    controller_mode = any(
        "syncStateSet" in (table or {}) for _, _, tables in groups for table in tables.values()
    )
    epochs = ("#Epoch(InSync)",) if controller_mode else ()
    print_row(
        CLUSTER_LIST_FORMAT + "  %s" * len(epochs), "#Cluster Name", "#Broker Name", "#BID",
        "#Addr", "#Version", "#InTPS(LOAD)", "#OutTPS(LOAD)", "#PCWait(ms)", "#Hour", "#SPACE",
        "#FallBehind(B)", *epochs,
    )  # fmt: skip
    now_ms = time.time() * 1000
    for cluster, broker, tables in groups:
        for broker_id, address in sorted(broker.addrs.items()):
            table = tables.get(broker_id) or {}
            earliest = table.get("earliestMessageTimeStamp")
            ratio = table.get("commitLogDiskRatio")
            epoch = (_epoch_in_sync(broker_id, table),) if controller_mode else ()
            print_row(
                CLUSTER_LIST_FORMAT + "  %s" * len(epoch),
                cluster,
                broker.broker_name,
                broker_id,
                address,
                table.get("brokerVersionDesc", ""),
                _load(table, "putTps", "send"),
                _load(table, "getTransferedTps", "pull"),
                table.get("pageCacheLockTimeMills", "-"),
                "-" if earliest is None else f"{(now_ms - int(earliest)) / 3_600_000:2.2f}",
                "-" if ratio is None else f"{float(ratio):.4f}",
                _dash(fall_behind_bytes(broker_id, tables)),
                *epoch,
            )


def _epoch_in_sync(broker_id: int, table: dict) -> str:
    """clusterList's #Epoch(InSync), for clusters with controller-mode groups: the last
    epoch in a member's epoch file, and on the master its SyncStateSet's brokerIds ("2(1,2)");
    `-` for a member not in controller mode (or not answering)."""
    if "syncStateSet" not in table:
        return "-"
    epoch = table.get("masterEpoch", "-")
    return f"{epoch}({table['syncStateSet']})" if broker_id == MASTER_ID else epoch


@verb(
    "brokerStatus",
    "Fetch broker runtime status data",
    *broker_or_cluster("Broker address", "which cluster"),
)
async def broker_status(admin: Admin, args: argparse.Namespace) -> None:
    if args.brokerAddr is not None:
        for key, value in sorted((await admin.broker_status(args.brokerAddr.strip())).items()):
            print_row("%-32s: %s", key, value)
        return
    if args.clusterName is None:
        raise UsageError("give -b (a broker) or -c (a cluster)")
    for broker in (await admin.cluster_info()).broker_datas(args.clusterName):
        tables = await admin.runtime_tables(broker.addrs)
        for broker_id, address in sorted(broker.addrs.items()):
            for key, value in sorted((tables.get(broker_id) or {}).items()):
                print_row("%-24s %-32s: %s", address, key, value)


TIMER_STATUS_FORMAT = "%-22s  %-12s  %12s  %10s  %9s  %-23s  %10s  %10s  %12s"


@verb(
    "timerStatus",
    "Show timer messages on each member: backlog, in memory, firing progress, lateness",
    *broker_or_cluster("Broker address", "which cluster"),
)
async def timer_status(admin: Admin, args: argparse.Namespace) -> None:
    """The timer keys of each member's runtime table (broker.timer's TimerService.status):
    #Backlog, timer messages filed and not yet past the fired progress (recalls count);
    #InMemory, those in the master's heap (what is due within two minutes); #Buckets,
    files by due minute; #FiredUpTo, the replicated progress every member holds (what a
    new master resumes from); #Delivered and #Recalled since the member started; #LateMs,
    how late its last delivery went out after the time asked."""
    target = target_kwargs(args)
    if "broker_addr" in target:
        members = [(target["broker_addr"], await admin.broker_status(target["broker_addr"]))]
    else:
        members = []
        for broker in (await admin.cluster_info()).broker_datas(target["cluster"]):
            tables = await admin.runtime_tables(broker.addrs)
            members += [(a, tables.get(i) or {}) for i, a in sorted(broker.addrs.items())]
    print_row(TIMER_STATUS_FORMAT, "#Addr", "#Role", "#Backlog", "#InMemory", "#Buckets",
              "#FiredUpTo", "#Delivered", "#Recalled", "#LateMs")  # fmt: skip
    for address, table in members:
        fired_ms = int(table.get("timerFiredMs", -1))
        print_row(
            TIMER_STATUS_FORMAT,
            address,
            table.get("brokerRole", "-"),
            table.get("timerBacklog", "-"),
            table.get("timerInMemory", "-"),
            table.get("timerBuckets", "-"),
            "-" if fired_ms < 0 else human_ms(fired_ms),
            table.get("timerDelivered", "-"),
            table.get("timerRecalled", "-"),
            table.get("timerLatenessMs", "-"),
        )


@verb(
    "dledgerStatus",
    "Show every DLedger member: role, term, log end and commit index",
    option("-c", "clusterName", "only this cluster"),
)
async def dledger_status(admin: Admin, args: argparse.Namespace) -> int:
    members = await admin.dledger_status(args.clusterName)
    fmt = "%-16s  %-8s  %-22s  %-22s  %-11s  %-6s  %-16s  %s"
    print_row(
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
        print_row(
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


_GROUP_BROKER = option("-b", "brokerAddr", "a broker of the group", required=True)


async def _broker_or_masters(admin: Admin, args: argparse.Namespace) -> list[str]:
    """-b's broker, or every master of -c's cluster."""
    target = target_kwargs(args)
    if "broker_addr" in target:
        return [target["broker_addr"]]
    brokers = (await admin.cluster_info()).broker_datas(target["cluster"])
    return [b.master for b in brokers if b.master is not None]


def print_members(address: str, members: dict, asked: str = "#Broker") -> None:
    """A DLedger group's members, one row each, as the broker (or controller) at
    `address` answered them; `asked` heads its column."""
    print_row("%-22s  %-16s  %-8s  %s", asked, "#SelfId", "#Role", "#DLedger Addr")
    for role in ("voters", "learners"):
        for member in members[role]:
            print_row(
                "%-22s  %-16s  %-8s  %s", address, member, role[:-1], members["peers"][member]
            )


@verb(
    "getDLedgerPeers",
    "Show the DLedger members (voters, learners) of a broker's group, or of every group",
    *broker_or_cluster("a broker of the group", "every group of this cluster"),
)
async def get_dledger_peers(admin: Admin, args: argparse.Namespace) -> None:
    addresses = await _broker_or_masters(admin, args)
    for address in addresses:
        print_members(address, await admin.dledger_members(address))


_ADD_OPTIONS = (
    _GROUP_BROKER,
    option("-m", "member", "the new member's dLegerSelfId-host:port", required=True),
    option("-t", "timeoutSeconds", "for it to catch up and be promoted (60)", type=float),
)


@verb("addDLedgerPeer", "Add a broker started with joinAsLearner=true to a group", *_ADD_OPTIONS)
async def add_dledger_peer(admin: Admin, args: argparse.Namespace) -> None:
    """`Admin.add_dledger_member`: a learner, then a voter once it has caught up."""
    address = args.brokerAddr.strip()
    print_members(address, await add_member(admin, address, args.member, args.timeoutSeconds))


async def add_member(admin: Admin, address: str, spec: str, timeout_s: float | None) -> dict:
    """Add member `spec` (id-host:port) to the DLedger group of the broker or
    controller at `address` (`Admin.add_dledger_member`; within `timeout_s`, 60 s if
    None). The members after."""
    member, sep, peer_addr = spec.strip().partition("-")
    if not sep or not member or not peer_addr:
        raise UsageError(f"-m {spec!r}: expected id-host:port")
    return await admin.add_dledger_member(address, member, peer_addr, timeout_s or 60.0)


_REMOVE_OPTIONS = (_GROUP_BROKER, option("-m", "member", "its dLegerSelfId", required=True))


@verb(
    "removeDLedgerPeer", "Remove a member from a DLedger group (the leader too)", *_REMOVE_OPTIONS
)
async def remove_dledger_peer(admin: Admin, args: argparse.Namespace) -> None:
    """The leader, removed, hands leadership to the voter furthest along and steps down."""
    address = args.brokerAddr.strip()
    print_members(address, await remove_member(admin, address, args.member.strip()))


async def remove_member(admin: Admin, address: str, member: str) -> dict:
    """Remove `member` from the DLedger group of the broker or controller at `address`
    (skipped if it is none); the members after, as the leader that made the change
    answers them: asked again, a member that removed itself may still show its old view
    (the leader need not send it the entry that removed it)."""
    members = await admin.dledger_members(address)
    if member in members["peers"]:
        members = await admin.dledger_members(address, "remove", member)
    return members


@verb(
    "haStatus",
    "Fetch ha runtime status data",
    *broker_or_cluster("which broker to fetch", "which cluster"),
)
async def ha_status(admin: Admin, args: argparse.Namespace) -> None:
    """RocketMQ 5's HAStatusSubCommand: a classic master's slaves and how far behind
    each is, or a slave's view of its master; -c asks every master of the cluster."""
    addresses = await _broker_or_masters(admin, args)
    for address in addresses:
        _print_ha_status(address, await admin.ha_status(address))


def _print_ha_status(address: str, info: dict) -> None:
    if info.get("master"):
        connections = info.get("haConnectionInfo") or []
        print(
            f"\n#MasterAddr\t{address}\n#MasterCommitLogMaxOffset\t"
            f"{info.get('masterCommitLogMaxOffset', 0)}\n#SlaveNum\t{len(connections)}\n"
            f"#InSyncSlaveNum\t{info.get('inSyncSlaveNums', 0)}"
        )
        print_row(
            "%-32s  %-16s %16s %16s %16s %16s",
            "#SlaveAddr", "#SlaveAckOffset", "#Diff", "#TransferSpeed(KB/s)", "#Status",
            "#TransferFromWhere",
        )  # fmt: skip
        for c in connections:
            print_row(
                "%-32s  %-16d %16d %16.2f %16s %16d",
                c.get("addr", ""),
                c.get("slaveAckOffset", 0),
                c.get("diff", 0),
                c.get("transferredByteInSecond", 0) / 1024.0,
                "OK" if c.get("inSync") else "Fall Behind",
                c.get("transferFromWhere", 0),
            )
        return
    client = info.get("haClientRuntimeInfo") or {}
    print(f"\n#MasterAddr\t{client.get('masterAddr', '')}")
    print(f"#CommitLogMaxOffset\t{client.get('maxOffset', 0)}")
    print(f"#TransferSpeed(KB/s)\t{client.get('transferredByteInSecond', 0) / 1024.0:.2f}")
    print(f"#LastReadTime\t{human_ms(client.get('lastReadTimestamp', 0))}")
    print(f"#LastWriteTime\t{human_ms(client.get('lastWriteTimestamp', 0))}")
    print(f"#MasterFlushOffset\t{client.get('masterFlushOffset', 0)}")


@verb(
    "getBrokerConfig",
    "Get broker config by cluster or special broker.",
    *broker_or_cluster("get which broker", "get which cluster"),
)
async def get_broker_config(admin: Admin, args: argparse.Namespace) -> None:
    target = target_kwargs(args)
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
        print_row("%-50s=  %s", key, value)
    print()


@verb(
    "updateBrokerConfig",
    "Update broker's config",
    *broker_or_cluster("update which broker", "update which cluster"),
    option("-k", "key", "config key", required=True),
    option("-v", "value", "config value", required=True),
)
async def update_broker_config(admin: Admin, args: argparse.Namespace) -> None:
    key, value = args.key.strip(), args.value.strip()
    for address in await admin.update_broker_config(key, value, **target_kwargs(args)):
        print(f"update broker config success, {address}")


@verb(
    "clusterRT",
    "List All clusters Message Send RT.",
    option("-a", "amount", "message amount | default 100", type=int, default=100),
    option("-s", "size", "message size | default 128 Byte", type=int, default=128),
    option("-c", "cluster", "cluster name | default display all cluster"),
    option("-p", "printLog", "print as tlog | default false", default="false"),
    option("-m", "machineRoom", "machine room name | default noname", default="noname"),
    option("-i", "interval", "print interval | default 10 seconds", type=float, default=10.0),
    option("-r", "rounds", "stop after this many rounds | default 0, never (raftmq's)",
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
    as_tlog = java_bool(args.printLog)
    if not as_tlog:
        print_row("%-24s  %-24s  %-4s  %-8s  %-8s", "#Cluster Name", "#Broker Name", "#RT",
             "#successCount", "#failCount")  # fmt: skip
    body = b"a" * args.size
    rounds = 0
    async with Producer(
        admin.namesrv_addrs,
        str(int(time.time() * 1000)),
        tls=admin.tls,
        credentials=admin.credentials,
    ) as producer:
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
                        print_row("%-24s  %-24s  %-8s  %-16s  %-16s", cluster, broker_name,
                             f"{rt_ms:.2f}", sent, failed)  # fmt: skip
            rounds += 1
            if rounds == args.rounds:
                return
            await trio.sleep(args.interval)


def send_result_text(result: SendResult) -> str:
    """SendResult.toString, with MessageQueue's."""
    mq = result.message_queue
    return (
        f"SendResult [sendStatus={result.status.name}, msgId={result.msg_id}, "
        f"offsetMsgId={result.offset_msg_id}, messageQueue=MessageQueue [topic={mq.topic}, "
        f"brokerName={mq.broker_name}, queueId={mq.queue_id}], queueOffset={result.queue_offset}]"
    )


@verb(
    "sendMsgStatus",
    "send msg to broker.",
    option("-b", "brokerName", "Broker Name", required=True),
    option("-s", "messageSize", "Message Size, Default: 128", type=int, default=128),
    option("-c", "count", "send message count, Default: 50", type=int, default=50),
)
async def send_msg_status(admin: Admin, args: argparse.Namespace) -> None:
    """SendMsgStatusCommand: to the broker group's own topic (named after it), one
    16-byte message to warm up, then `count` of `messageSize` bytes, each with its
    time and result."""
    topic = args.brokerName.strip()
    async with Producer(
        admin.namesrv_addrs, "PID_SMSC", tls=admin.tls, credentials=admin.credentials
    ) as producer:
        await producer.send(topic, b"a" * 16)
        for _ in range(args.count):
            start = time.monotonic()
            result = await producer.send(topic, b"a" * args.messageSize)
            rt_ms = int((time.monotonic() - start) * 1000)
            print(f"rt={rt_ms}ms, SendResult={send_result_text(result)}")


def _on_each_member(name: str, desc: str, cluster_help: str, code: RequestCode) -> None:
    """Register verb `name`: `code` to one broker (-b), or to every member of a cluster
    (of every cluster without -c), slaves too, since each keeps its own ConsumeQueues;
    it prints "success" when all did it, else "false" (exit 1), and, as RocketMQ's,
    no line break."""

    async def run(admin: Admin, args: argparse.Namespace) -> int | None:
        if args.brokerAddr is not None:
            addresses = [args.brokerAddr.strip()]
        else:
            cluster = args.cluster.strip() if args.cluster else None
            addresses = [a for b in (await admin.cluster_info()).broker_datas(cluster)
                         for a in b.addresses()]  # fmt: skip
        done = True
        for address in addresses:
            try:
                await admin.call(address, code)
            except MQClientError as exc:
                print(f"mqadmin {name}: {exc}", file=sys.stderr)
                done = False
        print("success" if done else "false", end="")
        return None if done else EXIT_ANSWERED_ERROR

    options = (option("-b", "brokerAddr", "Broker address"), option("-c", "cluster", cluster_help))
    verb(name, desc, *options)(run)


# CLEAN_EXPIRED_CONSUMEQUEUE: drop the entries whose messages retention deleted
_on_each_member(
    "cleanExpiredCQ",
    "Clean expired ConsumeQueue on broker.",
    "clustername",
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
)
# CLEAN_UNUSED_TOPIC: drop the ConsumeQueues of topics the broker no longer has
_on_each_member(
    "cleanUnusedTopic",
    "Clean unused topic on broker.",
    "cluster name",
    RequestCode.CLEAN_UNUSED_TOPIC,
)
