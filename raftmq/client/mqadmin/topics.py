"""Topic verbs: updateTopic, deleteTopic, topicRoute, topicStatus, topicList."""

from __future__ import annotations

import argparse
import json

from raftmq.client.admin import Admin
from raftmq.client.mqadmin.commands import (
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
        **target_kwargs(args),
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


@verb("topicRoute", "Examine topic route info", option("-t", "topic", "topic name", required=True))
async def topic_route(admin: Admin, args: argparse.Namespace) -> None:
    route = await admin.topic_route(args.topic.strip())
    print(json.dumps(_route_json(route), indent=4))


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
