"""CPU time per acknowledged message, per process role, from /proc/<pid>/stat.

Throughput on a shared, noisy machine moves 10-25 % between runs; the CPU a process
spent per message moves far less, because it does not count the time the process
waited for a core. So every benchmark row carries, for each role (the master or
leader, each follower, the load generator), the user + system CPU it used during the
measured window divided by the messages acknowledged in that window.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of every thread of process ``pid`` so far (None once gone)."""
    stat = _stat(f"/proc/{pid}/stat")
    return None if stat is None else stat[1]


def _stat(path: str) -> tuple[str, float] | None:
    """A /proc stat file's command name and user + system CPU seconds (None once gone)."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    name = text[text.index(b"(") + 1 : text.rindex(b")")].decode(errors="replace")
    fields = text[text.rindex(b")") + 2 :].split()
    utime_ticks, stime_ticks = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat
    return name, (utime_ticks + stime_ticks) / _TICKS_PER_S


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of process ``pid``'s threads, summed by thread name; its first
    thread is "main" (a Python process's threads all carry the program's name unless
    a library names its own, as gRPC's core does)."""
    seconds: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return seconds
    for tid in tids:
        stat = _stat(f"/proc/{pid}/task/{tid}/stat")
        if stat is not None:
            name = "main" if int(tid) == pid else stat[0]
            seconds[name] = seconds.get(name, 0.0) + stat[1]
    return seconds


class ThreadMeter:
    """`CpuMeter` for one process's threads, by name: where its CPU per message goes.
    A thread that started within the window counts whole; one that ended within it is
    missing at the end, so its name's figure is low (the proxy's threads live as long
    as it does)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start = thread_seconds(pid)
        self._end: dict[str, float] | None = None

    def restart(self) -> None:
        self._start = thread_seconds(self.pid)
        self._end = None

    def stop(self) -> None:
        self._end = thread_seconds(self.pid)

    def per_message_us(self, messages: int) -> dict[str, float]:
        """CPU µs per message by thread name in the window, largest first."""
        end = self._end if self._end is not None else thread_seconds(self.pid)
        if messages <= 0:
            return {}
        figures = {
            name: round((seconds - self._start.get(name, 0.0)) * 1e6 / messages, 1)
            for name, seconds in end.items()
        }
        return dict(sorted(figures.items(), key=lambda item: -item[1]))


class CpuMeter:
    """Snapshots of named processes' CPU time; ``per_message_us`` turns two into a figure.

    ``roles`` maps a role name ("leader", "follower n1", "generator"; the
    broker's master is its group's leader) to a pid. A role
    whose process is gone at either snapshot gets no figure rather than a wrong one.
    """

    def __init__(self, roles: Mapping[str, int]) -> None:
        self.roles = dict(roles)
        self._start = self._sample()
        self._end: dict[str, float | None] | None = None

    def _sample(self) -> dict[str, float | None]:
        return {role: cpu_seconds(pid) for role, pid in self.roles.items()}

    def restart(self) -> None:
        """Begin the measured window now (after a warm-up, say)."""
        self._start = self._sample()
        self._end = None

    def stop(self) -> None:
        """End the measured window now, for a count of messages known only later."""
        self._end = self._sample()

    def per_message_us(self, messages: int) -> dict[str, float]:
        """CPU µs each role spent per message in the window (ending now unless stopped)."""
        end = self._end if self._end is not None else self._sample()
        figures = {}
        for role, started in self._start.items():
            ended = end[role]
            if started is not None and ended is not None and messages > 0:
                figures[role] = round((ended - started) * 1e6 / messages, 1)
        return figures


def columns(figures: Mapping[str, float]) -> dict[str, float | None]:
    """The table's CPU columns from per-role figures: the leader (master), the followers'
    mean, the name server (where it is measured) and the load generator; each role's own
    figure stays in the JSON."""
    followers = [v for role, v in figures.items() if role.startswith("follower")]
    return {
        "cpu_leader_us": figures.get("leader"),
        "cpu_follower_us": round(sum(followers) / len(followers), 1) if followers else None,
        "cpu_namesrv_us": figures.get("namesrv"),
        "cpu_generator_us": figures.get("generator"),
        "cpu_us_per_message": dict(figures),
    }
