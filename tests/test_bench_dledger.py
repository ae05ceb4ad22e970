"""`bench dledger`'s own phases run end to end against a real 3-process group: every
figure of raftmq's row is measured, so the table in docs/benchmarks.md can always be
measured again. Speed is not asserted (PySyncObj's row has its own run in `python -m
bench dledger`)."""

from __future__ import annotations

import math

import pytest

from bench import dledger_bench


@pytest.mark.processes
async def test_the_dledger_benchmark_measures_every_phase():
    row = await dledger_bench.measure(payload=128, duration_s=1.0, window=32, failover_trials=1)
    assert row["appends_per_s"] > 0 and row["batched_appends_per_s"] > 0
    assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert 0 < row["half_load_p50_ms"] <= row["half_load_p99_ms"]  # the open-loop phase
    assert row["single_p50_ms"] > 0 and not math.isnan(row["single_p50_ms"])
    assert row["failover_ms"] > 0 and len(row["failover_trials_ms"]) == 1
    assert row["peak_rss_mib"] > 0
    assert row["cpu_leader_us"] > 0 and row["cpu_follower_us"] > 0
    assert row["cpu_generator_us"] > 0
