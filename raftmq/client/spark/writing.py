"""What the sink writes: the columns it takes, checked on the driver, and a task's rows
turned into messages.

Columns: `body` (binary or string, required), `topic`, `keys`, `tags` (strings) and
`properties` (map<string,string>), each optional; others are ignored, so a DataFrame
read with the source (which has all of these and more) can be written back as it is.
A type that does not fit fails the query before any task runs, naming the column.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs
from pyspark.sql.types import BinaryType, DataType, MapType, StringType, StructType

from raftmq.client.spark.session import Outgoing

__all__ = ["Columns", "columns_of", "outgoing"]

_STRING = "string"
_OPTIONAL: dict[str, tuple[str, tuple[DataType, ...]]] = {
    "topic": (_STRING, (StringType(),)),
    "keys": (_STRING, (StringType(),)),
    "tags": (_STRING, (StringType(),)),
    "properties": ("map<string,string>", (MapType(StringType(), StringType(), True),)),
}


@attrs.frozen
class Columns:
    """Where each column the sink takes is in a row (None: absent), and the topic for
    rows without one (picklable: it travels to the executors with the writer)."""

    body: int
    topic: int | None
    keys: int | None
    tags: int | None
    properties: int | None
    default_topic: str | None


def _same_type(given: DataType, wanted: DataType) -> bool:
    """Equal up to the nullability of a map's values, which Spark sets as it likes."""
    if isinstance(given, MapType) and isinstance(wanted, MapType):
        return given.keyType == wanted.keyType and given.valueType == wanted.valueType
    return given == wanted


def columns_of(schema: StructType, default_topic: str | None) -> Columns:
    """The positions of the sink's columns in `schema`; ValueError names a column that is
    missing or of the wrong type."""
    names = schema.fieldNames()
    lowered = {name.lower(): i for i, name in enumerate(names)}
    if "body" not in lowered:
        raise ValueError(
            f"the rocketmq sink needs a column body (binary or string); the columns are {names}"
        )
    body_type = schema.fields[lowered["body"]].dataType
    if not isinstance(body_type, BinaryType | StringType):
        raise ValueError(f"column body must be binary or string, not {body_type.simpleString()}")
    found: dict[str, int | None] = {}
    for name, (text, types) in _OPTIONAL.items():
        position = lowered.get(name)
        if position is not None:
            given = schema.fields[position].dataType
            if not any(_same_type(given, wanted) for wanted in types):
                raise ValueError(f"column {name} must be {text}, not {given.simpleString()}")
        found[name] = position
    if found["topic"] is None and default_topic is None:
        raise ValueError("the rocketmq sink needs a column topic or the option topic")
    return Columns(body=lowered["body"], default_topic=default_topic, **found)


def outgoing(columns: Columns, rows: Iterable[tuple]) -> Iterator[Outgoing]:
    """`rows` as messages; a row without a body or a topic raises ValueError (the task
    fails: Spark reports the message)."""
    for row in rows:
        body = row[columns.body]
        if body is None:
            raise ValueError("a row with a null body: a message needs one")
        if isinstance(body, str):
            body = body.encode()
        topic = row[columns.topic] if columns.topic is not None else None
        topic = topic or columns.default_topic
        if topic is None:
            raise ValueError("a row with a null topic and no option topic")
        properties = row[columns.properties] if columns.properties is not None else None
        yield Outgoing(
            topic=topic,
            body=bytes(body),
            tags=row[columns.tags] if columns.tags is not None else None,
            keys=row[columns.keys] if columns.keys is not None else None,
            properties=dict(properties) if properties else None,
        )
