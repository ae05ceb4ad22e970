"""Message queries: queryMsgByKey, queryMsgByUniqueKey, queryMsgByOffset, printMsg.

Outputs are RocketMQ's (`QueryMsgByKeySubCommand`, `QueryMsgByUniqueKeySubCommand`,
`QueryMsgByOffsetSubCommand`, `PrintMessageSubCommand`); the detail print is
queryMsgById's, with the body inline.
"""

from __future__ import annotations

import argparse
import codecs

from raftmq.client.admin import Admin
from raftmq.client.consumer import PullConsumer
from raftmq.client.message_query import (
    MAX_KEY_HITS,
    message_at,
    query_all_by_unique_key,
    query_by_key,
)
from raftmq.client.mqadmin.commands import (
    UsageError,
    option,
    parse_timestamp_ms,
    print_row,
    verb,
)
from raftmq.client.mqadmin.messages import (
    body_text,
    consume_directly,
    direct_options,
    mq_text,
    print_message,
    print_queue,
)
from raftmq.client.route import MessageQueue
from raftmq.protocol.message import MessageExt


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
