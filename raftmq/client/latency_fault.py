"""Latency-based broker avoidance for producers: RocketMQ's `sendLatencyFaultEnable`
(`MQFaultStrategy` and `LatencyFaultToleranceImpl`).

After each send attempt the producer reports the broker group it went to and how long
the attempt took; a failed attempt counts as `ISOLATION_LATENCY_MS` (30 s). The latency
picks a not-available duration from two tables, RocketMQ 4.x's defaults: at least
`LATENCY_MAX_MS[i]` -> avoid the group for `NOT_AVAILABLE_DURATION_MS[i]`. So a send
answered within 100 ms leaves the group in use, one of 550 ms avoids it for 30 s, and
a failed one for 10 minutes. While a group is avoided the producer picks queues of the
others; when every group is avoided it takes the least bad one (`pickOneAtLeast`).

Unlike RocketMQ, an entry holds for the master address it was measured on: when the
route names a new master for the group (a DLedger group failed over, an operator
restarted a classic master elsewhere) the group is available again at once, instead of
being avoided for the rest of a 10-minute window that was about a dead process.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Sequence

import attrs

__all__ = [
    "ISOLATION_LATENCY_MS",
    "LATENCY_MAX_MS",
    "NOT_AVAILABLE_DURATION_MS",
    "LatencyFaultTolerance",
]

LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
ISOLATION_LATENCY_MS = 30000  # what a failed attempt counts as (`isolation`)


@attrs.define
class FaultItem:
    """One group's last measurement: on which master, how slow, usable again when."""

    address: str
    latency_ms: float
    available_at_s: float


class LatencyFaultTolerance:
    """Which broker groups a producer should avoid for now, by latency measured."""

    def __init__(
        self,
        latency_max_ms: Sequence[float] = LATENCY_MAX_MS,
        not_available_duration_ms: Sequence[float] = NOT_AVAILABLE_DURATION_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if len(latency_max_ms) != len(not_available_duration_ms):
            raise ValueError("latency_max_ms and not_available_duration_ms differ in length")
        if list(latency_max_ms) != sorted(latency_max_ms):
            raise ValueError("latency_max_ms must be in increasing order")
        self.latency_max_ms = tuple(latency_max_ms)
        self.not_available_duration_ms = tuple(not_available_duration_ms)
        self._clock = clock
        self._items: dict[str, FaultItem] = {}  # by brokerName

    def not_available_ms(self, latency_ms: float) -> float:
        """`computeNotAvailableDuration`: the duration of the highest step reached."""
        step = bisect.bisect_right(self.latency_max_ms, latency_ms)
        return self.not_available_duration_ms[step - 1] if step else 0

    def update(self, broker_name: str, address: str, latency_ms: float, failed: bool) -> None:
        """Record one attempt to `broker_name`'s master at `address`."""
        measured_ms = ISOLATION_LATENCY_MS if failed else latency_ms
        duration_s = self.not_available_ms(measured_ms) / 1000
        self._items[broker_name] = FaultItem(address, measured_ms, self._clock() + duration_s)

    def available(self, broker_name: str, address: str | None) -> bool:
        """True unless the group was measured bad on this same master and its time
        has not run out."""
        item = self._items.get(broker_name)
        return item is None or item.address != address or self._clock() >= item.available_at_s

    def least_bad(self, broker_names: Iterable[str]) -> str | None:
        """Of `broker_names`, the one to use when all are avoided: the one available
        soonest, then the fastest (`pickOneAtLeast` picks among the better half; one
        choice is enough, the next update moves the others)."""
        known = [(self._items[n].available_at_s, self._items[n].latency_ms, n)
                 for n in broker_names if n in self._items]  # fmt: skip
        return min(known)[2] if known else None
