"""Leadership transfer, seen from the old leader and from the transferee, and the
preferred leader that asks for it (DLedger's LEADERSHIP_TRANSFER and TakeLeadershipTask).

The old leader stops taking appends and asks the transferee to take over once it has
caught up to the leader's end; the transferee then campaigns in the next term with
short vote gaps, and answers the old leader when the campaign is decided.
"""

from __future__ import annotations

import math

import attrs
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.fsync_health import UNKNOWN_US
from raftmq.dledger.core.messages import LeadershipTransferRequest, LeadershipTransferResponse
from raftmq.dledger.core.output import Completion


@attrs.define(slots=True)
class Transfer:
    """A leadership transfer in progress, seen from the old leader or from the transferee."""

    transferee: str
    deadline_ms: float
    handle: int | None = None  # the admin request on the leader side
    reply_to: str | None = None  # transferee side: the old leader waiting for our answer
    reply_seq: int = 0
    take_index: int = -1  # transferee side: catch up to this index first
    target_term: int = -1  # transferee side: the term we campaign in


class LeadershipTransfer:
    """Owns the transfer in progress (`current`), the term a transferee campaigns in
    (`term_to_take_leadership`) and when the leader next looks for a preferred peer.
    The role and term are the replica's: a transferee campaigns through its role
    changes, and the replica reports every role change (`role_changed`). Each event it
    handles ends by writing its two timers' deadlines (the transfer, the preferred
    leader check) into the replica's timer table."""

    def __init__(self, replica, now_ms: float) -> None:
        self._r = replica
        self._due_ms = replica.timers.due_ms
        self.current: Transfer | None = None
        self.term_to_take_leadership = -1
        self._leading_since_ms = now_ms
        self._due_ms["leader placement"] = now_ms
        self._rearm()

    def start_leading(self, now_ms: float) -> None:
        self._leading_since_ms = now_ms
        self._next_preferred_check(now_ms)

    def _next_preferred_check(self, now_ms: float) -> None:
        """The leader looks for a preferred peer again an interval after `now_ms`."""
        interval_ms = self._r.config.check_preferred_leader_interval_ms
        self._due_ms["leader placement"] = now_ms + interval_ms

    def _rearm(self) -> None:
        """A transfer times out at its deadline; a transferee that has caught up moves on
        at once. Called after every change to the transfer in progress and after every
        push a transferee receives (what grows its log)."""
        t = self.current
        if t is None:
            due_ms = math.inf
        elif t.handle is None and t.target_term < 0 and self._r.store.end_index >= t.take_index:
            due_ms = -math.inf
        else:
            due_ms = t.deadline_ms
        self._due_ms["transfer"] = due_ms

    def taking_leadership(self) -> bool:
        """Whether we campaign in this term to take over from a leader that asked us."""
        return self.term_to_take_leadership == self._r.term

    def transfer_leadership(self, handle: int, transferee: str, now_ms: float) -> Code:
        """Admin: hand leadership to `transferee` (DLedger's LEADERSHIP_TRANSFER at the leader)."""
        r = self._r
        if r.role is not Role.LEADER:
            return Code.NOT_LEADER
        if transferee not in r.voter_peers:
            return Code.UNKNOWN_MEMBER if transferee != r.self_id else Code.SUCCESS
        if self.current is not None:
            return Code.LEADER_TRANSFERRING
        behind = r.store.end_index - r.replication.match_index(transferee)
        if behind >= r.config.max_leadership_transfer_wait_index:
            return Code.FALL_BEHIND_TOO_MUCH
        timeout_ms = r.config.leadership_transfer_wait_timeout_ms
        self.current = Transfer(
            transferee, now_ms + 3 * timeout_ms + self._election_span_ms(), handle=handle
        )
        self._ask_to_take_over(transferee, r.store.end_index)
        self._rearm()
        return Code.SUCCESS

    def _ask_to_take_over(self, transferee: str, take_index: int) -> None:
        """Ask `transferee` to campaign at once, once it holds our log up to `take_index`."""
        r = self._r
        r.send(
            LeadershipTransferRequest(
                r.config.group,
                r.self_id,
                transferee,
                r.self_id,
                r.term,
                transfer_id=r.self_id,
                transferee_id=transferee,
                take_leadership_ledger_index=take_index,
                seq=next(r.seqs),
            )
        )

    def hand_over(self) -> None:
        """We lead no longer (our own removal committed): ask the voter furthest along
        to campaign at once rather than wait out its lease. Nothing waits for the
        answer: we are not a member."""
        r = self._r
        best = max(r.voter_peers, key=lambda p: r.replication.match_index(p), default=None)
        if best is not None:
            self._ask_to_take_over(best, r.committed_index)

    def _election_span_ms(self) -> float:
        return self._r.lease_ms + self._r.config.max_vote_interval_ms

    def on_transfer_request(self, req: LeadershipTransferRequest, now_ms: float) -> None:
        r = self._r
        if req.transferee_id != r.self_id:
            self._answer_transfer(req.local_id, req.seq, Code.UNEXPECTED_ARGUMENT)
            return
        if req.transfer_id != r.leader_id:
            self._answer_transfer(req.local_id, req.seq, Code.INCONSISTENT_LEADER)
            return
        if req.term != r.term:
            self._answer_transfer(req.local_id, req.seq, Code.INCONSISTENT_TERM)
            return
        if r.disk_full:  # as leader it could not append its first entry
            self._answer_transfer(req.local_id, req.seq, Code.DISK_FULL)
            return
        if self._fsyncs_over_bound(now_ms):  # as leader it would hand over again
            self._answer_transfer(req.local_id, req.seq, Code.TAKE_LEADERSHIP_FAILED)
            return
        self.current = Transfer(
            r.self_id,
            now_ms + r.config.leadership_transfer_wait_timeout_ms,
            reply_to=req.local_id,
            reply_seq=req.seq,
            take_index=req.take_leadership_ledger_index,
        )
        self.check_transfer(now_ms)

    def _answer_transfer(self, to: str, seq: int, code: Code) -> None:
        r = self._r
        r.send(LeadershipTransferResponse(*r.answer_header(to), code, seq=seq))

    def check_transfer(self, now_ms: float) -> None:
        self._check_transfer(now_ms)
        self._rearm()

    def _check_transfer(self, now_ms: float) -> None:
        r = self._r
        t = self.current
        if t is None:
            return
        if t.handle is not None:  # old leader waiting for the transferee's answer
            if now_ms >= t.deadline_ms:
                self.current = None
                r.complete(Completion(t.handle, Code.TIMEOUT))
            return
        if t.target_term < 0:  # transferee catching up
            if r.store.end_index >= t.take_index:
                t.target_term = r.term + 1
                t.deadline_ms = now_ms + self._election_span_ms() * 3
                self.term_to_take_leadership = t.target_term
                r.change_to_candidate(t.target_term, now_ms, campaign_at_once=True)
                # Into the target term now, not at the next tick: until then we are a
                # candidate in the old leader's term with no leader, and one of its
                # pushes handled first (read in the same batch, or while an fsync held
                # the loop) would make us its follower again and fail the transfer.
                # DLedger leaves that window open until its state maintainer runs.
                r.election.campaign(now_ms)
            elif now_ms >= t.deadline_ms:
                self.current = None
                self._answer_transfer(t.reply_to, t.reply_seq, Code.TAKE_LEADERSHIP_FAILED)
        elif now_ms >= t.deadline_ms:
            self.current = None
            self._answer_transfer(t.reply_to, t.reply_seq, Code.TAKE_LEADERSHIP_FAILED)

    def role_changed(self) -> None:
        """DLedger's TakeLeadershipTask.check: answer the old leader once the campaign ends."""
        r = self._r
        t = self.current
        if t is None or t.handle is not None or t.target_term < 0:
            return
        code = None
        if r.role is Role.LEADER and r.term == t.target_term:
            code = Code.SUCCESS
        elif r.term > t.target_term:
            code = Code.EXPIRED_TERM
        elif r.role is Role.FOLLOWER:
            code = Code.TAKE_LEADERSHIP_FAILED
        if code is not None:
            self.current = None
            self._answer_transfer(t.reply_to, t.reply_seq, code)
            self._rearm()

    def on_transfer_response(self, resp: LeadershipTransferResponse, now_ms: float) -> None:
        t = self.current
        if t is None or t.handle is None or resp.local_id != t.transferee:
            return
        self.current = None
        self._rearm()
        prog = self._r.replication.progress.get(t.transferee)
        if resp.code == Code.DISK_FULL and prog is not None:
            prog.disk_full = True  # not a candidate until it stores our entries again
        self._r.complete(Completion(t.handle, Code(resp.code)))

    def check_leader_placement(self, now_ms: float) -> None:
        """Every checkPreferredLeaderInterval: a leader whose disk is full (it refuses
        every append) hands over to any voter whose disk is not; a leader whose fsyncs
        are slow (`_fsyncs_slow`) to a voter whose own are known to be quick; and
        otherwise a leader that is not preferred hands over to a preferred peer; in
        each case one that is alive and close enough behind. (DLedger keeps a full
        leader leading.)"""
        r = self._r
        self._next_preferred_check(now_ms)
        if self.current is not None:
            return
        if r.disk_full:
            candidates = [p for p in r.voter_peers if not r.replication.disk_full(p)]
        elif self._fsyncs_slow(now_ms):
            bound_us = r.config.leader_slow_fsync_ms * 1000
            candidates = [
                p
                for p in r.voter_peers
                if not r.replication.disk_full(p)
                and UNKNOWN_US < r.replication.fsync_p99_us(p) <= bound_us
            ]
        elif r.config.preferred_leader_ids and r.self_id not in r.config.preferred_leader_ids:
            # not back to a preferred peer whose own fsyncs are slow: it would hand over again
            bound_us = r.config.leader_slow_fsync_ms * 1000
            candidates = [
                p
                for p in r.config.preferred_leader_ids
                if not bound_us or r.replication.fsync_p99_us(p) <= bound_us
            ]
        else:
            return
        best = None
        for peer in candidates:
            match = r.replication.match_index(peer)
            if match is None or not r.heartbeats.heard_within(peer, now_ms, r.lease_ms):
                continue
            lag = r.store.end_index - match
            if lag < r.config.max_leadership_transfer_wait_index and (
                best is None or lag < best[0]
            ):
                best = (lag, peer)
        if best is not None:
            self.transfer_leadership(-1, best[1], now_ms)

    def _fsyncs_slow(self, now_ms: float) -> bool:
        """We have led for a whole leaderSlowFsyncWindowMs (a hold-off: a new leader is
        not judged, nor handed over from, at once), and our own fsyncs are slow."""
        r = self._r
        if now_ms - self._leading_since_ms < r.config.leader_slow_fsync_window_ms:
            return False
        return self._fsyncs_over_bound(now_ms)

    def _fsyncs_over_bound(self, now_ms: float) -> bool:
        """leaderSlowFsyncMs is set and our own fsyncs' p99 over the window is over it."""
        bound_ms = self._r.config.leader_slow_fsync_ms
        return bool(bound_ms) and self._r.fsync_latency.p99_us(now_ms) > bound_ms * 1000
