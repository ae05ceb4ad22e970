"""The "rocketmq" sink: `df.write.format("rocketmq")` and `df.writeStream.format("rocketmq")`.

At least once (the default): each task sends its rows with a Producer and returns only
when every send is acknowledged (stored on a quorum of the broker group); a send that
is not fails the task, and Spark runs it again, so a row may be written twice (the
retried task's rows that had been acknowledged before the failure) but never lost.

Exactly once (`exactlyOnce=true`, streaming): each task sends its rows as half
messages and hands their send results to the driver; `commit` records the batch and
ends them, `abort` rolls them back (`exactly_once` has the rules).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from raftmq.client.producer import SendResult
from raftmq.client.spark.exactly_once import half_properties
from raftmq.client.spark.options import SinkOptions
from raftmq.client.spark.session import BlockingSinkSession, sink_session_for
from raftmq.client.spark.writing import Columns, outgoing

__all__ = ["Halves", "RocketMQStreamWriter", "RocketMQWriter"]

# Rows handed to the client's loop at once: its sends overlap within a chunk.
ROWS_PER_CHUNK = 1024


@dataclass
class Halves(WriterCommitMessage):
    """What a task of an exactly-once batch hands the driver: its attempt's id and the
    send results of its half messages, which END_TRANSACTION needs."""

    task: str
    sent: list[SendResult]


def _session(options: SinkOptions) -> BlockingSinkSession:
    records_topic = options.records_topic if options.exactly_once else None
    return sink_session_for(
        options.namesrv_addr, options.producer_group, options.send_timeout_s, records_topic
    )


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple]:
    """The rows of Arrow record batches as tuples, a column converted at a time: Spark
    hands Arrow writers its rows without building a Row object for each (a sink taking
    Rows spent most of its time there)."""
    for batch in batches:
        yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


def _chunks(columns: Columns, batches: Iterator[pa.RecordBatch]) -> Iterator[list]:
    messages = outgoing(columns, _rows(batches))
    while chunk := list(itertools.islice(messages, ROWS_PER_CHUNK)):
        yield chunk


def _write(
    options: SinkOptions, columns: Columns, batches: Iterator[pa.RecordBatch]
) -> WriterCommitMessage:
    session = _session(options)
    for chunk in _chunks(columns, batches):
        session.send_all(chunk, options.sends_in_flight)
    return WriterCommitMessage()


class RocketMQWriter(DataSourceArrowWriter):
    """`df.write.format("rocketmq")`: every row sent at least once."""

    def __init__(self, options: SinkOptions, columns: Columns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.options, self.columns, iterator)


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("rocketmq")`. At least once: every row of every micro-batch
    sent, and a micro-batch Spark runs again (after a failure, or a restart from the
    checkpoint before its commit was recorded) sent again. Exactly once: see `Halves`."""

    def __init__(self, options: SinkOptions, columns: Columns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if not self.options.exactly_once:
            return _write(self.options, self.columns, iterator)
        from pyspark import TaskContext

        # MicroBatchExecution's BATCH_ID_KEY, which Spark hands every task of a batch
        batch_id = TaskContext.get().getLocalProperty("streaming.sql.batchId")
        if batch_id is None:
            raise RuntimeError("exactly-once write outside a micro-batch: no batch id")
        batch = int(batch_id)
        task = uuid.uuid4().hex  # this attempt's, never reused: a retry sends anew
        properties = half_properties(self.options.query_id, batch, task)
        session = _session(self.options)
        sent: list[SendResult] = []
        for chunk in _chunks(self.columns, iterator):
            sent += session.send_halves(chunk, self.options.sends_in_flight, properties)
        return Halves(task, sent)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            halves = [(m.task, m.sent) for m in messages if isinstance(m, Halves)]
            _session(self.options).commit_batch(
                self.options.query_id, batchId, halves, self.options.sends_in_flight
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            sent = [s for m in messages if isinstance(m, Halves) for s in m.sent]
            _session(self.options).roll_back(sent, self.options.sends_in_flight)
