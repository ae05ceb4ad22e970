"""The Spark sink's parts that need no Spark: its options and how a task's rows are cut
into batch sends (the sink in real Spark is in test_spark_source.py)."""

from __future__ import annotations

import pytest

from raftmq.client.spark.options import SinkOptions
from raftmq.client.spark.session import BATCH_BYTES, BATCH_MESSAGES, Outgoing, batches


def test_rows_go_in_batches_per_topic_in_order_within_the_limits():
    big = BATCH_BYTES // 2 + 1
    rows = [Outgoing("A" if i % 3 else "B", b"%d" % i, None, None, None) for i in range(200)]
    rows[10:12] = [Outgoing("C", b"x" * big, None, None, None)] * 2  # two do not fit one
    sent = batches(rows)
    assert [(topic, len(batch)) for topic, batch in sent] == [
        ("B", BATCH_MESSAGES), ("A", BATCH_MESSAGES), ("C", 1), ("C", 1),
        ("A", BATCH_MESSAGES), ("B", 3), ("A", 3),
    ]  # fmt: skip
    for topic in "AB":
        bodies = [m.body for t, batch in sent if t == topic for m in batch]
        assert bodies == [r.body for r in rows if r.topic == topic]


def test_options_name_what_is_wrong():
    base = {"NAMESRVADDR": "127.0.0.1:9876"}
    parsed = SinkOptions.parse(base, streaming=False)
    assert (parsed.topic, parsed.producer_group, parsed.exactly_once) == (
        None, "raftmq-spark-sink", False,
    )  # fmt: skip
    once = SinkOptions.parse(
        {**base, "exactlyOnce": "true", "checkpointLocation": "/c"}, streaming=True
    )
    assert once.exactly_once and once.query_id == "/c"
    with pytest.raises(ValueError, match="exactlyOnce is for streaming writes"):
        SinkOptions.parse({**base, "exactlyOnce": "true", "queryId": "q"}, streaming=False)
    with pytest.raises(ValueError, match="needs option queryId or a checkpointLocation"):
        SinkOptions.parse({**base, "exactlyOnce": "true"}, streaming=True)
    with pytest.raises(ValueError, match="option nameSrvAddr is required"):
        SinkOptions.parse({}, streaming=False)
    with pytest.raises(ValueError, match="option sendsInFlight must be positive"):
        SinkOptions.parse({**base, "sendsInFlight": "0"}, streaming=False)
