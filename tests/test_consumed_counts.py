"""How much a group consumed, from its offset commits, per minute over a day: the
OutTPS and OutMsg24Hour of `mqadmin statsAll`."""

from raftmq.broker.stats import DAY_MINUTES, MINUTE_MS, MinuteCounts

HOUR_MS, DAY_MS = 60 * MINUTE_MS, DAY_MINUTES * MINUTE_MS


def test_counts_fall_out_of_each_window_by_the_minute():
    counts = MinuteCounts()
    start = 1_000 * DAY_MS
    counts.add(("T", "g"), 5, start)
    counts.add(("T", "g"), 2, start + 30_000)  # the same minute
    counts.add(("T", "other"), 9, start)
    assert counts.since(("T", "g"), MINUTE_MS, start + 59_000) == 7
    counts.add(("T", "g"), 1, start + 2 * HOUR_MS)
    now = start + 2 * HOUR_MS
    assert counts.since(("T", "g"), MINUTE_MS, now) == 1
    assert counts.since(("T", "g"), HOUR_MS, now) == 1
    assert counts.since(("T", "g"), DAY_MS, now) == 8
    assert counts.since(("T", "nobody"), DAY_MS, now) == 0
    # A commit just before a minute turned still counts in the next minute's window.
    assert counts.since(("T", "g"), MINUTE_MS, now + MINUTE_MS + 1_000) == 1
    assert counts.since(("T", "g"), MINUTE_MS, now + 2 * MINUTE_MS) == 0


def test_a_day_old_minute_is_dropped_when_a_new_minute_starts():
    counts = MinuteCounts()
    counts.add(("T", "g"), 4, 0)
    counts.add(("T", "g"), 1, DAY_MS)
    assert counts.since(("T", "g"), 2 * DAY_MS, DAY_MS) == 1  # the first minute is gone
