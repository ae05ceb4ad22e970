"""Registers the "rocketmq" data source with every SparkSession: pyspark looks for
top-level modules named `pyspark_*` and registers their `DefaultSource`."""

from raftmq.client.spark import RocketMQSource as DefaultSource

__all__ = ["DefaultSource"]
