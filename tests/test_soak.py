"""The soak's measuring and judging, without a cluster: reading a process from /proc and a
store's disk use, splitting samples at restarts, growth between the first and last quarter
(flat is flat, a climb is a leak, a spike is not, a short life is not judged), latency per
interval, the fault schedule, and the command line's errors."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jepsen.__main__ import main
from jepsen.history import Recorder
from jepsen.resources import (
    FIELDS,
    Sample,
    disk_bytes,
    growth,
    incarnations,
    judge,
    log_begin_bytes,
    longest,
    read_process,
    read_samples,
)
from jepsen.soak import SOAK_TARGETS, SoakConfig, schedule
from jepsen.soak_report import load_intervals, passed, recovery_text

MIB = 1 << 20


def life(process, pid, rss_mib, fds, start=0.0, every=5.0):
    return [
        Sample(start + i * every, process, pid, int(r * MIB), f)
        for i, (r, f) in enumerate(zip(rss_mib, fds, strict=True))
    ]


def test_read_process_measures_a_live_process_and_nothing_for_a_dead_one():
    rss, fds = read_process(os.getpid())
    assert 5 * MIB < rss < 4096 * MIB
    with open(os.devnull) as _:
        assert read_process(os.getpid())[1] == fds + 1  # one more open file, one more fd
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert read_process(child.pid) is None


def test_disk_use_counts_written_blocks_not_a_sparse_preallocation(tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "written").write_bytes(b"x" * 100_000)
    with open(tmp_path / "data" / "sparse", "wb") as sparse:
        sparse.truncate(64 * MIB)
    used = disk_bytes(tmp_path)
    assert 100_000 <= used < 1 * MIB


def test_the_log_begins_at_its_first_data_file(tmp_path: Path):
    assert log_begin_bytes(tmp_path / "missing") is None
    for name in ("00000000000008388608", "00000000000004194304", "begin"):
        (tmp_path / name).write_bytes(b"")
    assert log_begin_bytes(tmp_path) == 4 * MIB


def test_samples_read_back_from_their_csv(tmp_path: Path):
    samples = [Sample(0.5, "n0", 10, 3 * MIB, 20, 7 * MIB, 0), Sample(0.5, "clients", 9, MIB, 30)]
    with open(tmp_path / "samples.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(FIELDS)
        writer.writerows(sample.row() for sample in samples)
    assert read_samples(tmp_path / "samples.csv") == samples


def test_samples_split_into_lives_where_the_pid_changes():
    samples = [*life("n0", 10, [30, 31], [20, 20]), *life("n0", 11, [25, 26], [18, 19], 10)]
    samples += life("namesrv", 5, [20] * 4, [10] * 4)
    lives = incarnations(reversed(samples))  # any order in, time order out
    assert [[s.pid for s in one] for one in lives["n0"]] == [[10, 10], [11, 11]]
    assert len(lives["namesrv"]) == 1


def test_flat_memory_and_descriptors_are_no_leak():
    g = growth(
        life("n0", 1, [40, 41, 40, 42, 41, 40, 41, 41], [30, 31, 30, 30, 31, 30, 31, 30]), 30
    )
    assert g.judged
    assert abs(g.rss_growth_pct) < 3 and g.fd_growth <= 1
    assert g.leaks(rss_limit_pct=20, fd_limit=8) == []


def test_a_steady_climb_is_flagged_and_a_single_spike_is_not():
    climbing = growth(life("n1", 7, [40, 45, 50, 55, 60, 65, 70, 75], [30] * 8), 30)
    # the first quarter's median (40, 45) against the last quarter's lowest (70, 75)
    assert climbing.rss_growth_pct == pytest.approx(100 * (70 - 42.5) / 42.5, abs=0.1)
    (leak,) = climbing.leaks(rss_limit_pct=20, fd_limit=8)
    assert "n1 (pid 7) RSS grew" in leak
    fds = growth(life("n1", 7, [40] * 8, [30, 30, 32, 35, 38, 40, 42, 44]), 30)
    assert fds.fd_growth == 12 and "open descriptors grew +12" in fds.leaks(20, 8)[0]
    spike = growth(
        life("n2", 8, [40, 40, 40, 40, 90, 40, 40, 40], [30, 30, 30, 90, 30, 30, 30, 30]), 30
    )
    assert spike.leaks(20, 8) == []


def test_a_burst_released_before_the_end_is_no_leak_and_one_held_to_the_end_is():
    """A client's connections to a new master, closed after two idle minutes, may fall in
    the last quarter; they count only if they are never given back."""
    released = growth(life("clients", 2, [40] * 8, [38, 38, 38, 38, 38, 38, 48, 38]), 30)
    assert released.fd_growth == 0 and released.leaks(20, 8) == []
    held = growth(life("clients", 2, [40] * 8, [38, 38, 38, 38, 38, 38, 48, 48]), 30)
    assert held.fd_growth == 10 and held.leaks(20, 8)


def test_the_warm_up_before_retention_first_deletes_is_not_growth():
    """A store grows until retention deletes its first files, then holds steady."""
    warming = life(
        "n0", 5, [30, 40, 50, 60, 60, 61, 60, 61, 60, 61, 60, 61], [20, 30, 40] + [45] * 9
    )
    assert growth(warming, 30).leaks(20, 8)  # judged from the first sample: "leaks"
    settled = growth(warming, 30, warmup_s=15)
    assert settled.start_s == 15 and settled.judged
    assert settled.leaks(20, 8) == [] and settled.fd_growth == 0


def test_a_life_too_short_is_not_judged_and_the_longest_life_speaks_for_a_process():
    short = growth(life("n0", 3, [40, 80, 160], [10, 50, 90]), 30)
    assert not short.judged and short.leaks(20, 8) == []
    growths = judge(
        [*life("n0", 3, [40, 80, 160], [10, 50, 90]), *life("n0", 4, [40] * 10, [20] * 10, 20)],
        min_span_s=30,
    )
    assert [g.pid for g in growths["n0"]] == [3, 4]
    assert longest(growths["n0"]).pid == 4


def test_load_per_interval_percentiles_of_acknowledged_sends(tmp_path: Path):
    now = [0.0]
    rec = Recorder(tmp_path / "h.jsonl", clock=lambda: now[0])
    for i, latency in enumerate([0.001, 0.002, 0.003, 0.100]):
        now[0] = i * 0.5
        rec.invoke(i + 1, "send", value=f"{i + 1}-0", key=0)
        now[0] += latency
        rec.complete("ok", i + 1, "send", offset=i)
    now[0] = 6.0
    rec.invoke(9, "send", value="9-0", key=0)
    now[0] = 6.5
    rec.complete("fail", 9, "send", error="no master")
    rows = load_intervals(rec.ops, every_s=5.0)
    assert [(r["sends_ok"], r["sends_not_ok"]) for r in rows] == [(4, 0), (0, 1)]
    assert (rows[0]["send_p50_ms"], rows[0]["send_p99_ms"]) == (2.0, 100.0)
    assert rows[1]["send_p50_ms"] is None


def test_the_schedule_spaces_soak_faults_and_ends_them_before_the_run():
    config = SoakConfig(Path("unused"), seed=3, duration_s=1800, fault_every_s=240)
    steps = schedule(config)
    assert [s.at_s for s in steps] == [240.0 * k for k in range(1, 8)]
    assert all(s.target in SOAK_TARGETS[s.kind] for s in steps)
    assert all(s.at_s + s.duration_s < 1800 for s in steps)
    assert schedule(config) == steps  # the seed decides
    assert schedule(SoakConfig(Path("unused"), seed=3, duration_s=1800, faults=())) == []


def test_the_soak_command_refuses_bad_arguments_in_one_line(capsys):
    assert main(["soak", "--minutes", "1", "--faults", "disk"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "disk" in err and "not soak faults" in err
    with pytest.raises(SystemExit) as exit_:
        main(["soak", "--minutes", "1", "--hours", "1"])
    assert exit_.value.code == 2


def test_a_soak_passes_only_if_valid_without_leaks_and_recovered():
    clean = {"leaks": [], "recovered": True}
    assert passed(clean, {"valid": True})
    assert not passed(clean, {"valid": False})
    assert not passed({**clean, "leaks": ["n0 (pid 1) RSS grew +40.0%"]}, {"valid": True})
    assert not passed({**clean, "recovered": False}, {"valid": True})
    assert "NOT RECOVERED" in recovery_text({"recovered": False, "recovery_s": 60.0})
