"""Orders -> orders and revenue per minute: a Spark streaming job over a RocketMQ topic.

Each message of the topic is an order, a JSON body `{"id": "o-1", "amount": 12.5,
"ts": 1763800000000}` (ts: when the order was placed, epoch ms) tagged with its status
("paid", "refunded"). The job counts orders and sums amounts per minute of `ts` and per
status, and prints each minute as it changes:

    python examples/orders_per_minute.py --namesrv 127.0.0.1:9876 --topic Orders \\
        --checkpoint /var/lib/orders-per-minute

Stopped and started again with the same --checkpoint, it goes on where it stopped,
counting each order once, also when the broker group changed masters meanwhile.

    python examples/orders_per_minute.py --demo

starts its own name server and 3-broker group (from this repository), sends 300
orders spread over the last five minutes, reads them with trigger availableNow and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from raftmq.client.spark import RocketMQSource

ORDER = "id STRING, amount DOUBLE, ts BIGINT"


def per_minute(messages: DataFrame) -> DataFrame:
    """Orders and revenue per minute of the order time and per status (the tag).

    The watermark lets Spark forget minutes more than two minutes older than the newest
    order seen, so the state stays small on an endless stream."""
    orders = messages.select(
        F.from_json(F.col("body").cast("string"), ORDER).alias("order"),
        F.col("tags").alias("status"),
    ).select("order.*", "status")
    orders = orders.withColumn("placed", F.timestamp_millis("ts"))
    return (
        orders.withWatermark("placed", "2 minutes")
        .groupBy(F.window("placed", "1 minute").alias("minute"), "status")
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
        .select(F.col("minute.start").alias("minute"), "status", "orders", "revenue")
    )


def orders_stream(spark: SparkSession, namesrv: str, topic: str) -> DataFrame:
    return (
        spark.readStream.format("rocketmq")
        .option("nameSrvAddr", namesrv)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "10000")
        .load()
    )


def session() -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need raftmq too
    spark = (
        SparkSession.builder.appName("orders-per-minute")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.dataSource.register(RocketMQSource)  # automatic when raftmq is pip-installed
    return spark


def run(namesrv: str, topic: str, checkpoint: str) -> None:
    spark = session()
    query = (
        per_minute(orders_stream(spark, namesrv, topic))
        .writeStream.outputMode("update")
        .format("console")
        .option("truncate", "false")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="10 seconds")
        .start()
    )
    query.awaitTermination()


def demo() -> None:
    import trio

    from raftmq.client import Producer
    from raftmq.tools.broker_local import LocalCluster

    now_ms = int(time.time() * 1000)

    async def send_orders(cluster: LocalCluster) -> None:
        await cluster.create_topic("Orders", 4)
        async with Producer(cluster.namesrv_addr) as producer:
            for i in range(300):
                order = {
                    "id": f"o-{i}",
                    "amount": random.randint(100, 9999) / 100,
                    "ts": now_ms - random.randint(0, 5 * 60_000),
                }
                status = "refunded" if i % 10 == 0 else "paid"
                await producer.send("Orders", json.dumps(order).encode(), tags=status)

    with tempfile.TemporaryDirectory(prefix="orders-per-minute-") as tmp:
        cluster = LocalCluster(os.path.join(tmp, "cluster"))
        trio.run(cluster.__aenter__)
        try:
            trio.run(send_orders, cluster)
            spark = session()
            query = (
                per_minute(orders_stream(spark, cluster.namesrv_addr, "Orders"))
                .writeStream.outputMode("complete")
                .format("memory")
                .queryName("orders_per_minute")
                .option("checkpointLocation", os.path.join(tmp, "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            spark.table("orders_per_minute").orderBy("minute", "status").show(truncate=False)
            spark.stop()
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876", help="name server(s), ';'-joined")
    parser.add_argument("--topic", default="Orders")
    parser.add_argument("--checkpoint", default="orders-per-minute-checkpoint")
    parser.add_argument("--demo", action="store_true", help="a local broker group and 300 orders")
    args = parser.parse_args()
    if args.demo:
        demo()
    else:
        run(args.namesrv, args.topic, args.checkpoint)


if __name__ == "__main__":
    main()
