"""What the replica asks its driver to do: one `Ready` per drain, as etcd's `Ready`.

After feeding the replica an event the driver takes `Replica.ready()` in one call:
the outputs it may carry out now, the term and vote to make durable, the next
deadline. The hard state is made durable before any message that depends on it
leaves, so no vote or term is ever announced that a crash could take back:
`Handoff` holds every output behind the save it waits for, for every driver.
"""

from __future__ import annotations

import attrs
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.membership import MemberState


@attrs.define(slots=True)
class Completion:
    """The outcome of a client append or an admin request identified by `handle`."""

    handle: int
    code: Code
    positions: list[tuple[int, int]] | None = None  # (index, pos) per entry on SUCCESS


@attrs.define(slots=True)
class Output:
    hard_state: tuple[int, str | None] | None = None
    members: MemberState | None = None  # a new configuration, saved with hard_state
    messages: list = attrs.Factory(list)
    needs_sync: bool = False
    completions: list[Completion] = attrs.Factory(list)
    role_changes: list[tuple[int, Role]] = attrs.Factory(list)
    committed_index: int | None = None  # set when the commit index moved
    # (index, bytes): a snapshot from the leader to install (core.snapshot); the driver
    # reports the outcome with `Replica.snapshot_installed`
    snapshot: tuple[int, bytes] | None = None

    def __bool__(self) -> bool:
        return bool(
            self.hard_state is not None
            or self.messages
            or self.needs_sync
            or self.completions
            or self.role_changes
            or self.committed_index is not None
            or self.snapshot is not None
        )


@attrs.define(slots=True)
class Ready:
    """Everything a driver has to do after an event, taken in one call (`Replica.ready`).

    The driver carries it out in this order: each of `outputs` in turn (its messages
    sent, then the fsync it wants started, its role changes, its commit index, its
    completions and the snapshot to install), then the save of `save`, (term, vote),
    if any, with `members` when the configuration changed, reporting
    `Replica.hard_state_saved` once it is durable; the outputs that wait for that save
    come in a later Ready. `next_deadline_ms` is when the replica next wants a `tick`.
    A Ready taken while another is being carried out (an effect fed the replica) is
    carried out after it, so effects leave in the order the replica made them.
    """

    outputs: list[Output]
    save: tuple[int, str | None] | None
    next_deadline_ms: float
    members: MemberState | None = None  # to save with `save` when the configuration changed


class Handoff:
    """The rule that no term or vote leaves before it is durable, for every driver.

    An output that changes the hard state is held, with every output after it, until
    the save completes; saves are not overlapped, and the outputs held during one are
    released behind one save of the latest hard state among them. Everything else is
    released at once, in the order the replica made it. No I/O: the replica hands it
    each output in `Replica.ready` and reports the driver's saves.
    """

    __slots__ = ("_held", "_released", "_saving")

    def __init__(self) -> None:
        self._held: list[Output] = []  # behind a save, in order, not yet part of one
        self._saving: list[Output] | None = None  # released when the save in progress completes
        self._released: list[Output] = []  # the save completed: go out with the next Ready

    @property
    def saving(self) -> bool:
        """A save is in progress (outputs wait for `hard_state_saved`)."""
        return self._saving is not None

    def ready(self, out: Output, next_deadline_ms: float) -> Ready:
        """The Ready of the replica's latest output `out`: what a completed save released,
        then what may go now, or the save everything held waits for."""
        if out:
            self._held.append(out)
        outputs, self._released = self._released, []
        save = members = None
        if self._saving is None and self._held:
            batch, self._held = self._held, []
            save = next((o.hard_state for o in reversed(batch) if o.hard_state is not None), None)
            if save is None:
                outputs += batch
            else:
                self._saving = batch
                members = next((o.members for o in reversed(batch) if o.members), None)
        return Ready(outputs, save, next_deadline_ms, members)

    def hard_state_saved(self) -> None:
        """The save the last Ready asked for completed: what waited for it goes out with
        the next Ready."""
        assert self._saving is not None, "no save in progress"
        self._released += self._saving
        self._saving = None
