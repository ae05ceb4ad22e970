"""The broker's message counters, and their rates over trailing windows.

`BrokerStats` holds what GET_BROKER_RUNTIME_INFO reports (msgPutTotalTodayNow,
msgGetTotalTodayNow; since start, not since midnight) and what pulls returned per
topic and consumer group (RocketMQ's GROUP_GET_NUMS and GROUP_GET_SIZE), counted
once per pull, not per message.

`Rates` turns growing counts into per-second rates over the last 10 s, minute or
10 minutes, as RocketMQ's StatsItem does: a sample of every count every 10 s, and a
rate from the sample at the start of the window to the value now.
"""

from __future__ import annotations

from collections import deque

import attrs

SAMPLE_INTERVAL_S = 10.0  # StatsItem's samplingInSeconds
LONGEST_WINDOW_S = 600.0  # the 10-minute rates (putTps's third figure)


@attrs.define
class BrokerStats:
    put_messages: int = 0  # messages stored by sends
    got_messages: int = 0  # messages returned by pulls
    # (topic, group) -> [messages, bytes] returned by pulls
    pulled: dict[tuple[str, str], list[int]] = attrs.Factory(dict)

    def count_pull(self, topic: str, group: str, messages: int, size_bytes: int) -> None:
        """A pull returned `messages` of `topic` to `group`, `size_bytes` in all."""
        self.got_messages += messages
        counts = self.pulled.get((topic, group))
        if counts is None:
            counts = self.pulled[(topic, group)] = [0, 0]
        counts[0] += messages
        counts[1] += size_bytes


class Rates:
    """Per-second rates of counts that only grow (or restart from zero), from samples.

    `sample` records every count at a moment (every SAMPLE_INTERVAL_S); `per_second`
    compares a count's value now with its value in the oldest sample inside the
    window. A count absent from that sample started after it, from zero; a count that
    went down (a topic deleted and made again) gives 0, not a negative rate.
    """

    def __init__(self, longest_window_s: float = LONGEST_WINDOW_S) -> None:
        self.longest_window_s = longest_window_s
        self._samples: deque[tuple[float, dict]] = deque()

    def sample(self, now_s: float, counts: dict) -> None:
        assert not self._samples or now_s >= self._samples[-1][0], now_s
        self._samples.append((now_s, counts))
        # keep one sample at or before the longest window's start
        while len(self._samples) > 1 and self._samples[1][0] <= now_s - self.longest_window_s:
            self._samples.popleft()

    def base(self, now_s: float, window_s: float) -> tuple[float, dict] | None:
        """The oldest sample no older than `window_s` (the oldest of all when the
        process is younger than the window); None before the first sample."""
        start = now_s - window_s
        for when, counts in self._samples:
            if when >= start or when == self._samples[-1][0]:
                return (when, counts) if when < now_s else None
        return None

    @staticmethod
    def per_second(base: tuple[float, dict] | None, now_s: float, key, value: int) -> float:
        """`key`'s rate from `base` (from `Rates.base`) to `value` at `now_s`."""
        if base is None:
            return 0.0
        when, counts = base
        return max(0, value - counts.get(key, 0)) / (now_s - when)
