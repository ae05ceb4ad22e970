"""`python -m bench broker` runs end to end (without its peer): every phase produces a
figure, so the README's table can always be measured again. Speed is not asserted."""

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
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["single_p50_ms"] > 0 and row["failover_ms"] > 0
        assert row["peak_rss_mib"] > 0
        assert row["cpu_leader_us"] > 0 and row["cpu_follower_us"] > 0
        assert row["cpu_generator_us"] > 0
        # the Go generator wherever Go can be had; then this process only pulls
        assert row["generator"] in ("go", "python")
        assert row["generator"] == "python" or row["cpu_puller_us"] > 0
    assert "| raftmq broker R3" in run.stdout
