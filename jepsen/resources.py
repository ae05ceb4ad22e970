"""What a soak measures of each process, and whether it grew: RSS, open descriptors, disk use.

Samples come from /proc (`VmRSS` in /proc/<pid>/status, the entries of /proc/<pid>/fd) and
from the blocks each store directory's files occupy, every few seconds for every process of
the run. Growth is judged per incarnation of a process (a node the nemesis killed starts a
new one when it restarts), after a warm-up (until retention first deletes files, a store and
its open files only grow): the median of the first quarter of what is left against the
lowest sample of its last quarter. A leak is what a process never gives back, so a climb
that continues to the end counts, while a burst that is released again (the connections a
client opens to a new master, closed after two idle minutes; a segment mapped until
retention deletes it) does not, however late in the run it falls. An incarnation too short
to judge after its warm-up is not judged.
"""

from __future__ import annotations

import contextlib
import csv
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import attrs

FIELDS = ("time_s", "process", "pid", "rss_bytes", "fds", "disk_bytes", "log_begin_bytes")


@attrs.frozen
class Sample:
    time_s: float
    process: str  # its role: namesrv, n0, n1, ..., clients
    pid: int
    rss_bytes: int
    fds: int
    disk_bytes: int | None = None  # its store directory, for a broker
    log_begin_bytes: int | None = None  # where its log's first data file starts (retention)

    def row(self) -> list:
        return [getattr(self, name) for name in FIELDS]


def read_process(pid: int) -> tuple[int, int] | None:
    """(RSS in bytes, open descriptors) of `pid`, None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024, fds
    return None  # a zombie has no VmRSS


def disk_bytes(path: Path) -> int:
    """Bytes the files under `path` occupy on disk (what du counts: preallocated but never
    written space in a sparse file is not counted)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            # a file retention deleted since the walk listed it counts nothing
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def log_begin_bytes(data_dir: Path) -> int | None:
    """The start offset of the first data file of a DLedger log (files are named by it)."""
    try:
        names = [name for name in os.listdir(data_dir) if name.isdigit()]
    except FileNotFoundError:
        return None
    return int(min(names)) if names else None


@attrs.frozen
class Growth:
    """One incarnation's growth after its warm-up: `*_first` is the median of the first
    quarter, `*_last` the lowest sample of the last quarter (see the module docstring)."""

    process: str
    pid: int
    start_s: float
    end_s: float
    samples: int
    rss_first_bytes: int
    rss_last_bytes: int
    fds_first: float
    fds_last: float
    judged: bool  # long enough to judge (see `growth`)

    @property
    def rss_growth_pct(self) -> float:
        return 100.0 * (self.rss_last_bytes - self.rss_first_bytes) / max(self.rss_first_bytes, 1)

    @property
    def fd_growth(self) -> float:
        return self.fds_last - self.fds_first

    def leaks(self, rss_limit_pct: float, fd_limit: float) -> list[str]:
        """What grew past the limits, in words; empty when nothing did or it is not judged."""
        if not self.judged:
            return []
        found = []
        if self.rss_growth_pct > rss_limit_pct:
            found.append(
                f"{self.process} (pid {self.pid}) RSS grew {self.rss_growth_pct:+.1f}% "
                f"({self.rss_first_bytes / 2**20:.1f} -> {self.rss_last_bytes / 2**20:.1f} MiB)"
            )
        if self.fd_growth > fd_limit:
            found.append(
                f"{self.process} (pid {self.pid}) open descriptors grew {self.fd_growth:+g} "
                f"({self.fds_first:g} -> {self.fds_last:g})"
            )
        return found


def incarnations(samples: Iterable[Sample]) -> dict[str, list[list[Sample]]]:
    """Each process's samples split where its pid changes (a restart), in time order."""
    runs: dict[str, list[list[Sample]]] = defaultdict(list)
    for sample in sorted(samples, key=lambda s: s.time_s):
        lives = runs[sample.process]
        if not lives or lives[-1][-1].pid != sample.pid:
            lives.append([])
        lives[-1].append(sample)
    return dict(runs)


def growth(life: list[Sample], min_span_s: float, warmup_s: float = 0.0) -> Growth:
    """Growth over one incarnation from `warmup_s` after its first sample: the median of
    the first quarter (by time) against the lowest of the last. It is judged only if that
    spans at least `min_span_s` and each quarter has two samples."""
    assert life and len({s.pid for s in life}) == 1, "one incarnation, one pid"
    judged_part = [s for s in life if s.time_s >= life[0].time_s + warmup_s] or life[-1:]
    start, end = judged_part[0].time_s, judged_part[-1].time_s
    quarter = (end - start) / 4
    first = [s for s in judged_part if s.time_s <= start + quarter]
    last = [s for s in judged_part if s.time_s >= end - quarter]
    return Growth(
        process=life[0].process,
        pid=life[0].pid,
        start_s=start,
        end_s=end,
        samples=len(judged_part),
        rss_first_bytes=int(statistics.median(s.rss_bytes for s in first)),
        rss_last_bytes=min(s.rss_bytes for s in last),
        fds_first=statistics.median(s.fds for s in first),
        fds_last=min(s.fds for s in last),
        judged=end - start >= min_span_s and len(first) >= 2 and len(last) >= 2,
    )


def judge(
    samples: Iterable[Sample], min_span_s: float, warmup_s: float = 0.0
) -> dict[str, list[Growth]]:
    """Every incarnation's growth, per process."""
    return {
        process: [growth(life, min_span_s, warmup_s) for life in lives]
        for process, lives in incarnations(samples).items()
    }


def read_samples(path: Path) -> list[Sample]:
    """The samples a soak wrote to samples.csv."""

    def number(text: str) -> int | None:
        return int(text) if text else None

    with open(path, newline="") as file:
        return [
            Sample(
                float(row["time_s"]),
                row["process"],
                int(row["pid"]),
                int(row["rss_bytes"]),
                int(row["fds"]),
                number(row["disk_bytes"]),
                number(row["log_begin_bytes"]),
            )
            for row in csv.DictReader(file)
        ]


def longest(growths: list[Growth]) -> Growth:
    """The incarnation that says most about a process: the longest (the later on a tie)."""
    return max(reversed(growths), key=lambda g: g.end_s - g.start_s)
