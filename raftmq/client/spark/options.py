"""The source's and the sink's options, checked once on the driver and carried to the
executors.

Spark hands a data source a case-insensitive dict of strings; `SourceOptions.parse`
turns it into a frozen, picklable value, so a typo or a bad number fails the query
when it is defined, with the option's name, instead of in an executor later.
Names follow the Kafka source and apache/rocketmq-externals' rocketmq-spark where
they mean the same thing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from raftmq.client.consumer import SQL92, TAG, MessageSelector
from raftmq.client.instance import parse_namesrv_addrs
from raftmq.client.spark.exactly_once import RECORDS_TOPIC
from raftmq.client.spark.offsets import EARLIEST, split_key

__all__ = ["SinkOptions", "SourceOptions"]

DEFAULT_GROUP = "raftmq-spark"  # what pulls name when no consumerGroup is given
DEFAULT_PRODUCER_GROUP = "raftmq-spark-sink"  # what the sink sends as without producerGroup
NO_TAG = "raftmq-spark: no tag"  # a TAG expression that selects nothing (see with_tags)


def _offsets_json(name: str, text: str) -> dict[str, int]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(
            f'option {name}: "earliest", "latest" or JSON like {{"RaftNode00:0": 42}}, not {text!r}'
        ) from None
    if not isinstance(doc, dict):
        raise ValueError(f"option {name}: a JSON object of <brokerName>:<queueId> -> offset")
    for key, value in doc.items():
        split_key(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
            raise ValueError(f"option {name}: offset of {key} must be an integer >= -2")
    return doc


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {name}: an integer, not {text!r}") from None
    if value <= 0:
        raise ValueError(f"option {name} must be positive, not {value}")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ValueError(f'option {name}: "true" or "false", not {text!r}')
    return text.strip().lower() == "true"


class _Lower(dict):
    """Option names in any case, as Spark treats them."""

    def __init__(self, given: Mapping[str, str]) -> None:
        super().__init__((str(k).lower(), v) for k, v in given.items())

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


@dataclass(frozen=True)
class SourceOptions:
    namesrv_addr: str
    topic: str
    starting: str | dict[str, int]  # "earliest" | "latest" | "timestamp" | offsets
    starting_timestamp_ms: int | None
    ending: str | dict[str, int]  # batch reads only: "latest" | offsets
    max_messages_per_trigger: int | None
    fail_on_data_loss: bool
    consumer_group: str | None
    pull_timeout_s: float  # an executor gives up on a queue that makes no progress this long
    fetch_timeout_s: float  # the driver keeps asking for offsets this long
    selector: MessageSelector  # what the brokers hand out (subExpression)
    push_filters: bool  # batch reads: Spark's filters on the tags column go to the brokers

    @property
    def group(self) -> str:
        return self.consumer_group or DEFAULT_GROUP

    @property
    def filtered(self) -> bool:
        """Whether pulls skip messages: then offsets jump past those not selected."""
        return self.selector.expression_type != TAG or self.selector.expression.strip() != "*"

    def with_tags(self, tags: frozenset[str]) -> SourceOptions:
        """These options reading only messages tagged one of `tags` (a filter Spark pushed
        down), as well as what `subExpression` already selects; an SQL92 selector is kept
        as it is (the caller leaves the filter to Spark)."""
        assert self.selector.expression_type == TAG and tags
        given = self.selector.expression.strip()
        if given != "*":
            tags = tags & {t.strip() for t in given.split("||")}
        # an empty intersection selects nothing: a tag no message can carry (RocketMQ's
        # tags never contain "||", so this one cannot be a real message's)
        expression = " || ".join(sorted(tags)) if tags else NO_TAG
        return replace(self, selector=MessageSelector.by_tag(expression))

    @classmethod
    def parse(cls, given: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Spark's options (names in any case) checked; ValueError names the bad one."""
        options = _Lower(given)
        namesrv = _namesrv(options)
        topic = options.get("topic")
        if not topic:
            raise ValueError("option topic is required")

        starting_text = options.get("startingOffsets", "latest" if streaming else "earliest")
        starting: str | dict[str, int] = starting_text.strip().lower()
        if starting not in ("earliest", "latest", "timestamp"):
            starting = _offsets_json("startingOffsets", starting_text)
        timestamp = _positive(options, "startingTimestamp", None)
        if (starting == "timestamp") != (timestamp is not None):
            raise ValueError(
                'startingOffsets "timestamp" and option startingTimestamp (epoch ms) go together'
            )

        ending_text = options.get("endingOffsets")
        if ending_text is not None and streaming:
            raise ValueError("option endingOffsets is for batch reads (spark.read) only")
        ending: str | dict[str, int] = (ending_text or "latest").strip().lower()
        if ending != "latest":
            ending = _offsets_json("endingOffsets", ending_text)

        return cls(
            namesrv_addr=namesrv,
            topic=topic,
            selector=_selector(options),
            push_filters=_boolean(options, "pushFilters", False),
            starting=starting,
            starting_timestamp_ms=timestamp,
            ending=ending,
            max_messages_per_trigger=_positive(options, "maxMessagesPerTrigger", None),
            fail_on_data_loss=_boolean(options, "failOnDataLoss", True),
            consumer_group=options.get("consumerGroup") or None,
            pull_timeout_s=_positive(options, "pullTimeoutMs", 60_000) / 1000,
            fetch_timeout_s=_positive(options, "fetchOffset.timeoutMs", 15_000) / 1000,
        )


def _selector(options: Mapping[str, str]) -> MessageSelector:
    """subExpression (a TAG expression, "*" by default, as RocketMQ's connectors name it)
    and subExpressionType (TAG or SQL92: the brokers then need enablePropertyFilter)."""
    expression = options.get("subExpression", "*").strip() or "*"
    kind = options.get("subExpressionType", TAG).strip().upper()
    if kind == TAG:
        return MessageSelector.by_tag(expression)
    if kind == SQL92:
        if expression == "*":
            raise ValueError("option subExpression: an SQL92 expression is required")
        return MessageSelector.by_sql(expression)
    raise ValueError(f"option subExpressionType: TAG or SQL92, not {kind!r}")


def _namesrv(options: Mapping[str, str]) -> str:
    namesrv = options.get("nameSrvAddr")
    if not namesrv:
        raise ValueError('option nameSrvAddr is required (e.g. "127.0.0.1:9876")')
    parse_namesrv_addrs(namesrv)
    return namesrv


@dataclass(frozen=True)
class SinkOptions:
    namesrv_addr: str
    topic: str | None  # for rows without a topic column or with a null one
    producer_group: str
    sends_in_flight: int  # per task: sends awaiting their result at once
    send_timeout_s: float  # one send, retries included, before the task fails
    query_id: str | None  # exactly-once: names the query in its batch records; else None
    records_topic: str  # exactly-once: where committed batches are recorded

    @property
    def exactly_once(self) -> bool:
        return self.query_id is not None

    @classmethod
    def parse(cls, given: Mapping[str, str], *, streaming: bool) -> SinkOptions:
        """Spark's options (names in any case) checked; ValueError names the bad one."""
        options = _Lower(given)
        exactly_once = _boolean(options, "exactlyOnce", False)
        if exactly_once and not streaming:
            raise ValueError("option exactlyOnce is for streaming writes (writeStream) only")
        query_id = options.get("queryId") or options.get("checkpointLocation") or None
        if exactly_once and query_id is None:
            raise ValueError(
                "option exactlyOnce needs option queryId or a checkpointLocation: it names "
                "the query in the records of its committed batches"
            )
        return cls(
            namesrv_addr=_namesrv(options),
            topic=options.get("topic") or None,
            producer_group=options.get("producerGroup") or DEFAULT_PRODUCER_GROUP,
            sends_in_flight=_positive(options, "sendsInFlight", 64),
            send_timeout_s=_positive(options, "sendTimeoutMs", 10_000) / 1000,
            query_id=query_id if exactly_once else None,
            records_topic=options.get("recordsTopic") or RECORDS_TOPIC,
        )
