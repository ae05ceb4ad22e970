"""`RocketMQSource`: the "rocketmq" Python data source, batch and streaming, reading
(here) and writing (`sink`).

How pyspark 4.3 drives it, and what follows:

- The driver keeps one Python process per streaming query holding the stream reader:
  `initialOffset`, `latestOffset`, `partitions`, `commit` and
  `prepareForTriggerAvailableNow` all reach the same object, so the availableNow target
  and the last bounds seen live on it. The reader is pickled to get there (and to the
  executors, for `read`), so it holds options and plain dicts only; broker connections
  live in a per-process cache (`session.session_for`).
- `read` runs in executor Python workers, one task per queue range.
- `commit(end)` comes late (while the next batch is planned) and not at all for the
  last batch, and `stop()` was never seen to run: the checkpoint is the only truth, and
  the optional consumer-group commit in `commit` is for monitoring.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    In,
    InputPartition,
    IsNotNull,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from raftmq.client.consumer import TAG, Subscription
from raftmq.client.instance import backoff_delays
from raftmq.client.spark.offsets import (
    Bounds,
    Plan,
    QueueRange,
    ending_offsets,
    initial_offsets,
    next_offsets,
    ordered,
    ranges,
    regressed,
)
from raftmq.client.spark.options import SinkOptions, SourceOptions
from raftmq.client.spark.reading import read_joined
from raftmq.client.spark.rows import SCHEMA, records_batch, tagged
from raftmq.client.spark.session import session_for
from raftmq.client.spark.sink import RocketMQStreamWriter, RocketMQWriter
from raftmq.client.spark.writing import columns_of

__all__ = ["RocketMQSource"]

log = logging.getLogger(__name__)

# Pulls bring 32 messages; Spark pays per Arrow batch it receives, so they are joined
# (and decoded into one batch at once), up to so many rows or bytes of records.
ROWS_PER_BATCH = 2048
BYTES_PER_BATCH = 16 << 20


class RocketMQSource(DataSource):
    """`spark.readStream.format("rocketmq").option("nameSrvAddr", ...).option("topic", ...)`,
    and the same names to write (`sink`)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        options = SourceOptions.parse(self.options, streaming=False)
        if options.push_filters:
            return RocketMQFilteringBatchReader(options)
        return RocketMQBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return RocketMQStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError('a topic is appended to, never overwritten: use mode("append")')
        options = SinkOptions.parse(self.options, streaming=False)
        return RocketMQWriter(options, columns_of(schema, options.topic))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = SinkOptions.parse(self.options, streaming=True)
        return RocketMQStreamWriter(options, columns_of(schema, options.topic))


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise ValueError(f"the rocketmq source has a fixed schema: {SCHEMA.simpleString()}")


class QueueSplit(InputPartition):
    """One queue range, the unit of work of an executor task (picklable)."""

    def __init__(self, queue: QueueRange) -> None:
        super().__init__(queue)
        self.queue = queue


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, QueueSplit):  # Spark's placeholder for "no partitions"
        return
    session = session_for(options.namesrv_addr, options.group)
    queue = partition.queue
    selector = options.selector if options.filtered else None
    tags = Subscription.of(options.topic, selector).tags if selector is not None else None
    for chunk in session.iterate(
        read_joined,
        options.topic,
        queue,
        ROWS_PER_BATCH,
        BYTES_PER_BATCH,
        fail_on_data_loss=options.fail_on_data_loss,
        timeout_s=options.pull_timeout_s,
        selector=selector,
    ):
        batch = records_batch(queue.broker_name, chunk.records)
        yield tagged(batch, tags) if tags else batch


def _report(plan: Plan) -> Plan:
    for loss in plan.losses:
        log.warning("data loss (failOnDataLoss=false, skipped): %s", loss)
    for note in plan.notes:
        log.info("%s", note)
    return plan


def _complete_bounds(options: SourceOptions) -> dict[str, Bounds]:
    """Bounds of every queue in the route: where a query starts, nothing may be missing."""
    session = session_for(options.namesrv_addr, options.group)
    queues = session.queues(options.topic)
    bounds = session.bounds(options.topic)
    missing = sorted(set(queues) - set(bounds))
    if missing:
        raise RuntimeError(
            f"topic {options.topic}: no member answered for queues {', '.join(missing)}"
        )
    return bounds


def _start(options: SourceOptions, bounds: dict[str, Bounds]) -> dict[str, int]:
    starting = options.starting
    if starting == "timestamp":
        session = session_for(options.namesrv_addr, options.group)
        starting = session.search(options.topic, list(bounds), options.starting_timestamp_ms)
    return _report(
        initial_offsets(starting, bounds, fail_on_data_loss=options.fail_on_data_loss)
    ).offsets


class RocketMQBatchReader(DataSourceReader):
    """`spark.read`: from startingOffsets (default earliest) to endingOffsets (default
    latest, resolved when the query is planned)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        bounds = _complete_bounds(self.options)
        start = _start(self.options, bounds)
        end = ending_offsets(self.options.ending, bounds)
        behind = [k for k in end if end[k] < start[k]]
        if behind:
            raise ValueError(f"endingOffsets before startingOffsets for {', '.join(behind)}")
        return [QueueSplit(queue) for queue in ranges(start, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class RocketMQFilteringBatchReader(RocketMQBatchReader):
    """`spark.read` with option pushFilters=true: as RocketMQBatchReader, and Spark's
    filters on the tags column go to the brokers. A separate class because pyspark
    refuses any reader that implements pushFilters unless the session sets
    spark.sql.python.filterPushdown.enabled (false by default): implemented on every
    reader, it would break every batch read in a default session."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """`where(tags == "A")` and `tags.isin("A", "B")` become the brokers' TAG filter
        (with subExpression's tags, if any: the filters are ANDed), so what is not
        selected never leaves the broker; any other filter, or any under an SQL92
        subExpression, is left to Spark. The TAG filter is exact (brokers select by tag
        hash, the client then by the tag itself), so Spark need not apply it again."""
        if self.options.selector.expression_type != TAG:
            return filters
        left, tags = [], None
        for pushed in filters:
            these = _tags_of(pushed)
            if these is None:
                left.append(pushed)
            else:
                tags = these if tags is None else tags & these
        if tags is None:
            return filters
        self.options = self.options.with_tags(tags)
        # `tags IS NOT NULL`, which Spark adds beside `tags = ...`, holds for every row
        # a TAG filter selects
        return [f for f in left if not (isinstance(f, IsNotNull) and f.attribute == ("tags",))]


def _tags_of(pushed: Filter) -> frozenset[str] | None:
    """The tags a filter on the tags column keeps, if a TAG expression can say it: a
    tag with "||" or surrounding blanks cannot be written in one."""
    if isinstance(pushed, EqualTo):
        values: tuple = (pushed.value,)
    elif isinstance(pushed, In):
        values = pushed.value
    else:
        return None
    if pushed.attribute != ("tags",) or not all(
        isinstance(v, str) and v and v == v.strip() and "||" not in v for v in values
    ):
        return None
    return frozenset(values)


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of per-queue offset ranges; see `offsets` for the planning rules."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.target: dict[str, int] | None = None  # availableNow: never read past this
        self.latest: dict[str, int] | None = None  # the ends last seen, for Spark's metrics

    def initialOffset(self) -> dict:
        return _start(self.options, _complete_bounds(self.options))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_messages_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        session = session_for(self.options.namesrv_addr, self.options.group)
        self.target = ordered({k: b.high for k, b in session.bounds(self.options.topic).items()})
        log.info("availableNow: reading up to %s", self.target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        bounds = self._bounds_not_behind(start)
        self.latest = ordered({k: b.high for k, b in bounds.items()})
        plan = next_offsets(
            start,
            bounds,
            fail_on_data_loss=self.options.fail_on_data_loss,
            max_rows=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
            target=self.target,
        )
        return _report(plan).offsets

    def _bounds_not_behind(self, start: dict) -> dict[str, Bounds]:
        """Bounds that do not put any queue behind `start`, asking again with a fresh route
        (up to fetchOffset.timeoutMs) while one does: after a leader change the member
        that answers may be one that has not yet learned of the latest commits."""
        session = session_for(self.options.namesrv_addr, self.options.group)
        topic = self.options.topic
        delays = backoff_delays()
        waited = 0.0
        while True:
            bounds = session.bounds(topic)
            behind = regressed(start, bounds)
            if not behind or waited >= self.options.fetch_timeout_s:
                return bounds
            log.info("queues %s report ends below the query's offsets; asking again", behind)
            session.forget_route(topic)
            delay = next(delays)
            time.sleep(delay)
            waited += delay

    def reportLatestOffset(self) -> dict | None:
        return self.latest

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [QueueSplit(queue) for queue in ranges(start, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        if self.options.consumer_group:
            session = session_for(self.options.namesrv_addr, self.options.group)
            session.commit(self.options.topic, end)
