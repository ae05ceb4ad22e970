"""A replica's timers as one table of deadlines, so `tick` and `next_deadline_ms` cannot
disagree and neither asks the parts anything.

Each `Timer` names a deadline and what to do when it is due. The deadline itself is
not computed on demand: the part that owns a timer's state writes it into the
table's `due_ms` (a plain dict, name -> milliseconds; `inf` when not armed) whenever
that state changes. `next_deadline_ms`, which the driver asks after every event,
then reads the table and calls into no part; `fire_due` runs, in table order, each
timer that is due. A timer must stop being due once it has fired (its action moves
its deadline or disarms it), or the driver would be asked to tick again at once,
forever.

A timer bound to a role runs only if the replica held that role when the tick began
and still holds it: a leader that steps down part-way through its timers does not go
on acting as one, nor start campaigning in the same tick. The deadlines of other
roles' timers stay in the table (a follower keeps its leader's last lease expiry)
and are simply not consulted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs
from raftmq.dledger.codes import Role


@attrs.frozen
class Timer:
    name: str
    role: Role | None  # None: in every role
    fire: Callable[[object, float], None]  # (replica, now_ms)


class TimerTable:
    """The deadlines of `timers`, written by their owners, read by the driver's clock."""

    __slots__ = ("_names", "_timers", "due_ms")

    def __init__(self, timers: Sequence[Timer]) -> None:
        self._timers = tuple(timers)
        self.due_ms: dict[str, float] = {t.name: math.inf for t in self._timers}
        assert len(self.due_ms) == len(self._timers), "two timers of one name"
        self._names = {
            role: tuple(t.name for t in self._timers if t.role is None or t.role is role)
            for role in Role
        }

    def next_deadline_ms(self, role: Role) -> float:
        """The earliest time one of the timers that apply in `role` is due."""
        due_ms = self.due_ms
        # every deadline written is one of the table's (a misspelt name would add one
        # that nothing reads)
        assert len(due_ms) == len(self._timers), sorted(
            set(due_ms) - {t.name for t in self._timers}
        )
        return min([due_ms[name] for name in self._names[role]], default=math.inf)

    def fire_due(self, replica, now_ms: float, timers: Sequence[Timer] | None = None) -> None:
        """Run every timer (of `timers`, by default the table's) that is due at `now_ms`,
        in table order."""
        role = replica.role
        due_ms = self.due_ms
        for timer in self._timers if timers is None else timers:
            if timer.role is not None and (timer.role is not role or replica.role is not role):
                continue
            if now_ms >= due_ms[timer.name]:
                timer.fire(replica, now_ms)
