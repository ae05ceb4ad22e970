"""The history recorder and the queue checkers: each fatal check fires on a hand-built history
that breaks it and stays quiet on the near misses a correct broker produces; a generated model
history passes everything, and mutating its final log is caught."""

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jepsen.checker import TOPOLOGY_CHECKS, check, check_membership
from jepsen.history import Recorder, faults, load, pairs
from jepsen.runner import checks_for


class Clock:
    """A clock that advances one second per reading unless set, so every op gets its own time."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        now = self.t
        self.t += 1.0
        return now


class Run:
    """Builds a history through the real Recorder, plus the final log and replicas."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.rec = Recorder(os.devnull, clock=self.clock)
        self.final: dict[int, list] = {0: []}
        self.replicas: dict[str, dict] = {}

    def invoke_send(self, process, value, key=0):
        self.rec.invoke(process, "send", value=value, key=key)

    def ack(self, process, offset, node="n1"):
        self.rec.complete("ok", process, "send", offset=offset, node=node, msg_id="m")

    def send(self, process, value, offset, key=0):
        self.invoke_send(process, value, key)
        self.ack(process, offset)

    def unsent(self, process, value, type, key=0):
        self.invoke_send(process, value, key)
        self.rec.complete(type, process, "send", error="timeout")

    def poll(self, process, requested, entries, next_offset=None, key=0, group="g"):
        self.rec.invoke(process, "poll", key=key, offset=requested, group=group)
        if next_offset is None:
            next_offset = entries[-1][0] + 1 if entries else requested
        self.rec.complete(
            "ok", process, "poll", key=key, group=group, offset=requested,
            value=[list(e) for e in entries], next_offset=next_offset, node="n1",
        )  # fmt: skip

    def commit(self, process, offset, key=0, group="g"):
        self.rec.invoke(process, "commit", group=group, key=key, offset=offset)
        self.rec.complete("ok", process, "commit", group=group, key=key, offset=offset)

    def fetch(self, process, offset, key=0, group="g"):
        self.rec.invoke(process, "fetch_offset", group=group, key=key)
        self.rec.complete("ok", process, "fetch_offset", group=group, key=key, offset=offset)

    def log(self, *values, key=0, start=0):
        self.final[key] = list(enumerate(values, start))

    def check(self):
        return check(self.rec.ops, self.final, self.replicas)


FATAL = (
    "lost", "unexpected", "aborted_reads", "duplicated", "inconsistent_offsets",
    "offset_mismatch", "realtime_order", "producer_fifo", "nonmonotonic_poll", "poll_skip",
    "consumer_offsets_monotonic", "replica_agreement",
)  # fmt: skip


def failing(results):
    return {name for name in FATAL if not results[name]["valid"]}


def healthy_run():
    run = Run()
    run.send(1, "1-0", 0)
    run.send(2, "2-0", 1)
    run.send(1, "1-1", 2)
    run.poll(10, 0, [(0, "1-0"), (1, "2-0")])
    run.commit(10, 2)
    run.fetch(11, 2)
    run.poll(10, 2, [(2, "1-1")])
    run.log("1-0", "2-0", "1-1")
    run.replicas = {"n1": {0: run.final[0]}, "n2": {0: run.final[0][:2]}}
    return run


def test_a_healthy_run_passes_every_check():
    results = healthy_run().check()
    assert results["valid"] is True
    assert failing(results) == set()
    counts = results["counts"]
    assert (counts["attempted"], counts["acknowledged"], counts["failed"]) == (3, 3, 0)
    assert set(results) >= {*FATAL, "counts", "recovered", "availability", "latency", "valid"}
    assert all(len(r["examples"]) <= 10 for r in results.values() if isinstance(r, dict))


def test_an_acknowledged_message_missing_from_the_final_log_is_lost():
    run = healthy_run()
    run.send(3, "3-0", 3)
    results = run.check()
    assert results["valid"] is False
    assert failing(results) == {"lost"}
    assert results["lost"]["examples"][0]["value"] == "3-0"


def test_under_retention_a_message_consumed_then_deleted_is_kept_and_one_never_polled_lost():
    run = healthy_run()
    run.log("2-0", "1-1", start=1)  # retention deleted offset 0, which a poll returned
    run.replicas = {}
    results = check(run.rec.ops, run.final, run.replicas, retention=True)
    assert results["valid"] is True, failing(results)
    assert results["unconsumed"]["valid"] is True
    assert check(run.rec.ops, run.final, run.replicas)["lost"]["count"] == 1  # without it
    run.send(3, "3-0", 3)  # acknowledged, never polled, and not in the final log
    results = check(run.rec.ops, run.final, run.replicas, retention=True)
    assert (results["lost"]["count"], results["unconsumed"]["count"]) == (1, 1)
    run.log("2-0", "1-1", "3-0", start=1)  # in the log but never polled: unconsumed only
    results = check(run.rec.ops, run.final, run.replicas, retention=True)
    assert (results["lost"]["count"], results["unconsumed"]["count"]) == (0, 1)
    assert results["valid"] is False


def test_a_recorder_that_keeps_no_ops_still_writes_them_all(tmp_path):
    path = tmp_path / "history.jsonl"
    with Recorder(path, clock=Clock(), keep_ops=False) as rec:
        rec.invoke(1, "send", value="1-0", key=0)
        rec.complete("ok", 1, "send", offset=0)
        assert rec.ops == []
        assert rec.elapsed() == 3.0  # the clock read at start, at each op, and now
    assert [(op["index"], op["type"]) for op in load(path)] == [(0, "invoke"), (1, "ok")]


def test_an_indeterminate_send_that_appears_is_recovered_not_lost():
    run = healthy_run()
    run.unsent(3, "3-0", "info")
    run.invoke_send(4, "4-0")  # the run ended before this send completed
    run.unsent(5, "5-0", "info")  # never appended: allowed
    run.log("1-0", "2-0", "1-1", "3-0", "4-0")
    results = run.check()
    assert results["valid"] is True
    assert results["recovered"]["count"] == 2
    assert results["recovered"]["valid"] is None
    assert results["counts"]["indeterminate"] == 3
    assert results["counts"]["incomplete"] == 1


def test_a_failed_send_that_appears_is_an_aborted_read():
    run = healthy_run()
    run.unsent(3, "3-0", "fail")
    run.poll(10, 3, [(3, "3-0")])
    run.log("1-0", "2-0", "1-1", "3-0")
    results = run.check()
    assert failing(results) == {"aborted_reads"}
    assert results["recovered"]["count"] == 0


def test_a_failed_send_that_never_appears_is_fine():
    run = healthy_run()
    run.unsent(3, "3-0", "fail")
    assert run.check()["valid"] is True


def test_a_message_nobody_sent_is_unexpected():
    run = healthy_run()
    run.log("1-0", "2-0", "1-1", "ghost")
    results = run.check()
    assert failing(results) == {"unexpected"}
    assert results["unexpected"]["examples"][0]["source"] == "final"


def test_a_message_at_two_offsets_is_duplicated():
    run = healthy_run()
    run.log("1-0", "2-0", "1-1", "2-0")
    assert failing(run.check()) == {"duplicated"}


def test_a_group_receiving_a_message_twice_is_reported_not_fatal():
    run = healthy_run()
    run.poll(12, 1, [(1, "2-0"), (2, "1-1")])
    results = run.check()
    assert results["valid"] is True
    assert results["redelivered"]["count"] == 2
    assert results["redelivered"]["per_group"] == {"g": 2}


def test_one_offset_with_two_messages_is_inconsistent():
    run = healthy_run()
    run.send(3, "3-0", 3)
    run.poll(12, 3, [(3, "other")])
    run.unsent(4, "other", "info")
    run.log("1-0", "2-0", "1-1", "3-0")
    results = run.check()
    assert "inconsistent_offsets" in failing(results)
    example = results["inconsistent_offsets"]["examples"][0]
    assert (example["offset"], set(example["values"])) == (3, {"3-0", "other"})


def test_an_acknowledged_offset_holding_another_message_is_a_mismatch():
    run = healthy_run()
    run.log("2-0", "1-0", "1-1")
    results = run.check()
    assert {"offset_mismatch", "inconsistent_offsets"} <= failing(results)
    assert results["offset_mismatch"]["count"] == 2
    assert "lost" not in failing(results)


def test_a_send_acknowledged_before_another_began_must_get_the_lower_offset():
    run = Run()
    run.send(1, "1-0", 1)
    run.send(2, "2-0", 0)
    run.log("2-0", "1-0")
    results = run.check()
    assert "realtime_order" in failing(results)
    assert "producer_fifo" not in failing(results)


def test_concurrent_sends_may_land_in_either_order():
    run = Run()
    run.invoke_send(1, "1-0")
    run.invoke_send(2, "2-0")
    run.ack(1, 1)
    run.ack(2, 0)
    run.log("2-0", "1-0")
    assert run.check()["valid"] is True


def test_realtime_order_is_per_queue():
    run = Run()
    run.send(1, "1-0", 5, key=0)
    run.send(2, "2-0", 0, key=1)
    run.final = {0: [(5, "1-0")], 1: [(0, "2-0")]}
    assert run.check()["valid"] is True


def test_a_producers_later_send_landing_earlier_breaks_fifo():
    run = Run()
    run.send(1, "1-0", 1)
    run.send(1, "1-1", 0)
    run.log("1-1", "1-0")
    assert failing(run.check()) == {"producer_fifo", "realtime_order"}


@pytest.mark.parametrize(
    ("requested", "entries", "next_offset"),
    [
        (0, [(1, "2-0"), (0, "1-0")], None),  # backwards within one poll
        (2, [(1, "2-0"), (2, "1-1")], None),  # below the requested offset
        (0, [(0, "1-0"), (1, "2-0")], 1),  # next offset would re-read the last message
    ],
)
def test_a_consumer_going_back_in_the_log_is_nonmonotonic(requested, entries, next_offset):
    run = healthy_run()
    run.poll(12, requested, entries, next_offset=next_offset)
    assert "nonmonotonic_poll" in failing(run.check())


def test_a_consumer_rewinding_on_purpose_is_not_flagged():
    run = healthy_run()
    run.poll(10, 0, [(0, "1-0")])  # process 10 already read up to 2, and asks again from 0
    assert failing(run.check()) == set()


@pytest.mark.parametrize(
    ("requested", "entries", "next_offset"),
    [
        (0, [(1, "2-0")], None),  # jumps over 0 to the first message
        (0, [(0, "1-0"), (2, "1-1")], None),  # a hole between two messages
        (0, [(0, "1-0")], 2),  # the next offset steps over 1
        (0, [], 3),  # an empty poll moving past messages the log holds
    ],
)
def test_a_poll_stepping_over_committed_offsets_is_a_skip(requested, entries, next_offset):
    run = healthy_run()
    run.poll(12, requested, entries, next_offset=next_offset)
    results = run.check()
    assert failing(results) == {"poll_skip"}


def test_a_poll_below_the_queue_minimum_may_resume_at_the_minimum():
    run = Run()
    run.send(1, "1-0", 5)
    run.poll(10, 0, [(5, "1-0")])
    run.poll(11, 100, [], next_offset=6)  # past the end: the broker corrects it downwards
    run.log("1-0", start=5)
    assert run.check()["valid"] is True


def test_a_consumer_offset_moving_back_after_a_commit_is_caught():
    run = healthy_run()
    run.commit(12, 3)
    run.fetch(13, 2)
    results = run.check()
    assert failing(results) == {"consumer_offsets_monotonic"}
    assert results["consumer_offsets_monotonic"]["examples"][0]["committed_before"] == 3


def test_a_fetch_overlapping_the_commit_may_see_the_old_offset():
    run = healthy_run()
    run.rec.invoke(13, "fetch_offset", group="g", key=0)
    run.commit(12, 3)
    run.rec.complete("ok", 13, "fetch_offset", group="g", key=0, offset=2)
    run.fetch(14, -1, group="other")
    assert run.check()["valid"] is True


@pytest.mark.parametrize(
    "replica",
    [
        [(0, "1-0"), (1, "1-1")],  # diverges from the final log
        [(0, "1-0"), (1, "2-0"), (2, "1-1"), (3, "1-2")],  # committed past the master's end
    ],
)
def test_a_replica_that_is_not_a_prefix_of_the_final_log_disagrees(replica):
    run = healthy_run()
    run.replicas["n3"] = {0: replica}
    results = run.check()
    assert "replica_agreement" in failing(results)
    assert results["replica_agreement"]["examples"][0]["node"] == "n3"


def test_ack_below_the_highest_polled_offset_but_never_polled_is_unseen():
    run = Run()
    run.send(1, "1-0", 0)
    run.send(1, "1-1", 1)
    run.send(1, "1-2", 2)
    run.poll(10, 1, [(1, "1-1")])
    run.log("1-0", "1-1", "1-2")
    results = run.check()
    assert results["valid"] is True
    unseen = results["unseen_below_observed"]
    assert (unseen["valid"], unseen["count"], unseen["never_polled"]) == (None, 1, 2)
    assert unseen["examples"][0]["value"] == "1-0"


def test_unavailability_windows_are_attributed_to_faults():
    run = Run()
    run.send(1, "1-0", 0)  # t 1, 2
    run.clock.t = 10
    run.rec.fault("kill", "start", ["n1"], "kill -9 leader", True, 7)  # t 10
    run.unsent(1, "1-1", "info")  # 11, 12
    run.unsent(2, "2-0", "fail")  # 13, 14
    run.clock.t = 20
    run.rec.fault("kill", "stop", ["n1"], "restart", True, 7)  # t 20
    run.send(3, "3-0", 1)  # 21, 22
    run.log("1-0", "3-0")
    results = run.check()
    assert results["valid"] is True
    availability = results["availability"]
    assert availability["windows"] == [
        {"start": 11.0, "end": 22.0, "duration": 11.0, "recovered": True, "faults": [7]}
    ]
    (effect,) = availability["faults"]
    assert effect["time_to_unavailable"] == 1.0
    assert effect["time_to_recover"] == 2.0
    assert effect["unavailable_seconds"] == 9.0
    assert effect["ok_sends"] == 0
    assert effect["longest_gap"] == 10.0
    assert availability["no_progress"] == [7]
    assert availability["worst"]["duration"] == 11.0
    assert results["counts"]["faults"] == {"kill": 1}


def test_a_window_still_open_at_the_end_never_recovered():
    run = Run()
    run.rec.fault("partition", "start", ["n1", "n2"], "halves", False, 1)
    run.unsent(1, "1-0", "info")
    results = run.check()
    (window,) = results["availability"]["windows"]
    assert window["recovered"] is False
    (effect,) = results["availability"]["faults"]
    assert (effect["stopped"], effect["time_to_recover"]) == (False, None)
    assert results["availability"]["no_progress"] == []


def test_a_window_open_when_the_load_ends_ends_with_the_load_not_the_run():
    """A send failed at the end of the load, then the run read for 10 s more: the window
    is the send's, not the reading's (a fault near the end was charged 2.3-3.4 s so)."""
    run = Run()
    run.send(1, "1-0", 0)  # t 1, 2
    run.unsent(2, "2-0", "fail")  # 3, 4
    run.clock.t = 14
    run.poll(10, 0, [(0, "1-0")])  # reading after the load, t 15, 16
    run.log("1-0")
    (window,) = run.check()["availability"]["windows"]
    assert (window["start"], window["end"], window["recovered"]) == (3.0, 4.0, False)


def test_latency_percentiles_of_ok_sends():
    run = Run()
    for i in range(100):
        run.send(i, f"{i}-0", i)  # each send takes one clock tick
    run.log(*(f"{i}-0" for i in range(100)))
    latency = run.check()["latency"]
    assert latency["send"] == {"count": 100, "p50": 1.0, "p95": 1.0, "p99": 1.0, "max": 1.0}
    assert latency["poll"]["count"] == 0


def test_logs_that_went_through_json_check_the_same():
    run = healthy_run()
    final = json.loads(json.dumps(run.final))
    replicas = json.loads(json.dumps(run.replicas))
    assert check(run.rec.ops, final, replicas) == run.check()


# --- the recorder ----------------------------------------------------------------------------


def test_recorder_writes_what_load_reads(tmp_path):
    path = tmp_path / "history.jsonl"
    clock = Clock()
    with Recorder(path, clock=clock) as rec:
        rec.invoke(1, "send", value="1-0", key=3)
        rec.fault("pause", "start", ["n2"], "SIGSTOP", True, 1)
        assert path.read_text().count("\n") == 2  # flushed as recorded, before close
        rec.complete("ok", 1, "send", offset=0, node="n1", msg_id="x")
        rec.invoke(2, "poll", key=3, offset=0, group="g")
        rec.complete("ok", 2, "poll", key=3, group="g", offset=0, value=[[0, "1-0"]],
                     next_offset=1, node="n1")  # fmt: skip
        rec.fault("pause", "stop", ["n2"], "SIGCONT", True, 1)
        rec.invoke(3, "send", value="3-0", key=3)
        assert rec.pending() == {3: "send"}
    ops = load(path)
    assert ops == rec.ops
    assert [op["index"] for op in ops] == list(range(7))
    assert [op["time"] for op in ops] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert ops[1]["value"]["targets"] == ["n2"]
    pairs_ = pairs(ops)
    assert [(p.f, p.type) for p in pairs_] == [("send", "ok"), ("poll", "ok"), ("send", "info")]
    (fault,) = faults(ops)
    assert (fault.kind, fault.start, fault.stop, fault.stopped) == ("pause", 2.0, 6.0, True)


def test_load_drops_a_torn_last_line_only(tmp_path):
    path = tmp_path / "history.jsonl"
    with Recorder(path) as rec:
        rec.invoke(1, "send", value="1-0", key=0)
    path.write_text(path.read_text() + '{"index": 1, "ti')
    assert len(load(path)) == 1
    path.write_text('{"index": 1, "ti\n' + path.read_text())
    with pytest.raises(ValueError, match="not a JSON op"):
        load(path)


def test_recorder_refuses_a_broken_protocol():
    rec = Recorder(os.devnull)
    rec.invoke(1, "send", value="1-0", key=0)
    with pytest.raises(ValueError, match="already has a send pending"):
        rec.invoke(1, "poll", key=0, offset=0, group="g")
    with pytest.raises(ValueError, match="no pending poll"):
        rec.complete("ok", 1, "poll")
    rec.complete("info", 1, "send", error="timeout")
    with pytest.raises(ValueError, match="retired"):
        rec.invoke(1, "send", value="1-1", key=0)
    with pytest.raises(ValueError, match="unknown client function"):
        rec.invoke(2, "drain")


def test_pairs_refuses_a_completion_without_an_invoke():
    ops = [{"index": 0, "time": 0.0, "process": 1, "type": "ok", "f": "send", "offset": 0}]
    with pytest.raises(ValueError, match="without a matching invoke"):
        pairs(ops)


# --- generated histories ---------------------------------------------------------------------


class Model:
    """A correct single-queue broker driven by hypothesis: sends take effect at their
    completion (or, when indeterminate, possibly later or never), polls read the log, and
    one offset client commits and fetches each group's position."""

    GROUPS = ("g0", "g1")

    def __init__(self) -> None:
        self.rec = Recorder(os.devnull, clock=Clock())
        self.log: list[str] = []
        self.late: list[str] = []
        self.fresh = iter(range(10**6))
        self.producers = [[next(self.fresh), None] for _ in range(3)]
        self.consumers = [[next(self.fresh), group, 0, False] for group in self.GROUPS]
        self.committed = dict.fromkeys(self.GROUPS, -1)
        self.offsets = [next(self.fresh), None]
        self.sequence = 0

    def step(self, slot: int, choice: int, n: int) -> None:
        if slot < 3:
            self.produce(self.producers[slot], choice)
        elif slot < 5:
            self.consume(self.consumers[slot - 3], choice, n)
        elif slot == 5:
            self.offset_client(choice, n)
        elif self.late:
            self.log.append(self.late.pop(n % len(self.late)))

    def produce(self, producer: list, outcome: int) -> None:
        process, pending = producer
        if pending is None:
            self.sequence += 1
            producer[1] = f"{process}-{self.sequence}"
            self.rec.invoke(process, "send", value=producer[1], key=0)
            return
        producer[1] = None
        if outcome == 3:
            self.rec.complete("fail", process, "send", error="rejected")
            return
        if outcome == 5:
            self.late.append(pending)
        else:
            self.log.append(pending)
        if outcome < 3:
            self.rec.complete("ok", process, "send", offset=len(self.log) - 1, node="n1",
                              msg_id="m")  # fmt: skip
        else:
            self.rec.complete("info", process, "send", error="timeout")
            producer[0] = next(self.fresh)

    def consume(self, consumer: list, outcome: int, n: int) -> None:
        process, group, position, polling = consumer
        if not polling:
            self.rec.invoke(process, "poll", key=0, offset=position, group=group)
            consumer[3] = True
            return
        consumer[3] = False
        if outcome == 5:
            self.rec.complete("fail", process, "poll", error="no route")
            return
        entries = [[o, self.log[o]] for o in range(position, min(position + n, len(self.log)))]
        consumer[2] = position + len(entries)
        self.rec.complete("ok", process, "poll", key=0, group=group, offset=position,
                          value=entries, next_offset=consumer[2], node="n1")  # fmt: skip

    def offset_client(self, choice: int, n: int) -> None:
        process, pending = self.offsets
        if pending is None:
            consumer = self.consumers[n % 2]
            if choice % 2:
                self.offsets[1] = ("commit", consumer[1], consumer[2])
                self.rec.invoke(process, "commit", group=consumer[1], key=0, offset=consumer[2])
            else:
                self.offsets[1] = ("fetch_offset", consumer[1], None)
                self.rec.invoke(process, "fetch_offset", group=consumer[1], key=0)
            return
        f, group, offset = pending
        self.offsets[1] = None
        if f == "commit":
            self.committed[group] = offset
            fields = {"offset": offset}
        else:
            fields = {"offset": self.committed[group]}
        self.rec.complete("ok", process, f, group=group, key=0, **fields)

    def final(self) -> dict:
        return {0: list(enumerate(self.log))}


# (slot, outcome, count): slots 0-2 produce, 3-4 consume, 5 commits or fetches offsets, 6 lets
# an indeterminate send take effect late. A send succeeds on 0-2, fails on 3, is indeterminate
# on 4 (appended) and 5 (appended later, if ever); a poll fails on 5.
steps = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 5), st.integers(0, 4)), min_size=40, max_size=200
)


def model_run(plan, lag: int):
    model = Model()
    for step in plan:
        model.step(*step)
    final = model.final()
    replicas = {"n1": final, "n2": {0: final[0][: max(0, len(final[0]) - lag)]}}
    return model, final, replicas


@given(steps, st.integers(0, 3))
def test_a_correct_model_history_passes_every_check(plan, lag):
    model, final, replicas = model_run(plan, lag)
    results = check(model.rec.ops, final, replicas)
    assert failing(results) == set()
    assert results["valid"] is True


# Two sends invoked and acknowledged, so a mutation always has acknowledged entries to break.
PRIMER = [(0, 0, 0), (0, 0, 0), (1, 0, 0), (1, 0, 0)]


def acked(model: Model) -> set[str]:
    return {p.invoke["value"] for p in pairs(model.rec.ops) if p.f == "send" and p.ok}


@given(steps, st.data())
def test_dropping_an_acknowledged_message_is_caught(plan, data):
    model, final, replicas = model_run(PRIMER + plan, 0)
    entries = [i for i, (_, value) in enumerate(final[0]) if value in acked(model)]
    del final[0][data.draw(st.sampled_from(entries))]
    assert "lost" in failing(check(model.rec.ops, final, replicas))


@given(steps, st.data())
def test_swapping_two_offsets_is_caught(plan, data):
    model, final, _ = model_run(PRIMER + plan, 0)
    log = final[0]
    entries = [i for i, (_, value) in enumerate(log) if value in acked(model)]
    i = data.draw(st.sampled_from(entries))
    j = data.draw(st.sampled_from([k for k in range(len(log)) if k != i]))
    log[i], log[j] = (i, log[j][1]), (j, log[i][1])
    results = check(model.rec.ops, final, {})
    assert "offset_mismatch" in failing(results)
    assert results["valid"] is False


@given(steps, st.data())
def test_duplicating_a_message_is_caught(plan, data):
    model, final, replicas = model_run(PRIMER + plan, 0)
    _, value = data.draw(st.sampled_from(final[0]))
    final[0].append((len(final[0]), value))
    assert "duplicated" in failing(check(model.rec.ops, final, replicas))


def _async_loss(lose_master: bool, lost: set[str]):
    """Sends a..e acknowledged in turn on an ASYNC_MASTER, then (maybe) the master lost
    for good; the final log (the slave's) lacks `lost`."""
    run = Run()
    values = ["a", "b", "c", "d", "e"]
    for offset, value in enumerate(values):
        run.send(offset + 1, value, offset)
    if lose_master:
        run.rec.fault("lose-master", "start", ["n0"], "SIGKILL n0 for good", False, 1)
        run.rec.fault("lose-master", "stop", ["n0"], "not restarted", True, 1)
    run.log(*(v for v in values if v not in lost))
    return check(run.rec.ops, run.final, {}, checks=TOPOLOGY_CHECKS["ms-async"])["lost"]


def test_async_loss_of_the_unreplicated_suffix_is_allowed_and_stated():
    lost = _async_loss(True, {"d", "e"})
    assert lost["valid"] and lost["count"] == 2
    assert lost["statement"].startswith("lost 2 acknowledged messages with the master")
    assert "(a suffix of the log)" in lost["statement"]


def test_async_loss_with_a_hole_or_without_a_lost_master_is_fatal():
    hole = _async_loss(True, {"b"})  # c, d, e were sent after b was acked, and survived
    assert not hole["valid"] and [v["value"] for v in hole["violations"]] == ["c", "d", "e"]
    assert "NOT a suffix" in hole["statement"]
    intact = _async_loss(False, {"e"})  # kill -9 and restart keeps the disk
    assert not intact["valid"] and intact["violations"][0]["value"] == "e"
    assert _async_loss(True, set())["valid"]


def _failover_loss(lost: set[str]):
    """A controller-mode group with allAckInSyncStateSet=false: a..c acknowledged by n0,
    then d..f by n1 (elected in its place); the final log lacks `lost`."""
    run = Run()
    values = ["a", "b", "c", "d", "e", "f"]
    for offset, value in enumerate(values):
        run.invoke_send(offset + 1, value)
        run.ack(offset + 1, offset, node="n0" if value < "d" else "n1")
    run.log(*(v for v in values if v not in lost))
    return check(run.rec.ops, run.final, {}, checks=TOPOLOGY_CHECKS["controller-async"])["lost"]


def test_failover_loss_of_the_old_masters_last_acks_is_allowed_and_stated():
    lost = _failover_loss({"b", "c"})
    assert lost["valid"] and lost["count"] == 2, lost
    assert lost["by_master"] == [
        {"node": "n0", "lost": 2, "last_ms": lost["by_master"][0]["last_ms"]}
    ]
    assert "(suffixes of their reigns)" in lost["statement"]
    assert _failover_loss(set())["valid"]


def test_failover_loss_with_a_hole_or_by_the_last_master_is_fatal():
    hole = _failover_loss({"a"})  # b and c were sent after a was acked, and survived
    assert not hole["valid"] and [v["value"] for v in hole["violations"]] == ["b", "c"]
    assert "NOT only such suffixes" in hole["statement"]
    last = _failover_loss({"f"})  # n1 was never replaced
    assert not last["valid"] and last["violations"][0]["value"] == "f"


@pytest.mark.parametrize("lost", [{"c"}, {"a", "c"}], ids=["suffix", "hole"])
def test_offsets_a_failover_loss_reused_count_against_it_only_when_allowed(lost):
    """n0 acknowledges a..c at 0..2 and a consumer reads c at 2; n1, elected, gives 2
    to d. The offset checks leave c out when `lost` allows its loss; with a hole (a
    lost too) they judge everything, c included."""
    run = Run()
    for process, (value, offset, node) in enumerate(
        [("a", 0, "n0"), ("b", 1, "n0"), ("c", 2, "n0"), ("d", 2, "n1"), ("e", 3, "n1")], 1
    ):
        run.invoke_send(process, value)
        run.ack(process, offset, node=node)
        if value == "c":
            run.poll(9, 2, [(2, "c")])
    run.final[0] = [(o, v) for o, v in [(0, "a"), (1, "b"), (2, "d"), (3, "e")] if v not in lost]
    results = check(run.rec.ops, run.final, {}, checks=checks_for("queue", "controller-async"))
    allowed = lost == {"c"}
    assert results["lost"]["valid"] is allowed
    for name in ("inconsistent_offsets", "offset_mismatch", "realtime_order"):
        assert results[name]["valid"] is allowed, (name, results[name])
    assert results["valid"] is allowed


def test_sync_master_sends_without_the_slave_copy_are_counted_apart():
    run = Run()
    run.send(1, "a", 0)
    run.invoke_send(2, "b")
    run.rec.complete("info", 2, "send", error="code 12: timeout", node="n0", code=12)
    run.invoke_send(3, "c")
    run.rec.complete("info", 3, "send", error="code 11: no slave", node="n0", code=11)
    run.log("a", "c")
    results = check(run.rec.ops, run.final, {}, checks=TOPOLOGY_CHECKS["ms-sync"])
    unconfirmed = results["acked_without_slave"]
    assert unconfirmed["count"] == 2 and unconfirmed["lost"] == 1
    assert unconfirmed["by_code"] == {"FLUSH_SLAVE_TIMEOUT": 1, "SLAVE_NOT_AVAILABLE": 1}
    assert results["valid"], "losing a send answered 11/12 is allowed"


def upgraded_run():
    """An old message acknowledged before an upgrade (offset 0), two new ones, every member
    holding all three; group "g" read from 0, group "r" resumed at its old commit, 1."""
    run = Run()
    run.rec.invoke(0, "send", value="classic-0-0", key=0, era="classic")
    run.ack(0, 0, node="n0")
    run.send(1, "1-0", 1)
    run.send(1, "1-1", 2)
    run.fetch(10, -1)
    run.poll(10, 0, [(0, "classic-0-0"), (1, "1-0"), (2, "1-1")])
    run.fetch(11, 1, group="r")
    run.poll(11, 1, [(1, "1-0"), (2, "1-1")], group="r")
    run.log("classic-0-0", "1-0", "1-1")
    run.replicas = {"n1": {0: run.final[0]}, "n2": {0: run.final[0]}}
    return run


def check_upgraded(run):
    return check(run.rec.ops, run.final, run.replicas, checks=TOPOLOGY_CHECKS["upgraded"])


def test_an_old_message_gone_from_one_member_fails_the_upgraded_check():
    run = upgraded_run()
    results = check_upgraded(run)
    assert results["valid"] is True
    assert results["old_messages"]["old_messages"] == 1
    assert results["consumed"]["started_at"] == {"g/0": 0, "r/0": 1}
    run.replicas["n2"] = {0: run.final[0][1:]}  # n2 serves the queue from offset 1
    results = check_upgraded(run)
    assert results["valid"] is False
    [missing] = results["old_messages"]["examples"]
    assert (missing["value"], missing["source"], missing["holds"]) == (
        "classic-0-0",
        "replica n2",
        None,
    )


def test_a_group_missing_a_message_above_where_it_started_fails_consumed():
    run = upgraded_run()
    run.send(2, "2-0", 3)
    run.final[0].append((3, "2-0"))
    run.poll(10, 3, [(3, "2-0")])
    # "r" started at 1, so the old message at 0 is not owed to it, but 2-0 is
    results = check_upgraded(run)
    assert results["valid"] is False
    [missed] = results["consumed"]["examples"]
    assert (missed["group"], missed["value"]) == ("r", "2-0")
    run.poll(11, 3, [(3, "2-0")], group="r")
    assert check_upgraded(run)["valid"] is True


def test_the_membership_check_fails_when_the_voters_are_not_those_the_changes_left():
    """A replacement recorded as done whose group still has its old voters at the end (a
    change answered but not made) fails the run; each change gets the worst window of
    unavailability within a second of it, and only those."""
    replaced = [
        {
            "kind": "membership",
            "changes": [
                {"change": "add", "member": "n3", "start": 10.0, "end": 14.0},
                {"change": "remove", "member": "n0", "start": 16.0, "end": 16.5},
            ],
        }
    ]
    windows = [
        {"start": 9.5, "end": 9.8, "duration": 0.3},
        {"start": 16.4, "end": 17.1, "duration": 0.7},
        {"start": 30.0, "end": 35.0, "duration": 5.0},
    ]
    done = {
        "start": ["n0", "n1", "n2"],
        "expected": ["n1", "n2", "n3"],
        "final": ["n1", "n2", "n3"],
    }
    result = check_membership(done, replaced, windows)
    assert result["valid"]
    assert [c["worst_unavailable_s"] for c in result["changes"]] == [0.3, 0.7]
    undone = {**done, "final": ["n0", "n1", "n2"]}
    assert not check_membership(undone, replaced, windows)["valid"]
