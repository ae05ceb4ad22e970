"""Topic verbs: updateTopic, updateTopicPerm, deleteTopic, topicRoute, topicStatus,
topicClusterList, topicList, allocateMQ."""

from __future__ import annotations

import argparse
import json

from raftmq.client.admin import Admin
from raftmq.client.allocate import allocate_averagely
from raftmq.client.mqadmin.commands import (
    EXIT_ANSWERED_ERROR,
    UsageError,
    broker_or_cluster,
    human_ms,
    java_bool,
    option,
    print_row,
    target_kwargs,
    verb,
)
from raftmq.client.route import TopicRouteData


def _perm_string(perm: int) -> str:
    """`PermName.perm2String`: R, W and X (inherit) or '-'."""
    return "".join(c if perm & bit else "-" for c, bit in (("R", 4), ("W", 2), ("X", 1)))


@verb(
    "updateTopic",
    "Update or create topic",
    *broker_or_cluster("create topic to which broker", "create topic to which cluster"),
    option("-t", "topic", "topic name", required=True),
    option("-r", "readQueueNums", "set read queue nums", type=int, default=8),
    option("-w", "writeQueueNums", "set write queue nums", type=int, default=8),
    option(
        "-p", "perm", "set topic's permission(2|4|6), intro[2:W 4:R; 6:RW]", type=int, default=6
    ),
    option("-o", "order", "set topic's order(true|false)", default="false"),
    option("-a", "attributes", "attribute(+a=b,+c=d,-e), e.g. +message.type=FIFO"),
)
async def update_topic(admin: Admin, args: argparse.Namespace) -> None:
    order = java_bool(args.order)
    topic = args.topic.strip()
    targets = await admin.create_topic(
        topic,
        args.readQueueNums,
        args.writeQueueNums,
        args.perm,
        order=order,
        attributes=args.attributes,
        **target_kwargs(args),
    )
    for address in targets:
        print(f"create topic to {address} success.")
    print(
        f"TopicConfig [topicName={topic}, readQueueNums={args.readQueueNums}, "
        f"writeQueueNums={args.writeQueueNums}, perm={_perm_string(args.perm)}, "
        f"topicFilterType=SINGLE_TAG, topicSysFlag=0, order={str(order).lower()}"
        + (f", attributes={args.attributes}" if args.attributes else "")
        + "]"
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


ROUTE_LIST_FORMAT = "%-45s %-32s %-50s %-10s %-11s %-5s"


@verb(
    "topicRoute",
    "Examine topic route info",
    option("-t", "topic", "topic name", required=True),
    option("-l", "list", "Use list format to print data", action="store_true"),
)
async def topic_route(admin: Admin, args: argparse.Namespace) -> None:
    route = await admin.topic_route(args.topic.strip())
    if not args.list:
        print(json.dumps(_route_json(route), indent=4))
        return
    print_row(ROUTE_LIST_FORMAT, "#ClusterName", "#BrokerName", "#BrokerAddrs", "#ReadQueue",
              "#WriteQueue", "#Perm")  # fmt: skip
    queues = {q.broker_name: q for q in route.queue_datas}
    for name, broker in sorted(route.brokers.items()):
        q = queues[name]
        addrs = "{" + ", ".join(f"{i}={a}" for i, a in sorted(broker.addrs.items())) + "}"
        print_row(ROUTE_LIST_FORMAT, broker.cluster, name, addrs, q.read_queue_nums,
                  q.write_queue_nums, q.perm)  # fmt: skip
    print("-" * 158)
    total_read = sum(q.read_queue_nums for q in queues.values())
    total_write = sum(q.write_queue_nums for q in queues.values())
    print_row(ROUTE_LIST_FORMAT, "Total:", len(queues), "", total_read, total_write, "")


@verb(
    "topicStatus", "Examine topic Status info", option("-t", "topic", "topic name", required=True)
)
async def topic_status(admin: Admin, args: argparse.Namespace) -> None:
    fmt = "%-32s  %-4s  %-20s  %-20s    %s"
    print_row(fmt, "#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated")
    for row in await admin.topic_status(args.topic.strip()):
        updated = human_ms(row.last_update_ms) if row.last_update_ms > 0 else ""
        print_row(fmt, row.broker_name, row.queue_id, row.min_offset, row.max_offset, updated)


@verb(
    "topicList",
    "Fetch all topic list from name server",
    option("-c", "clusterModel", "print the cluster of each topic", action="store_true"),
)
async def topic_list(admin: Admin, args: argparse.Namespace) -> None:
    topics = await admin.topic_list()
    if not args.clusterModel:
        for topic in topics:
            print(topic)
        return
    info = await admin.cluster_info()
    fmt = "%-20s  %-48s  %-48s"
    print_row(fmt, "#Cluster Name", "#Topic", "#Consumer Group")
    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        route = await admin.topic_route(topic)
        names = sorted(route.brokers)
        cluster = (info.cluster_of(names[0]) if names else None) or ""
        print_row(fmt, cluster, topic, "")


@verb(
    "deleteTopic",
    "Delete topic from broker and NameServer.",
    option("-t", "topic", "topic name", required=True),
    option("-c", "clusterName", "delete topic from which cluster", required=True),
)
async def delete_topic(admin: Admin, args: argparse.Namespace) -> None:
    topic, cluster = args.topic.strip(), args.clusterName.strip()
    await admin.delete_topic(topic, cluster)
    report_topic_deleted(topic, cluster)


def report_topic_deleted(topic: str, cluster: str) -> None:
    print(f"delete topic [{topic}] from cluster [{cluster}] success.")
    print(f"delete topic [{topic}] from NameServer success.")


@verb(
    "updateTopicPerm",
    "Update topic perm",
    *broker_or_cluster("create topic to which broker", "create topic to which cluster"),
    option("-t", "topic", "topic name", required=True),
    option("-p", "perm", "set topic's permission(2|4|6), intro[2:W; 4:R; 6:RW]", type=int,
           required=True),
)  # fmt: skip
async def update_topic_perm(admin: Admin, args: argparse.Namespace) -> int | None:
    """UpdateTopicPermSubCommand: the topic's config as the route has it (its first
    group's queue numbers and flags), with the new perm, on one master (-b, which must
    be a master of the topic) or every master of a cluster (-c)."""
    target, topic = target_kwargs(args), args.topic.strip()
    route = await admin.topic_route(topic)
    first = route.queue_datas[0]
    config = dict(read_queues=first.read_queue_nums, write_queues=first.write_queue_nums,
                  perm=args.perm)  # fmt: skip
    if "broker_addr" in target:
        address = target["broker_addr"]
        name = next((n for n, b in route.brokers.items() if b.master == address), None)
        if name is None:
            print("updateTopicPerm error broker not exit or broker is not master!.")
            return EXIT_ANSWERED_ERROR
        old = next(q.perm for q in route.queue_datas if q.broker_name == name)
        if old == args.perm:
            print("new perm equals to the old one!")
            return None
        await admin.create_topic(topic, **config, broker_addr=address)
        print(f"update topic perm from {old} to {args.perm} in {address} success.")
        print(
            f"TopicConfig [topicName={topic}, readQueueNums={first.read_queue_nums}, "
            f"writeQueueNums={first.write_queue_nums}, perm={_perm_string(args.perm)}, "
            f"topicFilterType=SINGLE_TAG, topicSysFlag={first.topic_sys_flag}, order=false]."
        )
        return None
    for address in await admin.create_topic(topic, **config, cluster=target["cluster"]):
        print(f"update topic perm from {first.perm} to {args.perm} in {address} success.")
    return None


@verb(
    "topicClusterList",
    "get cluster info for topic",
    option("-t", "topic", "topic name", required=True),
)
async def topic_cluster_list(admin: Admin, args: argparse.Namespace) -> None:
    """The clusters of the broker groups serving the topic, one a line (RocketMQ's looks
    at the route's first group only; a topic served by two clusters shows both)."""
    route = await admin.topic_route(args.topic.strip())
    info = await admin.cluster_info()
    for cluster in sorted({info.cluster_of(name) for name in route.brokers} - {None}):
        print(cluster)


@verb(
    "allocateMQ",
    "Allocate MQ",
    option("-t", "topic", "topic name", required=True),
    option("-i", "ipList", "ipList", required=True),
)
async def allocate_mq(admin: Admin, args: argparse.Namespace) -> None:
    """What AllocateMessageQueueAveragely gives each client id of -i (comma-separated)
    of the topic's readable queues, as RebalanceResult's JSON. The queues are sorted
    first, as a consumer's rebalance sorts them (RocketMQ's tool takes them in hash
    order, which no consumer sees)."""
    ips = [ip for ip in args.ipList.strip().split(",")]
    if not all(ips):
        raise UsageError(f"-i {args.ipList!r}: an empty client id")
    queues = (await admin.topic_route(args.topic.strip())).read_queues()
    result = {
        ip: [
            {"brokerName": q.broker_name, "queueId": q.queue_id, "topic": q.topic}
            for q in allocate_averagely(queues, ips, ip)
        ]
        for ip in ips
    }
    print(json.dumps({"result": result}, separators=(",", ":")))
