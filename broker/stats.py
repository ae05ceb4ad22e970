"""The broker's message counters, and their rates over trailing windows.

`BrokerStats` holds what GET_BROKER_RUNTIME_INFO reports and what pulls returned per
topic and consumer group (RocketMQ's GROUP_GET_NUMS and GROUP_GET_SIZE), counted
once per pull, not per message. As in RocketMQ's BrokerStats, msgPutTotalTodayNow and
msgGetTotalTodayNow are the totals since the broker started, and `record_midnight`
snapshots them at every local midnight (msgPutTotalTodayMorning, and the day before's
as ...YesterdayMorning): today's puts are TodayNow - TodayMorning, yesterday's
TodayMorning - YesterdayMorning, which is what `mqadmin clusterList -m` prints.

`MinuteCounts` keeps counts per minute for a day, for VIEW_BROKER_STATS_DATA's minute,
hour and day windows: what groups consumed (their offset commits), and the calls its
avgpt divides by (pulls, and the extra messages of batch puts).

`Rates` turns growing counts into per-second rates over the last 10 s, minute or
10 minutes, as RocketMQ's StatsItem does: a sample of every count every 10 s, and a
rate from the sample at the start of the window to the value now.
"""

from __future__ import annotations

import datetime
import time
from collections import deque
from collections.abc import Callable

import attrs
import trio

SAMPLE_INTERVAL_S = 10.0  # StatsItem's samplingInSeconds
MINUTE_MS = 60_000
DAY_MINUTES = 24 * 60
MIDNIGHT_CHECK_S = 60.0  # the wall clock is read again at least this often before midnight
LONGEST_WINDOW_S = 600.0  # the 10-minute rates (putTps's third figure)


class MinuteCounts:
    """Counts per key per minute for the last day: how many in the minutes that overlap
    the last minute, hour or day (VIEW_BROKER_STATS_DATA's windows). Kept in memory
    from the broker's start, as RocketMQ keeps its StatsItems."""

    def __init__(self) -> None:
        self._minutes: dict[object, dict[int, int]] = {}

    def add(self, key, count: int, now_ms: int) -> None:
        assert count > 0, count
        minutes = self._minutes.setdefault(key, {})
        minute = now_ms // MINUTE_MS
        if minute not in minutes:  # a new minute: the one a day old goes
            for old in [m for m in minutes if m <= minute - DAY_MINUTES]:
                del minutes[old]
            minutes[minute] = 0
        minutes[minute] += count

    def since(self, key, window_ms: int, now_ms: int) -> int:
        """What was counted for `key` in the minutes that overlap the last `window_ms`."""
        first = (now_ms - window_ms) // MINUTE_MS
        return sum(n for m, n in self._minutes.get(key, {}).items() if m >= first)


@attrs.define
class BrokerStats:
    put_messages: int = 0  # messages stored by sends
    got_messages: int = 0  # messages returned by pulls
    # (topic, group) -> [messages, bytes] returned by pulls
    pulled: dict[tuple[str, str], list[int]] = attrs.Factory(dict)
    # per minute, for GROUP_GET_NUMS's avgpt (messages per pull): keyed (topic, group),
    # the pulls that returned messages and the messages they returned
    pulls_per_minute: MinuteCounts = attrs.Factory(MinuteCounts)
    pulled_per_minute: MinuteCounts = attrs.Factory(MinuteCounts)
    # per minute, for TOPIC_PUT_NUMS's avgpt (messages per put): keyed by topic, the
    # messages of each SEND_BATCH_MESSAGE beyond its first (every other put stores one)
    batched_per_minute: MinuteCounts = attrs.Factory(MinuteCounts)

    # the totals at the last local midnight and the one before (0 before the first)
    put_messages_today_morning: int = 0
    put_messages_yesterday_morning: int = 0
    got_messages_today_morning: int = 0
    got_messages_yesterday_morning: int = 0

    def record_midnight(self) -> None:
        """RocketMQ's BrokerStats.record, run at local midnight: today's morning
        totals become yesterday's, the totals now become today's."""
        self.put_messages_yesterday_morning = self.put_messages_today_morning
        self.got_messages_yesterday_morning = self.got_messages_today_morning
        self.put_messages_today_morning = self.put_messages
        self.got_messages_today_morning = self.got_messages

    def runtime_info(self) -> dict[str, str]:
        """The counts as GET_BROKER_RUNTIME_INFO names them."""
        return {
            "msgPutTotalTodayNow": str(self.put_messages),
            "msgGetTotalTodayNow": str(self.got_messages),
            "msgPutTotalTodayMorning": str(self.put_messages_today_morning),
            "msgGetTotalTodayMorning": str(self.got_messages_today_morning),
            "msgPutTotalYesterdayMorning": str(self.put_messages_yesterday_morning),
            "msgGetTotalYesterdayMorning": str(self.got_messages_yesterday_morning),
        }

    def count_pull(self, topic: str, group: str, messages: int, size_bytes: int) -> None:
        """A pull returned `messages` of `topic` to `group`, `size_bytes` in all."""
        self.got_messages += messages
        now_ms = int(time.time() * 1000)
        self.pulls_per_minute.add((topic, group), 1, now_ms)
        self.pulled_per_minute.add((topic, group), messages, now_ms)
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


def next_local_midnight_s(now_s: float) -> float:
    """The wall-clock time (s since the epoch) of the next local midnight after `now_s`
    (RocketMQ's UtilAll.computeNextMorningTimeMillis)."""
    tomorrow = datetime.date.fromtimestamp(now_s) + datetime.timedelta(days=1)
    return datetime.datetime.combine(tomorrow, datetime.time()).timestamp()


async def record_at_midnight(
    stats: BrokerStats, wall_clock_s: Callable[[], float] = time.time
) -> None:
    """`stats.record_midnight()` at every local midnight, for as long as the broker runs.

    The wait is measured on the wall clock, read at least once a minute, so a clock
    stepped by NTP or a change of time zone rules (daylight saving) moves the
    snapshot with it rather than leaving it a fixed 24 h after the last one."""
    while True:
        midnight_s = next_local_midnight_s(wall_clock_s())
        while (now_s := wall_clock_s()) < midnight_s:
            await trio.sleep(min(MIDNIGHT_CHECK_S, midnight_s - now_s))
        stats.record_midnight()
