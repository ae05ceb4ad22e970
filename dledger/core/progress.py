"""The leader's view of one follower: where replication to it stands (etcd's `tracker/`).

DLedger's `EntryDispatcher` states: COMPARE finds the last index both logs agree on
(fast backup with xTerm/xIndex), TRUNCATE cuts the follower's disagreeing suffix,
APPEND pipelines batches with at most `max_pending_pushes` in flight. COMPARE and
TRUNCATE are probes: one request at a time, answered or timed out before the next.
Every move between the states is a method here, so the leader's dispatcher reads as
the transitions it makes and the bookkeeping that goes with each cannot be forgotten.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import attrs
from raftmq.dledger.codes import PushType
from raftmq.dledger.core.snapshot import SnapshotSend

_PROBES = (PushType.COMPARE, PushType.TRUNCATE)


class Inflights:
    """The APPEND pushes sent to one follower and not yet answered, oldest first.

    At most `capacity` are outstanding (DLedger's maxPendingSize). Answers may come
    back in any order; a push whose answer is lost is noticed through the oldest
    send time, which the leader's push timeout watches. What the dispatcher asks on
    every push, whether the window is `full` and when the oldest push left
    (`oldest_sent_ms`, inf when none is out), are fields kept by the changes here.
    """

    __slots__ = ("_sent_ms", "capacity", "full", "oldest_sent_ms")

    def __init__(self, capacity: int) -> None:
        assert capacity > 0, capacity
        self.capacity = capacity
        self._sent_ms: OrderedDict[int, float] = OrderedDict()  # seq -> sent at
        self._changed()

    def __len__(self) -> int:
        return len(self._sent_ms)

    def _changed(self) -> None:
        sent_ms = self._sent_ms
        self.full = len(sent_ms) >= self.capacity
        self.oldest_sent_ms = next(iter(sent_ms.values())) if sent_ms else math.inf

    def add(self, seq: int, sent_ms: float) -> None:
        assert not self.full and seq not in self._sent_ms, seq
        self._sent_ms[seq] = sent_ms
        self._changed()

    def free(self, seq: int) -> bool:
        """The answer to push `seq` arrived; False if it is not ours (stale or forgotten)."""
        if self._sent_ms.pop(seq, None) is None:
            return False
        self._changed()
        return True

    def clear(self) -> None:
        self._sent_ms.clear()
        self._changed()


@attrs.define(slots=True)
class Progress:
    next_index: int  # COMPARE checks next_index - 1; APPEND sends from next_index
    inflight: Inflights
    state: PushType = PushType.COMPARE
    match_index: int = -1  # highest index this follower has durably, agreeing with us
    probe_seq: int = -1  # the outstanding COMPARE/TRUNCATE, if any
    probe_sent_ms: float = 0.0
    sent_commit: int = -1  # the last commit index sent to this follower
    stalled: bool = False  # a push could not be delivered: wait for a heartbeat answer
    disk_full: bool = False  # its last answer was DISK_FULL, and nothing matched since
    fsync_p99_us: int = -1  # its own fsyncs, as its last heartbeat answer said (-1 unknown)
    snapshot: SnapshotSend | None = None  # a snapshot on its way (core.snapshot)
    snapshot_index: int = -1  # the follower installed our snapshot as of this entry

    @classmethod
    def for_new_leader(cls, end_index: int, window: int) -> Progress:
        """A new leader knows nothing of the follower: COMPARE at its own last entry."""
        return cls(next_index=end_index + 1, inflight=Inflights(window))

    # ------------------------------------------------------------------ the states
    def become_probe(self, state: PushType, next_index: int) -> None:
        """COMPARE or TRUNCATE after `next_index - 1`, forgetting everything in flight
        (answers to it are then ignored)."""
        assert state in _PROBES, state
        self._restart(state, next_index)

    def become_replicate(self, next_index: int) -> None:
        """APPEND from `next_index`: the follower's log is a prefix of ours up to the entry
        before it (a snapshot under way is not needed: its bytes go)."""
        self._restart(PushType.APPEND, next_index)
        self.snapshot = None

    def stall(self) -> None:
        """A push could not be delivered: probe again from what the follower is known to
        hold, once it answers a heartbeat (`resume`)."""
        resume = self.next_index if self.state is PushType.COMPARE else self.match_index + 1
        self._restart(PushType.COMPARE, resume)
        self.stalled = True

    def resume(self) -> bool:
        """The follower answered a heartbeat: True if replication to it was stalled."""
        stalled, self.stalled = self.stalled, False
        return stalled

    def forgotten(self, verified_index: int) -> bool:
        """The follower says its log is known to agree with ours only up to
        `verified_index`, below what it acknowledged: it restarted since (what it knows
        of a leader is not saved), and trusts our commit index only once a COMPARE or an
        APPEND verifies its log again. True if a COMPARE is now due: while pushes are
        out, their answers verify it or send us to COMPARE anyway. The COMPARE is at
        `next_index - 1`, our end when idle, where a follower that kept its log agrees."""
        if self.state is not PushType.APPEND or self.inflight or verified_index >= self.match_index:
            return False
        self.become_probe(PushType.COMPARE, self.next_index)
        return True

    def _restart(self, state: PushType, next_index: int) -> None:
        self.state = state
        self.next_index = next_index
        self.stalled = False
        self.probe_seq = -1
        self.inflight.clear()

    # ------------------------------------------------------------------ probes
    @property
    def probing(self) -> bool:
        """A COMPARE or TRUNCATE is out and neither answered nor timed out."""
        return self.probe_seq >= 0

    def probe_sent(self, seq: int, now_ms: float) -> None:
        assert self.state in _PROBES and not self.probing, (self.state, self.probe_seq)
        self.probe_seq = seq
        self.probe_sent_ms = now_ms

    def probe_answered(self, seq: int) -> bool:
        """The answer to probe `seq` arrived: True if it is the one outstanding."""
        if seq != self.probe_seq or seq < 0:
            return False
        self.probe_seq = -1
        return True

    def probe_timed_out(self) -> None:
        """No answer within the push timeout: the probe may be sent again."""
        self.probe_seq = -1

    # ------------------------------------------------------------------ snapshots
    def needs_snapshot(self, begin_index: int) -> bool:
        """Whether the follower must install a snapshot before its log can restart at
        our first entry `begin_index`: none it installed reaches the entry before."""
        return self.snapshot_index < begin_index - 1

    def snapshot_installed(self) -> None:
        """The follower installed the snapshot under way: its log may restart after it."""
        assert self.snapshot is not None
        self.snapshot_index, self.snapshot = self.snapshot.index, None

    def log_reset(self) -> None:
        """The follower's log restarted at our beginning: a later reset (it was wiped
        again) needs a snapshot again."""
        self.snapshot_index = -1

    # ------------------------------------------------------------------ appends
    def appended(self, seq: int, count: int, now_ms: float) -> None:
        """An APPEND of `count` entries from `next_index` went out as push `seq`."""
        assert self.state is PushType.APPEND and count > 0, (self.state, count)
        self.inflight.add(seq, now_ms)
        self.next_index += count

    def resend_unacknowledged(self) -> None:
        """The oldest APPEND timed out: send again everything after what the follower
        acknowledged."""
        self.become_replicate(self.match_index + 1)

    def matched(self, index: int) -> bool:
        """The follower holds our log up to `index` durably; True if that is news."""
        if index <= self.match_index:
            return False
        self.match_index = index
        self.disk_full = False
        return True

    def deadline_ms(self, end_index: int, push_timeout_ms: float) -> float | None:
        """When the leader next has something to send to this follower (-inf: now), or
        None while it waits for an answer with no timeout running."""
        if self.stalled:
            return None
        if self.state is PushType.APPEND:
            if self.next_index <= end_index and not self.inflight.full:
                return float("-inf")
            oldest_sent_ms = self.inflight.oldest_sent_ms
            return None if oldest_sent_ms == math.inf else oldest_sent_ms + push_timeout_ms
        if self.probing:
            return self.probe_sent_ms + push_timeout_ms
        return float("-inf")
