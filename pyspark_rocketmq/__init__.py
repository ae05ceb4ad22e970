"""Registers the "rocketmq" data source with every SparkSession: pyspark looks for
top-level modules named `pyspark_*` and registers their `DefaultSource`."""

from client.spark import RocketMQSource as DefaultSource

__all__ = ["DefaultSource"]
