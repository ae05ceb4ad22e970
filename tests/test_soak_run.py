"""A short soak against real processes: a name server and a 3-node group under steady load,
retention deleting 1 MiB log files kept for 18 s, kills and pauses. It must lose nothing,
consume everything, and leave every part of its report: the samples of every process, the
load per interval, the charts and the summary."""

import csv

import pytest

from jepsen.__main__ import main
from jepsen.soak import CLIENTS, SoakConfig, soak


@pytest.mark.untimed
@pytest.mark.processes
@pytest.mark.slow
async def test_a_short_soak_loses_nothing_and_writes_its_report(tmp_path):
    config = SoakConfig(
        run_dir=tmp_path / "soak",
        seed=1,
        duration_s=45,
        rate=100,
        faults=("kill", "pause"),
        fault_every_s=12,
        sample_every_s=2.5,
        segment_bytes=1 << 20,
        reserved_hours=0.005,
        progress=False,
    )
    results = await soak(config)
    run_dir = config.run_dir
    summary = (run_dir / "soak-summary.txt").read_text()
    assert results["valid"], summary
    assert results["soak"]["recovered"] and results["soak"]["leaks"] == [], summary
    assert results["lost"]["count"] == 0 and results["unconsumed"]["count"] == 0
    counts = results["counts"]
    assert counts["acknowledged"] > 3000, summary
    assert sum(counts["faults"].values()) == 3  # at 12, 24 and 36 s

    with open(run_dir / "samples.csv") as file:
        samples = list(csv.DictReader(file))
    processes = {row["process"] for row in samples}
    assert processes == {"namesrv", "n0", "n1", "n2", CLIENTS}
    assert all(int(row["rss_bytes"]) > 0 and int(row["fds"]) > 0 for row in samples)
    brokers = [row for row in samples if row["process"] in ("n0", "n1", "n2")]
    # every sample but the first (taken as the group starts: a store may be empty yet)
    first_s = min(float(row["time_s"]) for row in samples)
    assert all(int(row["disk_bytes"]) > 0 for row in brokers if float(row["time_s"]) > first_s)
    # retention deleted log files on some node while the soak ran (a sample taken before
    # a store's first data file exists has no begin)
    begins = [int(row["log_begin_bytes"]) for row in brokers if row["log_begin_bytes"]]
    assert max(begins) >= 1 << 20, summary

    with open(run_dir / "load.csv") as file:
        intervals = list(csv.DictReader(file))
    # the first interval may end before the load's first send
    assert len(intervals) >= 15 and all(row["send_p99_ms"] for row in intervals[1:11])

    for chart in ("soak-rss.svg", "soak-fds.svg", "soak-disk.svg", "soak-latency.svg"):
        svg = (run_dir / chart).read_text()
        assert svg.startswith("<svg") and "<polyline" in svg, chart
    assert "soak-rss.svg" in (run_dir / "soak.html").read_text()
    assert summary.startswith("raftmq soak: VALID ✓; leaks: none; recovered")
    for process in processes:
        assert f"\n{process} " in summary
    assert set(results["soak"]["growth"]) == processes
    assert main(["check", str(run_dir)]) == 0  # the saved run checks again, as a soak
