"""The timer workload (`--workload timers`) and its checks.

Producers send timer messages (RocketMQ 5's TIMER_DELIVER_MS), each due DELAY_S after
its send, to a random queue; the queue workload's consumers pull the topic, where the
master stores each message again once it is due. A send's invoke records `due`, the
due time on the history's clock (read together with the wall clock the property is
computed from), and its `deliver_at_ms`.

A message is first seen by the earliest ok poll that returned it. It must not be seen
before it is due (`early`: the poll ended before `due`), and it must be seen within
the bound: PRECISION_MS (the broker's timerPrecisionMs) plus POLL_SLACK_S for the
consumer's long poll and a shared CPU; when the group was unavailable to producers
around the due time (a failover; the windows of the availability check), no later
than the window's end plus the same bound (`late`). Every acknowledged send must
reach the log and a consumer (`lost`, `unconsumed`). A message the old master fired
after its last replicated firing progress is fired again by the new one (docs/timers.md):
`fired_twice` counts those, informationally.

The acknowledged send's offset is the timer topic's, not the real queue's, so the
checks that compare it with the log are left out.
"""

from __future__ import annotations

import time

import trio

from jepsen.checker import (
    EXAMPLES,
    SEND_OFFSET_CHECKS,
    Facts,
    check_duplicated,
    check_unconsumed,
    checks_without,
    info,
    summarise,
    unavailability,
    verdict,
)
from jepsen.history import end_time
from jepsen.workload import QUEUES, Workload, wait_stored
from raftmq.client.instance import ClientInstance
from raftmq.protocol.message import MessageConst, properties_to_string

PRECISION_MS = 1000  # timerPrecisionMs, set for the run
BROKER_CONF = {"timerPrecisionMs": str(PRECISION_MS)}
DELAY_S = (0.5, 5.0)  # a message is due this long after its send
POLL_SLACK_S = 1.0  # beyond the precision: the consumer's long poll and a shared CPU
SETTLE_TIMEOUT_S = 60.0


class TimerWorkload(Workload):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: set[str] = set()  # values whose send ended ok
        self.last_due_ms = 0.0  # the latest deliver_at_ms sent

    def _operation(self, process: int, seq: int) -> dict:
        op = super()._operation(process, seq)
        delay_s = self.rng.uniform(*DELAY_S)
        op["due"] = round(self.history.elapsed() + delay_s, 6)
        op["deliver_at_ms"] = int(time.time() * 1000 + delay_s * 1000)
        return op

    async def _perform(self, client: ClientInstance, op: dict) -> tuple[str, dict]:
        properties = properties_to_string(
            {
                MessageConst.PROPERTY_WAIT_STORE_MSG_OK: "true",
                MessageConst.PROPERTY_TIMER_DELIVER_MS: str(op["deliver_at_ms"]),
            }
        )
        self.last_due_ms = max(self.last_due_ms, op["deliver_at_ms"])
        outcome, fields = await self._send(client, op["value"], op["key"], properties)
        if outcome == "ok":
            self.sent.add(op["value"])
        return outcome, fields

    async def settle(self, master_address: str) -> bool:
        """Until every acknowledged timer message is due and in the master's log."""
        await trio.sleep(max(0.0, (self.last_due_ms + PRECISION_MS) / 1000 - time.time()))
        queues = [self.queue(queue_id) for queue_id in range(QUEUES)]
        return await wait_stored(master_address, queues, self.sent, SETTLE_TIMEOUT_S)


def first_polled(facts: Facts) -> dict[str, float]:
    """value -> when the earliest ok poll that returned it ended."""
    seen: dict[str, float] = {}
    for pair, _offset, value in facts.polled():
        seen[value] = min(seen.get(value, pair.end), pair.end)
    return seen


def allowed_by(due: float, windows: list[dict]) -> float:
    """The latest a message due at `due` may be seen: the bound after its due time, or
    after the end of an unavailability window it fell into (windows in time order; a
    message not yet out when a window opens waits for it too)."""
    bound = PRECISION_MS / 1000 + POLL_SLACK_S
    allowed = due + bound
    for window in windows:
        if window["start"] <= allowed and window["end"] >= due:
            allowed = max(allowed, window["end"] + bound)
    return allowed


def check_early(facts: Facts) -> dict:
    """Timer messages a poll returned before they were due."""
    seen = first_polled(facts)
    problems = [
        {"value": value, "due": pair.invoke["due"], "seen": seen[value]}
        for value, pair in facts.acked.items()
        if value in seen and seen[value] < pair.invoke["due"]
    ]
    return verdict(problems)


def check_late(facts: Facts) -> dict:
    """Timer messages first seen later than allowed_by their due time; also the
    lateness percentiles over every acknowledged message seen."""
    seen = first_polled(facts)
    windows = unavailability(facts.sends, end_time(facts.history))
    problems, lateness = [], []
    for value, pair in facts.acked.items():
        if value not in seen:
            continue
        due = pair.invoke["due"]
        lateness.append(seen[value] - due)
        allowed = allowed_by(due, windows)
        if seen[value] > allowed:
            problems.append(
                {"value": value, "due": due, "seen": seen[value], "allowed": round(allowed, 6)}
            )
    return verdict(problems, lateness_s=summarise(lateness))


def check_fired_twice(facts: Facts) -> dict:
    """Timer messages stored twice in the log (informational: a new master fires again
    what the old one fired after its last replicated progress)."""
    duplicated = check_duplicated(facts)
    return info(duplicated["count"], duplicated["examples"][:EXAMPLES])


TIMER_CHECKS = {
    **checks_without(*SEND_OFFSET_CHECKS, "duplicated"),
    "unconsumed": check_unconsumed,
    "early": check_early,
    "late": check_late,
    "fired_twice": check_fired_twice,
}
