"""Heartbeats and the lease: how a leader keeps its followers and knows it still may lead.

DLedger's heartbeat checks run in its order (UNKNOWN_MEMBER, UNEXPECTED_MEMBER,
EXPIRED_TERM, SUCCESS / follow, INCONSISTENT_LEADER, TERM_NOT_READY) and pushes go
through the same checks. The lease is `maxHeartBeatLeak` beats (`Replica.lease_ms`):
a follower that hears no leader for that long campaigns, and a leader that has not
heard a quorum for that long steps down. A leader counts a peer as heard from the time
the beat it answers was sent (DLedger counts the time the answer arrives), so answers
read late, after the leader was stopped for longer than a lease, renew nothing.
"""

from __future__ import annotations

import math

import attrs
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.election import is_quorum
from raftmq.dledger.core.messages import HeartBeatRequest, HeartBeatResponse


@attrs.define(slots=True)
class HeartbeatRound:
    seq: int
    deadline_ms: float
    answers: dict = attrs.Factory(dict)  # peer -> Code


class Heartbeats:
    """Part of `Replica`: the leader's beats and lease, the follower's view of its leader."""

    # ------------------------------------------------------------------ leader
    def _heartbeat_due_ms(self) -> float:
        return self.last_send_heartbeat_ms + self.config.heartbeat_interval_ms

    def _send_heartbeats(self, now_ms: float) -> None:
        self.last_send_heartbeat_ms = now_ms
        seq = self._next_seq()
        self._hb_round = HeartbeatRound(
            seq, now_ms + max(1, self.config.heartbeat_interval_ms - 10)
        )
        # An answer can extend the lease only from when its beat left: beats older than a
        # lease could not extend it past now, so they are forgotten.
        sent = self._beats_sent_ms
        for old_seq in [s for s, at in sent.items() if at < now_ms - self.lease_ms]:
            del sent[old_seq]
        sent[seq] = now_ms
        for peer in self.peers:
            self._send(
                HeartBeatRequest(
                    self.config.group, self.self_id, peer, self.self_id, self.term, seq=seq
                )
            )

    def _heartbeat_round_due_ms(self) -> float | None:
        """A round ends at its deadline, or at once when every peer has answered."""
        hb_round = self._hb_round
        if hb_round is None:
            return None
        if len(hb_round.answers) >= len(self.peers):
            return float("-inf")
        return hb_round.deadline_ms

    def _finish_heartbeat_round(self, now_ms: float) -> None:
        hb_round, self._hb_round = self._hb_round, None
        answers = list(hb_round.answers.values())
        success = 1 + answers.count(Code.SUCCESS)
        if is_quorum(success, self.peer_count):
            return
        if is_quorum(success + answers.count(Code.TERM_NOT_READY), self.peer_count):
            self.last_send_heartbeat_ms = float("-inf")  # resend at once
        elif Code.INCONSISTENT_LEADER in answers:
            self._change_to_candidate(self.term, now_ms)

    def _lease_expiry_ms(self) -> float | None:
        """DLedger's step-down: the leader holds its lease while a quorum (itself counted)
        has answered within `lease_ms`; it is lost the moment after that runs out."""
        needed = self.quorum - 1
        if needed == 0:
            return None
        heard = sorted(self.last_ack_ms.values(), reverse=True)
        return math.nextafter(heard[needed - 1] + self.lease_ms, math.inf)

    def holds_lease(self, now_ms: float) -> bool:
        """Whether this replica leads with its lease at `now_ms`: DLedger's step-down rule
        read before a tick may have applied it. A leader stopped for longer than the
        lease (SIGSTOP, a VM pause) and then resumed is still LEADER until its timers
        run, while a newer leader may have committed meanwhile: it must not act as
        one (a broker must not become master) until a quorum has answered again."""
        if self.role is not Role.LEADER:
            return False
        expiry = self._lease_expiry_ms()
        return expiry is None or now_ms < expiry

    def _lose_lease(self, now_ms: float) -> None:
        self._change_to_candidate(self.term, now_ms)

    def _on_heartbeat_response(self, resp: HeartBeatResponse, now_ms: float) -> None:
        if self.role is not Role.LEADER:
            return
        if resp.code == Code.EXPIRED_TERM and resp.term > self.term:
            self._change_to_candidate(resp.term, now_ms)
            return
        if resp.term == self.term and resp.code == Code.SUCCESS:
            # The answer proves the peer followed us when the beat left, not when the
            # answer is read: a leader stopped (SIGSTOP, a VM pause) reads answers queued
            # meanwhile, and they must not renew a lease a newer leader may have taken.
            sent_ms = self._beats_sent_ms.get(resp.seq)
            if sent_ms is not None:
                heard = self.last_ack_ms.get(resp.local_id, float("-inf"))
                self.last_ack_ms[resp.local_id] = max(heard, sent_ms)
            prog = self.progress.get(resp.local_id)
            if prog is not None and prog.resume():
                self._replicate(resp.local_id, prog, now_ms)
        if self._hb_round and resp.seq == self._hb_round.seq:
            self._hb_round.answers[resp.local_id] = Code(resp.code)
            if len(self._hb_round.answers) >= len(self.peers):
                self._finish_heartbeat_round(now_ms)

    # ------------------------------------------------------------------ follower
    def _leader_lost_ms(self) -> float:
        return self.last_leader_heartbeat_ms + self.lease_ms

    def _lose_leader(self, now_ms: float) -> None:
        self._change_to_candidate(self.term, now_ms)

    def _on_heartbeat(self, req: HeartBeatRequest, now_ms: float) -> None:
        code = self._accept_leader(req.leader_id, req.term, now_ms)
        self._send(HeartBeatResponse(*self._answer_header(req.local_id), code, seq=req.seq))

    def _accept_leader(self, leader: str, term: int, now_ms: float) -> Code:
        """DLedger's heartbeat checks, shared by pushes: may this leader talk to us now?"""
        if leader not in self.config.peers:
            return Code.UNKNOWN_MEMBER
        if leader == self.self_id:
            return Code.UNEXPECTED_MEMBER
        if term < self.term:
            return Code.EXPIRED_TERM
        if term > self.term:
            self._change_to_candidate(term, now_ms)
            self.need_increase_term_immediately = True
            return Code.TERM_NOT_READY
        if self.leader_id is None and self.role is not Role.LEADER:
            self._change_to_follower(leader, now_ms)
            return Code.SUCCESS
        if self.leader_id == leader and self.role is Role.FOLLOWER:
            self.last_leader_heartbeat_ms = now_ms
            return Code.SUCCESS
        return Code.INCONSISTENT_LEADER
