"""A PySpark (4.3) data source reading and writing RocketMQ topics on raftmq or any
RocketMQ 4.x broker: `spark.readStream.format("rocketmq")`, `spark.read.format("rocketmq")`,
`df.writeStream.format("rocketmq")` and `df.write.format("rocketmq")`.

Needs the `spark` extra (`pip install raftmq[spark]`: pyspark and pyarrow) and, for
the executors, `PYSPARK_PYTHON` pointing at a Python that has raftmq installed.
Installing raftmq registers the source by itself (pyspark imports every top-level
`pyspark_*` module and registers its `DefaultSource`: ours is `pyspark_rocketmq`);
`spark.dataSource.register(RocketMQSource)` does the same by hand.

Modules: `options` (the options, checked), `offsets` (offset planning, pure),
`session` (broker calls from Spark's threads), `reading` (an executor's range read),
`rows` (the columns, as Arrow), `source` (the DataSource and its readers), `writing`
(the sink's columns, checked, and rows as messages), `sink` (the writers).
"""

from raftmq.client.spark.offsets import DataLossError

__all__ = ["SCHEMA", "DataLossError", "RocketMQSource"]


def __getattr__(name: str):
    """pyspark and pyarrow are imported on first use of what needs them, so the planning
    modules import (and test) without the spark extra."""
    if name == "RocketMQSource":
        from raftmq.client.spark.source import RocketMQSource

        return RocketMQSource
    if name == "SCHEMA":
        from raftmq.client.spark.rows import SCHEMA

        return SCHEMA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
