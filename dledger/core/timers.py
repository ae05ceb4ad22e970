"""A replica's timers as one table, so `tick` and `next_deadline_ms` cannot disagree.

Each `Timer` names a deadline (when it is due; None when not armed) and what to do
when it is. `next_deadline_ms` is the earliest armed deadline of the timers that
apply, and `fire_due` runs, in table order, each one that is due. A timer must stop
being due once it has fired (its action moves its deadline or disarms it), or the
driver would be asked to tick again at once, forever.

A timer bound to a role runs only if the replica held that role when the tick began
and still holds it: a leader that steps down part-way through its timers does not go
on acting as one, nor start campaigning in the same tick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from raftmq.dledger.codes import Role


@attrs.frozen
class Timer:
    name: str
    role: Role | None  # None: in every role
    deadline_ms: Callable[[object], float | None]  # (replica) -> when due; None: not armed
    fire: Callable[[object, float], None]  # (replica, now_ms)


def next_deadline_ms(replica, timers: Sequence[Timer]) -> float:
    """The earliest time one of `timers` that applies to the replica's role is due."""
    role = replica.role
    deadlines = [
        d
        for timer in timers
        if timer.role is None or timer.role is role
        if (d := timer.deadline_ms(replica)) is not None
    ]
    return min(deadlines, default=float("inf"))


def fire_due(replica, timers: Sequence[Timer], now_ms: float) -> None:
    """Run every timer that is due at `now_ms`, in table order."""
    role = replica.role
    for timer in timers:
        if timer.role is not None and (timer.role is not role or replica.role is not role):
            continue
        deadline_ms = timer.deadline_ms(replica)
        if deadline_ms is not None and now_ms >= deadline_ms:
            timer.fire(replica, now_ms)
