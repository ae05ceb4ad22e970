"""The transactions workload's checks on hand-built histories: a committed transaction
missing, a rolled-back one delivered, and one stored twice are each caught; the history
a correct broker gives passes."""

import os

from jepsen.checker import check
from jepsen.history import Recorder
from jepsen.transactions import TRANSACTION_CHECKS


def history(transactions: list[tuple[str, str, str]]) -> list[dict]:
    """(value, decision, outcome) per transaction, through the real Recorder."""
    recorder = Recorder(os.devnull)
    for process, (value, decision, outcome) in enumerate(transactions, start=1):
        fields = {"value": value, "key": 0, "decision": decision, "via": "check"}
        recorder.invoke(process, "send", **fields)
        recorder.complete(outcome, process, "send", **fields)
    return recorder.ops


TRANSACTIONS = [("c1", "commit", "ok"), ("c2", "commit", "ok"), ("r1", "rollback", "fail")]


def judge(final_values: list[str]) -> dict:
    final = {0: list(enumerate(final_values))}
    return check(history(TRANSACTIONS), final, {"n0": final}, {}, TRANSACTION_CHECKS)


def failed_checks(results: dict) -> set[str]:
    return {n for n, r in results.items() if isinstance(r, dict) and r["valid"] is False}


def test_exactly_the_committed_once_passes():
    results = judge(["c2", "c1"])  # a check-back may commit out of order
    assert results["valid"], failed_checks(results)
    assert results["settled_by_check_back"]["count"] == 2


def test_a_lost_commit_a_delivered_rollback_and_a_duplicate_are_caught():
    assert failed_checks(judge(["c1"])) == {"lost"}
    assert failed_checks(judge(["c1", "c2", "r1"])) == {"rolled_back_delivered", "aborted_reads"}
    assert failed_checks(judge(["c1", "c2", "c1"])) == {"duplicated"}
