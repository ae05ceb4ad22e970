"""The "rocketmq" data source in real Spark (local[2]) against a real name server and a
3-member DLedger broker group, the way a user runs it: batch reads, streams into a
parquet sink with a checkpoint, a topic spread over two groups, a master killed twice
under a running query, and a query stopped and restarted from its checkpoint across a
leader change.

One SparkSession and one LocalCluster serve the module (starting them is most of the
time); the tests that kill masters run last. Spark calls block, so the trio tests make
them from a thread while producers and kills run in the loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import os
import pkgutil
import re
import signal
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import trio

from raftmq.client import Message, MessageQueue, Producer, PullConsumer, SendError
from raftmq.client.spark.exactly_once import PROPERTY_BATCH, RECORDS_TOPIC
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode
from raftmq.tools.broker_local import LocalCluster, LocalGroups
from tests.helpers import cpp_peer, run_peer
from tests.spark_driver.session import spark_session

SPARK_DRIVER = Path(__file__).parent / "spark_driver" / "peer.py"

pytestmark = [pytest.mark.processes, pytest.mark.requires("pyspark", "java"), pytest.mark.untimed]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    conf = {
        "enablePropertyFilter": "true",  # the SQL92 subExpression
        # the check-back that resolves what a killed driver left open: every second, for
        # halves older than 3 s (RocketMQ's defaults: 60 s and 6 s)
        "transactionCheckInterval": "1000",
        "transactionTimeOut": "3000",
    }
    local = LocalCluster(tmp_path_factory.mktemp("spark-cluster"), extra_conf=conf)
    trio.run(local.__aenter__)
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="module")
def spark():
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    session = spark_session("raftmq-spark-tests")
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def source(spark, cluster: LocalCluster, topic: str, *, stream: bool, **options):
    reader = (spark.readStream if stream else spark.read).format("rocketmq")
    reader = reader.option("nameSrvAddr", cluster.namesrv_addr).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def start_stream(spark, cluster, topic, tmp_path, trigger: dict, **options):
    df = source(spark, cluster, topic, stream=True, startingOffsets="earliest", **options)
    return (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


async def send_numbered(cluster, topic: str, count: int, start: int = 0) -> dict[str, bytes]:
    """msgId -> body of `count` acknowledged sends, spread over the queues."""
    acked = {}
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(start, start + count):
            result = await producer.send(topic, b"m-%d" % i)
            acked[result.msg_id] = b"m-%d" % i
    return acked


async def caught_up_with_master(cluster: LocalCluster, node: str) -> None:
    """Until `node` holds the log the master held when asked (under a load that never
    pauses, the members' ends are never all equal at once)."""
    master = await cluster.wait_master()
    goal = int((await cluster.member_state(master))["dLegerLedgerEndIndex"])
    with trio.fail_after(60):
        while int((await cluster.member_state(node))["dLegerLedgerEndIndex"]) < goal:
            await trio.sleep(0.05)


async def queue_ends(cluster, topic: str) -> dict[tuple[str, int], int]:
    async with PullConsumer(cluster.namesrv_addr, "spark-test-reader") as consumer:
        return {
            (mq.broker_name, mq.queue_id): await consumer.max_offset(mq)
            for mq in await consumer.fetch_queues(topic)
        }


def sink_rows(spark, tmp_path) -> list:
    """What the file sink committed (its metadata log decides), with each row's file and
    position in it, so the order the source emitted can be checked."""
    df = spark.read.parquet(str(tmp_path / "sink"))
    return df.select("*", "_metadata.file_path", "_metadata.row_index").collect()


def check_exactly_once(rows, acked: dict[str, bytes], ends: dict, maybe: set[bytes] = frozenset()):
    """Every message of every queue exactly once (offsets 0 to the queue's end, each
    once), the acknowledged ones among them and nothing else but sends of unknown
    outcome; within each file, each queue's rows in offset order."""
    got = {r.msgId: r.body for r in rows}
    assert sorted(set(acked) - set(got)) == []
    assert all(got[k] == body for k, body in acked.items())
    assert {got[k] for k in set(got) - set(acked)} <= set(maybe)
    offsets = defaultdict(list)
    for r in rows:
        offsets[(r.brokerName, r.queueId)].append(r.queueOffset)
    assert {q: sorted(o) for q, o in offsets.items()} == {
        q: list(range(end)) for q, end in ends.items() if end
    }
    files = defaultdict(list)
    for r in rows:
        files[r.file_path].append((r.row_index, r.brokerName, r.queueId, r.queueOffset))
    for in_file in files.values():
        in_file.sort()
        for (_, b1, q1, o1), (_, b2, q2, o2) in itertools.pairwise(in_file):
            assert (b1, q1) != (b2, q2) or o2 == o1 + 1


def test_pyspark_finds_the_source_by_its_module_name():
    """pyspark's lookup: every top-level `pyspark_*` module's DefaultSource, by its name."""
    from pyspark.sql.datasource import DataSource

    from raftmq.client.spark import RocketMQSource

    root = Path(__file__).parents[1]
    found = {
        info.name: importlib.import_module(info.name).DefaultSource
        for info in pkgutil.iter_modules([str(root)])
        if info.name.startswith("pyspark_")
    }
    assert {name: ds.name() for name, ds in found.items()} == {"pyspark_rocketmq": "rocketmq"}
    assert issubclass(found["pyspark_rocketmq"], DataSource)
    assert found["pyspark_rocketmq"] is RocketMQSource


# ---------------------------------------------------------------- batch


async def test_batch_read_of_a_topic_and_of_an_offset_range(cluster, spark):
    topic = "SparkBatch"
    await cluster.create_topic(topic, 4)
    sent = []
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(40):
            message = Message(
                b"o-%d" % i, tags="paid", keys=[f"order-{i}"], properties={"n": str(i)}
            )
            sent.append((i, await producer.send_batch(topic, [message])))
    rows = await in_thread(source(spark, cluster, topic, stream=False).collect)
    by_id = {r.msgId: r for r in rows}
    assert len(rows) == len(by_id) == 40
    for i, result in sent:
        row = by_id[result.msg_id]
        assert (row.topic, row.brokerName, row.queueId, row.queueOffset) == (
            topic,
            result.message_queue.broker_name,
            result.message_queue.queue_id,
            result.queue_offset,
        )
        assert (row.body, row.tags, row.keys, row.properties["n"]) == (
            b"o-%d" % i,
            "paid",
            f"order-{i}",
            str(i),
        )
        assert row.bornTimestamp <= row.storeTimestamp

    broker = sent[0][1].message_queue.broker_name
    ranged = source(
        spark,
        cluster,
        topic,
        stream=False,
        startingOffsets=json.dumps({f"{broker}:0": 3, f"{broker}:1": -1}),
        endingOffsets=json.dumps({f"{broker}:0": 7, f"{broker}:2": 4}),
    )
    got = sorted((r.queueId, r.queueOffset) for r in await in_thread(ranged.collect))
    assert got == [(0, o) for o in range(3, 7)] + [(2, o) for o in range(4)] + [
        (3, o) for o in range(10)
    ]

    stored = {
        (r.queueId, r.queueOffset): r.stored
        for r in await in_thread(
            source(spark, cluster, topic, stream=False)
            .selectExpr("queueId", "queueOffset", "unix_millis(storeTimestamp) AS stored")
            .collect
        )
    }
    since = sorted(stored.values())[len(stored) // 2]
    from_time = source(
        spark, cluster, topic, stream=False, startingOffsets="timestamp", startingTimestamp=since
    )
    got = {(r.queueId, r.queueOffset) for r in await in_thread(from_time.collect)}
    assert got == {q for q, at in stored.items() if at >= since}

    unknown = source(spark, cluster, topic, stream=False, startingOffsets='{"Nowhere:0": 1}')
    with pytest.raises(Exception, match="Nowhere:0"):
        await in_thread(unknown.collect)


async def test_a_topic_spread_over_two_groups_is_read_from_both(spark, tmp_path):
    """A topic over two DLedger groups (one name server, `updateTopic -c`'s layout): a
    batch read returns every message of both, and a stream reads both exactly once."""
    topic = "SparkGroups"
    async with LocalGroups(tmp_path / "groups", groups=2, nodes=1) as groups:
        await groups.create_topic(topic, 2)
        acked = await send_numbered(groups, topic, 60)
        rows = await in_thread(source(spark, groups, topic, stream=False).collect)
        assert {r.msgId: r.body for r in rows} == acked
        assert {r.brokerName for r in rows} == {"RaftNode00", "RaftNode01"}

        acked |= await send_numbered(groups, topic, 20, start=60)
        query = await in_thread(
            lambda: start_stream(spark, groups, topic, tmp_path, {"availableNow": True})
        )
        await in_thread(query.awaitTermination)
        ends = await queue_ends(groups, topic)
        assert {broker for broker, _ in ends} == {"RaftNode00", "RaftNode01"} and len(ends) == 4
        check_exactly_once(await in_thread(sink_rows, spark, tmp_path), acked, ends)


# ---------------------------------------------------------------- streams


async def test_stream_to_parquet_with_read_limits_new_queues_and_triggers(cluster, spark, tmp_path):
    topic = "SparkStream"
    await cluster.create_topic(topic, 2)
    acked = await send_numbered(cluster, topic, 300)

    query = await in_thread(
        lambda: start_stream(
            spark, cluster, topic, tmp_path, {"availableNow": True}, maxMessagesPerTrigger="100"
        )
    )
    await in_thread(query.awaitTermination)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 300 and max(sizes) <= 100 and len(sizes) >= 3

    await cluster.create_topic(topic, 4)  # topic expansion: two new queues
    acked |= await send_numbered(cluster, topic, 200, start=300)
    query = await in_thread(
        lambda: start_stream(spark, cluster, topic, tmp_path, {"availableNow": True})
    )
    await in_thread(query.awaitTermination)

    acked |= await send_numbered(cluster, topic, 40, start=500)
    query = await in_thread(lambda: start_stream(spark, cluster, topic, tmp_path, {"once": True}))
    await in_thread(query.awaitTermination)
    ends = await queue_ends(cluster, topic)
    assert len(ends) == 4 and all(ends.values())
    check_exactly_once(await in_thread(sink_rows, spark, tmp_path), acked, ends)


async def test_filters_are_applied_by_the_brokers_in_batch_and_stream_reads(
    cluster, spark, tmp_path
):
    """subExpression (TAG or SQL92), in batch and stream reads, and with pushFilters a
    `where` on the tags column, reach the brokers: exactly the selected rows come back,
    and Spark's plan has no Filter of its own left for a pushed one. A bad SQL92
    expression fails the query with the broker's remark, not after a minute of retries."""
    from pyspark.sql.functions import col

    topic = "SparkFiltered"
    await cluster.create_topic(topic, 4)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(120):
            await producer.send(topic, b"f-%d" % i, tags="ABC"[i % 3], properties={"n": str(i)})

    def bodies(df) -> set[int]:
        return {int(r.body[2:]) for r in df.collect()}

    tagged = source(spark, cluster, topic, stream=False, subExpression="A || B")
    assert await in_thread(bodies, tagged) == {i for i in range(120) if i % 3 != 2}
    sql = source(spark, cluster, topic, stream=False, subExpressionType="SQL92",
                 subExpression="n >= 100")  # fmt: skip
    assert await in_thread(bodies, sql) == set(range(100, 120))

    def spark_filters(df) -> bool:
        """Whether Spark's physical plan has a Filter of its own over the scan."""
        return re.search(r"\bFilter\b", df._jdf.queryExecution().executedPlan().toString())

    # `where` on the tags column: Spark filters, unless pushFilters (and the session's
    # spark.sql.python.filterPushdown.enabled) hand it to the brokers
    unpushed = source(spark, cluster, topic, stream=False).where(col("tags") == "C")
    assert await in_thread(bodies, unpushed) == {i for i in range(120) if i % 3 == 2}
    assert await in_thread(spark_filters, unpushed)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        every = source(spark, cluster, topic, stream=False, pushFilters="true")
        where = every.where(col("tags") == "C")
        assert await in_thread(bodies, where) == {i for i in range(120) if i % 3 == 2}
        assert not await in_thread(spark_filters, where)  # the brokers did
        pushed = source(spark, cluster, topic, stream=False, pushFilters="true",
                        subExpression="A || B").where(col("tags").isin("B", "C"))  # fmt: skip
        assert await in_thread(bodies, pushed) == {i for i in range(120) if i % 3 == 1}
        mixed = every.where((col("tags") == "A") & (col("body") != b"f-0"))  # one pushed
        assert await in_thread(bodies, mixed) == {i for i in range(3, 120, 3)}
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")

    bad = source(spark, cluster, topic, stream=False, subExpressionType="SQL92",
                 subExpression="n >")  # fmt: skip
    with pytest.raises(Exception, match="invalid SQL92 expression"):
        await in_thread(bad.collect)

    query = await in_thread(
        lambda: start_stream(
            spark, cluster, topic, tmp_path, {"availableNow": True}, subExpression="B"
        )
    )
    await in_thread(query.awaitTermination)
    rows = await in_thread(sink_rows, spark, tmp_path)
    assert sorted(int(r.body[2:]) for r in rows) == list(range(1, 120, 3))


async def test_the_orders_per_minute_example(cluster, spark, tmp_path):
    spec = importlib.util.spec_from_file_location(
        "orders_per_minute", Path(__file__).parents[1] / "examples" / "orders_per_minute.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    await cluster.create_topic("Orders", 4)
    minute = 60_000 * 29_000_000  # some whole minute, in epoch ms
    expected = {}
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(60):
            at, status = minute + (i % 3) * 60_000 + i * 7, "refunded" if i % 5 == 0 else "paid"
            order = {"id": f"o-{i}", "amount": 1.25, "ts": at}
            await producer.send("Orders", json.dumps(order).encode(), tags=status)
            key = ((at - at % 60_000) // 1000, status)
            expected[key] = expected.get(key, 0) + 1

    def run() -> list:
        query = (
            example.per_minute(example.orders_stream(spark, cluster.namesrv_addr, "Orders"))
            .writeStream.outputMode("complete")
            .format("memory")
            .queryName("orders_per_minute")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return spark.sql(
            "SELECT unix_seconds(minute) AS at, status, orders, revenue FROM orders_per_minute"
        ).collect()

    rows = await in_thread(run)
    assert {(r.at, r.status): r.orders for r in rows} == expected
    assert all(r.revenue == r.orders * 1.25 for r in rows)


# ---------------------------------------------------------------- the sink


def sink(df, cluster: LocalCluster, **options):
    writer = df.write.format("rocketmq").mode("append").option("nameSrvAddr", cluster.namesrv_addr)
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


async def test_batch_write_is_read_back_with_every_column(cluster, spark):
    """Rows written with body, keys, tags and properties come back as messages carrying
    them; rows with a topic column go to their own topic, the others to the option's."""
    await cluster.create_topic("SinkBatch", 4)
    await cluster.create_topic("SinkBatchOther", 2)

    def run() -> tuple[list, list]:
        df = spark.createDataFrame(
            [
                (f"row-{i}", f"k{i}", "even" if i % 2 == 0 else "odd", {"n": str(i)},
                 "SinkBatchOther" if i % 10 == 0 else None)
                for i in range(300)
            ],
            "body string, keys string, tags string, properties map<string,string>, topic string",
        )  # fmt: skip
        sink(df.repartition(3), cluster, topic="SinkBatch").save()
        main = source(spark, cluster, "SinkBatch", stream=False).collect()
        other = source(spark, cluster, "SinkBatchOther", stream=False).collect()
        return main, other

    main, other = await in_thread(run)
    assert sorted(r.body for r in other) == sorted(b"row-%d" % i for i in range(0, 300, 10))
    assert len(main) == 270
    for r in main + other:
        i = int(r.body.split(b"-")[1])
        assert (r.keys, r.tags) == (f"k{i}", "even" if i % 2 == 0 else "odd")
        assert r.properties["n"] == str(i)


async def test_a_schema_the_sink_cannot_write_fails_naming_the_column(cluster, spark):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    def attempt(ddl: str, **options) -> str:
        df = spark.createDataFrame([], ddl)
        with pytest.raises((PySparkException, Py4JJavaError)) as failure:
            sink(df, cluster, **options).save()
        return str(failure.value)

    def run() -> list[str]:
        return [
            attempt("value string", topic="T"),
            attempt("body int", topic="T"),
            attempt("body binary, properties map<string,int>", topic="T"),
            attempt("body binary"),
        ]

    no_body, int_body, bad_map, no_topic = await in_thread(run)
    assert "needs a column body" in no_body
    assert "column body must be binary or string, not int" in int_body
    assert "column properties must be map<string,string>, not map<string,int>" in bad_map
    assert "needs a column topic or the option topic" in no_topic


def copy_stream(spark, cluster, source_topic: str, tmp_path, trigger: dict, **options):
    """A query writing the bodies and tags of `source_topic` to `<source_topic>Out`.

    Called from a thread other than the one that made the session, whose JVM thread has
    no active session: Spark then looks a Python streaming sink up in a session it does
    not know of (DATA_SOURCE_NOT_FOUND), so the active session is set first."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    writer = (
        source(spark, cluster, source_topic, stream=True, startingOffsets="earliest",
               maxMessagesPerTrigger="200")
        .select("body", "tags")
        .writeStream.format("rocketmq")
        .option("nameSrvAddr", cluster.namesrv_addr)
        .option("topic", source_topic + "Out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(**trigger)
    )  # fmt: skip
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.start()


@pytest.mark.parametrize("exactly_once", ["false", "true"])
async def test_a_stream_copies_a_topic_into_another(cluster, spark, tmp_path, exactly_once):
    """The Kafka-style round trip: read a topic as a stream, write its bodies and tags
    into another topic; with nothing failing, every message arrives once, in either
    mode, and in exactly-once mode each micro-batch is recorded."""
    topic = "SinkCopy" + ("Tx" if exactly_once == "true" else "")
    await cluster.create_topic(topic, 4)
    await cluster.create_topic(topic + "Out", 4)
    await cluster.create_topic(RECORDS_TOPIC, 1)
    acked = await send_numbered(cluster, topic, 500)

    def run() -> list:
        query = copy_stream(
            spark, cluster, topic, tmp_path, {"availableNow": True}, exactlyOnce=exactly_once
        )
        query.awaitTermination()
        assert query.exception() is None
        return source(spark, cluster, topic + "Out", stream=False).collect()

    rows = await in_thread(run)
    assert sorted(r.body for r in rows) == sorted(acked.values())
    if exactly_once == "true":
        assert {r.properties[PROPERTY_BATCH] for r in rows} == {"0", "1", "2"}


# ---------------------------------------------------------------- failover


async def numbered_copy_source(cluster: LocalCluster, topic: str) -> None:
    """`topic` holding the numbers 0..599 as bodies, an empty `topic`Out for a copy of
    them, and the sink's records topic."""
    await cluster.create_topic(topic, 4)
    await cluster.create_topic(topic + "Out", 4)
    await cluster.create_topic(RECORDS_TOPIC, 1)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(600):
            await producer.send(topic, b"%d" % i)


@pytest.mark.requires("rocketmq-cpp")
@pytest.mark.parametrize("exactly_once", ["false", "true"])
async def test_a_stream_written_across_a_master_kill_is_read_by_the_cpp_client(
    cluster, spark, tmp_path, exactly_once
):
    """A copying query runs while the master is SIGKILLed after its first micro-batch
    is written; RocketMQ's C++ client then consumes the output from its first offsets:
    every number at least once, and in exactly-once mode each in one message only (a
    redelivery to the consumer keeps its msgId; a second write would not)."""
    topic = "SinkKill" + ("Tx" if exactly_once == "true" else "")
    group = topic + "Reader"
    await numbered_copy_source(cluster, topic)
    query = await in_thread(
        lambda: copy_stream(
            spark, cluster, topic, tmp_path, {"processingTime": "200 milliseconds"},
            exactlyOnce=exactly_once, queryId=topic,
        )
    )  # fmt: skip
    try:
        with trio.fail_after(30):
            while not sum((await queue_ends(cluster, topic + "Out")).values()):
                await trio.sleep(0.05)
        master = await cluster.wait_master()
        cluster.kill(master)
        await cluster.wait_master(not_node=master)
        await in_thread(query.processAllAvailable)
        await cluster.restart(master)
    finally:
        await in_thread(query.stop)
    assert query.exception() is None
    # The C++ client starts a new group at the queues' ends: start it at 0 instead.
    async with PullConsumer(cluster.namesrv_addr, group) as offsets:
        for mq in await offsets.fetch_queues(topic + "Out"):
            await offsets.update_offset(mq, 0)
    async with cpp_peer(cluster, "consume", topic + "Out", group) as consumer:
        await consumer.wait_for(
            lambda: {e["n"] for e in consumer.of("consumed")} >= set(range(600)), 30, "all 600"
        )
        await trio.sleep(0.5)  # anything more would come now
        await consumer.finish()
    written: dict[int, set[str]] = defaultdict(set)
    for event in consumer.of("consumed"):
        written[event["n"]].add(event["msg_id"])
    assert set(written) == set(range(600))
    if exactly_once == "true":
        assert {n: ids for n, ids in written.items() if len(ids) > 1} == {}


@pytest.mark.requires("rocketmq-cpp")
async def test_an_exactly_once_driver_killed_mid_batch_and_restarted_writes_every_row_once(
    cluster, tmp_path
):
    """The driver of an exactly-once copy (a process of its own: JVM, Python workers) is
    SIGKILLed while a micro-batch is in flight (the checkpoint has the batch's offsets
    and not its commit: its halves are out, maybe recorded, maybe partly ended) and
    started again from its checkpoint; RocketMQ's C++ client then reads the output: each
    of the 600 numbers in exactly one message. The restarted writers and the broker's
    check-back resolve what the kill left open from the batch records."""
    topic, group = "SinkDriverKill", "SinkDriverKillReader"
    await numbered_copy_source(cluster, topic)
    checkpoint = tmp_path / "checkpoint"
    command = [sys.executable, str(SPARK_DRIVER), cluster.namesrv_addr, topic, str(checkpoint),
               topic]  # fmt: skip

    def committed() -> int:
        """Micro-batches the checkpoint records as done."""
        path = checkpoint / "commits"
        return sum(p.name.isdigit() for p in path.iterdir()) if path.exists() else 0

    master = cluster.broker_addrs[await cluster.wait_master()]
    half_queue = {"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": "0"}
    async with RemotingClient(master) as broker:

        async def halves() -> int:
            """Half messages stored so far (every query's: count from a start)."""
            request = RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields=half_queue)
            return int((await broker.invoke(request, 5.0)).ext_fields["offset"])

        async def open_halves(since: tuple[int, int]) -> bool:
            """Whether halves of a batch the checkpoint has not committed are out, given
            (halves, committed batches) at the run's start: each committed batch of the
            run sent 100 (its rows)."""
            return await halves() - since[0] > 100 * (committed() - since[1])

        killed_mid_batch = False
        for run in itertools.count():
            start = (await halves(), committed())
            # a JVM and a session: 10-15 s on a quiet machine
            async with run_peer(f"Spark driver {run}", command,
                                tmp_path / f"driver-{run}.stderr", ready="started",
                                ready_timeout_s=90, start_new_session=True) as driver:  # fmt: skip
                if not killed_mid_batch:
                    assert run < 3, "no kill landed while a batch's halves were out"
                    await driver.wait_for(lambda: driver.of("batch"), 90, "a batch")
                    with trio.fail_after(30):
                        while not await open_halves(start):
                            await trio.sleep(0.002)
                    os.killpg(driver.process.pid, signal.SIGKILL)
                    await driver.process.wait()
                    killed_mid_batch = await open_halves(start)  # no commit slipped in first
                    continue
                async with PullConsumer(cluster.namesrv_addr, group) as offsets:
                    for mq in await offsets.fetch_queues(topic + "Out"):
                        await offsets.update_offset(mq, 0)  # the C++ client starts at the ends
                async with cpp_peer(cluster, "consume", topic + "Out", group) as consumer:
                    await consumer.wait_for(
                        lambda: {e["n"] for e in consumer.of("consumed")} >= set(range(600)),
                        90,
                        lambda: f"all 600 (have {len({e['n'] for e in consumer.of('consumed')})})",
                    )
                    await trio.sleep(1.0)  # a second copy would come now
                    await consumer.finish()
                await driver.finish(60)
                break
    written: dict[int, set[str]] = defaultdict(set)
    for event in consumer.of("consumed"):
        written[event["n"]].add(event["msg_id"])
    assert set(written) == set(range(600))
    assert {n: ids for n, ids in written.items() if len(ids) > 1} == {}


async def test_drill_two_master_kills_under_a_running_query(cluster, spark, tmp_path):
    """What a user runs: producers write, a query streams to parquet with a checkpoint,
    the master is killed, later the next one; after the producers stop and the query
    drains, the sink holds every acknowledged message once, in queue order."""
    topic, group = "SparkDrill", "spark-drill"
    await cluster.create_topic(topic, 4)
    query = await in_thread(
        lambda: start_stream(
            spark,
            cluster,
            topic,
            tmp_path,
            {"processingTime": "300 milliseconds"},
            maxMessagesPerTrigger="400",
            consumerGroup=group,
        )
    )
    acked: dict[str, bytes] = {}
    unknown: set[bytes] = set()

    stop = trio.Event()  # not a cancellation: a send cut short may still be stored

    async def sender(worker: int, producer: Producer) -> None:
        for seq in itertools.count():
            if stop.is_set():
                return
            body = b"%d-%d" % (worker, seq)
            try:
                result = await producer.send(topic, body)
            except SendError as exc:
                assert exc.indeterminate, exc  # a refusal would mean no master came back
                unknown.add(body)
                continue
            acked[result.msg_id] = body
            await trio.sleep(0.005)  # leave the cores to the brokers and Spark too

    async def until_acked(more: int) -> None:
        goal = len(acked) + more
        while len(acked) < goal:
            await trio.sleep(0.02)

    try:
        with trio.fail_after(120):
            async with (
                Producer(cluster.namesrv_addr, send_timeout_s=10) as producer,
                trio.open_nursery() as senders,
            ):
                for worker in range(4):
                    senders.start_soon(sender, worker, producer)
                await until_acked(400)
                first = await cluster.wait_master()
                cluster.kill(first)
                second = await cluster.wait_master(not_node=first)
                await until_acked(400)
                await cluster.restart(first)  # a quorum is needed for the next kill
                await caught_up_with_master(cluster, first)
                cluster.kill(second)
                await cluster.wait_master(not_node=second)
                await until_acked(400)
                stop.set()
            await in_thread(query.processAllAvailable)
            await cluster.restart(second)
    finally:
        await in_thread(query.stop)
    assert query.exception() is None
    ends = await queue_ends(cluster, topic)
    rows = await in_thread(sink_rows, spark, tmp_path)
    check_exactly_once(rows, acked, ends, unknown)
    # Each producer sends one message at a time, so in every queue its numbers only grow
    # (a retried send that had been stored may repeat one).
    last: dict[tuple, int] = {}
    for r in sorted(rows, key=lambda r: (r.queueId, r.queueOffset)):
        worker, seq = r.body.split(b"-")
        assert int(seq) >= last.get((r.queueId, worker), -1)
        last[(r.queueId, worker)] = int(seq)
    async with PullConsumer(cluster.namesrv_addr, group) as monitor:
        committed = {q: await monitor.query_offset(MessageQueue(topic, *q)) for q in ends}
    assert any(committed.values())  # the group's offsets, for monitoring, trail the query
    assert all(c is None or c <= ends[q] for q, c in committed.items())


async def test_restart_from_the_checkpoint_across_a_leader_change(cluster, spark, tmp_path):
    topic = "SparkRestart"
    await cluster.create_topic(topic, 4)
    acked = await send_numbered(cluster, topic, 200)
    query = await in_thread(
        lambda: start_stream(spark, cluster, topic, tmp_path, {"availableNow": True})
    )
    await in_thread(query.awaitTermination)
    assert len(await in_thread(sink_rows, spark, tmp_path)) == 200

    old = await cluster.wait_master()
    cluster.kill(old)
    await cluster.wait_master(not_node=old)
    acked |= await send_numbered(cluster, topic, 200, start=200)
    query = await in_thread(
        lambda: start_stream(spark, cluster, topic, tmp_path, {"availableNow": True})
    )
    await in_thread(query.awaitTermination)
    await cluster.restart(old)
    ends = await queue_ends(cluster, topic)
    check_exactly_once(await in_thread(sink_rows, spark, tmp_path), acked, ends)
