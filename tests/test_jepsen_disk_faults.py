"""Full and slow disks under the fault-injection runner, against real processes.

- disk-full: each broker's store is a tmpfs of its own; a ballast file fills a
  follower's to the last byte (the group commits on the other two), the leader's over
  diskSpaceWarningLevelRatio (it refuses sends with SERVICE_NOT_AVAILABLE and RocketMQ's
  remark), then everyone's to the last byte. No broker stops over it, nothing
  acknowledged is lost, and sends resume by themselves once the ballast is gone;
- slow-disk: strace attached to the leader's broker, then a follower's, returns every
  fsync 100 ms late; the other two make the quorum, so sends keep their latency.
"""

from pathlib import Path

import pytest

from jepsen.history import load, pairs
from jepsen.nemesis import Step
from jepsen.runner import RunConfig, run, summary

pytestmark = pytest.mark.processes


def _explain(results: dict, config: RunConfig) -> str:
    return f"{summary(results, config)}\nrun directory: {config.run_dir}"


def _mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines() if str(path) in line]


@pytest.mark.requires("tmpfs")
async def test_full_disks_refuse_sends_lose_nothing_and_resume(tmp_path):
    schedule = [
        (3.0, "follower", "no-room", 4.0),
        (10.0, "leader", "over-ratio", 4.0),
        (17.0, "all", "no-room", 3.0),
    ]
    config = RunConfig(
        run_dir=tmp_path / "full",
        seed=1,
        time_limit_s=22,
        steps=tuple(
            Step(at, "disk-full", t, v, d, seed=i) for i, (at, t, v, d) in enumerate(schedule)
        ),
        progress=False,
    )
    results = await run(config)
    assert results["valid"], _explain(results, config)  # no process errors among them
    assert results["run"]["recovered"] and results["run"]["drained"]
    assert not _mounts_under(tmp_path), "the harness left its filesystems mounted"
    follower, leader, every = results["disk_faults"]["faults"]
    assert follower["ok_during"] > 100, follower  # the other two commit
    for fault in (leader, every):
        assert fault["refused"] > 0, fault
        assert fault["resumed_after_s"] is not None and fault["resumed_after_s"] < 5, fault
    refused = [
        p.completion["error"]
        for p in pairs(load(config.run_dir / "history.jsonl"))
        if p.f == "send" and p.type == "fail" and "disk is full" in p.completion["error"]
    ]
    assert refused[0].startswith("code 14: service not available now."), refused[0]
    assert "CL: " in refused[0] and " CQ: " in refused[0] and " INDEX: " in refused[0]
    text = (config.run_dir / "summary.txt").read_text()
    assert "sends refused (disk full)" in text and "sends resumed" in text, text


@pytest.mark.requires("strace")
async def test_a_slow_disk_on_the_leader_or_a_follower_costs_no_latency(tmp_path):
    config = RunConfig(
        run_dir=tmp_path / "slow",
        seed=1,
        time_limit_s=22,
        steps=(
            Step(4.0, "slow-disk", "leader", "fsync-delay", 6.0, seed=5),
            Step(13.0, "slow-disk", "follower", "fsync-delay", 6.0, seed=5),
        ),
        progress=False,
    )
    results = await run(config)
    assert results["valid"], _explain(results, config)
    injected = results["run"]["faults"]
    assert [f["fsync_delay_ms"] for f in injected] == [100, 100]
    assert all(f["fsyncs_delayed"] > 10 for f in injected), injected  # it did bite
    for fault in results["disk_faults"]["faults"]:
        during = fault["during"]
        assert during["count"] > 100, fault
        # a send waits for a quorum's fsyncs, and the two fast replicas are one
        assert during["p50"] < 0.1, fault
    assert results["availability"]["count"] == 0, _explain(results, config)
