"""JSON as fastjson writes it for Java's admin: maps keyed by objects.

`TopicStatsTable` and `ConsumeStats` (GET_TOPIC_STATS_INFO 202, GET_CONSUME_STATS 208)
map a MessageQueue to its offsets, and fastjson writes the key as an object:
`{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":5,...}}}`,
which no standard JSON reader accepts. `loads` reads it: a map with such keys becomes a
list of (key, value) pairs; one with bare integer keys (`{0:"h:1"}`) a dict keyed by
their text, as if quoted; anything else what `json.loads` gives.

`dumps` writes it, for the broker's answers and the client's (ConsumerRunningInfo's
`mqTable`, GetConsumerStatusBody's tables): a `QueueMap` value becomes such a map,
everything else standard compact JSON with sorted keys, as fastjson sorts them.
"""

from __future__ import annotations

import json
import re

__all__ = ["QueueMap", "dumps", "loads", "queue_map_body"]

_DECODER = json.JSONDecoder()


class QueueMap(tuple):
    """A map keyed by MessageQueue: (topic, brokerName, queueId, value) entries."""


def dumps(value) -> str:
    """`value` as fastjson writes it; a QueueMap anywhere in it keyed by objects."""
    if isinstance(value, QueueMap):
        return (
            "{"
            + ",".join(
                dumps({"brokerName": b, "queueId": q, "topic": t}) + ":" + dumps(v)
                for t, b, q, v in value
            )
            + "}"
        )
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in sorted(value.items()))
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


def queue_map_body(entries: list[tuple[str, str, int, object]], **fields) -> bytes:
    """A JSON object whose `offsetTable` maps MessageQueue objects to their values
    (TopicStatsTable, ConsumeStats, a reset's offsets); `fields` are its other members.
    `entries` are (topic, brokerName, queueId, value)."""
    rest = "".join(f",{json.dumps(k)}:{dumps(v)}" for k, v in sorted(fields.items()))
    return ('{"offsetTable":' + dumps(QueueMap(entries)) + rest + "}").encode()


_BLANKS = re.compile(r"\s*")


def loads(text: str):
    """The value of `text`; ValueError naming the position of what is malformed."""
    value, end = _value(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def _skip(text: str, i: int) -> int:
    return _BLANKS.match(text, i).end()


def _value(text: str, i: int) -> tuple[object, int]:
    if text.startswith("{", i):
        return _object(text, i)
    if text.startswith("[", i):
        return _sequence(text, i, "]", _value)
    return _DECODER.raw_decode(text, i)  # a string, number, true, false or null


def _sequence(text: str, i: int, close: str, read) -> tuple[list, int]:
    """The items `read` finds between the bracket at `i` and its `close`, comma-separated."""
    items: list[object] = []
    i = _skip(text, i + 1)
    while not text.startswith(close, i):
        if items:
            if not text.startswith(",", i):
                raise ValueError(f"expected ',' at character {i}")
            i = _skip(text, i + 1)
        item, i = read(text, i)
        items.append(item)
        i = _skip(text, i)
    return items, i + 1


def _pair(text: str, i: int) -> tuple[tuple[object, object], int]:
    key, i = _value(text, i)
    i = _skip(text, i)
    if not text.startswith(":", i):
        raise ValueError(f"expected ':' at character {i}")
    value, i = _value(text, _skip(text, i + 1))
    return (key, value), i


def _object(text: str, i: int) -> tuple[object, int]:
    pairs, i = _sequence(text, i, "}", _pair)
    if all(isinstance(k, str | int) and not isinstance(k, bool) for k, _ in pairs):
        return {str(k): v for k, v in pairs}, i
    return pairs, i
