"""`python -m bench broker` runs end to end (without its peer): every phase produces a
figure, so the tables in docs/benchmarks.md can always be measured again. Speed is not
asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.processes
def test_the_broker_benchmark_measures_every_phase(tmp_path):
    out = tmp_path / "rows.json"
    command = [sys.executable, "-m", "bench", "broker", "--duration", "1"]
    command += ["--failover-trials", "1", "--no-peer", "--json", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [row["size"] for row in rows] == [128, 1024]
    for row in rows:
        assert row["errors"] == 0
        assert row["acked_per_s"] > 0 and row["consumed_per_s"] > 0
        assert row["acked_consuming_per_s"] > 0  # a second phase, pulled meanwhile
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["single_p50_ms"] > 0 and row["failover_ms"] > 0
        assert row["peak_rss_mib"] > 0
        assert row["cpu_leader_us"] > 0 and row["cpu_follower_us"] > 0
        assert row["cpu_generator_us"] > 0
        # the Go generator wherever Go can be had; then this process only pulls
        assert row["generator"] in ("go", "python")
        assert row["generator"] == "python" or row["cpu_puller_us"] > 0
    assert "| raftmq broker R3" in run.stdout


def test_stage_timeline_orders_each_sends_first_marks_and_ignores_strays(tmp_path):
    """`bench broker --stages`: a mark counts for the send whose write and read enclose
    it (first occurrence), rows come in time order with the gap from the row before,
    and a mark seen in no more than half the sends (a heartbeat) is left out."""
    from bench.stages import CLIENT_READ, timeline
    from raftmq.process import stages

    (tmp_path / "10.stages").write_text("read 1100\nread 1150\nread 2100\nstray 2500\n")
    (tmp_path / "20.stages").write_text("fsync 1300\nfsync 2400\n")
    marks = stages.read(str(tmp_path))
    rows = timeline([(1000, 1500), (2000, 2600)], marks, {10: "master", 20: "follower1"})
    assert [(r["role"], r["stage"]) for r in rows] == [
        ("master", "read"),
        ("follower1", "fsync"),
        ("client", CLIENT_READ),
    ]
    assert [r["at_us"] for r in rows] == [0.1, 0.35, 0.55]
    assert rows[1]["gap_us"] == pytest.approx(0.25)
