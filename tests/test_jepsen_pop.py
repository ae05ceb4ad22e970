"""The POP workload: its checks on hand-built histories (an acked message popped again
after its ack committed, a message never popped, one popped and never acknowledged are
each caught; an ack answered after the handle expired, and an abandoned message coming
back, are not). The real run is in test_jepsen_runs.py."""

import os

from jepsen.checker import check
from jepsen.history import Recorder
from jepsen.pop import ACK_MARGIN_MS, POP_CHECKS

VISIBLE_AT_MS = 10_000


class PopRun:
    """A history through the real Recorder, one op per second, and its final log."""

    def __init__(self) -> None:
        self.time = iter(range(1_000))
        self.rec = Recorder(os.devnull, clock=lambda: float(next(self.time)))
        self.sent: list[str] = []

    def send(self, process: int, value: str) -> None:
        self.rec.invoke(process, "send", value=value, key=0)
        self.rec.complete("ok", process, "send", offset=len(self.sent), node="n1", msg_id="m")
        self.sent.append(value)

    def pop(self, process: int, *values: str, visible_at_ms: int = VISIBLE_AT_MS) -> None:
        self.rec.invoke(process, "pop", node="n1")
        popped = [[value, visible_at_ms, 0] for value in values]
        self.rec.complete("ok", process, "pop", node="n1", value=popped)

    def ack(self, process: int, *values: str, at_ms: int, visible_at_ms: int = VISIBLE_AT_MS):
        """`values` acknowledged in one request, each invisible until `visible_at_ms`."""
        values = [[value, visible_at_ms] for value in values]
        self.rec.invoke(process, "ack", value=values, node="n1")
        self.rec.complete("ok", process, "ack", value=values, at_ms=at_ms)

    def failed_checks(self) -> set[str]:
        final = {0: list(enumerate(self.sent))}
        results = check(self.rec.ops, final, {"n1": final}, {}, POP_CHECKS)
        return {n for n, r in results.items() if isinstance(r, dict) and r["valid"] is False}


def consumed_once() -> PopRun:
    """a, b and c sent and popped; a and c acked; b abandoned, popped again and acked."""
    history = PopRun()
    history.send(1, "a")
    history.send(1, "b")
    history.send(1, "c")
    history.pop(2, "a", "b", "c")
    history.ack(2, "a", "c", at_ms=5_000)
    history.pop(2, "b", visible_at_ms=20_000)
    history.ack(2, "b", at_ms=15_000, visible_at_ms=20_000)
    return history


def test_every_message_popped_and_acked_passes():
    assert consumed_once().failed_checks() == set()


def test_a_message_popped_again_after_its_ack_committed_is_caught():
    history = consumed_once()
    history.pop(3, "c", visible_at_ms=30_000)
    assert history.failed_checks() == {"popped_after_ack"}


def test_a_message_whose_ack_was_answered_after_its_handle_expired_may_come_back():
    history = consumed_once()
    history.send(1, "d")
    history.pop(3, "d", visible_at_ms=40_000)
    history.ack(3, "d", at_ms=40_000 - ACK_MARGIN_MS, visible_at_ms=40_000)
    history.pop(3, "d", visible_at_ms=60_000)
    history.ack(3, "d", at_ms=50_000, visible_at_ms=60_000)
    assert history.failed_checks() == set()


def test_a_message_never_popped_and_one_never_acked_are_caught():
    history = consumed_once()
    history.send(1, "d")
    assert history.failed_checks() == {"undelivered", "unacked"}
    history.pop(2, "d")
    assert history.failed_checks() == {"unacked"}
