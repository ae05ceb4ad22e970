"""How a broker becomes master: the one sequence the broker runs and the simulator drives.

A DLedger replica that leads is not yet a master. Its queues are final only once it
has committed an entry of its own term (the NOOP it appends on election) and
dispatched everything up to its log's end, and it may act for the group only while it
holds its leader lease: a leader resumed after a pause longer than the lease is still
LEADER until its timers run, while a newer leader may have committed meanwhile. Then
it rebuilds the queue offset table from its ConsumeQueues (the next message of each
queue continues them), restarts what a master runs from replicated progress (delayed
delivery, timer messages), and takes brokerId 0.

`BrokerController` calls `try_lead` between its waits for dispatch, and the broker
simulation (jepsen.sim_broker) after every event of a replica, so the sequence the
simulation checks through leader changes is the one the broker runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from raftmq.broker.role import BrokerRole
from raftmq.dledger.codes import Role


class Promotion:
    """A broker's way to master over its message store (see the module docstring);
    `resets` restart what a master runs from the store's replicated progress."""

    def __init__(self, store, role: BrokerRole, resets: Iterable[Callable[[], None]] = ()) -> None:
        self._store = store
        self._role = role
        self._resets = tuple(resets)

    def try_lead(self, replica, term: int, now_ms: float) -> bool | None:
        """Become master for `replica`'s leadership of `term` if the broker may now:
        True once master, False while it must wait (dispatch, or the lease), None when
        the replica no longer leads in `term` (the next role change decides)."""
        if replica.role is not Role.LEADER or replica.term != term:
            return None
        if not (self._store.caught_up() and replica.holds_lease(now_ms)):
            return False
        self.take_over(term)
        return True

    def take_over(self, term: int) -> None:
        """The last step, once the queues are final: a classic master's too."""
        assert self._store.caught_up(), "a master's queue offsets continue final queues"
        self._store.take_over_offsets()
        for reset in self._resets:
            reset()
        self._role.become_master(term)
