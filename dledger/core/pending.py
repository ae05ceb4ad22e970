"""Client appends the leader accepted and has not answered yet (DLedger's pending map).

Each waits for the commit index to pass its last entry. It is answered SUCCESS only
if that entry is still the one it appended (same term), TERM_CHANGED once a
truncation or a new leader's log provably replaced it, and WAIT_QUORUM_ACK_TIMEOUT
when `maxWaitAckTimeMs` passes first — then its fate is unknown to the client.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import attrs
from raftmq.dledger.codes import Code
from raftmq.dledger.core.output import Completion


@attrs.define(slots=True)
class _Pending:
    handle: int
    term: int
    first: int
    last: int
    deadline_ms: float
    positions: list


class PendingAppends:
    """Oldest first; deadlines grow with arrival, so the first one expires first. The
    oldest one's is the "pending appends" timer's deadline, written into `due_ms` (the
    replica's timer table) whenever the queue changes, as is how many wait (`waiting`,
    which the leader reads to admit each append)."""

    __slots__ = ("_due_ms", "_queue", "waiting")

    def __init__(self, due_ms: dict[str, float]) -> None:
        self._queue: deque[_Pending] = deque()
        self._due_ms = due_ms
        self._changed()

    def _changed(self) -> None:
        queue = self._queue
        self.waiting = len(queue)
        self._due_ms["pending appends"] = queue[0].deadline_ms if queue else math.inf

    def add(
        self, term: int, requests: list[tuple[int, int]], positions: list, deadline_ms: float
    ) -> None:
        """One append of `requests` ((handle, entry count) each, in log order) wrote entries
        at `positions` ((index, pos) each) in `term`: each request waits for its own."""
        queue = self._queue
        assert not queue or queue[-1].deadline_ms <= deadline_ms
        offset = 0
        for handle, count in requests:
            mine = positions[offset : offset + count]
            queue.append(_Pending(handle, term, mine[0][0], mine[-1][0], deadline_ms, mine))
            offset += count
        assert offset == len(positions), (offset, len(positions))
        self._changed()

    def resolve(self, committed_index: int, term_at: Callable[[int], int]) -> list[Completion]:
        """Answer every append whose last entry is now committed."""
        done = []
        queue = self._queue
        while queue and queue[0].last <= committed_index:
            p = queue.popleft()
            committed = term_at(p.last) == p.term
            code = Code.SUCCESS if committed else Code.TERM_CHANGED
            done.append(Completion(p.handle, code, p.positions if committed else None))
        self._changed()
        return done

    def drop_lost(self, term_at: Callable[[int], int]) -> list[Completion]:
        """After a truncation: appends whose first entry is gone can no longer commit."""
        kept: deque[_Pending] = deque()
        done = []
        for p in self._queue:
            if term_at(p.first) != p.term:
                done.append(Completion(p.handle, Code.TERM_CHANGED))
            else:
                kept.append(p)
        self._queue = kept
        self._changed()
        return done

    def expire(self, now_ms: float) -> list[Completion]:
        """Answer WAIT_QUORUM_ACK_TIMEOUT to every append whose deadline has passed."""
        done = []
        queue = self._queue
        while queue and queue[0].deadline_ms <= now_ms:
            done.append(Completion(queue.popleft().handle, Code.WAIT_QUORUM_ACK_TIMEOUT))
        self._changed()
        return done
