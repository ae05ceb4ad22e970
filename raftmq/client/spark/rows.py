"""The source's columns, and pulled messages turned into Arrow record batches.

`read` yields pyarrow RecordBatches rather than tuples: Spark then skips its per-value
Python conversion, which costs more than the pull itself. Spark checks a batch's
schema against the declared one with `pa.Schema.equals`, so the Arrow schema is
derived from `SCHEMA` by Spark's own converter, never written twice.

`msgId` is what RocketMQ's Java client returns from `getMsgId()` for a consumed
message: the producer's UNIQ_KEY when it set one (it is also what a send result
reports), else the offset msgId (store host + physical offset). Timestamps are the
epoch milliseconds the record carries, as TIMESTAMP.
"""

from __future__ import annotations

import functools

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from raftmq.protocol.message import MessageExt

__all__ = ["SCHEMA", "to_batch"]

SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("brokerName", StringType()),
        StructField("queueId", IntegerType()),
        StructField("queueOffset", LongType()),
        StructField("msgId", StringType()),
        StructField("keys", StringType()),
        StructField("tags", StringType()),
        StructField("body", BinaryType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("bornTimestamp", TimestampType()),
        StructField("storeTimestamp", TimestampType()),
    ]
)


@functools.cache
def arrow_schema() -> pa.Schema:
    return to_arrow_schema(SCHEMA, timezone="UTC")


def to_batch(broker_name: str, messages: list[MessageExt]) -> pa.RecordBatch:
    """One record batch of `messages`, pulled from `broker_name`, in their order."""
    schema = arrow_schema()
    n = len(messages)
    columns = [
        [m.topic for m in messages],
        [broker_name] * n,
        [m.queue_id for m in messages],
        [m.queue_offset for m in messages],
        [m.uniq_key or m.msg_id for m in messages],
        [m.keys for m in messages],
        [m.tags for m in messages],
        [m.body for m in messages],
        [list(m.properties.items()) for m in messages],
        [m.born_timestamp * 1000 for m in messages],
        [m.store_timestamp * 1000 for m in messages],
    ]
    arrays = [
        pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
