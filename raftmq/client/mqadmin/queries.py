"""Message queries: queryMsgByKey, queryMsgByUniqueKey, queryMsgByOffset,
queryMsgTraceById, printMsg, printMsgByQueue, queryCq.

Outputs are RocketMQ's (`QueryMsgByKeySubCommand`, `QueryMsgByUniqueKeySubCommand`,
`QueryMsgByOffsetSubCommand`, `QueryMsgTraceByIdSubCommand`, `PrintMessageSubCommand`,
`PrintMessageByQueueCommand`, `QueryConsumeQueueCommand`);
the detail print is
queryMsgById's, with the body inline.
"""

from __future__ import annotations

import argparse
import codecs
import datetime
import json
from collections import Counter

from raftmq.client.admin import Admin
from raftmq.client.consumer import PullConsumer, PullStatus
from raftmq.client.message_query import (
    END_OF_TIME_MS,
    MAX_KEY_HITS,
    message_at,
    query_all_by_unique_key,
    query_by_key,
    query_traces,
)
from raftmq.client.mqadmin.commands import (
    UsageError,
    format_row,
    java_bool,
    option,
    parse_timestamp_ms,
    print_row,
    verb,
)
from raftmq.client.mqadmin.messages import (
    body_text,
    consume_directly,
    direct_options,
    message_line,
    mq_text,
    print_message,
    print_queue,
)
from raftmq.client.route import MessageQueue
from raftmq.client.trace import TRACE_TOPIC, TraceRecord, TraceType
from raftmq.protocol.message import MessageExt
from raftmq.remoting import RequestCode


@verb(
    "queryMsgByKey",
    "Query Message by Key",
    option("-t", "topic", "topic name", required=True),
    option("-k", "msgKey", "Message Key", required=True),
)
async def query_msg_by_key(admin: Admin, args: argparse.Namespace) -> None:
    messages = await query_by_key(admin, args.topic.strip(), args.msgKey.strip(), MAX_KEY_HITS)
    print_row("%-50s %4s %40s", "#Message ID", "#QID", "#Offset")
    for msg in messages:
        print_row("%-50s %4d %40d", msg.uniq_key or msg.msg_id, msg.queue_id, msg.queue_offset)


@verb(
    "queryMsgByUniqueKey",
    "Query Message by Unique key",
    option("-i", "msgId", "Message Id", required=True),
    option("-t", "topic", "The topic of msg", required=True),
    *direct_options(),
    option("-a", "showAll", "Print all message, the limit is 32", action="store_true"),
)
async def query_msg_by_unique_key(admin: Admin, args: argparse.Namespace) -> None:
    topic, uniq_key = args.topic.strip(), args.msgId.strip()
    if args.consumerGroup and args.clientId:
        await consume_directly(admin, args, uniq_key, topic)
        return
    messages = await query_all_by_unique_key(admin, topic, uniq_key)
    for n, msg in enumerate(messages if args.showAll else messages[:1]):
        if n:
            print()
        print_message(msg)


TRACE_ROW = "%-10s %-20s %-20s %-20s %-10s %-10s"
PUB_HEADER = ("#Type", "#ProducerGroup", "#ClientHost", "#SendTime", "#CostTimes", "#Status")
SUB_HEADER = ("#Type", "#ConsumerGroup", "#ClientHost", "#ConsumerTime", "#CostTimes", "#Status")


def _trace_row(kind: str, record: TraceRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.timestamp_ms / 1000)
    status = "success" if record.success else "failed"
    time_text = f"{moment:%Y-%m-%d %H:%M:%S}"
    return format_row(
        TRACE_ROW, kind, record.group, record.client_host, time_text, f"{record.cost_ms}ms", status
    )


def trace_table(records: list[TraceRecord]) -> list[str]:
    """`QueryMsgTraceByIdSubCommand.printMessageTrace`'s lines: each Pub under its own
    header, then each consumer group's SubAfter records (as "Sub") under one header;
    groups in name order (Java's follow a HashMap's)."""
    lines = []
    by_group: dict[str, list[TraceRecord]] = {}
    for record in records:
        if record.type is TraceType.Pub:
            lines += [format_row(TRACE_ROW, *PUB_HEADER), _trace_row("Pub", record), ""]
        elif record.type is TraceType.SubAfter:
            by_group.setdefault(record.group, []).append(record)
    for group in sorted(by_group):
        lines.append(format_row(TRACE_ROW, *SUB_HEADER))
        lines += [_trace_row("Sub", record) for record in by_group[group]]
        lines.append("")
    return lines


@verb(
    "queryMsgTraceById",
    "Query a message trace.",
    option("-i", "msgId", "Message Id", required=True),
    option("-t", "traceTopic", "The name value of message trace topic"),
    option("-b", "beginTimestamp", "Begin timestamp(ms). default:0", type=int),
    option("-e", "endTimestamp", "End timestamp(ms). default:Long.MAX_VALUE", type=int),
    option("-c", "maxNum", "The maximum number of messages returned, default:64", type=int),
    alias="QueryMsgTraceById",
)
async def query_msg_trace_by_id(admin: Admin, args: argparse.Namespace) -> None:
    records = await query_traces(
        admin,
        args.msgId.strip(),
        args.traceTopic.strip() if args.traceTopic else TRACE_TOPIC,
        MAX_KEY_HITS if args.maxNum is None else args.maxNum,
        args.beginTimestamp or 0,
        END_OF_TIME_MS if args.endTimestamp is None else args.endTimestamp,
    )
    for line in trace_table(records):
        print(line)


@verb(
    "queryMsgByOffset",
    "Query Message by offset",
    option("-t", "topic", "topic name", required=True),
    option("-b", "brokerName", "Broker Name", required=True),
    option("-i", "queueId", "Queue Id", type=int, required=True),
    option("-o", "offset", "Queue Offset", type=int, required=True),
)
async def query_msg_by_offset(admin: Admin, args: argparse.Namespace) -> None:
    mq = MessageQueue(args.topic.strip(), args.brokerName.strip(), args.queueId)
    msg = await message_at(admin, mq, args.offset)
    if msg is not None:
        print_message(msg)


@verb(
    "printMsg",
    "Print Message Detail",
    option("-t", "topic", "Topic name", required=True),
    option("-c", "charsetName", "CharsetName(eg: UTF-8,GBK)"),
    option("-s", "subExpression", "Subscribe Expression(eg: TagA || TagB)"),
    option("-b", "beginTimestamp", "Begin timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    option("-e", "endTimestamp", "End timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    option("-d", "printBody", "print body"),
)
async def print_msg(admin: Admin, args: argparse.Namespace) -> None:
    """PrintMessageSubCommand: every queue of the topic, between two store times, the
    messages a tag expression selects, bodies in a charset (or "NOT PRINT BODY")."""
    topic = args.topic.strip()
    charset = args.charsetName.strip() if args.charsetName else "UTF-8"
    try:
        codecs.lookup(charset)
    except LookupError:
        raise UsageError(f"unknown charsetName {charset!r}") from None
    subscription = args.subExpression.strip() if args.subExpression else "*"
    print_body = args.printBody is None or args.printBody.strip().lower() == "true"

    def body(msg: MessageExt) -> str:
        return body_text(msg, charset) if print_body else "NOT PRINT BODY"

    begin_ms = parse_timestamp_ms(args.beginTimestamp.strip()) if args.beginTimestamp else 0
    end_ms = parse_timestamp_ms(args.endTimestamp.strip()) if args.endTimestamp else 0
    async with PullConsumer(
        admin.namesrv_addrs, "TOOLS_CONSUMER", tls=admin.tls, credentials=admin.credentials
    ) as consumer:
        for mq in await consumer.fetch_queues(topic):
            low = await consumer.search_offset(mq, begin_ms) if begin_ms else None
            if low is None:
                low = await consumer.min_offset(mq)
            high = await consumer.max_offset(mq)
            if end_ms:
                high = await consumer.search_offset(mq, end_ms)
            print(f"minOffset={low}, maxOffset={high}, {mq_text(mq)}")
            await print_queue(
                consumer, mq, low, high - 1, subscription=subscription, body=body, consume_ok=False
            )
            print("-" * 56)


@verb(
    "printMsgByQueue",
    "Print Message Detail",
    option("-t", "topic", "topic name", required=True),
    option("-a", "brokerName", "broker name", required=True),
    option("-i", "queueId", "queue id", type=int, required=True),
    option("-c", "charsetName", "CharsetName(eg: UTF-8,GBK)", default="UTF-8"),
    option("-s", "subExpression", "Subscribe Expression(eg: TagA || TagB)", default="*"),
    option("-b", "beginTimestamp", "Begin timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    option("-e", "endTimestamp", "End timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    option("-p", "printMsg", "print msg. eg: true | false(default)", default="false"),
    option("-d", "printBody", "print body. eg: true | false(default)", default="false"),
    option("-f", "calculate", "calculate by tag. eg: true | false(default)", default="false"),
)
async def print_msg_by_queue(admin: Admin, args: argparse.Namespace) -> None:
    """PrintMessageByQueueCommand: one queue's messages between two store times that the
    expression selects, each printed (-p) with its body (-d), then (-f) how many of
    each tag, most first."""
    charset = args.charsetName.strip()
    try:
        codecs.lookup(charset)
    except LookupError:
        raise UsageError(f"unknown charsetName {charset!r}") from None
    print_msgs, print_body = java_bool(args.printMsg), java_bool(args.printBody)
    mq = MessageQueue(args.topic.strip(), args.brokerName.strip(), args.queueId)
    tags: Counter[str] = Counter()
    async with PullConsumer(
        admin.namesrv_addrs, "TOOLS_CONSUMER", tls=admin.tls, credentials=admin.credentials
    ) as consumer:
        low, high = await consumer.min_offset(mq), await consumer.max_offset(mq)
        if args.beginTimestamp:
            low = await consumer.search_offset(mq, parse_timestamp_ms(args.beginTimestamp.strip()))
        if args.endTimestamp:
            high = await consumer.search_offset(mq, parse_timestamp_ms(args.endTimestamp.strip()))
        offset = low
        while offset < high:
            result = await consumer.pull(mq, offset, 32, subscription=args.subExpression.strip())
            offset = result.next_begin_offset
            if result.status is not PullStatus.FOUND:
                break
            for msg in result.messages:
                if msg.tags and msg.tags.strip():
                    tags[msg.tags] += 1
                if print_msgs:
                    body = body_text(msg, charset) if print_body else "NOT PRINT BODY"
                    print(message_line(msg, mq.broker_name, body))
    if java_bool(args.calculate):
        for tag, count in sorted(tags.items(), key=lambda item: (-item[1], item[0])):
            print_row("Tag: %-30s Count: %s", tag, count)


def _cq_entry_text(entry: dict) -> str:
    """ConsumeQueueData.toString (no extension data: raftmq writes no ConsumeQueueExt)."""

    def quoted(key: str) -> str:
        value = entry.get(key)
        return "'null'" if value is None else f"'{value}'"

    return (
        f"ConsumeQueueData{{physicOffset={entry.get('physicOffset')}, "
        f"physicSize={entry.get('physicSize')}, tagsCode={entry.get('tagsCode')}, "
        f"extendDataJson={quoted('extendDataJson')}, bitMap={quoted('bitMap')}, "
        f"eval={str(bool(entry.get('eval'))).lower()}, msg={quoted('msg')}}}"
    )


@verb(
    "queryCq",
    "Query cq command.",
    option("-t", "topic", "topic name", required=True),
    option("-q", "queue", "queue num, ie. 1", type=int, required=True),
    option("-i", "index", "start queue index.", type=int, required=True),
    option("-c", "count", "how many.", type=int, default=10),
    option("-b", "broker", "broker addr."),
    option("-g", "consumer", "consumer group."),
)
async def query_cq(admin: Admin, args: argparse.Namespace) -> None:
    """`count` ConsumeQueue entries from `index`, read on -b or on the master of the
    topic's first broker group."""
    topic = args.topic.strip()
    broker = args.broker.strip() if args.broker else None
    if broker is None:
        route = await admin.topic_route(topic)
        broker = route.master(sorted(route.brokers)[0]) if route.brokers else None
        if broker is None:
            raise UsageError(f"No topic route data! (no master serves {topic})")
    ext = {"topic": topic, "queueId": args.queue, "index": args.index, "count": args.count}
    if args.consumer:
        ext["consumerGroup"] = args.consumer.strip()
    doc = await admin.broker_json(broker, RequestCode.QUERY_CONSUME_QUEUE, ext)
    rule = "======================================"
    if doc.get("subscriptionData") is not None:
        pretty = json.dumps(doc["subscriptionData"], indent="\t", separators=(",", ":"))
        print(f"Subscription data: \n{pretty}")
        print(rule)
    if doc.get("filterData") is not None:
        print(f"Filter data: \n{doc['filterData']}")
        print(rule)
    print(f"Queue data: \nmax: {doc.get('maxQueueIndex')}, min: {doc.get('minQueueIndex')}")
    print(rule)
    for n, entry in enumerate(doc.get("queueData") or (), args.index):
        print(f"idx: {n}")
        print(_cq_entry_text(entry))
        print(rule)
