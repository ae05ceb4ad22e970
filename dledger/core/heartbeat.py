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
    """The leader's beats and lease, the follower's view of its leader.

    Owns the times they keep: when the leader was last heard (`last_leader_heartbeat_ms`),
    when each peer last answered a beat of this leader's term (`last_ack_ms`, the beat's
    send time), the beats in flight and the round being counted. The term, role and
    leader are the replica's: read there, changed through its role changes. Writes the
    deadlines of its four timers (the round, the next beat, the lease, the leader lost)
    into the replica's timer table whenever what they derive from changes.
    """

    def __init__(self, replica, now_ms: float) -> None:
        self._r = replica
        self._due_ms = replica.timers.due_ms
        self.last_ack_ms: dict[str, float] = {}
        self._beats_sent_ms: dict[int, float] = {}  # seq -> send time, for a lease's span
        self._round: HeartbeatRound | None = None
        self._beat_sent(float("-inf"))
        self.heard_leader(now_ms)

    # ------------------------------------------------------------------ the timers' deadlines
    def _beat_sent(self, sent_ms: float) -> None:
        """The next beat is due an interval after `sent_ms` (-inf: at once)."""
        self._due_ms["heartbeat"] = sent_ms + self._r.config.heartbeat_interval_ms

    def _round_changed(self) -> None:
        """A round ends at its deadline, or at once when every peer has answered."""
        hb_round = self._round
        if hb_round is None:
            due_ms = math.inf
        elif len(hb_round.answers) >= len(self._r.peers):
            due_ms = -math.inf
        else:
            due_ms = hb_round.deadline_ms
        self._due_ms["heartbeat round"] = due_ms

    def _acks_changed(self) -> None:
        """DLedger's step-down: the leader holds its lease while a quorum (itself counted)
        has answered within `lease_ms`; it is lost the moment after that runs out."""
        r = self._r
        needed = r.quorum - r.is_voter
        expiry_ms = math.inf
        if needed:
            heard_ms = sorted((self.last_ack_ms[p] for p in r.voter_peers), reverse=True)
            expiry_ms = math.nextafter(heard_ms[needed - 1] + r.lease_ms, math.inf)
        self._due_ms["lease"] = expiry_ms

    # ------------------------------------------------------------------ role changes
    def start_leading(self, now_ms: float) -> None:
        """A new leader counts every peer as heard now and beats at once."""
        self.last_ack_ms = dict.fromkeys(self._r.peers, now_ms)
        self._acks_changed()
        self._beat_sent(float("-inf"))

    def members_changed(self, now_ms: float) -> None:
        """A leader's configuration changed: a new member counts as heard now, as every
        peer does when a leader starts; a removed one is forgotten."""
        r = self._r
        self.last_ack_ms = {p: self.last_ack_ms.get(p, now_ms) for p in r.peers}
        self._acks_changed()
        self._round_changed()

    def stop_leading(self) -> None:
        self._round = None
        self._round_changed()

    def heard_leader(self, now_ms: float) -> None:
        """Our leader spoke: we wait a lease for it again."""
        self.last_leader_heartbeat_ms = now_ms
        self._due_ms["leader lost"] = now_ms + self._r.lease_ms

    def heard_within(self, peer: str, now_ms: float, span_ms: float) -> bool:
        """Whether `peer` answered a beat of this leader sent within `span_ms` of `now_ms`."""
        return now_ms <= self.last_ack_ms.get(peer, float("-inf")) + span_ms

    # ------------------------------------------------------------------ leader
    def send_heartbeats(self, now_ms: float) -> None:
        r = self._r
        self._beat_sent(now_ms)
        seq = next(r.seqs)
        self._round = HeartbeatRound(seq, now_ms + max(1, r.config.heartbeat_interval_ms - 10))
        self._round_changed()
        # An answer can extend the lease only from when its beat left: beats older than a
        # lease could not extend it past now, so they are forgotten.
        sent_at_ms = self._beats_sent_ms
        for old_seq in [s for s, at in sent_at_ms.items() if at < now_ms - r.lease_ms]:
            del sent_at_ms[old_seq]
        sent_at_ms[seq] = now_ms
        for peer in r.peers:
            r.send(HeartBeatRequest(r.config.group, r.self_id, peer, r.self_id, r.term, seq=seq))

    def finish_round(self, now_ms: float) -> None:
        r = self._r
        hb_round, self._round = self._round, None
        self._round_changed()
        answers = [code for peer, code in hb_round.answers.items() if peer in r.voters]
        success = r.is_voter + answers.count(Code.SUCCESS)
        if is_quorum(success, r.peer_count):
            return
        if is_quorum(success + answers.count(Code.TERM_NOT_READY), r.peer_count):
            self._beat_sent(float("-inf"))  # resend at once
        elif Code.INCONSISTENT_LEADER in answers:
            r.change_to_candidate(r.term, now_ms)

    def send_failed(self, msg: HeartBeatRequest) -> None:
        if self._round and msg.seq == self._round.seq:
            self._round.answers[msg.remote_id] = Code.NETWORK_ERROR
            self._round_changed()

    def holds_lease(self, now_ms: float) -> bool:
        """Whether this replica leads with its lease at `now_ms`: DLedger's step-down rule
        read before a tick may have applied it. A leader stopped for longer than the
        lease (SIGSTOP, a VM pause) and then resumed is still LEADER until its timers
        run, while a newer leader may have committed meanwhile: it must not act as
        one (a broker must not become master) until a quorum has answered again."""
        if self._r.role is not Role.LEADER:
            return False
        return now_ms < self._due_ms["lease"]

    def lose_lease(self, now_ms: float) -> None:
        self._r.change_to_candidate(self._r.term, now_ms)

    def on_heartbeat_response(self, resp: HeartBeatResponse, now_ms: float) -> None:
        r = self._r
        if r.role is not Role.LEADER:
            return
        if resp.code == Code.EXPIRED_TERM and resp.term > r.term:
            r.change_to_candidate(resp.term, now_ms)
            return
        if resp.term == r.term and resp.code == Code.SUCCESS:
            # The answer proves the peer followed us when the beat left, not when the
            # answer is read: a leader stopped (SIGSTOP, a VM pause) reads answers queued
            # meanwhile, and they must not renew a lease a newer leader may have taken.
            sent_ms = self._beats_sent_ms.get(resp.seq)
            if sent_ms is not None:
                heard_ms = self.last_ack_ms.get(resp.local_id, float("-inf"))
                self.last_ack_ms[resp.local_id] = max(heard_ms, sent_ms)
                self._acks_changed()
            r.replication.peer_answered(resp.local_id, resp.verified_index, now_ms)
            r.replication.peer_fsyncs(resp.local_id, resp.fsync_p99_us)
        if self._round and resp.seq == self._round.seq:
            self._round.answers[resp.local_id] = Code(resp.code)
            if len(self._round.answers) >= len(r.peers):
                self.finish_round(now_ms)

    # ------------------------------------------------------------------ follower
    def lose_leader(self, now_ms: float) -> None:
        self._r.change_to_candidate(self._r.term, now_ms)

    def on_heartbeat(self, req: HeartBeatRequest, now_ms: float) -> None:
        r = self._r
        code = self.accept_leader(req.leader_id, req.term, now_ms)
        verified_index = r.follower.leader_verified_index
        r.send(
            HeartBeatResponse(
                *r.answer_header(req.local_id),
                code,
                seq=req.seq,
                verified_index=verified_index,
                fsync_p99_us=r.fsync_latency.p99_us(now_ms),
            )
        )

    def accept_leader(self, leader: str, term: int, now_ms: float) -> Code:
        """DLedger's heartbeat checks, shared by pushes: may this leader talk to us now?"""
        r = self._r
        if leader not in r.known_members:  # the prior configuration's: a leader removing itself
            return Code.UNKNOWN_MEMBER
        if leader == r.self_id:
            return Code.UNEXPECTED_MEMBER
        if term < r.term:
            return Code.EXPIRED_TERM
        if term > r.term:
            r.change_to_candidate(term, now_ms, campaign_at_once=True)
            return Code.TERM_NOT_READY
        if r.leader_id is None and r.role is not Role.LEADER:
            r.change_to_follower(leader, now_ms)
            return Code.SUCCESS
        if r.leader_id == leader and r.role is Role.FOLLOWER:
            self.heard_leader(now_ms)
            return Code.SUCCESS
        return Code.INCONSISTENT_LEADER
