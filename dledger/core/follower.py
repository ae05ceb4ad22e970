"""The follower's side of replication: DLedger's `EntryHandler`, with Raft's safety.

A follower acknowledges only what it has fsynced (unless configured for page-cache
acks): an answer that vouches for entries waits until `persisted` covers them. Its
TRUNCATE removes only entries that disagree with the leader's log, never a matching
(possibly committed) one; APPEND pushes that arrive ahead of a gap wait in a small
reorder buffer instead of being refused.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque

from raftmq.dledger.codes import Code, PushType, Role
from raftmq.dledger.core.membership import MEMBERS_PREFIX, MemberState
from raftmq.dledger.core.messages import PushRequest, PushResponse
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.base import InconsistentAppend

from raftmq.disk.filesystem import DiskFull

log = logging.getLogger(__name__)

REORDER_BUFFER = 64  # out-of-order APPEND pushes a follower keeps while waiting for a gap


class FollowerReplication:
    """The follower's side of replication.

    Owns how far our log is known to agree with the leader's (`leader_verified_index`),
    the answers waiting for an fsync and the reorder buffer. The log, the commit and
    persisted indexes and the role are the replica's: it is told of truncations
    (`Replica.log_truncated`) and moves the commit index (`Replica.set_committed`).
    """

    def __init__(self, replica) -> None:
        self._r = replica
        self.leader_verified_index = -1  # our log agrees with the leader's up to here
        self._deferred_acks: deque[tuple[int, PushResponse]] = deque()
        self._reorder: dict[int, PushRequest] = {}

    def new_term(self) -> None:
        """What the last leader vouched for says nothing about the next one's log."""
        self.leader_verified_index = -1

    def on_push(self, req: PushRequest, now_ms: float) -> None:
        r = self._r
        code = r.heartbeats.accept_leader(req.leader_id, req.term, now_ms)
        if code is not Code.SUCCESS:
            self._answer_push(req, code, req.pre_log_index)
            return
        if req.type == PushType.APPEND:
            self._on_append(req)
        elif req.type == PushType.COMPARE:
            self._on_compare(req)
        elif req.type == PushType.TRUNCATE:
            self._on_truncate(req)
        else:  # COMMIT: nothing to acknowledge
            self._learn_commit(req.commit_index)
        r.transfers.check_transfer(now_ms)  # a transferee campaigns once it has caught up

    def _answer_push(
        self, req: PushRequest, code: Code, index: int, defer_to: int = -1, **extra
    ) -> None:
        r = self._r
        store = r.store
        resp = PushResponse(
            *r.answer_header(req.local_id),
            code,
            req.type,
            index,
            store.begin_index,
            store.end_index,
            seq=req.seq,
            **extra,
        )
        if defer_to > r.persisted_index:
            self._deferred_acks.append((defer_to, resp))
        else:
            r.send(resp)

    def flush_deferred_acks(self) -> None:
        """Send the answers that waited for entries the replica now counts as durable."""
        r = self._r
        acks = self._deferred_acks
        while acks and acks[0][0] <= r.persisted_index:
            r.send(acks.popleft()[1])

    def _learn_commit(self, leader_commit: int) -> None:
        known = min(leader_commit, self.leader_verified_index)
        if known > self._r.committed_index:
            self._r.set_committed(known)

    def _on_compare(self, req: PushRequest) -> None:
        store = self._r.store
        pre = req.pre_log_index
        self._reorder.clear()
        if pre > store.end_index or pre < store.begin_index - 1:
            self._answer_push(req, Code.INCONSISTENT_STATE, pre)
        elif store.term_at(pre) == req.pre_log_term:
            self.leader_verified_index = max(self.leader_verified_index, pre)
            # a follower that agrees at the leader's end has nothing more to hear, and
            # a restarted one learns the commit index here or not until the next write
            self._learn_commit(req.commit_index)
            self._answer_push(req, Code.SUCCESS, pre, defer_to=pre)
        else:
            x_term = store.term_at(pre)
            self._answer_push(
                req,
                Code.INCONSISTENT_STATE,
                pre,
                x_term=x_term,
                x_index=store.first_index_of_term(pre),
            )

    def _on_truncate(self, req: PushRequest) -> None:
        r = self._r
        store = r.store
        pre = req.pre_log_index
        self._reorder.clear()
        if req.leader_end_index < pre:  # a log cannot end before the entry it is compared at
            self._answer_push(req, Code.UNEXPECTED_ARGUMENT, pre)
            return
        agrees = (
            store.begin_index - 1 <= pre <= store.end_index
            and store.term_at(pre) == req.pre_log_term
        )
        if not agrees:
            if req.reset_pos < 0:
                self._answer_push(req, Code.INCONSISTENT_STATE, pre)
                return
            # the leader's log begins past ours: whatever we hold ends before it
            if pre < r.committed_index:
                self._refuse_cut(req, pre + 1)
                return
            try:
                members = self._members_at_reset(req)
            except ValueError:  # a peer's bytes: refused, never asserted
                self._answer_push(req, Code.UNEXPECTED_ARGUMENT, pre)
                return
            if r.disk_full:  # a reset writes the new beginning's file
                self._answer_push(req, Code.DISK_FULL, pre)
                return
            store.reset(pre + 1, req.reset_pos, req.pre_log_term)
            self._after_truncation(pre)
            if members is not None:
                r.members_reset(members)
            r.after_local_append()  # the answer waits for the new beginning to be durable
        cut = self._first_disagreement(pre, req.term_runs, req.leader_end_index, req.term)
        if cut <= r.committed_index:
            self._refuse_cut(req, cut)
            return
        if cut <= store.end_index:
            assert cut > r.committed_index, (cut, r.committed_index)
            store.truncate(cut)
            self._after_truncation(cut - 1)
        self.leader_verified_index = cut - 1
        self._learn_commit(req.commit_index)
        self._answer_push(req, Code.SUCCESS, cut - 1, defer_to=cut - 1)

    @staticmethod
    def _members_at_reset(req: PushRequest) -> MemberState | None:
        """The configuration a reset puts in force: the leader's at the entry before its
        beginning, as retention may have deleted the entries that set it (a learner
        added then, a log wiped); None to keep ours (its entries are all still to come).
        ValueError for one no leader sends."""
        if not req.members:
            return None
        members = MemberState.from_text(req.members)
        if members.current.index > req.pre_log_index:
            raise ValueError(f"a configuration set at {members.current.index} is past the reset")
        return members

    def _refuse_cut(self, req: PushRequest, cut: int) -> None:
        """A TRUNCATE that would cut committed entries: no legitimate leader sends one.

        Raft's leader holds every committed entry, so only a forged or corrupt push
        gets here; the cut is a peer's word, not a local invariant, so it is refused
        (INCONSISTENT_LEADER) rather than asserted, which would let those bytes end the
        process.
        """
        log.warning(
            "%s: refusing a TRUNCATE from %s (term %d) that would cut from index %d, "
            "at or below the commit index %d",
            self._r.self_id,
            req.leader_id,
            req.term,
            cut,
            self._r.committed_index,
        )
        self._answer_push(req, Code.INCONSISTENT_LEADER, req.pre_log_index)

    def _after_truncation(self, new_end: int) -> None:
        """Our log now ends at `new_end`: nothing committed may have been cut, and only
        a follower cuts (a leader never removes an entry of its log)."""
        r = self._r
        assert r.committed_index <= new_end, (r.committed_index, new_end)
        assert r.role is Role.FOLLOWER, r.role
        self._deferred_acks = deque(a for a in self._deferred_acks if a[0] <= new_end)
        r.log_truncated(new_end)

    def _first_disagreement(
        self, pre: int, term_runs: list, leader_end: int, push_term: int
    ) -> int:
        """The first index after `pre` where our log leaves the leader's (whose runs are given).

        Past `leader_end` the push says nothing, and entries there of the leader's own
        term (`push_term`) came from that leader after the push left (a push can arrive late,
        behind later APPENDs): only one leader writes a term and it never drops an
        entry, so they are in its log — some may be acknowledged already — and stay.
        Entries there of an older term are another leader's and go."""
        store = self._r.store
        if store.end_index > leader_end and store.term_at(leader_end + 1) == push_term:
            leader_end = store.end_index
        end = min(store.end_index, leader_end)
        for n, (first, term) in enumerate(term_runs):
            last = term_runs[n + 1][0] - 1 if n + 1 < len(term_runs) else leader_end
            low, high = max(first, pre + 1), min(last, end)
            if low > high:
                continue
            if store.term_at(low) != term:
                return low
            if store.term_at(high) != term:
                # terms never decrease along a log: find the first index past this term
                return bisect.bisect_right(range(low, high + 1), term, key=store.term_at) + low
        return end + 1

    def _on_append(self, req: PushRequest) -> None:
        store = self._r.store
        first = req.pre_log_index + 1
        if first > store.end_index + 1:
            if len(self._reorder) < REORDER_BUFFER:
                self._reorder[first] = req
            else:
                self._answer_push(req, Code.INCONSISTENT_STATE, req.pre_log_index)
            return
        self._apply_append(req)
        while (nxt := self._reorder.pop(store.end_index + 1, None)) is not None:
            self._apply_append(nxt)

    def _apply_append(self, req: PushRequest) -> None:
        r = self._r
        store = r.store
        pre = req.pre_log_index
        last = pre + req.count
        blob = req.entries
        # A push from before our log's beginning (a stale duplicate from before a reset)
        # cannot be checked against entries we no longer hold: let the leader COMPARE.
        if pre < store.begin_index - 1 or (
            pre <= store.end_index and store.term_at(pre) != req.pre_log_term
        ):
            self._answer_push(req, Code.INCONSISTENT_STATE, pre)
            return
        skip = store.end_index - pre  # entries we already hold (a resend or a duplicate)
        if skip > 0:
            offset = self._skip_held(blob, min(skip, req.count))
            if offset is None:
                self._answer_push(req, Code.INCONSISTENT_STATE, pre)
                return
            blob = blob[offset:]
        if blob:
            if r.disk_full:  # DLedger's appendAsFollower check: write nothing, ack nothing
                self._answer_push(req, Code.DISK_FULL, pre)
                return
            # Log matching: what we append follows an entry the leader holds too (the
            # one at `pre`, checked above, or later ones equal by chainCrc).
            assert store.begin_index - 1 <= pre <= store.end_index, (pre, store.end_index)
            assert store.term_at(pre) == req.pre_log_term, (pre, req.pre_log_term)
            try:
                store.append_encoded(blob)
            except (InconsistentAppend, codec.CorruptEntry):
                self._answer_push(req, Code.INCONSISTENT_STATE, pre)
                return
            except DiskFull:  # no room for a new segment; nothing was written
                r.out_of_room()
                self._answer_push(req, Code.DISK_FULL, pre)
                return
            r.after_local_append()
            if MEMBERS_PREFIX in blob:  # a byte search first: most pushes carry none
                r.members_appended(blob)
        # `count` is the peer's word: vouch only for entries we hold (all of them came
        # from, or matched, this push)
        last = min(last, store.end_index)
        self.leader_verified_index = max(self.leader_verified_index, last)
        self._learn_commit(req.commit_index)
        self._answer_push(req, Code.SUCCESS, last, defer_to=last)

    def _skip_held(self, blob: bytes, held: int) -> int | None:
        """Byte offset past the first `held` (>= 1) entries of `blob`, if they equal ours.

        Equal chainCrc at the last of them means equal logs up to it.
        """
        for n, (off, _t, size, index, _term, _pos, chain) in enumerate(codec.iter_entries(blob)):
            if n == held - 1:
                return off + size if self._r.store.get(index).chain_crc == chain else None
        return None
