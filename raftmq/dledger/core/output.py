"""What one step of the replica asks its driver to do, in the order it must be done.

Like etcd's `Ready`: the hard state (term, vote) is made durable first, then the
messages are sent, so no vote or term is ever announced that a crash could take back.
"""

from __future__ import annotations

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
