"""Message verbs: queryMsgById (either kind of id), sendMessage, checkMsgSendRT,
consumeMessage."""

from __future__ import annotations

import argparse
import contextlib
import time
import zlib
from collections.abc import Callable

from raftmq.client.admin import Admin
from raftmq.client.consumer import PullConsumer, PullStatus
from raftmq.client.errors import MQClientError
from raftmq.client.message_query import consume_message_directly, view_by_either_id
from raftmq.client.mqadmin.commands import (
    UsageError,
    human_ms,
    java_bool,
    option,
    parse_timestamp_ms,
    print_row,
    verb,
)
from raftmq.client.producer import Producer
from raftmq.client.route import MessageQueue
from raftmq.protocol.message import MessageConst, MessageExt, MessageSysFlag, inflate


def body_text(msg: MessageExt, charset: str = "utf-8") -> str:
    """The body as text: decompressed when stored compressed, undecodable bytes replaced."""
    body = msg.body or b""
    if msg.sysflag & MessageSysFlag.COMPRESSED_FLAG:
        with contextlib.suppress(zlib.error):  # else shown as stored
            body = zlib.decompress(body)
    return body.decode(charset, errors="replace")


def print_message(msg: MessageExt) -> None:
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
        ("Born Timestamp:", human_ms(msg.born_timestamp)),
        ("Store Timestamp:", human_ms(msg.store_timestamp)),
        ("Born Host:", "{}:{}".format(*msg.born_host)),
        ("Store Host:", "{}:{}".format(*msg.store_host)),
        ("System Flag:", msg.sysflag),
        ("Properties:", f"{{{properties}}}"),
        ("Message Body:", body_text(msg)),
    ):
        print_row("%-20s %s", label, value)


def direct_options() -> tuple[tuple, tuple]:
    """-g and -d: consume the message directly in one consumer (both needed)."""
    return (
        option("-g", "consumerGroup", "consumer group name"),
        option("-d", "clientId", "The consumer's client id"),
    )


def consume_result_text(result: dict) -> str:
    """ConsumeMessageDirectlyResult.toString."""

    def java(value) -> str:
        if value is None:
            return "null"
        return str(value).lower() if isinstance(value, bool) else str(value)

    fields = ("order", "autoCommit", "consumeResult", "remark", "spentTimeMills")
    return (
        f"ConsumeMessageDirectlyResult [{', '.join(f'{k}={java(result.get(k))}' for k in fields)}]"
    )


async def consume_directly(admin: Admin, args: argparse.Namespace, msg_id: str, topic) -> None:
    """pushMsg: the consumer runs its handler on the message; its result printed."""
    group, client_id = args.consumerGroup.strip(), args.clientId.strip()
    try:
        result = await consume_message_directly(admin, group, client_id, msg_id, topic)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(consume_result_text(result))


async def resend(admin: Admin, producer: Producer, msg_id: str, topic: str | None) -> None:
    """sendMsg: the message sent again to its topic, with its tags, keys and
    properties, under a new UNIQ_KEY."""
    try:
        msg = await view_by_either_id(admin, msg_id, topic)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    inflate(msg)
    properties = dict(msg.properties)
    properties.pop(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, None)
    print(f"prepare resend msg. originalMsgId={msg_id}")
    result = await producer.send(msg.topic, msg.body or b"", properties=properties)
    print(
        f"SendResult [sendStatus={result.status.name}, msgId={result.msg_id}, "
        f"offsetMsgId={result.offset_msg_id}, messageQueue={mq_text(result.message_queue)}, "
        f"queueOffset={result.queue_offset}]"
    )


@verb(
    "queryMsgById",
    "Query Message by Id",
    option(
        "-i", "msgId", "Message Id (offset msgIds or UNIQ_KEYs, comma separated)", required=True
    ),
    option("-t", "topic", "The topic, to look an id up as a UNIQ_KEY too"),
    *direct_options(),
    option("-s", "sendMessage", "resend message (true: send each message again to its topic)"),
)
async def query_msg_by_id(admin: Admin, args: argparse.Namespace) -> None:
    topic = args.topic.strip() if args.topic else None
    msg_ids = [i.strip() for i in args.msgId.split(",") if i.strip()]
    if args.consumerGroup and args.clientId:
        for msg_id in msg_ids:
            await consume_directly(admin, args, msg_id, topic)
        return
    if args.sendMessage is not None:
        if not java_bool(args.sendMessage):
            return
        async with Producer(
            admin.namesrv_addrs, "ReSendMsgById", tls=admin.tls, credentials=admin.credentials
        ) as producer:
            for msg_id in msg_ids:
                await resend(admin, producer, msg_id, topic)
        return
    for n, msg_id in enumerate(msg_ids):
        try:
            msg = await view_by_either_id(admin, msg_id, topic)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if n:
            print()
        print_message(msg)


def mq_text(mq: MessageQueue) -> str:
    """MessageQueue.toString."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


@verb(
    "sendMessage",
    "Send a message",
    option("-t", "topic", "Topic name", required=True),
    option("-p", "body", "UTF-8 string format of the message body", required=True),
    option("-k", "key", "Message keys"),
    option("-c", "tags", "Message tags"),
    option("-b", "broker", "Send message to target broker"),
    option("-i", "qid", "Send message to target queue", type=int),
)
async def send_message(admin: Admin, args: argparse.Namespace) -> None:
    topic = args.topic.strip()
    if args.qid is not None and args.broker is None:
        raise UsageError("Broker name must be set if the queue is chosen!")
    queue = None if args.qid is None else MessageQueue(topic, args.broker.strip(), args.qid)
    group = str(int(time.time() * 1000))  # as SendMessageCommand names its producer
    async with Producer(
        admin.namesrv_addrs, group, tls=admin.tls, credentials=admin.credentials
    ) as producer:
        result = await producer.send(
            topic,
            args.body.strip().encode("utf-8"),
            tags=args.tags and args.tags.strip(),
            keys=args.key and args.key.strip(),
            queue=queue,
        )
    fmt = "%-32s  %-4s  %-20s    %s"
    print_row(fmt, "#Broker Name", "#QID", "#Send Result", "#MsgId")
    mq = result.message_queue
    print_row(fmt, mq.broker_name, mq.queue_id, result.status.name, result.msg_id)


@verb(
    "checkMsgSendRT",
    "check message send response time",
    option("-t", "topic", "topic name", required=True),
    option("-a", "amount", "message amount | default 100", type=int, default=100),
    option("-s", "size", "message size | default 128 Byte", type=int, default=128),
)
async def check_msg_send_rt(admin: Admin, args: argparse.Namespace) -> None:
    """CheckMsgSendRTCommand: `amount` sends of `size` bytes, send i to the topic's
    writable queue i (mod their number); each send's result and time in ms, then the
    mean time of all but the first."""
    if args.amount < 2:
        raise UsageError("-a: at least 2 messages (the first is not timed)")
    topic = args.topic.strip()
    queues = (await admin.topic_route(topic)).write_queues()
    if not queues:
        raise UsageError(f"topic {topic} has no writable queue")
    fmt = "%-32s  %-4s  %-20s    %s"
    print_row(fmt, "#Broker Name", "#QID", "#Send Result", "#RT")
    body, elapsed_ms = b"a" * args.size, 0
    async with Producer(
        admin.namesrv_addrs, str(int(time.time() * 1000)), tls=admin.tls,
        credentials=admin.credentials,
    ) as producer:  # fmt: skip
        for n in range(args.amount):
            mq = queues[n % len(queues)]
            start_ms = time.time() * 1000
            try:
                await producer.send(topic, body, queue=mq)
                sent = True
            except MQClientError:
                sent = False
            rt_ms = int(time.time() * 1000 - start_ms)
            if n:
                elapsed_ms += rt_ms
            print_row(fmt, mq.broker_name, mq.queue_id, str(sent).lower(), rt_ms)
    print(f"Avg RT: {elapsed_ms / (args.amount - 1):.2f}")


def message_line(msg: MessageExt, broker_name: str, body: str) -> str:
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
    return f"MSGID: {msg.uniq_key or msg.msg_id} {described} BODY: {body}"


@verb(
    "consumeMessage",
    "Consume message",
    option("-t", "topic", "Topic name", required=True),
    option("-b", "brokerName", "Broker name"),
    option("-i", "queueId", "Queue Id", type=int),
    option("-o", "offset", "Queue offset", type=int),
    option("-g", "consumerGroup", "Consumer group name"),
    option("-s", "beginTimestamp", "Begin timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    option("-e", "endTimestamp", "End timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]"),
    option("-c", "MessageNumber", "Number of message to be consumed", type=int, default=128),
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
    begin_ms = parse_timestamp_ms(args.beginTimestamp.strip()) if args.beginTimestamp else 0
    end_ms = parse_timestamp_ms(args.endTimestamp.strip()) if args.endTimestamp else 0
    group = (args.consumerGroup or "TOOLS_CONSUMER").strip()
    async with PullConsumer(
        admin.namesrv_addrs, group, tls=admin.tls, credentials=admin.credentials
    ) as consumer:

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
                await print_queue(consumer, mq, low, high)
            return
        mq = MessageQueue(topic, args.brokerName.strip(), args.queueId)
        low, high = await span(mq)
        offset = args.offset or 0
        if offset > high:
            print(f"{mq_text(mq)} no matched msg, offset={offset}")
            return
        low = max(low, offset)
        if high - low > count:
            print(f"The oldler {count} message will be provided")
            high = low + count - 1
        await print_queue(consumer, mq, low, high)


async def print_queue(
    consumer: PullConsumer,
    mq: MessageQueue,
    low: int,
    high: int,
    *,
    subscription: str = "*",
    body: Callable[[MessageExt], str] = body_text,
    consume_ok: bool = True,
) -> None:
    """Messages [low, high] of `mq` that `subscription` selects, a pull at a time, until
    the queue has no more: consumeMessage's lines (`consume_ok`) or printMsg's."""
    offset = low
    while offset <= high:
        result = await consumer.pull(
            mq, offset, min(32, high - offset + 1), subscription=subscription
        )
        offset = result.next_begin_offset
        if result.status is PullStatus.FOUND:
            if consume_ok:
                print("Consume ok")
            for msg in result.messages:
                print(message_line(msg, mq.broker_name, body(msg)))
        elif result.status is PullStatus.NO_MATCHED_MSG:
            print(f"{mq_text(mq)} no matched msg. status={result.status.name}, offset={offset}")
        else:
            status = result.status.name
            print(f"{mq_text(mq)} print msg finished. status={status}, offset={offset}")
            return
