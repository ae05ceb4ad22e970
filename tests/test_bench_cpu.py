"""The per-role CPU figures of the benchmarks, read from /proc/<pid>/stat."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench import cpu


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_seconds_counts_this_process_work():
    before = cpu.cpu_seconds(os.getpid())
    _spin(0.2)
    after = cpu.cpu_seconds(os.getpid())
    assert before is not None and after is not None
    assert 0.15 <= after - before <= 1.0


@pytest.mark.processes  # a child that has exited stands for a vanished role
def test_a_finished_process_has_no_figure():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process
    assert cpu.cpu_seconds(child.pid) is None


@pytest.mark.processes  # a child that has exited stands for a vanished role
def test_per_message_figures_cover_only_the_window_and_skip_vanished_roles():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    meter = cpu.CpuMeter({"leader": os.getpid(), "follower gone": child.pid})
    _spin(0.3)  # before the window: not counted
    meter.restart()
    _spin(0.1)
    meter.stop()
    _spin(0.3)  # after the window: not counted
    figures = meter.per_message_us(1000)
    assert set(figures) == {"leader"}
    assert 80 <= figures["leader"] <= 250  # ~100 ms over 1000 messages, in µs each
    columns = cpu.columns({"leader": 40.0, "follower a": 10.0, "follower b": 20.0})
    assert columns["cpu_leader_us"] == 40.0 and columns["cpu_follower_us"] == 15.0
    assert columns["cpu_generator_us"] is None
