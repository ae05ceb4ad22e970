"""Offset planning for the Spark source: pure functions of offsets and queue bounds.

Everything the driver decides about a micro-batch is here, with no broker, trio or
Spark in sight, so each rule can be tested on its own:

- An offset is a dict `{"<brokerName>:<queueId>": next offset}`. Queue offsets are
  logical: every replica of a DLedger group holds the same message at the same offset,
  so a leader change never shifts them and an offset taken from one member is valid
  on all of them.
- Spark compares offsets as JSON **text** (`json.dumps`, no key sorting), so every dict
  handed to Spark goes through `ordered`: equal offsets always print the same.
- A queue that joins the route (topic expansion, a new broker group) is first
  *introduced* in a batch's end at its earliest offset, with no range; its messages are
  read from the next batch on. `partitions(start, end)` then never has to look up a
  start that is not in `start`, so replaying a batch after a restart needs no broker.
- Offsets never move backwards. A queue whose reported end is below an offset already
  read (a lagging replica answered, or the queue was recreated), or that is missing
  from the route, keeps its offset: re-reading would duplicate rows in the sink.
- What is lost for good (offsets deleted by retention before they were read, a queue
  recreated, a new queue whose first messages are gone) is data loss: the plan raises
  `DataLossError` when `failOnDataLoss` is true, and lists it for the caller to log
  otherwise. Messages deleted inside a planned range are skipped by the reader, which
  sees exactly where the store now starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bounds",
    "DataLossError",
    "Plan",
    "QueueRange",
    "ending_offsets",
    "initial_offsets",
    "next_offsets",
    "ordered",
    "queue_key",
    "ranges",
    "rate_limit",
    "regressed",
    "split_key",
]

EARLIEST = -2  # in startingOffsets / endingOffsets JSON, as Kafka and rocketmq-spark spell it
LATEST = -1

DATA_LOSS_HINT = (
    "Some data may have been lost: messages were deleted before they were read, or a queue "
    "was recreated. If you want the query to go on past this, set the source option "
    '"failOnDataLoss" to "false".'
)


class DataLossError(Exception):
    """Messages the query should have read no longer exist (failOnDataLoss)."""

    def __init__(self, losses: list[str]) -> None:
        super().__init__("; ".join(losses) + ". " + DATA_LOSS_HINT)
        self.losses = losses


def queue_key(broker_name: str, queue_id: int) -> str:
    return f"{broker_name}:{queue_id}"


def split_key(key: str) -> tuple[str, int]:
    """`"RaftNode00:3"` -> ("RaftNode00", 3); ValueError for anything else."""
    broker_name, sep, queue_id = key.rpartition(":")
    if not sep or not broker_name or not queue_id.isdigit():
        raise ValueError(f"{key!r} is not a queue key <brokerName>:<queueId>")
    return broker_name, int(queue_id)


def ordered(offsets: Mapping[str, int]) -> dict[str, int]:
    """The same offsets, keys in (brokerName, queueId) order: one JSON text per value."""
    return {key: int(offsets[key]) for key in sorted(offsets, key=split_key)}


@dataclass(frozen=True)
class Bounds:
    """What a member reports for one queue: the first offset it still stores and the
    offset the next message will get (its committed, dispatched end)."""

    low: int
    high: int


@dataclass(frozen=True)
class Plan:
    """Offsets decided, with what was lost (when not failing) and what was kept back."""

    offsets: dict[str, int]
    losses: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class QueueRange:
    """Messages [start, end) of one queue: one Spark task."""

    broker_name: str
    queue_id: int
    start: int
    end: int

    @property
    def key(self) -> str:
        return queue_key(self.broker_name, self.queue_id)


def _settle(plan: Plan, fail_on_data_loss: bool) -> Plan:
    if plan.losses and fail_on_data_loss:
        raise DataLossError(plan.losses)
    return plan


def initial_offsets(
    starting: str | Mapping[str, int], bounds: Mapping[str, Bounds], *, fail_on_data_loss: bool
) -> Plan:
    """Where a new query (or a batch read) starts.

    `starting` is "earliest", "latest", or offsets per queue key (a timestamp start
    arrives here already resolved to offsets), where -2 means earliest and -1 latest;
    queues it does not name start at their earliest offset. `bounds` must cover every
    queue of the route.
    """
    if starting == "earliest":
        return Plan(ordered({k: b.low for k, b in bounds.items()}))
    if starting == "latest":
        return Plan(ordered({k: b.high for k, b in bounds.items()}))
    unknown = sorted(set(starting) - set(bounds))
    if unknown:
        raise ValueError(
            f"offsets given for queues the topic's route does not have: {', '.join(unknown)}"
            f" (it has {', '.join(ordered(dict.fromkeys(bounds, 0)))})"
        )
    offsets, losses = {}, []
    for key, b in bounds.items():
        wanted = starting.get(key, EARLIEST)
        if wanted == EARLIEST:
            offsets[key] = b.low
        elif wanted == LATEST:
            offsets[key] = b.high
        elif wanted > b.high:
            raise ValueError(f"offset {wanted} of queue {key} is past its end {b.high}")
        elif wanted < b.low:
            losses.append(f"queue {key}: offsets {wanted}..{b.low - 1} were deleted")
            offsets[key] = b.low
        else:
            offsets[key] = wanted
    return _settle(Plan(ordered(offsets), losses), fail_on_data_loss)


def ending_offsets(ending: str | Mapping[str, int], bounds: Mapping[str, Bounds]) -> dict:
    """Where a batch read stops: "latest", or offsets per queue (-1 latest, -2 earliest;
    queues not named end at latest)."""
    if ending == "latest":
        return ordered({k: b.high for k, b in bounds.items()})
    unknown = sorted(set(ending) - set(bounds))
    if unknown:
        raise ValueError(f"endingOffsets names queues the route does not have: {unknown}")
    offsets = {}
    for key, b in bounds.items():
        wanted = ending.get(key, LATEST)
        offsets[key] = b.high if wanted == LATEST else b.low if wanted == EARLIEST else wanted
        if offsets[key] > b.high:
            raise ValueError(f"ending offset {wanted} of queue {key} is past its end {b.high}")
    return ordered(offsets)


def regressed(start: Mapping[str, int], bounds: Mapping[str, Bounds]) -> list[str]:
    """Queues whose reported end is below where the query already is: the caller asks
    again (with a fresh route) before planning on such an answer."""
    return [k for k, b in bounds.items() if k in start and b.high < start[k]]


def rate_limit(backlog: Mapping[str, int], max_rows: int) -> dict[str, int]:
    """How many of each queue's `backlog` messages fit in `max_rows`.

    Shares are proportional to the backlogs, as the Kafka source splits
    maxOffsetsPerTrigger, but the total is exactly `max_rows` (Kafka's rounding up may
    pass it) and, when the budget allows, every queue with a backlog gets at least one
    message, so a small queue is not starved behind a large one. Rows left after
    rounding down go by the largest remainder, ties in queue order.
    """
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(backlog)
    waiting = [k for k, n in backlog.items() if n > 0]
    floor = 1 if max_rows >= len(waiting) else 0
    take = {k: min(n, floor) for k, n in backlog.items()}
    rest = {k: n - take[k] for k, n in backlog.items()}
    budget, rest_total = max_rows - sum(take.values()), sum(rest.values())
    remainder = {}
    for k, n in rest.items():
        share, remainder[k] = divmod(budget * n, rest_total)
        take[k] += share
    left = max_rows - sum(take.values())
    for k in sorted(rest, key=lambda k: (-remainder[k], split_key(k)))[:left]:
        take[k] += 1
    return take


def next_offsets(
    start: Mapping[str, int],
    bounds: Mapping[str, Bounds],
    *,
    fail_on_data_loss: bool,
    max_rows: int | None = None,
    target: Mapping[str, int] | None = None,
) -> Plan:
    """The end of the next micro-batch from `start` and the queues' current bounds.

    `bounds` holds the queues that answered (a queue of an unreachable group is simply
    absent). `max_rows` caps the messages planned (ReadMaxRows); `target` is the
    availableNow snapshot, never passed (queues not in it get no further).
    """
    end: dict[str, int] = {}
    losses: list[str] = []
    notes: list[str] = []
    backlog: dict[str, int] = {}
    first: dict[str, int] = {}  # where each queue's readable messages begin
    for key, offset in start.items():
        b = bounds.get(key)
        end[key] = offset
        if b is None:
            notes.append(f"queue {key} did not answer or left the route; it stays at {offset}")
            continue
        if b.high < offset:
            losses.append(
                f"queue {key} now ends at {b.high}, below offset {offset} already read "
                "(the queue was recreated, or only a lagging replica answered)"
            )
            continue
        if offset < b.low:
            losses.append(f"queue {key}: offsets {offset}..{b.low - 1} were deleted unread")
        stop = b.high if target is None else min(b.high, target.get(key, offset))
        # Deleted messages are skipped even when nothing new is readable.
        first[key] = end[key] = max(offset, min(b.low, stop))
        backlog[key] = max(0, stop - first[key])
    for key in bounds.keys() - start.keys():
        if target is not None and key not in target:
            continue
        low = bounds[key].low
        end[key] = low
        notes.append(f"new queue {key} starts at {low}")
        if low > 0:
            losses.append(f"new queue {key}: offsets 0..{low - 1} were deleted before it was seen")
    taken = backlog if max_rows is None else rate_limit(backlog, max_rows)
    for key, count in taken.items():
        end[key] = first[key] + count
    return _settle(Plan(ordered(end), losses, notes), fail_on_data_loss)


def ranges(start: Mapping[str, int], end: Mapping[str, int]) -> list[QueueRange]:
    """One range per queue with messages to read; queues introduced by `end` (not in
    `start`) and queues kept back have none."""
    out = []
    for key, stop in ordered(end).items():
        begin = start.get(key)
        if begin is not None and stop > begin:
            out.append(QueueRange(*split_key(key), begin, stop))
    return out
