"""The run report: every file is written, the plots are well-formed SVG, and the summary shows
the verdict and the headline counts."""

import json
import os
import xml.etree.ElementTree as ET

from jepsen.__main__ import main as jepsen_main
from jepsen.checker import check
from jepsen.history import Recorder
from jepsen.report import format_summary, linear_ticks, write_report

META = {"workload": "queue", "nodes": 3, "seed": 7, "command": "python -m jepsen run --seed 7"}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


def faulty_run(history_path=os.devnull):
    """Sends through a kill and a partition: some fail or time out, most succeed."""
    clock = Clock()
    rec = Recorder(history_path, clock=clock)
    log = []
    process = 0
    for i in range(40):
        if i == 10:
            rec.fault("kill", "start", ["n1"], "kill -9 leader", True, 1)
        if i == 20:
            rec.fault("kill", "stop", ["n1"], "restart", True, 1)
            rec.fault("partition", "start", ["n2"], "isolate <n2>", True, 2)
        process += 1
        value = f"{process}-0"
        rec.invoke(process, "send", value=value, key=0)
        if 12 <= i < 15:
            rec.complete("info" if i % 2 else "fail", process, "send", error="timeout")
            continue
        log.append(value)
        rec.complete("ok", process, "send", offset=len(log) - 1, node="n1", msg_id="m")
        rec.invoke(1000, "poll", key=0, offset=len(log) - 1, group="g")
        rec.complete("ok", 1000, "poll", key=0, group="g", offset=len(log) - 1,
                     value=[[len(log) - 1, value]], next_offset=len(log), node="n1")  # fmt: skip
    final = {0: list(enumerate(log))}
    return rec.ops, final, {"n1": final, "n2": final}


def test_write_report_writes_every_file(tmp_path):
    history, final, replicas = faulty_run()
    results = check(history, final, replicas)
    assert results["valid"] is True
    written = write_report(tmp_path / "run", history, results, META)
    names = {path.name for path in written}
    assert names == {
        "results.json", "summary.txt", "latency.svg", "throughput.svg", "availability.svg"
    }  # fmt: skip
    for path in written:
        if path.suffix == ".svg":
            root = ET.parse(path).getroot()
            assert root.tag == "{http://www.w3.org/2000/svg}svg"
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["meta"] == META
    assert saved["lost"]["count"] == 0
    latency = (tmp_path / "run" / "latency.svg").read_text()
    assert "kill#1" in latency and "partition#2" in latency
    summary = (tmp_path / "run" / "summary.txt").read_text()
    assert "lost=0" in summary
    assert "VALID ✓" in summary
    assert "python -m jepsen run --seed 7" in summary
    assert "faults=2 (kill 1, partition 1)" in summary
    assert len(summary.splitlines()) <= 30


def test_summary_marks_failed_checks(tmp_path):
    history, final, replicas = faulty_run()
    final[0].pop()
    summary = format_summary(check(history, final, replicas), META)
    assert summary.startswith("raftmq jepsen: INVALID ✗")
    assert "lost=1" in summary
    assert any(line.split()[:2] == ["lost", "✗"] for line in summary.splitlines())


def test_an_empty_history_still_reports(tmp_path):
    results = check([], {}, {})
    written = write_report(tmp_path, [], results, {})
    for path in written:
        if path.suffix == ".svg":
            ET.parse(path)
    assert "worst unavailability: none" in format_summary(results, {})


def test_ticks_are_round_numbers():
    assert linear_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert linear_ticks(0, 0.35) == [0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35]


def test_a_process_error_fails_the_run(tmp_path):
    """A node that would not restart, or stopped with the wrong status, fails the run though
    no safety check did: the verdict names the check, the table marks it, the line shows it,
    and checking the run directory again exits non-zero."""
    history, final, replicas = faulty_run(tmp_path / "history.jsonl")
    clean = check(history, final, replicas, {"errors": []})
    assert clean["valid"] is True and clean["process_errors"]["count"] == 0
    assert "process errors: none" in format_summary({**clean, "run": {"errors": []}}, META)

    errors = ["n1 under fsync EIO exited with status 1, not 4", "n2 exited at start"]
    record = {"errors": errors, "read_errors": []}
    results = check(history, final, replicas, record)
    assert results["valid"] is False
    assert results["process_errors"] == {
        "valid": False, "fatal": True, "count": 2, "examples": errors
    }  # fmt: skip
    failed = [n for n, r in results.items() if isinstance(r, dict) and r["valid"] is False]
    assert failed == ["process_errors"]  # every safety check passed
    results["run"] = record
    summary = format_summary(results, META)
    assert summary.startswith("raftmq jepsen: INVALID ✗ (failed: process_errors)\n")
    assert "process errors: 2: n1 under fsync EIO exited with status 1, not 4 (+1 more" in summary
    assert any(line.split() == ["process_errors", "✗", "2"] for line in summary.splitlines())

    write_report(tmp_path, history, results, META)
    (tmp_path / "final.json").write_text(json.dumps(final))
    (tmp_path / "replicas.json").write_text(json.dumps(replicas))
    assert jepsen_main(["check", str(tmp_path)]) == 1
    assert json.loads((tmp_path / "results.json").read_text())["process_errors"]["count"] == 2


def test_a_reply_that_is_not_a_message_fails_the_run():
    results = check(*faulty_run(), {"read_errors": ["n2 jepsen/0 at 7: bad magic"]})
    assert results["valid"] is False
    assert results["unreadable_replies"]["examples"] == ["n2 jepsen/0 at 7: bad magic"]
