"""The source's options, checked once on the driver and carried to the executors.

Spark hands a data source a case-insensitive dict of strings; `SourceOptions.parse`
turns it into a frozen, picklable value, so a typo or a bad number fails the query
when it is defined, with the option's name, instead of in an executor later.
Names follow the Kafka source and apache/rocketmq-externals' rocketmq-spark where
they mean the same thing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from raftmq.client.instance import parse_namesrv_addrs
from raftmq.client.spark.offsets import EARLIEST, split_key

__all__ = ["SourceOptions"]

DEFAULT_GROUP = "raftmq-spark"  # what pulls name when no consumerGroup is given


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

    @property
    def group(self) -> str:
        return self.consumer_group or DEFAULT_GROUP

    @classmethod
    def parse(cls, given: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Spark's options (names in any case) checked; ValueError names the bad one."""
        options = _Lower(given)
        namesrv = options.get("nameSrvAddr")
        if not namesrv:
            raise ValueError('option nameSrvAddr is required (e.g. "127.0.0.1:9876")')
        parse_namesrv_addrs(namesrv)
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
            starting=starting,
            starting_timestamp_ms=timestamp,
            ending=ending,
            max_messages_per_trigger=_positive(options, "maxMessagesPerTrigger", None),
            fail_on_data_loss=_boolean(options, "failOnDataLoss", True),
            consumer_group=options.get("consumerGroup") or None,
            pull_timeout_s=_positive(options, "pullTimeoutMs", 60_000) / 1000,
            fetch_timeout_s=_positive(options, "fetchOffset.timeoutMs", 15_000) / 1000,
        )
