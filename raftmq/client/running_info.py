"""What a push consumer tells the brokers about itself, for `mqadmin`.

GET_CONSUMER_RUNNING_INFO (307, `mqadmin consumerStatus`): ConsumerRunningInfo — the
consumer's settings as Java's `properties`, its subscriptions, and per owned queue a
ProcessQueueInfo (the offset it would commit; the messages pulled and not yet consumed,
their lowest and highest offsets; when it last pulled and last consumed). Its
`statusTable` (Java's pull and consume rates per topic) is left empty: the consumer does
not measure them, and a row of zeros would say it did.

GET_CONSUMER_STATUS_FROM_CLIENT (221, `mqadmin getConsumerStatus`): GetConsumerStatusBody,
the offsets of one topic's owned queues.

Both bodies are fastjson's (maps keyed by MessageQueue), as the Java tools read them.
"""

from __future__ import annotations

import datetime

import attrs

from raftmq.client.route import MessageQueue
from raftmq.protocol.fastjson import QueueMap, dumps

__all__ = ["QueueState", "consumer_status_body", "running_info_body"]

CLIENT_VERSION = "V4_9_8"  # MQVersion's name of the version the heartbeat sends


@attrs.frozen
class QueueState:
    """One owned queue, as the consumer sees it now."""

    mq: MessageQueue
    commit_offset: int
    cached_offsets: frozenset[int]  # pulled, handed to the handler and not yet done
    last_pull_ms: int
    last_consume_ms: int

    def process_queue_info(self) -> dict:
        cached = sorted(self.cached_offsets)
        return {
            "commitOffset": self.commit_offset,
            "cachedMsgMinOffset": cached[0] if cached else 0,
            "cachedMsgMaxOffset": cached[-1] if cached else 0,
            "cachedMsgCount": len(cached),
            "cachedMsgSizeInMiB": 0,
            "transactionMsgMinOffset": 0,
            "transactionMsgMaxOffset": 0,
            "transactionMsgCount": 0,
            "locked": False,
            "tryUnlockTimes": 0,
            "lastLockTimestamp": 0,
            "droped": False,
            "lastPullTimestamp": self.last_pull_ms,
            "lastConsumeTimestamp": self.last_consume_ms,
        }


def java_timestamp(ms: int) -> str:
    """DefaultMQPushConsumer.consumeTimestamp's form, yyyyMMddHHmmss (local time)."""
    return f"{datetime.datetime.fromtimestamp(ms / 1000):%Y%m%d%H%M%S}"


def running_info_body(
    properties: dict[str, str], subscriptions: list[dict], queues: list[QueueState]
) -> bytes:
    """ConsumerRunningInfo's JSON."""
    doc = {
        "properties": {
            **properties,
            "PROP_CONSUMEORDERLY": "false",
            "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY",
            "PROP_CLIENT_VERSION": CLIENT_VERSION,
        },
        "subscriptionSet": subscriptions,
        "mqTable": QueueMap(
            (q.mq.topic, q.mq.broker_name, q.mq.queue_id, q.process_queue_info())
            for q in sorted(queues, key=lambda q: q.mq)
        ),
        "statusTable": {},
    }
    return dumps(doc).encode()


def consumer_status_body(topic: str, queues: list[QueueState]) -> bytes:
    """GetConsumerStatusBody: `topic`'s owned queues and their offsets."""
    table = QueueMap(
        (q.mq.topic, q.mq.broker_name, q.mq.queue_id, q.commit_offset)
        for q in sorted(queues, key=lambda q: q.mq)
        if q.mq.topic == topic
    )
    return dumps({"consumerTable": {}, "messageQueueTable": table}).encode()
