"""JSON as fastjson writes it for Java's admin: maps keyed by objects.

`TopicStatsTable` and `ConsumeStats` (GET_TOPIC_STATS_INFO 202, GET_CONSUME_STATS 208)
map a MessageQueue to its offsets, and fastjson writes the key as an object:
`{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":5,...}}}`,
which no standard JSON reader accepts. `loads` reads it: a map with such keys becomes a
list of (key, value) pairs; one with bare integer keys (`{0:"h:1"}`) a dict keyed by
their text, as if quoted; anything else what `json.loads` gives.
"""

from __future__ import annotations

import json
import re

__all__ = ["loads"]

_DECODER = json.JSONDecoder()
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
        return _array(text, i)
    return _DECODER.raw_decode(text, i)  # a string, number, true, false or null


def _expect(text: str, i: int, what: str) -> None:
    if not text.startswith(what, i):
        raise ValueError(f"expected {what!r} at character {i}")


def _object(text: str, i: int) -> tuple[object, int]:
    pairs: list[tuple[object, object]] = []
    i = _skip(text, i + 1)
    while not text.startswith("}", i):
        if pairs:
            _expect(text, i, ",")
            i = _skip(text, i + 1)
        key, i = _value(text, i)
        i = _skip(text, i)
        _expect(text, i, ":")
        value, i = _value(text, _skip(text, i + 1))
        pairs.append((key, value))
        i = _skip(text, i)
    if all(isinstance(k, str | int) and not isinstance(k, bool) for k, _ in pairs):
        return {str(k): v for k, v in pairs}, i + 1
    return pairs, i + 1


def _array(text: str, i: int) -> tuple[list, int]:
    items: list[object] = []
    i = _skip(text, i + 1)
    while not text.startswith("]", i):
        if items:
            _expect(text, i, ",")
            i = _skip(text, i + 1)
        item, i = _value(text, i)
        items.append(item)
        i = _skip(text, i)
    return items, i + 1
