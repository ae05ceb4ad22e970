"""The timer workload: its checks on hand-built histories (a message seen before it was
due, one seen later than the bound, later than the bound after a failover's window, one
lost are each caught; one seen within the bound, or within a failover's window plus the
bound, and one fired twice are not). The real run is in test_jepsen_runs.py."""

import os

import pytest

from jepsen.checker import check
from jepsen.history import Recorder
from jepsen.timers import POLL_SLACK_S, PRECISION_MS, TIMER_CHECKS

BOUND_S = PRECISION_MS / 1000 + POLL_SLACK_S


class TimerRun:
    """A history through the real Recorder at times the test sets, and its final log."""

    def __init__(self) -> None:
        self.now = 0.0
        self.rec = Recorder(os.devnull, clock=lambda: self.now)
        self.log: list[str] = []

    def at(self, now: float) -> "TimerRun":
        self.now = now
        return self

    def send(self, process: int, value: str, due: float, outcome: str = "ok") -> None:
        """Invoked now, answered 0.1 s later."""
        self.rec.invoke(process, "send", value=value, key=0, due=due, deliver_at_ms=0)
        self.now += 0.1
        if outcome == "ok":
            self.rec.complete("ok", process, "send", offset=0, node="n1", msg_id="m")
        else:
            self.rec.complete(outcome, process, "send", error="no master")

    def seen(self, process: int, value: str, when: float) -> None:
        """A poll ending at `when` (it took 0.5 s) returns `value`, next in the log."""
        self.log.append(value)
        offset = len(self.log) - 1
        self.now = when - 0.5
        self.rec.invoke(process, "poll", key=0, offset=offset, group="g")
        self.now = when
        self.rec.complete(
            "ok", process, "poll", key=0, group="g", offset=offset,
            value=[[offset, value]], next_offset=offset + 1,
        )  # fmt: skip

    def results(self) -> dict:
        final = {0: list(enumerate(self.log))}
        return check(self.rec.ops, final, {"n1": final}, {}, TIMER_CHECKS)

    def failed_checks(self) -> set[str]:
        return {n for n, r in self.results().items() if isinstance(r, dict) and r["valid"] is False}


def test_a_message_seen_after_its_due_time_within_the_bound_passes():
    history = TimerRun()
    history.send(1, "a", due=2.0)
    history.seen(2, "a", 2.0 + BOUND_S)
    assert history.failed_checks() == set()


def test_a_message_seen_before_its_due_time_is_caught():
    history = TimerRun()
    history.send(1, "a", due=2.0)
    history.seen(2, "a", 1.9)
    assert history.failed_checks() == {"early"}


def test_a_message_seen_later_than_the_bound_is_caught():
    history = TimerRun()
    history.send(1, "a", due=2.0)
    history.seen(2, "a", 2.0 + BOUND_S + 0.1)
    assert history.failed_checks() == {"late"}


def test_after_a_failover_a_message_may_be_late_by_the_failover_and_no_more():
    """Sends fail from 2.5 s until one is answered at 6.1 s: a message due at 3 s may be
    seen until 6.1 s plus the bound."""
    for seen, failed in ((6.1 + BOUND_S, set()), (6.1 + BOUND_S + 0.1, {"late"})):
        history = TimerRun()
        history.send(1, "a", due=3.0)
        history.at(2.5).send(3, "x", due=9.0, outcome="fail")
        history.at(6.0).send(3, "b", due=7.0)
        history.seen(2, "a", seen)
        history.seen(2, "b", 7.5)
        assert history.failed_checks() == failed, seen


def test_a_lost_message_is_caught_and_one_fired_twice_is_counted():
    history = TimerRun()
    history.send(1, "a", due=2.0)
    history.send(1, "b", due=2.0)
    history.seen(2, "a", 2.5)
    assert history.failed_checks() == {"lost", "unconsumed"}
    history.seen(2, "b", 2.6)
    history.seen(2, "b", 2.7)
    results = history.results()
    assert results["valid"]
    assert results["fired_twice"]["count"] == 1
    assert results["late"]["lateness_s"]["max"] == pytest.approx(0.6)
