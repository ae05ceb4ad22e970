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
SLOWED = ((4.0, "leader"), (13.0, "follower"))  # when, and whose fsyncs


def _explain(results: dict, config: RunConfig) -> str:
    return f"{summary(results, config)}\nrun directory: {config.run_dir}"


async def _valid_run(run_dir: Path, *steps: Step) -> tuple[RunConfig, dict]:
    """A 22 s run of `steps` (their seeds fix the targets and delays) that must pass
    every check, process errors (a broker that stopped) among them."""
    config = RunConfig(run_dir=run_dir, seed=1, time_limit_s=22, steps=steps, progress=False)
    results = await run(config)
    assert results["valid"], _explain(results, config)
    return config, results


def _mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines() if str(path) in line]


@pytest.mark.requires("tmpfs")
async def test_full_disks_refuse_sends_lose_nothing_and_resume(tmp_path):
    config, results = await _valid_run(
        tmp_path / "full",
        Step(3.0, "disk-full", "follower", "no-room", 4.0, seed=0),
        Step(10.0, "disk-full", "leader", "over-ratio", 4.0, seed=1),
        Step(17.0, "disk-full", "all", "no-room", 3.0, seed=2),
    )
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
    # seed 5 draws a 100 ms delay for either target
    slow = [Step(at, "slow-disk", target, "fsync-delay", 6.0, seed=5) for at, target in SLOWED]
    config, results = await _valid_run(tmp_path / "slow", *slow)
    injected = results["run"]["faults"]
    assert [f["fsync_delay_ms"] for f in injected] == [100, 100]
    assert all(f["fsyncs_delayed"] > 10 for f in injected), injected  # it did bite
    for fault in results["disk_faults"]["faults"]:
        during = fault["during"]
        assert during["count"] > 100, fault
        # a send waits for a quorum's fsyncs, and the two fast replicas are one
        assert during["p50"] < 0.1, fault
    assert results["availability"]["count"] == 0, _explain(results, config)
