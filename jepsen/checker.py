"""Checkers for a queue history against the logs read after the run (reference chaos.md §5.3).

`check(history, final, replicas, run)` returns one entry per check, each
`{"valid": True | False | None, "fatal": bool, "count": int, "examples": [...], ...}`, and a
top-level `"valid"` that is True only if every fatal check passed. `valid` None marks an
informational check (it measures, it cannot fail). Every check is one pass over the history or
the logs (plus sorting), so a million-op history checks in seconds.

Besides the history and the logs, two fatal checks judge what the runner saw itself (`run`): a
member serving bytes that are not a message, and process errors (a node that would not restart,
or exited with a status its fault does not explain). Neither loses a message by itself, but a
run that shows one has found a bug, and CI must not call it valid.

Client outcomes are read conservatively, as the runner records them: a send is acknowledged only
on `ok`, definitely absent only on `fail`, and indeterminate on `info` or no completion at all.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jepsen.history import Fault, Pair, end_time, faults, pairs

EXAMPLES = 10

Log = dict[int, list[tuple[int, str]]]


# How far before and after a membership change an unavailability window counts as its
MEMBERSHIP_MARGIN_S = 1.0


def check(
    history: list[dict],
    final: Mapping,
    replicas: Mapping,
    run: Mapping | None = None,
    checks: Mapping[str, Callable[[Facts], dict]] | None = None,
    retention: bool = False,
) -> dict:
    """Run every check; `final` is queue -> [(offset, message id)] read through the master after
    the faults healed, `replicas` is node -> such a dict read from each node directly, and `run`
    the runner's own record (the results' `run` section): its `read_errors` (replies that did
    not decode) and `errors` (process errors, from the nemesis) fail the run. `checks` are
    the workload's (default: the queue workload's, `CHECKS`).

    With `retention` (a soak, whose logs retention deletes from the front as it goes), the
    final logs no longer hold every message: an acknowledged message counts as kept if a poll
    returned it or a final log holds it, and `unconsumed` fails the run over any acknowledged
    message no poll returned."""
    facts = Facts.build(
        history, normalise_log(final), {n: normalise_log(r) for n, r in replicas.items()}
    )
    facts.retention = retention
    results = {name: judge(facts) for name, judge in (checks or CHECKS).items()}
    if retention:
        results["unconsumed"] = check_unconsumed(facts)
    run = run or {}
    results["unreadable_replies"] = verdict(list(run.get("read_errors", [])))
    results["process_errors"] = verdict(list(run.get("errors", [])))
    if "members" in run:
        windows = results.get("availability", {}).get("windows", [])
        results["membership"] = check_membership(run["members"], run.get("faults", []), windows)
    valid = all(r["valid"] for r in results.values() if r["fatal"])
    return {"valid": valid, **results}


def normalise_log(log: Mapping) -> Log:
    """Queue ids as ints and entries as (offset, id) tuples, so a log that went through JSON
    (string keys, lists) compares equal to one built in memory."""
    return {int(q): [(int(o), str(v)) for o, v in entries] for q, entries in log.items()}


@dataclass
class Facts:
    """What every check reads: the history's ops by kind and the final log indexed by offset."""

    history: list[dict]
    final: Log
    replicas: dict[str, Log]
    sends: list[Pair] = field(default_factory=list)
    polls: list[Pair] = field(default_factory=list)
    acked: dict[str, Pair] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    indeterminate: set[str] = field(default_factory=set)
    final_at: dict[int, dict[int, str]] = field(default_factory=dict)
    final_values: set[str] = field(default_factory=set)
    first_seen: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    retention: bool = False  # the logs lose their heads as the run goes (see `check`)

    @classmethod
    def build(cls, history: list[dict], final: Log, replicas: dict[str, Log]) -> Facts:
        facts = cls(history, final, replicas)
        for pair in pairs(history):
            if pair.f == "send":
                facts._add_send(pair)
            elif pair.f == "poll" and pair.ok:
                facts.polls.append(pair)
        facts.final_at = {q: dict(entries) for q, entries in final.items()}
        facts.final_values = {v for entries in final.values() for _, v in entries}
        for source, queue, offset, value in facts.observed():
            if value not in facts.first_seen:
                facts.first_seen[value] = (source, queue, offset)
        return facts

    def _add_send(self, pair: Pair) -> None:
        self.sends.append(pair)
        value = pair.invoke["value"]
        if pair.ok:
            self.acked[value] = pair
        elif pair.type == "fail":
            self.failed.add(value)
        else:
            self.indeterminate.add(value)

    def attempted(self) -> set[str]:
        return {pair.invoke["value"] for pair in self.sends}

    def polled(self) -> Iterator[tuple[Pair, int, str]]:
        """(poll, offset, id) for every message an ok poll returned."""
        for pair in self.polls:
            for offset, value in pair.completion["value"]:
                yield pair, offset, value

    def observed(self) -> Iterator[tuple[str, int, int, str]]:
        """(source, queue, offset, id) for every message seen by a poll or in a final log."""
        for pair, offset, value in self.polled():
            yield f"poll by {pair.process}", pair.invoke["key"], offset, value
        for source, log in self.logs():
            for queue, entries in log.items():
                for offset, value in entries:
                    yield source, queue, offset, value

    def logs(self) -> Iterator[tuple[str, Log]]:
        yield "final", self.final
        for node, log in self.replicas.items():
            yield f"replica {node}", log


def verdict(problems: list, **extra: Any) -> dict:
    """A fatal check: valid when it found no problem."""
    return {
        "valid": not problems,
        "fatal": True,
        "count": len(problems),
        "examples": problems[:EXAMPLES],
        **extra,
    }


def info(count: int, examples: list, **extra: Any) -> dict:
    """An informational check: it reports, it cannot fail the run."""
    return {"valid": None, "fatal": False, "count": count, "examples": examples[:EXAMPLES], **extra}


def send_example(pair: Pair) -> dict:
    example = {
        "value": pair.invoke["value"],
        "key": pair.invoke["key"],
        "process": pair.process,
        "invoked": pair.start,
    }
    if pair.completion:
        example.update(type=pair.type, completed=pair.end)
        for name in ("offset", "node", "error"):
            if name in pair.completion:
                example[name] = pair.completion[name]
    return example


def check_counts(facts: Facts) -> dict:
    """Attempted, acknowledged, failed and indeterminate sends, and what else the run did."""
    by_kind = Counter(
        op["value"]["kind"]
        for op in facts.history
        if op["f"] == "fault" and op["value"]["phase"] == "start"
    )
    ops = Counter(f"{op['f']} {op['type']}" for op in facts.history if op["f"] != "fault")
    attempted = len(facts.sends)
    return info(
        attempted,
        [],
        operations=len(facts.history),
        attempted=attempted,
        acknowledged=len(facts.acked),
        failed=len(facts.failed),
        indeterminate=len(facts.indeterminate),
        incomplete=sum(1 for pair in facts.sends if pair.completion is None),
        polls_ok=len(facts.polls),
        polled_messages=sum(len(pair.completion["value"]) for pair in facts.polls),
        final_messages=sum(len(entries) for entries in facts.final.values()),
        faults=dict(by_kind),
        ops=dict(sorted(ops.items())),
    )


def check_lost(facts: Facts) -> dict:
    """Acknowledged messages missing from the final log: the headline invariant. Under
    retention, missing from the final log and never polled either."""
    kept = facts.final_values
    if facts.retention:
        kept = kept | {value for _, _, value in facts.polled()}
    lost = [pair for value, pair in facts.acked.items() if value not in kept]
    by_queue = Counter(pair.invoke["key"] for pair in lost)
    return verdict([send_example(p) for p in lost], by_queue=dict(by_queue))


def check_unseen_below_observed(facts: Facts) -> dict:
    """Jepsen's Kafka prefix rule: an acknowledged message below the highest offset any poll
    saw on its queue, yet never polled. Informational, because consumers need not read every
    queue from its start; `never_polled` counts acknowledged messages no poll returned."""
    highest: dict[int, int] = {}
    seen = set()
    for pair, offset, value in facts.polled():
        key = pair.invoke["key"]
        highest[key] = max(highest.get(key, offset), offset)
        seen.add(value)
    unseen = [
        pair
        for value, pair in facts.acked.items()
        if value not in seen and pair.completion["offset"] < highest.get(pair.invoke["key"], -1)
    ]
    never = sum(1 for value in facts.acked if value not in seen)
    return info(len(unseen), [send_example(p) for p in unseen[:EXAMPLES]], never_polled=never)


def check_unconsumed(facts: Facts) -> dict:
    """Acknowledged messages no poll returned: with consumers reading every queue to its end,
    each acknowledged message must reach them (retention must not delete it first)."""
    polled = {value for _, _, value in facts.polled()}
    unconsumed = [pair for value, pair in facts.acked.items() if value not in polled]
    return verdict([send_example(p) for p in unconsumed])


def check_unexpected(facts: Facts) -> dict:
    """Messages observed anywhere that no send ever attempted."""
    attempted = facts.attempted()
    problems = first_sightings(facts, lambda value: value not in attempted)
    return verdict(problems)


def check_aborted_reads(facts: Facts) -> dict:
    """Messages observed anywhere whose send definitely failed: the `fail` was a lie."""
    return verdict(first_sightings(facts, facts.failed.__contains__))


def check_recovered(facts: Facts) -> dict:
    """Indeterminate sends that did take effect (expected after timeouts; informational)."""
    recovered = first_sightings(facts, facts.indeterminate.__contains__)
    return info(len(recovered), recovered, of_indeterminate=len(facts.indeterminate))


def first_sightings(facts: Facts, wanted: Callable[[str], bool]) -> list[dict]:
    """Each wanted message once, with where it was first seen."""
    return [
        {"value": value, "key": queue, "offset": offset, "source": source}
        for value, (source, queue, offset) in facts.first_seen.items()
        if wanted(value)
    ]


def check_duplicated(facts: Facts) -> dict:
    """A message at more than one (queue, offset) across the final log and the replicas: the
    log appended it twice (or replicas disagree on where it is)."""
    first: dict[str, tuple[int, int, str]] = {}
    extra: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for source, log in facts.logs():
        for queue, entries in log.items():
            for offset, value in entries:
                place = first.setdefault(value, (queue, offset, source))
                if place[:2] != (queue, offset):
                    extra[value].append((queue, offset, source))
    problems = [
        {"value": v, "positions": [list(first[v]), *map(list, more)]} for v, more in extra.items()
    ]
    return verdict(problems)


def check_redelivered(facts: Facts) -> dict:
    """Messages a consumer group received more than once. At-least-once delivery allows it (a
    consumer re-polls from its committed offset after a failover), so it is informational."""
    deliveries: dict[str, Counter] = defaultdict(Counter)
    for pair, _, value in facts.polled():
        deliveries[pair.invoke["group"]][value] += 1
    per_group = {g: sum(1 for n in c.values() if n > 1) for g, c in deliveries.items()}
    examples = [
        {"group": g, "value": v, "deliveries": n}
        for g, c in deliveries.items()
        for v, n in c.items()
        if n > 1
    ][:EXAMPLES]
    return info(sum(per_group.values()), examples, per_group=per_group)


def check_inconsistent_offsets(facts: Facts) -> dict:
    """One (queue, offset) holding two different messages anywhere: acknowledged sends, polls,
    the final log or a replica."""
    at: dict[int, dict[int, tuple[str, str]]] = defaultdict(dict)
    clashes: dict[tuple[int, int], dict[str, str]] = {}
    for source, queue, offset, value in positions(facts):
        seen = at[queue].setdefault(offset, (value, source))
        if seen[0] != value:
            clash = clashes.setdefault((queue, offset), {seen[0]: seen[1]})
            clash.setdefault(value, source)
    problems = [{"key": q, "offset": o, "values": v} for (q, o), v in clashes.items()]
    return verdict(problems)


def positions(facts: Facts) -> Iterator[tuple[str, int, int, str]]:
    for value, pair in facts.acked.items():
        yield f"send by {pair.process}", pair.invoke["key"], pair.completion["offset"], value
    yield from facts.observed()


def check_offset_mismatch(facts: Facts) -> dict:
    """An acknowledged offset that does not hold its message in the final log. A lost message
    whose offset is simply past the log's end is left to `lost`."""
    problems = []
    for value, pair in facts.acked.items():
        queue, offset = pair.invoke["key"], pair.completion["offset"]
        holder = facts.final_at.get(queue, {}).get(offset)
        if holder != value and (holder is not None or value in facts.final_values):
            problems.append({**send_example(pair), "final_holds": holder})
    return verdict(problems)


def check_realtime_order(facts: Facts) -> dict:
    """Per queue, a send acknowledged before another send was invoked has the lower offset.

    One pass in recording order: each invoke remembers the highest offset acknowledged on its
    queue so far, and its own acknowledgement must land above it.
    """
    highest: dict[int, tuple[int, str]] = {}
    floors: dict[Any, tuple[int, str, tuple[int, str] | None]] = {}
    problems = []
    for op in facts.history:
        if op["f"] != "send":
            continue
        if op["type"] == "invoke":
            floors[op["process"]] = (op["key"], op["value"], highest.get(op["key"]))
            continue
        key, value, floor = floors.pop(op["process"])
        if op["type"] != "ok":
            continue
        offset = op["offset"]
        if floor is not None and offset <= floor[0]:
            problems.append(
                {
                    "key": key,
                    "value": value,
                    "offset": offset,
                    "process": op["process"],
                    "acked_before_invoke": {"value": floor[1], "offset": floor[0]},
                }
            )
        if key not in highest or offset > highest[key][0]:
            highest[key] = (offset, value)
    return verdict(problems)


def check_producer_fifo(facts: Facts) -> dict:
    """Each process's acknowledged sends to one queue land at increasing offsets, in send order."""
    last: dict[tuple[Any, int], Pair] = {}
    problems = []
    for pair in facts.sends:
        if not pair.ok:
            continue
        stream = (pair.process, pair.invoke["key"])
        before = last.get(stream)
        if before is not None and pair.completion["offset"] <= before.completion["offset"]:
            problems.append({**send_example(pair), "previous": send_example(before)})
        last[stream] = pair
    return verdict(problems)


def check_nonmonotonic_poll(facts: Facts) -> dict:
    """A consumer never goes back in the log.

    Within one poll the returned offsets strictly increase; none lies below the requested
    offset; and the next offset handed back lies past the last message returned. A consumer
    that asks again from a lower offset is re-reading on purpose and is not flagged; since every
    poll is judged against its own request, this is the per-process rule "returned offsets keep
    increasing across polls unless the process re-polled from lower".
    """
    problems = []
    for pair in facts.polls:
        returned = [offset for offset, _ in pair.completion["value"]]
        requested = pair.invoke["offset"]
        reason = poll_backwards(requested, returned, pair.completion.get("next_offset"))
        if reason:
            problems.append({**poll_example(pair), "reason": reason})
    return verdict(problems)


def poll_backwards(requested: int, returned: list[int], next_offset: int | None) -> str | None:
    if any(b <= a for a, b in itertools.pairwise(returned)):
        return "offsets within the poll do not increase"
    if returned and returned[0] < requested:
        return "returned an offset below the requested one"
    if returned and next_offset is not None and next_offset <= returned[-1]:
        return "next offset is not past the last returned message"
    return None


def poll_example(pair: Pair) -> dict:
    completion = pair.completion
    returned = completion["value"]
    return {
        "process": pair.process,
        "group": pair.invoke["group"],
        "key": pair.invoke["key"],
        "requested": pair.invoke["offset"],
        "returned": [list(entry) for entry in returned[:5]]
        + (["..."] if len(returned) > 5 else []),
        "next_offset": completion.get("next_offset"),
        "node": completion.get("node"),
        "completed": pair.end,
    }


def check_poll_skip(facts: Facts) -> dict:
    """A poll jumped over offsets the final log holds: between the requested offset and the
    first message, between two messages, or from the last message to the next offset.

    The final log is dense from the queue's minimum offset, so "holds o" is min <= o <= max;
    a request below the minimum may legitimately resume at the minimum.
    """
    bounds = {q: (min(held), max(held)) for q, held in facts.final_at.items() if held}
    problems = []
    for pair in facts.polls:
        if pair.invoke["key"] not in bounds:
            continue
        skipped = poll_gaps(pair, *bounds[pair.invoke["key"]])
        if skipped:
            problems.append({**poll_example(pair), "skipped": skipped})
    return verdict(problems)


def poll_gaps(pair: Pair, lowest: int, highest: int) -> list[list[int]]:
    """[first, last] offset ranges the poll stepped over that the final log holds."""
    completion = pair.completion
    expected = pair.invoke["offset"]
    stops = [offset for offset, _ in completion["value"]]
    if completion.get("next_offset") is not None:
        stops.append(completion["next_offset"])
    gaps = []
    for offset in stops:
        first, last = max(expected, lowest), min(offset - 1, highest)
        if first <= last:
            gaps.append([first, last])
        expected = max(expected, offset + 1)
    return gaps


def check_consumer_offsets_monotonic(facts: Facts) -> dict:
    """A consumer group's offset never moves back: a fetch invoked after a commit of n
    completed returns at least n. One pass in recording order, as for realtime order."""
    committed: dict[tuple[str, int], int] = {}
    commits: dict[Any, tuple[tuple[str, int], int]] = {}
    fetches: dict[Any, tuple[tuple[str, int], int | None]] = {}
    problems = []
    for op in facts.history:
        f, process = op["f"], op["process"]
        if f not in ("commit", "fetch_offset"):
            continue
        if op["type"] == "invoke":
            stream = (op["group"], op["key"])
            if f == "commit":
                commits[process] = (stream, op["offset"])
            else:
                fetches[process] = (stream, committed.get(stream))
        elif f == "commit":
            stream, offset = commits.pop(process)
            if op["type"] == "ok":
                committed[stream] = max(committed.get(stream, offset), offset)
        else:
            stream, floor = fetches.pop(process)
            if op["type"] == "ok" and floor is not None and op["offset"] < floor:
                problems.append(
                    {
                        "group": stream[0],
                        "key": stream[1],
                        "fetched": op["offset"],
                        "committed_before": floor,
                        "process": process,
                        "time": op["time"],
                    }
                )
    return verdict(problems)


def check_replica_agreement(facts: Facts) -> dict:
    """Every replica's committed log is a prefix of the final log: same message at every offset
    both hold, nothing committed past the final log's end. Anything else is a split brain or
    a committed entry the master lost."""
    problems = []
    for node, log in facts.replicas.items():
        for queue, entries in log.items():
            held = facts.final_at.get(queue, {})
            end = max(held, default=-1)
            for offset, value in entries:
                if held.get(offset, value) != value or offset > end:
                    problems.append(
                        {
                            "node": node,
                            "key": queue,
                            "offset": offset,
                            "replica": value,
                            "final": held.get(offset),
                        }
                    )
                    break
    return verdict(problems)


def check_availability(facts: Facts) -> dict:
    """Unavailability windows and how each fault affected them (informational).

    A window opens at the invoke of a send that did not end ok and closes at the earliest ok
    acknowledgement of a send invoked at or after that moment; sends invoked inside the window
    belong to it. Each fault gets the delay until it caused unavailability, the time to recover
    after it stopped, and the progress (ok sends) made while it was active: the faults marked
    `majority_ok` should not stop progress, and `no_progress` lists those that did.
    A window no ok send closes ends with the load (the last send's answer), not with the
    run: the run goes on reading after it, and a fault near the end of the load was
    charged those seconds of reading, which no sender waited (2.3-3.4 s once).
    """
    end = load_end(facts.sends, end_time(facts.history))
    windows = unavailability(facts.sends, end)
    acked_at = sorted(pair.end for pair in facts.acked.values())
    for window in windows:
        window["faults"] = []
    ends = [window["end"] for window in windows]
    per_fault = [fault_effect(f, windows, ends, acked_at) for f in faults(facts.history)]
    worst = max(windows, key=lambda w: w["duration"], default=None)
    stalled = [f["id"] for f in per_fault if f["majority_ok"] and f["ok_sends"] == 0]
    return info(
        len(windows),
        windows,
        windows=windows,
        worst=worst,
        unavailable_seconds=round(sum(w["duration"] for w in windows), 6),
        faults=per_fault,
        no_progress=stalled,
    )


def check_membership(members: Mapping, injected: list[dict], windows: list[dict]) -> dict:
    """The membership fault's changes, each with its times and the worst unavailability
    window that overlaps it (from `MEMBERSHIP_MARGIN_S` before it starts to as long after
    it ends); fatal when the group's voters at the end are not those the changes made
    (`members`: the runner's start, expected and final voters), so a change that did
    not happen, or not as answered, fails the run."""
    changes = []
    for fault in injected:
        for change in fault.get("changes", []):
            low, high = change["start"] - MEMBERSHIP_MARGIN_S, change["end"] + MEMBERSHIP_MARGIN_S
            around = [w["duration"] for w in windows if w["start"] < high and w["end"] > low]
            changes.append({**change, "worst_unavailable_s": max(around, default=0.0)})
    problems = [] if list(members["final"]) == list(members["expected"]) else [dict(members)]
    return verdict(problems, changes=changes, members=dict(members))


def load_end(sends: list[Pair], otherwise: float) -> float:
    """When the last send was answered (or invoked, if never answered)."""
    return max((p.start if p.end is None else p.end for p in sends), default=otherwise)


def unavailability(sends: list[Pair], end: float) -> list[dict]:
    """Windows over sends in invoke order, using a suffix minimum of ok completion times."""
    earliest_ok = [math.inf] * (len(sends) + 1)
    for i in range(len(sends) - 1, -1, -1):
        done = sends[i].end if sends[i].ok else math.inf
        earliest_ok[i] = min(done, earliest_ok[i + 1])
    windows = []
    i = 0
    while i < len(sends):
        if sends[i].ok:
            i += 1
            continue
        start, close = sends[i].start, earliest_ok[i]
        recovered = close != math.inf
        close = close if recovered else max(end, start)
        windows.append(
            {
                "start": start,
                "end": close,
                "duration": round(close - start, 6),
                "recovered": recovered,
            }
        )
        while i < len(sends) and sends[i].start <= close:
            i += 1
    return windows


def fault_effect(
    fault: Fault, windows: list[dict], ends: list[float], acked_at: list[float]
) -> dict:
    """One fault's effect; also tags the windows it overlaps with its id. Windows are disjoint
    and in time order, so their `ends` are sorted and bisect finds the first overlap."""
    first = bisect.bisect_left(ends, fault.start)
    overlapping = []
    for window in windows[first:]:
        if window["start"] > fault.stop:
            break
        overlapping.append(window)
        window["faults"].append(fault.id)
    lo, hi = bisect.bisect_left(acked_at, fault.start), bisect.bisect_right(acked_at, fault.stop)
    marks = [fault.start, *acked_at[lo:hi], fault.stop]
    effect = {
        "id": fault.id,
        "kind": fault.kind,
        "targets": fault.targets,
        "majority_ok": fault.majority_ok,
        "start": fault.start,
        "stop": fault.stop,
        "stopped": fault.stopped,
        "ok_sends": hi - lo,
        "ok_per_second": round((hi - lo) / max(fault.stop - fault.start, 1e-9), 3),
        "longest_gap": round(max(b - a for a, b in itertools.pairwise(marks)), 6),
        "time_to_unavailable": None,
        "time_to_recover": 0.0,
        "unavailable_seconds": round(
            sum(min(w["end"], fault.stop) - max(w["start"], fault.start) for w in overlapping), 6
        ),
    }
    if overlapping:
        last = overlapping[-1]
        effect["time_to_unavailable"] = round(max(0.0, overlapping[0]["start"] - fault.start), 6)
        effect["time_to_recover"] = (
            round(max(0.0, last["end"] - fault.stop), 6) if last["recovered"] else None
        )
    return effect


def check_latency(facts: Facts) -> dict:
    """Latency percentiles of ok sends and ok polls, in seconds (informational)."""
    sends = summarise([pair.end - pair.start for pair in facts.acked.values()])
    polls = summarise([pair.end - pair.start for pair in facts.polls])
    return info(sends["count"], [], send=sends, poll=polls)


def summarise(latencies: list[float]) -> dict:
    """Nearest-rank percentiles."""
    ordered = sorted(latencies)
    if not ordered:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p * len(ordered)) - 1)], 6)

    return {
        "count": len(ordered),
        "p50": rank(0.50),
        "p95": rank(0.95),
        "p99": rank(0.99),
        "max": round(ordered[-1], 6),
    }


# What a broker says when it refuses a send for a full disk (RocketMQ's remark).
DISK_FULL_REMARK = "the broker's disk is full"


def check_disk_faults(facts: Facts) -> dict:
    """What full and slow disks cost (informational). Per `disk-full` fault: sends
    refused for a full disk while it lasted, and how long after the space came back
    the first send invoked after it was acknowledged (None: none was). Per
    `slow-disk` fault: latency of the acknowledged sends invoked while it lasted,
    and of those invoked in as long a window just before it."""
    rows = []
    for fault in faults(facts.history):
        if fault.kind == "disk-full":
            rows.append(disk_full_effect(fault, facts.sends))
        elif fault.kind == "slow-disk":
            rows.append(slow_disk_effect(fault, facts.sends))
    refused = sum(row.get("refused", 0) for row in rows)
    return info(len(rows), rows, faults=rows, refused=refused)


def disk_full_effect(fault: Fault, sends: list[Pair]) -> dict:
    during = [p for p in sends if fault.start <= p.start <= fault.stop and p.completion]
    refused = [
        p for p in during if p.type == "fail" and DISK_FULL_REMARK in p.completion.get("error", "")
    ]
    after = [p.end for p in sends if p.ok and p.start >= fault.stop]
    return {
        "id": fault.id,
        "kind": fault.kind,
        "detail": fault.detail,
        "targets": fault.targets,
        "refused": len(refused),
        "ok_during": sum(1 for p in during if p.ok),
        "resumed_after_s": round(min(after) - fault.stop, 3) if after else None,
    }


def slow_disk_effect(fault: Fault, sends: list[Pair]) -> dict:
    length = fault.stop - fault.start

    def latencies(start: float, stop: float) -> list[float]:
        return [p.end - p.start for p in sends if p.ok and start <= p.start < stop]

    return {
        "id": fault.id,
        "kind": fault.kind,
        "detail": fault.detail,
        "targets": fault.targets,
        "before": summarise(latencies(fault.start - length, fault.start)),
        "during": summarise(latencies(fault.start, fault.stop)),
    }


# A SYNC_MASTER's answers for "stored on the master, not confirmed on the slave".
SLAVE_UNCONFIRMED = {11: "SLAVE_NOT_AVAILABLE", 12: "FLUSH_SLAVE_TIMEOUT"}


def check_acked_without_slave(facts: Facts) -> dict:
    """SYNC_MASTER sends answered SLAVE_NOT_AVAILABLE (11) or FLUSH_SLAVE_TIMEOUT (12):
    stored on the master, which RocketMQ's clients count as sent, but without the slave's
    copy. The history holds them as indeterminate (`info`), so `lost` does not count them;
    here they are counted, with how many the final log lacks (informational: losing one
    with the master is what those codes allow)."""
    unconfirmed = [
        p for p in facts.sends if p.completion and p.completion.get("code") in SLAVE_UNCONFIRMED
    ]
    lost = [p for p in unconfirmed if p.invoke["value"] not in facts.final_values]
    by_code = Counter(SLAVE_UNCONFIRMED[p.completion["code"]] for p in unconfirmed)
    return info(
        len(unconfirmed),
        [send_example(p) for p in lost],
        lost=len(lost),
        by_code=dict(by_code),
        statement=f"acked without the slave guarantee (code 11/12): {len(unconfirmed)}, "
        f"lost {len(lost)}",
    )


def check_async_loss(facts: Facts) -> dict:
    """ASYNC_MASTER: the master answers SEND_OK before its slave has the bytes, so a
    master lost for good (`lose-master`: its disk gone, the slave serving what it had
    received) may take acknowledged messages with it, but only what had not been
    replicated yet: the slave holds a prefix of the master's CommitLog, so no message
    invoked after a lost one was acknowledged may survive. Fatal: any loss without a
    master lost (kill -9 and restart keeps the disk, so nothing may go), or a loss that
    is not such a suffix. `count` is the loss; `statement` its bound."""
    lost = [pair for value, pair in facts.acked.items() if value not in facts.final_values]
    losses = [f for f in faults(facts.history) if f.kind == "lose-master" and f.targets]
    problems: list[dict] = []
    if lost and not losses:
        problems = [{**send_example(p), "why": "lost with the master's disk intact"} for p in lost]
    elif lost:
        problems = _survivors_after_loss(facts.acked.values(), lost, facts.final_values)
    statement = "no acknowledged message lost"
    if lost and losses:
        # with a suffix lost, the last lost ack is the master's last: the span is the lag
        window_s = max(p.end for p in lost) - min(p.start for p in lost)
        statement = (
            f"lost {len(lost)} acknowledged messages with the master, all sent in its last "
            f"{window_s * 1000:.0f} ms: what the slave had not yet received"
            + (" (a suffix of the log)" if not problems else ", NOT a suffix of the log")
        )
    by_queue = dict(Counter(p.invoke["key"] for p in lost))
    return _loss_verdict(lost, problems, statement, by_queue=by_queue)


def _survivors_after_loss(acked, lost: list[Pair], final_values) -> list[dict]:
    """The acknowledged sends that survived though invoked after the first lost one was
    acknowledged: a replica that holds a prefix of the log cannot have them."""
    first_lost_ack = min(p.end for p in lost)
    return [
        {**send_example(p), "why": "survived, yet invoked after a lost message was acked"}
        for p in acked
        if p.invoke["value"] in final_values and p.start > first_lost_ack
    ]


def _loss_verdict(lost: list[Pair], problems: list[dict], statement: str, **extra) -> dict:
    """A fatal `lost` check's result whose `count` is the loss and `statement` its bound."""
    return {
        "valid": not problems,
        "fatal": True,
        "count": len(lost),
        "examples": [send_example(p) for p in lost[:EXAMPLES]],
        "violations": problems[:EXAMPLES],
        **extra,
        "statement": statement,
    }


def check_failover_loss(facts: Facts) -> dict:
    """A controller-mode group with `allAckInSyncStateSet=false`: a master answers
    SEND_OK before any slave has the bytes, so when the controller replaces it (killed,
    paused, cut off, lost) what it had not replicated is lost: the new master never had
    it, and the old one cuts it when it rejoins. Only that: the lost messages of one
    master's reign (its run of acknowledgements, in the order they were answered) are
    a suffix of that reign, and a reign that no other master followed loses nothing.
    Fatal otherwise. `count` is the loss; `by_master` the reigns that lost some."""
    lost, problems, by_master = _failover_losses(facts)
    statement = "no acknowledged message lost"
    if lost:
        statement = (
            f"lost {len(lost)} acknowledged messages in {len(by_master)} failovers, each "
            f"sent in its old master's last "
            f"{max(r['last_ms'] for r in by_master) if by_master else 0} ms at most"
            + (" (suffixes of their reigns)" if not problems else ", NOT only such suffixes")
        )
    return _loss_verdict(lost, problems, statement, by_master=by_master)


def _failover_losses(facts: Facts) -> tuple[list[Pair], list[dict], list[dict]]:
    """`check_failover_loss`'s lost sends, the problems with them, and the reigns that
    lost some."""
    reigns: list[list[Pair]] = []
    for pair in sorted(facts.acked.values(), key=lambda p: p.end):
        node = pair.completion.get("node")
        if not reigns or reigns[-1][0].completion.get("node") != node:
            reigns.append([])
        reigns[-1].append(pair)
    lost: list[Pair] = []
    problems: list[dict] = []
    by_master: list[dict] = []
    for index, reign in enumerate(reigns):
        gone = [p for p in reign if p.invoke["value"] not in facts.final_values]
        if not gone:
            continue
        lost += gone
        if index == len(reigns) - 1:
            why = "lost by the last master, which nothing replaced"
            problems += [{**send_example(p), "why": why} for p in gone]
            continue
        problems += _survivors_after_loss(reign, gone, facts.final_values)
        window_s = max(p.end for p in gone) - min(p.start for p in gone)
        by_master.append(
            {"node": reign[0].completion.get("node"), "lost": len(gone),
             "last_ms": round(window_s * 1000)}
        )  # fmt: skip
    return lost, problems, by_master


def without_failover_losses(judge: Callable[[Facts], dict]) -> Callable[[Facts], dict]:
    """`judge` over the history less the messages a failover lost, when
    `check_failover_loss` allows that loss: a consumer may have read such a message at
    its offset before the new master gave the offset to another one, and a producer's
    or the real-time order then sees the offset twice. That is the loss itself, which
    `lost` reports, not another fault; any other message is judged as usual."""

    def judged(facts: Facts) -> dict:
        lost, problems, _by_master = _failover_losses(facts)
        if not lost or problems:
            return judge(facts)
        gone = {pair.invoke["value"] for pair in lost}
        history, dropping = [], set()  # processes whose send's completion is left out
        for op in facts.history:
            if op["f"] == "send" and op["type"] == "invoke" and op["value"] in gone:
                dropping.add(op["process"])
                continue
            if op["f"] == "send" and op["type"] != "invoke" and op["process"] in dropping:
                dropping.remove(op["process"])
                continue
            if op["f"] == "poll" and op["type"] == "ok":
                op = {**op, "value": [[o, v] for o, v in op["value"] if v not in gone]}
            history.append(op)
        rest = Facts.build(history, facts.final, facts.replicas)
        rest.retention = facts.retention
        return {**judge(rest), "failover_losses_left_out": len(gone)}

    return judged


def check_old_messages(facts: Facts) -> dict:
    """An upgraded group: every message the classic group acknowledged before the upgrade
    (sends marked `era`) still at its queue offset, in the final log and on every member
    read at the end. They sit below the divide, in the old files each member started
    from, so no member may lack one; `old_messages` counts them."""
    old = [pair for pair in facts.acked.values() if "era" in pair.invoke]
    problems = []
    for source, log in facts.logs():
        at = {queue: dict(entries) for queue, entries in log.items()}
        for pair in old:
            queue, offset = pair.invoke["key"], pair.completion["offset"]
            holder = at.get(queue, {}).get(offset)
            if holder != pair.invoke["value"]:
                problems.append({**send_example(pair), "source": source, "holds": holder})
    return verdict(problems, old_messages=len(old))


def check_consumed_by_each_group(facts: Facts) -> dict:
    """Every consumer group polled every acknowledged message at or above the offset its
    first fetch returned on that queue: 0 for a group with no committed offset, the
    classic-era commit for one resuming after an upgrade. The drain makes each group read
    to the end of every queue, so a message a group never got was skipped or lost to it."""
    start: dict[tuple[str, int], int] = {}
    for op in facts.history:
        if op["f"] == "fetch_offset" and op["type"] == "ok":
            start.setdefault((op["group"], op["key"]), max(op["offset"], 0))
    polled: dict[str, set[str]] = defaultdict(set)
    for pair, _, value in facts.polled():
        polled[pair.invoke["group"]].add(value)
    acked_in: dict[int, list[Pair]] = defaultdict(list)
    for pair in facts.acked.values():
        acked_in[pair.invoke["key"]].append(pair)
    problems = [
        {**send_example(pair), "group": group}
        for (group, queue), first in sorted(start.items())
        for pair in acked_in[queue]
        if pair.completion["offset"] >= first and pair.invoke["value"] not in polled[group]
    ]
    started_at = {f"{group}/{queue}": offset for (group, queue), offset in start.items()}
    return verdict(problems, started_at=started_at)


# --topology's own rules, over the workload's checks.
TOPOLOGY_CHECKS: dict[str, dict[str, Callable[[Facts], dict]]] = {
    "ms-sync": {"acked_without_slave": check_acked_without_slave},
    "ms-async": {"lost": check_async_loss},
    "upgraded": {"old_messages": check_old_messages, "consumed": check_consumed_by_each_group},
    "controller-async": {
        "lost": check_failover_loss,
        "inconsistent_offsets": without_failover_losses(check_inconsistent_offsets),
        "offset_mismatch": without_failover_losses(check_offset_mismatch),
        "realtime_order": without_failover_losses(check_realtime_order),
        "producer_fifo": without_failover_losses(check_producer_fifo),
    },
}

CHECKS: dict[str, Callable[[Facts], dict]] = {
    "counts": check_counts,
    "lost": check_lost,
    "unseen_below_observed": check_unseen_below_observed,
    "unexpected": check_unexpected,
    "aborted_reads": check_aborted_reads,
    "recovered": check_recovered,
    "duplicated": check_duplicated,
    "redelivered": check_redelivered,
    "inconsistent_offsets": check_inconsistent_offsets,
    "offset_mismatch": check_offset_mismatch,
    "realtime_order": check_realtime_order,
    "producer_fifo": check_producer_fifo,
    "nonmonotonic_poll": check_nonmonotonic_poll,
    "poll_skip": check_poll_skip,
    "consumer_offsets_monotonic": check_consumer_offsets_monotonic,
    "replica_agreement": check_replica_agreement,
    "availability": check_availability,
    "latency": check_latency,
    "disk_faults": check_disk_faults,
}
# Checks a workload may leave out: those that read pulls (consumers that pop record
# none) and those that compare an acknowledged send's offset with the log (a timer
# send's offset is the timer topic's, not its queue's).
PULL_CHECKS = (
    "unseen_below_observed",
    "redelivered",
    "nonmonotonic_poll",
    "poll_skip",
    "consumer_offsets_monotonic",
)
SEND_OFFSET_CHECKS = (
    "unseen_below_observed",
    "inconsistent_offsets",
    "offset_mismatch",
    "realtime_order",
    "producer_fifo",
)


def checks_without(*names: str) -> dict[str, Callable[[Facts], dict]]:
    """The queue workload's checks but `names`."""
    return {name: judge for name, judge in CHECKS.items() if name not in names}
