"""The source's columns, and pulled records turned into Arrow record batches.

`read` yields pyarrow RecordBatches rather than tuples: Spark then skips its per-value
Python conversion, which costs more than the pull itself. The batches are made from
the buffers `decode_columns` fills straight from the pulled records, several pulls'
at once (no Python object per message). Spark checks a batch's schema against the declared one with
`pa.Schema.equals`, so the Arrow schema is derived from `SCHEMA` by Spark's own
converter, never written twice.

`msgId` is what RocketMQ's Java client returns from `getMsgId()` for a consumed
message: the producer's UNIQ_KEY when it set one (it is also what a send result
reports), else the offset msgId (store host + physical offset). Timestamps are the
epoch milliseconds the record carries, as TIMESTAMP.
"""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc
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

from raftmq.protocol.columns import DECODE_COLUMNS, RecordColumns

__all__ = ["SCHEMA", "records_batch", "tagged"]

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


def _array(kind: pa.DataType, rows: int, *buffers: bytes | None) -> pa.Array:
    return pa.Array.from_buffers(
        kind, rows, [None if b is None else pa.py_buffer(b) for b in buffers]
    )


def records_batch(broker_name: str, records: bytes) -> pa.RecordBatch:
    """A batch of the pulled `records` (back to back), from `broker_name`, in order."""
    c = RecordColumns._make(DECODE_COLUMNS(records))
    schema = arrow_schema()
    n = c.rows
    text, moment = pa.string(), schema.field("bornTimestamp").type
    pair_count = memoryview(c.property_offsets).cast("i")[n]
    properties = pa.MapArray.from_arrays(
        _array(pa.int32(), n + 1, None, c.property_offsets),
        _array(text, pair_count, None, c.name_offsets, c.name_data),
        _array(text, pair_count, None, c.value_offsets, c.value_data),
        type=schema.field("properties").type,
    )
    arrays = [
        _array(text, n, None, c.topic_offsets, c.topic_data),
        pa.array([broker_name] * n, text),
        _array(pa.int32(), n, None, c.queue_ids),
        _array(pa.int64(), n, None, c.queue_offsets),
        _array(text, n, None, c.msg_id_offsets, c.msg_id_data),
        _array(text, n, c.keys_valid, c.keys_offsets, c.keys_data),
        _array(text, n, c.tags_valid, c.tags_offsets, c.tags_data),
        _array(pa.binary(), n, None, c.body_offsets, c.body_data),
        properties,
        _array(moment, n, None, c.born_us),
        _array(moment, n, None, c.store_us),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def tagged(batch: pa.RecordBatch, tags: frozenset[str]) -> pa.RecordBatch:
    """The rows whose tag is one of `tags`: a broker matches tags by their hash code, so
    a tag that only shares a hash with one asked for comes along (as PullConsumer
    drops it, so does the source)."""
    return batch.filter(pc.is_in(batch.column("tags"), value_set=pa.array(sorted(tags))))
