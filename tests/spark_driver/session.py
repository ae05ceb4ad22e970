"""The Spark session the tests use, in the test process (tests/test_spark_source.py's
fixture) and in a driver process of its own (peer.py): the benchmark's local[2]
session, its JVM tuned to start fast (a test's lives a minute)."""

from __future__ import annotations

from bench.spark_bench import spark_session as bench_session

QUICK_START_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # half the start-up


def spark_session(app_name: str):
    """A local[2] session with the rocketmq source registered, named `app_name`."""
    return bench_session(app_name, jvm_options=QUICK_START_JVM)
