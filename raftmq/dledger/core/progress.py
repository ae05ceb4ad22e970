"""The leader's view of one follower: where replication to it stands.

DLedger's `EntryDispatcher` states: COMPARE finds the last index both logs agree on
(fast backup with xTerm/xIndex), TRUNCATE cuts the follower's disagreeing suffix,
APPEND pipelines batches with at most `max_pending_pushes` in flight.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from raftmq.dledger.codes import PushType


@attrs.define(slots=True)
class Progress:
    state: PushType = PushType.COMPARE
    next_index: int = 0  # COMPARE checks next_index - 1; APPEND sends from next_index
    match_index: int = -1  # highest index this follower has durably, agreeing with us
    waiting_seq: int = -1  # the outstanding COMPARE/TRUNCATE, if any
    waiting_since_ms: float = 0.0
    inflight: OrderedDict = attrs.Factory(OrderedDict)  # seq -> (last index, sent at ms)
    sent_commit: int = -1  # the last commit index sent to this follower
    stalled: bool = False  # a push could not be delivered: wait for a heartbeat answer

    def restart(self, state: PushType, next_index: int) -> None:
        """Forget everything in flight (their answers will be ignored) and go to `state`."""
        self.state = state
        self.next_index = next_index
        self.stalled = False
        self.waiting_seq = -1
        self.inflight.clear()
