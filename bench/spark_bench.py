"""`python -m bench spark`: how fast the Spark source reads, beside our own consumer.

A name server and a 3-broker DLedger group on loopback; a topic pre-filled with
`messages` messages of `size` bytes (incompressible) over `queues` queues; then, in the
same run, on the same data:

- our trio `PullConsumer`, one task per queue pulling 32 messages at a time from
  offset 0 to the end (one Python process, no Spark): the ceiling of one client;
- `spark.read.format("rocketmq")...count()`: a batch read in Spark `local[2]`, after a
  small read that starts the Python workers (Spark reuses them for every job);
- a `local[2]` streaming query, trigger availableNow, from earliest to the noop sink:
  the rate a user's stream gets, micro-batch planning included;
- the sink: the topic's bodies written back to another topic by a batch write (at
  least once), and by a streaming query, availableNow, `per_trigger` messages per
  micro-batch, in exactly-once mode (half messages, a batch record, END_TRANSACTION
  per row). Its rows/s counts the messages the output topic holds at the end.

Rows/s is messages over the wall time from the start of each read to its end (for the
stream, from `start()` until the query terminates, which includes starting the Python
process Spark plans a stream in; the SparkSession starts before). The readers take
turns `repeats` times on the same data and each row is the run of median time, with
every run's seconds beside it and its rate as a fraction of PullConsumer's: on two
shared cores a single run moves by a quarter either way.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

from raftmq.client import Message, MessageQueue, Producer, PullConsumer, PullStatus
from raftmq.client.spark.exactly_once import RECORDS_TOPIC
from raftmq.tools.broker_local import LocalCluster

TOPIC = "SparkBench"
WRITTEN = TOPIC + "Written"  # the batch write's output
WRITTEN_ONCE = TOPIC + "WrittenOnce"  # the exactly-once stream's
SEND_BATCH = 64
SENDERS = 8


async def _fill(cluster: LocalCluster, messages: int, size: int, queues: int) -> None:
    """Batches of 64 from 8 concurrent senders; the producer spreads them over the queues."""
    await cluster.create_topic(TOPIC, queues)
    body = os.urandom(size)
    firsts = range(0, messages, SEND_BATCH)
    async with Producer(cluster.namesrv_addr, send_timeout_s=30) as producer:

        async def sender(k: int) -> None:
            for first in firsts[k::SENDERS]:
                count = min(SEND_BATCH, messages - first)
                await producer.send_batch(
                    TOPIC, [Message(body, keys=str(first + j)) for j in range(count)]
                )

        async with trio.open_nursery() as nursery:
            for k in range(SENDERS):
                nursery.start_soon(sender, k)


async def _pull_consumer(namesrv: str) -> tuple[int, float]:
    async with PullConsumer(namesrv, "bench-pull") as consumer:
        total = 0
        started = time.perf_counter()

        async def drain(mq: MessageQueue) -> None:
            nonlocal total
            offset = 0
            while True:
                result = await consumer.pull(mq, offset, 32)
                if result.status is not PullStatus.FOUND:
                    return
                total += len(result.messages)
                offset = result.next_begin_offset

        async with trio.open_nursery() as nursery:
            for mq in await consumer.fetch_queues(TOPIC):
                nursery.start_soon(drain, mq)
        return total, time.perf_counter() - started


def spark_session(app_name: str = "raftmq-spark-bench", jvm_options: str | None = None):
    """A local[2] session with the rocketmq source registered; its Python workers run
    this interpreter (they need its raftmq and pyarrow). `jvm_options` for the driver's
    JVM (the tests' short-lived ones start faster with the client compiler)."""
    from pyspark.sql import SparkSession

    from raftmq.client.spark import RocketMQSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if jvm_options is not None:
        builder = builder.config("spark.driver.extraJavaOptions", jvm_options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RocketMQSource)
    return spark


def _spark_batch(spark, namesrv: str, ending: dict | None = None) -> tuple[int, float]:
    started = time.perf_counter()
    df = spark.read.format("rocketmq").option("nameSrvAddr", namesrv).option("topic", TOPIC)
    if ending:
        df = df.option("endingOffsets", json.dumps(ending))
    count = df.load().count()
    return count, time.perf_counter() - started


def _spark_stream(spark, namesrv: str, checkpoint: Path, per_trigger: int | None):
    reader = (
        spark.readStream.format("rocketmq")
        .option("nameSrvAddr", namesrv)
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
    )
    if per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(per_trigger))
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    return sum(p["numInputRows"] for p in batches), elapsed, len(batches)


async def _held(namesrv: str, topic: str) -> int:
    """How many messages `topic` holds (its queues' max offsets, summed)."""
    async with PullConsumer(namesrv, "bench-count") as consumer:
        return sum([await consumer.max_offset(mq) for mq in await consumer.fetch_queues(topic)])


def _spark_write(spark, namesrv: str) -> tuple[int, float]:
    started = time.perf_counter()
    df = spark.read.format("rocketmq").option("nameSrvAddr", namesrv).option("topic", TOPIC)
    (
        df.load().select("body").write.format("rocketmq").mode("append")
        .option("nameSrvAddr", namesrv).option("topic", WRITTEN).save()
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    return trio.run(_held, namesrv, WRITTEN), elapsed


def _spark_write_once(spark, namesrv: str, checkpoint: Path, per_trigger: int):
    started = time.perf_counter()
    query = (
        spark.readStream.format("rocketmq").option("nameSrvAddr", namesrv)
        .option("topic", TOPIC).option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(per_trigger)).load()
        .select("body").writeStream.format("rocketmq").option("nameSrvAddr", namesrv)
        .option("topic", WRITTEN_ONCE).option("exactlyOnce", "true")
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    return trio.run(_held, namesrv, WRITTEN_ONCE), elapsed, len(batches)


PULL = "PullConsumer (trio, 1 process)"


def measure(
    messages: int, size: int, queues: int, per_trigger: int, repeats: int = 3
) -> list[dict]:
    def row(reader: str, rows: int, seconds: float, batches: int | None = None) -> dict:
        if rows != messages:
            raise RuntimeError(f"{reader} read {rows} messages, not {messages}")
        return {
            "system": reader, "messages": rows, "size": size, "seconds": seconds,
            "rows_per_s": rows / seconds, "batches": batches,
        }  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        trio.run(cluster.__aenter__)
        try:
            print(f"filling {TOPIC}: {messages} x {size} B ...", file=sys.stderr, flush=True)
            trio.run(_fill, cluster, messages, size, queues)
            namesrv = cluster.namesrv_addr
            print("starting Spark local[2] ...", file=sys.stderr, flush=True)
            spark = spark_session()
            try:
                # the first job starts the Python workers and compiles Spark's code paths
                _spark_batch(
                    spark, namesrv, {f"{cluster.broker_name}:{q}": 10 for q in range(queues)}
                )
                runs: dict[str, list[dict]] = {}
                for run in range(repeats):  # the readers take turns, each `repeats` times
                    runs.setdefault(PULL, []).append(row(PULL, *trio.run(_pull_consumer, namesrv)))
                    name = "Spark local[2] batch count()"
                    runs.setdefault(name, []).append(row(name, *_spark_batch(spark, namesrv)))
                    for limit in (None, per_trigger):
                        count, seconds, batches = _spark_stream(
                            spark, namesrv, Path(tmp) / f"checkpoint-{limit}-{run}", limit
                        )
                        name = "Spark local[2] stream, availableNow"
                        if limit:
                            name += f", {limit}/trigger"
                        runs.setdefault(name, []).append(row(name, count, seconds, batches))
                rows = [_median(taken) for taken in runs.values()]
                for taken in rows:
                    taken["of_pull"] = taken["rows_per_s"] / rows[0]["rows_per_s"]
                for topic, queue_count in (
                    (WRITTEN, queues),
                    (WRITTEN_ONCE, queues),
                    (RECORDS_TOPIC, 1),
                ):
                    trio.run(cluster.create_topic, topic, queue_count)
                rows.append(row("Spark local[2] batch write (sink)", *_spark_write(spark, namesrv)))
                count, seconds, batches = _spark_write_once(
                    spark, namesrv, Path(tmp) / "checkpoint-once", per_trigger
                )
                name = f"Spark local[2] stream write, exactly once, {per_trigger}/trigger"
                rows.append(row(name, count, seconds, batches))
            finally:
                spark.stop()
        finally:
            cluster.stop()
    return rows


def _median(runs: list[dict]) -> dict:
    """The run of median time, with every run's seconds beside it."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    middle = dict(ordered[len(ordered) // 2])
    middle["runs_s"] = "/".join(f"{r['seconds']:.2f}" for r in runs)
    return middle
