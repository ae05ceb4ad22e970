"""A Spark driver as a process of its own, for tests that kill it (a SIGKILL of its
process group takes the JVM and its Python workers too) and start it again.

    python tests/spark_driver/peer.py NAMESRV TOPIC CHECKPOINT QUERY_ID

Copies TOPIC's bodies into TOPIC + "Out" with the rocketmq sink in exactly-once mode,
100 messages per micro-batch every 200 ms, from the earliest offsets or from
CHECKPOINT when it holds a query. Prints {"event": "started"} once the query runs and
{"event": "batch", "id": N, "rows": R} per micro-batch done; stops the query and exits
when its stdin closes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.*
from tests.peer_lines import emit, stop_at_end_of_stdin
from tests.spark_driver.session import spark_session


def main(namesrv: str, topic: str, checkpoint: str, query_id: str) -> None:
    spark = spark_session("raftmq-spark-driver")
    query = (
        spark.readStream.format("rocketmq")
        .option("nameSrvAddr", namesrv)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "100")
        .load()
        .select("body")
        .writeStream.format("rocketmq")
        .option("nameSrvAddr", namesrv)
        .option("topic", topic + "Out")
        .option("exactlyOnce", "true")
        .option("queryId", query_id)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    emit(event="started")
    stop = stop_at_end_of_stdin()
    reported = -1
    while not stop.is_set() and query.isActive:
        query.awaitTermination(0.1)
        for progress in query.recentProgress:
            if progress["batchId"] > reported:
                reported = progress["batchId"]
                emit(
                    event="batch",
                    id=reported,
                    rows=progress["numInputRows"],
                    duration_ms=progress["durationMs"],
                )
    query.stop()
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
