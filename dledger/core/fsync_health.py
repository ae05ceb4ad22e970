"""How slow a member's own fsyncs are: the p99 of those that completed within the last
`leaderSlowFsyncWindowMs`, as a leader judges itself and each follower reports itself
in its heartbeat answers (`HeartBeatResponse.fsync_p99_us`).

A leader whose p99 stays over `leaderSlowFsyncMs` hands leadership to a voter whose
own p99 is known and under it (`LeadershipTransfer.check_leader_placement`).
"""

from __future__ import annotations

import collections
import math

# fewer fsyncs than this in the window say nothing: one slow fsync of an idle member
# is not a slow disk
MIN_FSYNCS = 10
UNKNOWN_US = -1  # no p99: too few fsyncs in the window, or a peer that does not say
# a p99 is reused this long (at most a tenth of the window): heartbeat answers ask for
# it ten times a second, and a busy member's window holds tens of thousands of fsyncs
RECOMPUTE_MS = 1000


class FsyncLatency:
    """The member's own fsyncs of the last `window_ms`: (completed at, took) pairs;
    none are kept when `enabled` is false (leaderSlowFsyncMs=0), and the p99 is then
    always unknown."""

    def __init__(self, window_ms: float, enabled: bool) -> None:
        self.window_ms = window_ms
        self.enabled = enabled
        self._took: collections.deque[tuple[float, float]] = collections.deque()
        self._p99 = (-math.inf, UNKNOWN_US)  # (computed at, value)

    def record(self, took_ms: float, now_ms: float) -> None:
        assert self.enabled, "recorded only while the rule is on (Replica.fsync_took)"
        self._took.append((now_ms, took_ms))
        self._expire(now_ms)

    def p99_us(self, now_ms: float) -> int:
        """The p99 in microseconds, or UNKNOWN_US under MIN_FSYNCS in the window; as
        computed up to RECOMPUTE_MS (or a tenth of the window) ago."""
        if now_ms - self._p99[0] < min(RECOMPUTE_MS, self.window_ms / 10):
            return self._p99[1]
        self._expire(now_ms)
        value = UNKNOWN_US
        if len(self._took) >= MIN_FSYNCS:
            took = sorted(t for _, t in self._took)
            value = round(took[math.ceil(0.99 * len(took)) - 1] * 1000)
        self._p99 = (now_ms, value)
        return value

    def _expire(self, now_ms: float) -> None:
        while self._took and self._took[0][0] < now_ms - self.window_ms:
            self._took.popleft()
