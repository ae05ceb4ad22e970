"""The console's memory of the cluster: series of numbers over time and election marks.

Sans-IO: `History` is fed samples with their time (`raftmq.console.sampler` reads them
from the cluster) and answers what the charts draw. Each series keeps its points in
fixed-size rings, one per resolution (`TIERS`): the last 5 minutes in 1-second buckets,
the last 20 minutes in 5-second buckets and the last 6 hours in 1-minute buckets, a
bucket holding the mean of the samples that fell in it. A chart of a window takes the
finest ring that spans it. So a series never holds more than `POINTS_PER_SERIES`
buckets (about 21 KB, measured with tracemalloc), the history never more than
`MAX_SERIES` series (a series not fed for the longest ring's span is dropped; new ones
beyond the bound are not kept) and `MAX_ELECTIONS` election marks.

A counter (a broker's msgPutTotalTodayNow, a topic's stored messages) is charted as
its rate: the increase since the previous sample over the time between them. A
counter that went down restarted from zero in between (a broker restarted, a topic was
deleted and made again), so its increase is its value, as Prometheus's `rate` counts it.
"""

from __future__ import annotations

import math
from array import array
from collections import deque

import attrs

# (bucket width, buckets kept): 5 minutes at 1 s, 20 minutes at 5 s, 6 hours at 1 min
TIERS = ((1.0, 300), (5.0, 240), (60.0, 360))
POINTS_PER_SERIES = sum(buckets for _, buckets in TIERS)
LONGEST_S = max(width_s * buckets for width_s, buckets in TIERS)
MAX_SERIES = 2_000  # x ~21 KB: about 42 MB at most
MAX_ELECTIONS = 1_000


class _Ring:
    """One resolution of a series: the mean per `width_s` bucket, the newest `size`,
    in three preallocated arrays (20 bytes a bucket) used as a circular buffer."""

    def __init__(self, width_s: float, size: int) -> None:
        self.width_s = width_s
        self.size = size
        self.starts_s = array("d", bytes(8 * size))
        self.totals = array("d", bytes(8 * size))
        self.samples = array("I", bytes(4 * size))
        self.filled = 0
        self.newest = -1

    def __len__(self) -> int:
        return self.filled

    @property
    def span_s(self) -> float:
        return self.width_s * self.size

    def add(self, now_s: float, value: float) -> None:
        start_s = math.floor(now_s / self.width_s) * self.width_s
        if self.filled and self.starts_s[self.newest] == start_s:
            self.totals[self.newest] += value
            self.samples[self.newest] += 1
            return
        assert not self.filled or start_s > self.starts_s[self.newest], (start_s, now_s)
        self.newest = (self.newest + 1) % self.size
        self.starts_s[self.newest], self.totals[self.newest] = start_s, value
        self.samples[self.newest] = 1
        self.filled = min(self.filled + 1, self.size)

    def points(self, since_s: float) -> list[tuple[float, float]]:
        """(bucket middle, mean) of the buckets that end after `since_s`, oldest first."""
        half = self.width_s / 2
        oldest = self.newest - self.filled + 1
        indexes = [(oldest + k) % self.size for k in range(self.filled)]
        return [
            (self.starts_s[i] + half, self.totals[i] / self.samples[i])
            for i in indexes
            if self.starts_s[i] + self.width_s > since_s
        ]


class Series:
    """A number over time, at every resolution of `TIERS`."""

    def __init__(self) -> None:
        self.rings = [_Ring(width_s, size) for width_s, size in TIERS]
        self.last_s = -math.inf

    def add(self, now_s: float, value: float) -> None:
        self.last_s = now_s
        for ring in self.rings:
            ring.add(now_s, value)

    def points(self, now_s: float, window_s: float) -> list[tuple[float, float]]:
        """The last `window_s` from the finest ring that spans it (the coarsest when none
        does: the history is no longer than that)."""
        ring = next((r for r in self.rings if r.span_s >= window_s), self.rings[-1])
        return ring.points(now_s - window_s)


@attrs.define
class Election:
    """A group's term (or, for a classic group under a controller, master epoch) seen to
    rise between two samples: a new leader, `leader` (None while the vote is still on:
    a candidate raises its term before it wins, and the leader is filled in when a
    later sample of the same term names one)."""

    time_s: float
    broker_name: str
    term: int
    leader: str | None


class History:
    """Named charts of named series, counter rates, and election marks (module doc)."""

    def __init__(self, max_series: int = MAX_SERIES) -> None:
        self.max_series = max_series
        self.charts: dict[str, dict[str, Series]] = {}
        self.elections: deque[Election] = deque(maxlen=MAX_ELECTIONS)
        self.dropped_series = 0  # series not kept for the bound
        self._counters: dict[tuple[str, str], tuple[float, int]] = {}
        self._terms: dict[str, int] = {}

    def series_count(self) -> int:
        return sum(len(series) for series in self.charts.values())

    def gauge(self, chart: str, name: str, now_s: float, value: float) -> None:
        """A value as it is now (a lag, a size)."""
        series = self.charts.setdefault(chart, {}).get(name)
        if series is None:
            if self.series_count() >= self.max_series:
                self.dropped_series += 1
                return
            series = self.charts[chart][name] = Series()
        series.add(now_s, value)

    def counter(self, chart: str, name: str, now_s: float, value: int) -> None:
        """A count that only grows but for restarts from zero: charted as its rate per
        second since its previous sample (nothing for its first)."""
        previous = self._counters.get((chart, name))
        self._counters[(chart, name)] = (now_s, value)
        if previous is None or now_s <= previous[0]:
            return
        then_s, then = previous
        increase = value - then if value >= then else value  # restarted from zero
        self.gauge(chart, name, now_s, increase / (now_s - then_s))

    def term(self, broker_name: str, now_s: float, term: int, leader: str | None) -> None:
        """A group's current term: a mark when it rose since the group's previous one."""
        previous = self._terms.get(broker_name)
        self._terms[broker_name] = max(term, previous or term)
        if previous is not None and term > previous:
            self.elections.append(Election(now_s, broker_name, term, leader))
        elif term == previous and leader is not None:
            mark = next((e for e in reversed(self.elections) if e.broker_name == broker_name), None)
            if mark is not None and mark.term == term and mark.leader is None:
                mark.leader = leader

    def forget_stale(self, now_s: float) -> None:
        """Drop the series and counters not fed for the longest ring's span."""
        oldest_s = now_s - LONGEST_S
        for chart in self.charts.values():
            for name in [n for n, s in chart.items() if s.last_s < oldest_s]:
                del chart[name]
        for key in [k for k, (when_s, _) in self._counters.items() if when_s < oldest_s]:
            del self._counters[key]

    def document(self, now_s: float, window_s: float) -> dict:
        """The charts' points (times in ms since the epoch) and the elections in the last
        `window_s`, as /api/series answers."""
        since_s = now_s - window_s
        return {
            "charts": {
                chart: [
                    {"name": name, "points": [[round(t * 1000), round(v, 3)] for t, v in points]}
                    for name, series in sorted(named.items())
                    if (points := series.points(now_s, window_s))
                ]
                for chart, named in self.charts.items()
            },
            "elections": [
                {
                    "timeMs": round(e.time_s * 1000),
                    "brokerName": e.broker_name,
                    "term": e.term,
                    "leader": e.leader,
                }
                for e in self.elections
                if e.time_s >= since_s
            ],
        }
