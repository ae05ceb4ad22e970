"""What one step of the replica asks its driver to do, and the one place that does it.

Like etcd's `Ready`: the hard state (term, vote) is made durable first, then the
messages are sent, so no vote or term is ever announced that a crash could take back.
`Handoff` sequences that for every driver; a driver supplies only its I/O.
"""

from __future__ import annotations

from typing import Protocol

import attrs
from raftmq.dledger.codes import Code, Role


@attrs.define(slots=True)
class Completion:
    """The outcome of a client append or an admin request identified by `handle`."""

    handle: int
    code: Code
    positions: list[tuple[int, int]] | None = None  # (index, pos) per entry on SUCCESS


@attrs.define(slots=True)
class Output:
    hard_state: tuple[int, str | None] | None = None
    messages: list = attrs.Factory(list)
    needs_sync: bool = False
    completions: list[Completion] = attrs.Factory(list)
    role_changes: list[tuple[int, Role]] = attrs.Factory(list)
    committed_index: int | None = None  # set when the commit index moved

    def __bool__(self) -> bool:
        return bool(
            self.hard_state is not None
            or self.messages
            or self.needs_sync
            or self.completions
            or self.role_changes
            or self.committed_index is not None
        )


class Effects(Protocol):
    """The I/O a driver supplies to carry out a replica's effects (see `Handoff`)."""

    def save_hard_state(self, term: int, vote_for: str | None) -> None:
        """Start making (term, vote) durable; call `Handoff.hard_state_saved` once it is
        (at once, from inside this call, if the save completes synchronously)."""

    def send(self, msg) -> None: ...

    def sync(self) -> None:
        """Entries were appended: fsync them (the driver then reports `persisted`)."""

    def role_changed(self, term: int, role: Role) -> None: ...

    def committed(self, index: int) -> None: ...

    def completed(self, completion: Completion) -> None: ...


class Handoff:
    """The one interpreter of a replica's `Output`s; the trio server and the simulator
    both drive their replica through it and supply only the I/O (`Effects`).

    It carries out the rule that no term or vote leaves before it is durable: an output
    that changes the hard state is held, with every output after it, until the save
    completes; saves are not overlapped, and the outputs held during one are released
    behind one save of the latest hard state among them. Everything else is carried
    out at once, in the order `Output` lists it.
    """

    __slots__ = ("_held", "_releasing", "_saving", "effects", "replica")

    def __init__(self, replica, effects: Effects) -> None:
        self.replica = replica
        self.effects = effects
        self._held: list[Output] = []  # behind a save, in order, not yet part of one
        self._saving: list[Output] | None = None  # released when the save in progress completes
        self._releasing = False

    @property
    def saving(self) -> bool:
        """A save is in progress (outputs wait for `hard_state_saved`)."""
        return self._saving is not None

    def drain(self) -> None:
        """Take the replica's latest output and carry it out, or hold it behind a save."""
        out = self.replica.take_output()
        if out:
            self._held.append(out)
            self._pump()

    def hard_state_saved(self) -> None:
        """The save the driver was asked for completed: release what waited for it."""
        assert self._saving is not None, "no save in progress"
        released, self._saving = self._saving, None
        self._release(released)
        self._pump()

    def _pump(self) -> None:
        while self._saving is None and not self._releasing and self._held:
            batch, self._held = self._held, []
            latest = next((o.hard_state for o in reversed(batch) if o.hard_state is not None), None)
            if latest is None:
                self._release(batch)
            else:
                self._saving = batch
                self.effects.save_hard_state(*latest)

    def _release(self, outputs: list[Output]) -> None:
        # An effect may feed the replica again (a completion that appends); the output
        # that makes is held until these are done, so effects leave in order.
        self._releasing = True
        try:
            for out in outputs:
                self._carry_out(out)
        finally:
            self._releasing = False

    def _carry_out(self, out: Output) -> None:
        effects = self.effects
        for msg in out.messages:
            effects.send(msg)
        if out.needs_sync:
            effects.sync()
        for term, role in out.role_changes:
            effects.role_changed(term, role)
        if out.committed_index is not None:
            effects.committed(out.committed_index)
        for completion in out.completions:
            effects.completed(completion)
