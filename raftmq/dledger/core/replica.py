"""One DLedger replica as a deterministic state machine (no I/O, no clock, no threads).

The driver feeds it events — `tick(now)`, `receive(message, now)`, `append(...)`,
`persisted(index, generation, now)`, `transfer_leadership(...)` — and after each
one takes an `Output` of effects to carry out. Time is milliseconds supplied by the
caller and randomness comes from the `random.Random` it is given, so the simulator
replays any schedule exactly.

Election follows DLedger (`DLedgerLeaderElector`): replicas start as candidates, a
round first re-votes in the current term and only a WAIT_TO_VOTE_NEXT result moves
to the next term, voters check the log before the term, a voter with a live leader
answers REJECT_ALREADY_HAS_LEADER. Two departures, both for safety: term and vote
are durable before any message that depends on them leaves (see `Output`), and a
follower that learns its leader from a heartbeat records it as its vote, closing
DLedger's two-leaders-in-one-term window.

Replication follows DLedger HEAD (`DLedgerEntryPusher`) with Raft's commit rule: an
entry is committed once a quorum holds it durably and it belongs to the leader's
own term; a new leader appends a NOOP so inherited entries commit promptly. A
follower acknowledges only what it has fsynced (unless configured for page-cache
acks), and its TRUNCATE removes only entries that disagree with the leader's log.
"""

from __future__ import annotations

import bisect
import random
from collections import deque

import attrs

from raftmq.dledger.codes import Code, EntryType, ParseResult, PushType, Role, VoteResult
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.core.election import VoteRound, is_quorum
from raftmq.dledger.core.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    PushRequest,
    PushResponse,
    VoteRequest,
    VoteResponse,
)
from raftmq.dledger.core.output import Completion, Output
from raftmq.dledger.core.progress import Progress
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.base import InconsistentAppend, LogStore

_REORDER_BUFFER = 64  # out-of-order APPEND pushes a follower keeps while waiting for a gap
# A new commit index waits this long for an APPEND push to carry it before a COMMIT
# push goes out alone: under load it rides along for free, idle it arrives promptly.
_COMMIT_LINGER_MS = 2.0


@attrs.define(slots=True)
class _Pending:
    handle: int
    term: int
    first: int
    last: int
    deadline_ms: float
    positions: list


@attrs.define(slots=True)
class _HeartbeatRound:
    seq: int
    deadline_ms: float
    answers: dict = attrs.Factory(dict)  # peer -> Code


@attrs.define(slots=True)
class _Transfer:
    """A leadership transfer in progress, seen from the old leader or from the transferee."""

    transferee: str
    deadline_ms: float
    handle: int | None = None  # the admin request on the leader side
    reply_to: str | None = None  # transferee side: the old leader waiting for our answer
    reply_seq: int = 0
    take_index: int = -1  # transferee side: catch up to this index first
    target_term: int = -1  # transferee side: the term we campaign in


class Replica:
    def __init__(
        self,
        config: DLedgerConfig,
        store: LogStore,
        rng: random.Random,
        term: int = 0,
        vote_for: str | None = None,
        now_ms: float = 0.0,
    ) -> None:
        self.config = config
        self.store = store
        self.rng = rng
        self.self_id = config.self_id
        self.peers = [p for p in config.peer_ids if p != self.self_id]
        self.peer_count = len(config.peer_ids)
        self.term = term
        self.vote_for = vote_for
        self.role = Role.CANDIDATE
        self.leader_id: str | None = None
        self.committed_index = -1
        self.persisted_index = store.end_index  # what survived a restart is on disk
        self._out = Output()
        self._seq = 0
        # election
        self.known_max_term = term
        self.need_increase_term_immediately = False
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        # A restart that finds our own vote for this term: we may have led it, and a crash
        # may have cost us entries of it that followers kept, so we must never lead it
        # again (a win in it counts as WAIT_TO_VOTE_NEXT). We do not skip ahead to the next
        # term at once either: a live leader would be deposed by our higher term.
        self._never_lead_term = term if vote_for == config.self_id else -1
        self.next_vote_ms = now_ms + self._rand(0, config.max_vote_interval_ms)
        self._round: VoteRound | None = None
        self.last_leader_heartbeat_ms = now_ms
        # leader
        self.progress: dict[str, Progress] = {}
        self.last_ack_ms: dict[str, float] = {}  # any current-term answer from a peer
        self._hb_round: _HeartbeatRound | None = None
        self.last_send_heartbeat_ms = float("-inf")
        self._pending: deque[_Pending] = deque()
        self._next_preferred_check_ms = now_ms
        self._commit_push_at: float | None = None
        self._now = now_ms
        # follower
        self.leader_verified_index = -1  # our log agrees with the leader's up to here
        self._deferred_acks: deque[tuple[int, PushResponse]] = deque()
        self._reorder: dict[int, PushRequest] = {}
        # transfer
        self.transfer: _Transfer | None = None
        self.term_to_take_leadership = -1

    # ------------------------------------------------------------------ public surface
    def take_output(self) -> Output:
        out, self._out = self._out, Output()
        return out

    @property
    def quorum(self) -> int:
        return self.peer_count // 2 + 1

    def next_deadline_ms(self) -> float:
        """The earliest time `tick` has something to do."""
        hb = self.config.heartbeat_interval_ms
        deadlines = []
        if self.role is Role.LEADER:
            deadlines.append(self.last_send_heartbeat_ms + hb)
            if self._hb_round:
                deadlines.append(self._hb_round.deadline_ms)
            deadlines.append(self._next_preferred_check_ms)
            if self._commit_push_at is not None:
                deadlines.append(self._commit_push_at)
            for prog in self.progress.values():
                if prog.inflight:
                    deadlines.append(
                        next(iter(prog.inflight.values()))[1] + self.config.max_push_timeout_ms
                    )
                if prog.waiting_seq >= 0:
                    deadlines.append(prog.waiting_since_ms + self.config.max_push_timeout_ms)
        elif self.role is Role.FOLLOWER:
            deadlines.append(self.last_leader_heartbeat_ms + hb * self.config.max_heartbeat_leak)
        elif self.need_increase_term_immediately:
            deadlines.append(float("-inf"))
        else:
            deadlines.append(self._round.deadline_ms if self._round else self.next_vote_ms)
        if self._pending:
            deadlines.append(self._pending[0].deadline_ms)
        if self.transfer:
            deadlines.append(self.transfer.deadline_ms)
        return min(deadlines)

    def tick(self, now: float) -> None:
        self._now = now
        if self.role is Role.LEADER:
            self._maintain_leader(now)
        elif self.role is Role.FOLLOWER:
            self._maintain_follower(now)
        else:
            self._maintain_candidate(now)
        self._expire_pending(now)
        self._check_transfer(now)

    def receive(self, msg, now: float) -> None:
        self._now = now
        handler = self._HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, msg, now)

    def send_failed(self, msg, now: float) -> None:
        """The transport could not deliver `msg` (connection refused or reset)."""
        if isinstance(msg, VoteRequest) and self._round and msg.seq == self._round.seq:
            self._round.record(msg.remote_id, VoteResult.UNKNOWN, -1)
            self._maybe_finish_round(now)
        elif isinstance(msg, HeartBeatRequest) and self._hb_round and msg.seq == self._hb_round.seq:
            self._hb_round.answers[msg.remote_id] = Code.NETWORK_ERROR
        elif isinstance(msg, PushRequest) and self.role is Role.LEADER and msg.term == self.term:
            prog = self.progress[msg.remote_id]
            # Resend from what it is known to hold once it answers a heartbeat again.
            resume = prog.next_index if prog.state is PushType.COMPARE else prog.match_index + 1
            prog.restart(PushType.COMPARE, resume)
            prog.stalled = True

    def append(self, handle: int, bodies: list[bytes], now: float) -> Code:
        """Append one client request's entries as leader; see `append_batch`."""
        return self.append_batch([(handle, bodies)], now)[0]

    def append_batch(self, requests: list[tuple[int, list[bytes]]], now: float) -> list[Code]:
        """Append several client requests at once (one store write, one push per follower).

        Returns, per request, SUCCESS when accepted for replication — its outcome then
        arrives as a Completion — or the code to answer with at once.
        """
        self._now = now
        codes = []
        items = []
        accepted = []
        for handle, bodies in requests:
            code = self._admit(bodies, len(accepted))
            codes.append(code)
            if code is Code.SUCCESS:
                accepted.append((handle, len(bodies)))
                items.extend((EntryType.NORMAL, body) for body in bodies)
        if not items:
            return codes
        positions = self.store.append_leader(self.term, items)
        self._after_local_append()
        deadline = now + self.config.max_wait_ack_time_ms
        offset = 0
        for handle, count in accepted:
            placed = positions[offset : offset + count]
            offset += count
            self._pending.append(
                _Pending(handle, self.term, placed[0][0], placed[-1][0], deadline, placed)
            )
        self._replicate_all(now)
        self._advance_commit()
        return codes

    def _admit(self, bodies: list[bytes], already: int) -> Code:
        if self.role is not Role.LEADER:
            return Code.NOT_LEADER
        if self.transfer is not None:
            return Code.LEADER_TRANSFERRING
        if not bodies:
            return Code.REQUEST_WITH_EMPTY_BODYS
        if len(self._pending) + already >= self.config.max_pending_requests:
            return Code.LEADER_PENDING_FULL
        return Code.SUCCESS

    def retention_floor(self, now: float, keep_ms: float) -> int:
        """The lowest index retention may not delete past.

        Nothing uncommitted, and nothing a follower heard from within `keep_ms` still
        lacks. A follower silent for longer is not waited for: when it returns, the
        leader finds its next entry gone and restarts its log at the leader's beginning
        (a TRUNCATE with reset), as DLedger 0.3.1.2 does.
        """
        floor = self.committed_index + 1
        if self.role is Role.LEADER:
            for peer, prog in self.progress.items():
                if now <= self.last_ack_ms.get(peer, float("-inf")) + keep_ms:
                    floor = min(floor, prog.match_index + 1)
        return floor

    def persisted(self, index: int, generation: int, now: float) -> None:
        """The driver's fsync covering entries up to `index` of store `generation` completed."""
        self._now = now
        if generation != self.store.generation or index <= self.persisted_index:
            return
        self.persisted_index = min(index, self.store.end_index)
        self._flush_deferred_acks()
        if self.role is Role.LEADER:
            self._advance_commit()

    def transfer_leadership(self, handle: int, transferee: str, now: float) -> Code:
        """Admin: hand leadership to `transferee` (DLedger's LEADERSHIP_TRANSFER at the leader)."""
        if self.role is not Role.LEADER:
            return Code.NOT_LEADER
        if transferee not in self.peers:
            return Code.UNKNOWN_MEMBER if transferee != self.self_id else Code.SUCCESS
        if self.transfer is not None:
            return Code.LEADER_TRANSFERRING
        behind = self.store.end_index - self.progress[transferee].match_index
        if behind >= self.config.max_leadership_transfer_wait_index:
            return Code.FALL_BEHIND_TOO_MUCH
        timeout = self.config.leadership_transfer_wait_timeout_ms
        self.transfer = _Transfer(
            transferee, now + 3 * timeout + self._election_span_ms(), handle=handle
        )
        self._send(
            LeadershipTransferRequest(
                self.config.group,
                self.self_id,
                transferee,
                self.self_id,
                self.term,
                transfer_id=self.self_id,
                transferee_id=transferee,
                take_leadership_ledger_index=self.store.end_index,
                seq=self._next_seq(),
            )
        )
        return Code.SUCCESS

    # ------------------------------------------------------------------ helpers
    def _rand(self, low: float, high: float) -> float:
        return low + self.rng.random() * (high - low)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, msg) -> None:
        self._out.messages.append(msg)

    def _save_hard_state(self) -> None:
        self._out.hard_state = (self.term, self.vote_for)

    def _election_span_ms(self) -> float:
        return (
            self.config.heartbeat_interval_ms * self.config.max_heartbeat_leak
            + self.config.max_vote_interval_ms
        )

    def _after_local_append(self) -> None:
        if self.config.ack_after_fsync:
            self._out.needs_sync = True
        else:
            self.persisted_index = self.store.end_index

    def _set_role(self, role: Role, now: float) -> None:
        if role is self.role:
            return
        self.role = role
        self._out.role_changes.append((self.term, role))
        self._on_role_change_for_transfer(now)

    # ------------------------------------------------------------------ term and role changes
    def _change_to_candidate(self, term: int, now: float) -> None:
        """DLedger's changeRoleToCandidate: remember the term seen; nextTerm adopts it later."""
        self.known_max_term = max(self.known_max_term, term)
        self.leader_id = None
        if self.role is Role.LEADER:
            self._leave_leadership()
        self._round = None
        if self.role is not Role.CANDIDATE:
            self.last_parse_result = ParseResult.WAIT_TO_REVOTE
            # Our own timeout: campaign now. A newer term heard from someone else: that
            # node is campaigning; give it a vote gap before competing with it.
            self.next_vote_ms = now if term <= self.term else now + self._vote_gap_ms()
        self._set_role(Role.CANDIDATE, now)

    def _next_term(self) -> int:
        if self.known_max_term > self.term:
            self.term = self.known_max_term
        else:
            self.term += 1
        self.vote_for = None
        self.leader_verified_index = -1
        self._save_hard_state()
        return self.term

    def _change_to_follower(self, leader: str, now: float) -> None:
        if self.role is Role.LEADER:
            self._leave_leadership()
        self.leader_id = leader
        self.last_leader_heartbeat_ms = now
        self._round = None
        if self.vote_for is None:
            # DLedger leaves the vote empty here and may then accept a second candidate
            # in this term; recording the leader closes that window.
            self.vote_for = leader
            self._save_hard_state()
        self._set_role(Role.FOLLOWER, now)

    def _leave_leadership(self) -> None:
        self.progress.clear()
        self._hb_round = None
        self._commit_push_at = None

    # ------------------------------------------------------------------ candidate
    def _maintain_candidate(self, now: float) -> None:
        if self._round is not None:
            if now >= self._round.deadline_ms:
                self._finish_round(now)
            return
        if now < self.next_vote_ms and not self.need_increase_term_immediately:
            return
        if (
            self.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
            or self.need_increase_term_immediately
            or self.known_max_term > self.term  # a round in a term known to be over is wasted
        ):
            self._next_term()
            self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        if self.need_increase_term_immediately:
            self.need_increase_term_immediately = False
            self.next_vote_ms = now + self._vote_gap_ms()
            return
        self._start_round(now)

    def _vote_gap_ms(self) -> float:
        cfg = self.config
        if self._taking_leadership():
            return self._rand(
                cfg.min_take_leadership_vote_interval_ms, cfg.max_take_leadership_vote_interval_ms
            )
        return self._rand(cfg.min_vote_interval_ms, cfg.max_vote_interval_ms)

    def _taking_leadership(self) -> bool:
        return self.term_to_take_leadership == self.term

    def _start_round(self, now: float) -> None:
        cfg = self.config
        wait = 2 * cfg.heartbeat_interval_ms + self._rand(0, cfg.max_vote_interval_ms)
        self._round = VoteRound(self.term, self._next_seq(), now + wait, self.peer_count)
        request = VoteRequest(
            cfg.group,
            self.self_id,
            self.self_id,
            self.self_id,
            self.term,
            self.store.end_index,
            self.store.end_term,
            seq=self._round.seq,
        )
        self._round.record(self.self_id, self._vote_on(request, now), self.term)
        for peer in self.peers:
            self._send(attrs.evolve(request, remote_id=peer))
        self._maybe_finish_round(now)

    def _maybe_finish_round(self, now: float) -> None:
        if self._round is not None and self._round.early_stop():
            self._finish_round(now)

    def _finish_round(self, now: float) -> None:
        vote_round, self._round = self._round, None
        if self.role is not Role.CANDIDATE or vote_round.term != self.term:
            return
        result = vote_round.parse()
        if result is ParseResult.PASSED and vote_round.term == self._never_lead_term:
            result = ParseResult.WAIT_TO_VOTE_NEXT
        self.last_parse_result = result
        cfg = self.config
        leak_ms = cfg.heartbeat_interval_ms * cfg.max_heartbeat_leak
        if result is ParseResult.PASSED:
            self._become_leader(now)
            return
        if result is ParseResult.REVOTE_IMMEDIATELY:
            self.next_vote_ms = now
            return
        if result is ParseResult.WAIT_TO_VOTE_NEXT and vote_round.known_max_term > self.term:
            self.known_max_term = max(self.known_max_term, vote_round.known_max_term)
        extra = vote_round.backoff_ms(result, leak_ms, cfg.max_vote_interval_ms)
        self.next_vote_ms = now + self._vote_gap_ms() + extra

    def _become_leader(self, now: float) -> None:
        self.leader_id = self.self_id
        self.progress = {p: Progress(next_index=self.store.end_index + 1) for p in self.peers}
        self.last_ack_ms = dict.fromkeys(self.peers, now)
        self.last_send_heartbeat_ms = float("-inf")
        self._next_preferred_check_ms = now + self.config.check_preferred_leader_interval_ms
        self._set_role(Role.LEADER, now)
        # A NOOP of our own term lets everything inherited commit without waiting for a client.
        self.store.append_leader(self.term, [(EntryType.NOOP, b"")])
        self._after_local_append()
        self._maintain_leader(now)
        self._advance_commit()

    # ------------------------------------------------------------------ voter
    def _on_vote_request(self, req: VoteRequest, now: float) -> None:
        result = self._vote_on(req, now)
        self._send(
            VoteResponse(
                self.config.group,
                self.self_id,
                req.local_id,
                self.leader_id,
                self._vote_answer_term(result),
                result,
                seq=req.seq,
            )
        )

    def _vote_answer_term(self, result: VoteResult) -> int:
        if result is VoteResult.REJECT_TERM_SMALL_THAN_LEDGER:
            return self.store.end_term
        return self.term

    def _vote_on(self, req: VoteRequest, now: float) -> VoteResult:
        """DLedger's handleVote, checks in its order (log before term)."""
        from_self = req.local_id == self.self_id
        if req.leader_id not in self.config.peers:
            return VoteResult.REJECT_UNKNOWN_LEADER
        if not from_self and req.leader_id == self.self_id:
            return VoteResult.REJECT_UNEXPECTED_LEADER
        if req.ledger_end_term < self.store.end_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if (
            req.ledger_end_term == self.store.end_term
            and req.ledger_end_index < self.store.end_index
        ):
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        if req.term < self.term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if req.term == self.term:
            if self.vote_for is not None and self.vote_for != req.leader_id:
                if self.leader_id is not None:
                    return VoteResult.REJECT_ALREADY_HAS_LEADER
                return VoteResult.REJECT_ALREADY_VOTED
        else:
            self._change_to_candidate(req.term, now)
            self.need_increase_term_immediately = True
            return VoteResult.REJECT_TERM_NOT_READY
        if req.term < self.store.end_term:
            return VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
        if (
            not from_self
            and self._taking_leadership()
            and self.self_id in self.config.preferred_leader_ids
            and req.ledger_end_term == self.store.end_term
            and self.store.end_index >= req.ledger_end_index
        ):
            return VoteResult.REJECT_TAKING_LEADERSHIP
        if self.vote_for != req.leader_id:
            self.vote_for = req.leader_id
            self._save_hard_state()
        return VoteResult.ACCEPT

    def _on_vote_response(self, resp: VoteResponse, now: float) -> None:
        if self._round is None or resp.seq != self._round.seq:
            return
        self._round.record(resp.local_id, VoteResult(resp.vote_result), resp.term)
        self._maybe_finish_round(now)

    # ------------------------------------------------------------------ heartbeats
    def _maintain_follower(self, now: float) -> None:
        cfg = self.config
        if (
            now
            >= self.last_leader_heartbeat_ms + cfg.heartbeat_interval_ms * cfg.max_heartbeat_leak
        ):
            self._change_to_candidate(self.term, now)

    def _maintain_leader(self, now: float) -> None:
        cfg = self.config
        if self._hb_round and (
            now >= self._hb_round.deadline_ms or len(self._hb_round.answers) >= len(self.peers)
        ):
            self._finish_heartbeat_round(now)
            if self.role is not Role.LEADER:
                return
        if now >= self.last_send_heartbeat_ms + cfg.heartbeat_interval_ms:
            self._send_heartbeats(now)
        if self._commit_push_at is not None and now >= self._commit_push_at:
            self._send_commit_updates()
        if not self._lease_held(now):
            self._change_to_candidate(self.term, now)
            return
        if now >= self._next_preferred_check_ms:
            self._next_preferred_check_ms = now + cfg.check_preferred_leader_interval_ms
            if self.transfer is None:
                self._check_preferred_leader(now)
        self._replicate_all(now)

    def _lease_held(self, now: float) -> bool:
        """DLedger's step-down: a leader that has not heard a quorum for maxHeartBeatLeak beats."""
        window = self.config.heartbeat_interval_ms * self.config.max_heartbeat_leak
        heard = 1 + sum(1 for t in self.last_ack_ms.values() if now - t <= window)
        return is_quorum(heard, self.peer_count)

    def _send_heartbeats(self, now: float) -> None:
        self.last_send_heartbeat_ms = now
        seq = self._next_seq()
        self._hb_round = _HeartbeatRound(seq, now + max(1, self.config.heartbeat_interval_ms - 10))
        for peer in self.peers:
            self._send(
                HeartBeatRequest(
                    self.config.group, self.self_id, peer, self.self_id, self.term, seq=seq
                )
            )

    def _finish_heartbeat_round(self, now: float) -> None:
        hb_round, self._hb_round = self._hb_round, None
        answers = list(hb_round.answers.values())
        success = 1 + answers.count(Code.SUCCESS)
        if is_quorum(success, self.peer_count):
            return
        if is_quorum(success + answers.count(Code.TERM_NOT_READY), self.peer_count):
            self.last_send_heartbeat_ms = float("-inf")  # resend at once
        elif Code.INCONSISTENT_LEADER in answers:
            self._change_to_candidate(self.term, now)

    def _on_heartbeat(self, req: HeartBeatRequest, now: float) -> None:
        code = self._accept_leader(req.leader_id, req.term, now)
        self._send(
            HeartBeatResponse(
                self.config.group,
                self.self_id,
                req.local_id,
                self.leader_id,
                self.term,
                code,
                seq=req.seq,
            )
        )

    def _accept_leader(self, leader: str, term: int, now: float) -> Code:
        """DLedger's heartbeat checks, shared by pushes: may this leader talk to us now?"""
        if leader not in self.config.peers:
            return Code.UNKNOWN_MEMBER
        if leader == self.self_id:
            return Code.UNEXPECTED_MEMBER
        if term < self.term:
            return Code.EXPIRED_TERM
        if term > self.term:
            self._change_to_candidate(term, now)
            self.need_increase_term_immediately = True
            return Code.TERM_NOT_READY
        if self.leader_id is None and self.role is not Role.LEADER:
            self._change_to_follower(leader, now)
            return Code.SUCCESS
        if self.leader_id == leader and self.role is Role.FOLLOWER:
            self.last_leader_heartbeat_ms = now
            return Code.SUCCESS
        return Code.INCONSISTENT_LEADER

    def _on_heartbeat_response(self, resp: HeartBeatResponse, now: float) -> None:
        if self.role is not Role.LEADER:
            return
        if resp.code == Code.EXPIRED_TERM and resp.term > self.term:
            self._change_to_candidate(resp.term, now)
            return
        if resp.term == self.term and resp.code == Code.SUCCESS:
            self.last_ack_ms[resp.local_id] = now
            prog = self.progress.get(resp.local_id)
            if prog is not None and prog.stalled:
                prog.stalled = False
                self._replicate(resp.local_id, prog, now)
        if self._hb_round and resp.seq == self._hb_round.seq:
            self._hb_round.answers[resp.local_id] = Code(resp.code)
            if len(self._hb_round.answers) >= len(self.peers):
                self._finish_heartbeat_round(now)

    # ------------------------------------------------------------------ leader replication
    def _replicate_all(self, now: float) -> None:
        if self.role is not Role.LEADER:
            return
        for peer, prog in self.progress.items():
            self._replicate(peer, prog, now)

    def _push(self, peer: str, prog: Progress, push_type: PushType, pre_index: int, **extra) -> int:
        seq = self._next_seq()
        self._send(
            PushRequest(
                self.config.group,
                self.self_id,
                peer,
                self.self_id,
                self.term,
                push_type,
                pre_index,
                self.store.term_at(pre_index),
                self.committed_index,
                seq=seq,
                **extra,
            )
        )
        prog.sent_commit = self.committed_index
        return seq

    def _replicate(self, peer: str, prog: Progress, now: float) -> None:
        if prog.stalled:
            return
        store = self.store
        timeout = self.config.max_push_timeout_ms
        if prog.state is PushType.APPEND:
            if prog.inflight and now >= next(iter(prog.inflight.values()))[1] + timeout:
                prog.restart(
                    PushType.APPEND, prog.match_index + 1
                )  # resend what was not acknowledged
            while (
                prog.next_index <= store.end_index
                and len(prog.inflight) < self.config.max_pending_pushes
            ):
                blob, count = store.read_encoded(prog.next_index, self.config.max_batch_push_bytes)
                pre = prog.next_index - 1
                seq = self._push(peer, prog, PushType.APPEND, pre, entries=blob, count=count)
                prog.next_index += count
                prog.inflight[seq] = (prog.next_index - 1, now)
            return
        if prog.waiting_seq >= 0:
            if now < prog.waiting_since_ms + timeout:
                return
            prog.waiting_seq = -1
        if prog.state is PushType.COMPARE:
            pre = prog.next_index - 1
            if pre < store.begin_index - 1:
                self._send_truncate(peer, prog, now, reset=True)
                return
            prog.waiting_seq = self._push(peer, prog, PushType.COMPARE, pre)
        else:
            self._send_truncate(peer, prog, now, reset=False)
        prog.waiting_since_ms = now

    def _send_truncate(self, peer: str, prog: Progress, now: float, reset: bool) -> None:
        """TRUNCATE after `next_index - 1`, or reset a follower we left behind to our start."""
        store = self.store
        if reset:
            prog.next_index = store.begin_index
        pre = prog.next_index - 1
        reset_pos = -1
        if reset:
            reset_pos = store.get(store.begin_index).pos if not store.empty else store.end_pos
        prog.state = PushType.TRUNCATE
        prog.waiting_seq = self._push(
            peer,
            prog,
            PushType.TRUNCATE,
            pre,
            term_runs=self._term_runs(pre + 1, store.end_index),
            leader_end_index=store.end_index,
            reset_pos=reset_pos,
        )
        prog.waiting_since_ms = now

    def _term_runs(self, low: int, high: int) -> list[tuple[int, int]]:
        """[(first index, term)] of our log over [low, high], oldest first."""
        runs = []
        i = high
        while i >= low:
            first = max(low, self.store.first_index_of_term(i))
            runs.append((first, self.store.term_at(i)))
            i = first - 1
        runs.reverse()
        return runs

    def _on_push_response(self, resp: PushResponse, now: float) -> None:
        if self.role is not Role.LEADER:
            return
        if resp.term > self.term:
            self._change_to_candidate(resp.term, now)
            return
        prog = self.progress.get(resp.local_id)
        if prog is None:
            return
        if resp.code == Code.TERM_NOT_READY:  # it adopts our term at its next step: retry then
            prog.restart(PushType.COMPARE, prog.match_index + 1)
            return
        if resp.term != self.term:
            return
        if resp.code == Code.SUCCESS:
            self.last_ack_ms[resp.local_id] = now
        if resp.type == PushType.APPEND:
            if prog.inflight.pop(resp.seq, None) is None:
                return
            if resp.code == Code.SUCCESS:
                self._matched(prog, resp.index)
                self._replicate(resp.local_id, prog, now)
            elif resp.code == Code.INCONSISTENT_STATE:
                prog.restart(PushType.COMPARE, min(prog.match_index + 1, resp.end_index + 1))
                self._replicate(resp.local_id, prog, now)
            return
        if resp.type == PushType.COMMIT or resp.seq != prog.waiting_seq:
            return
        prog.waiting_seq = -1
        if resp.type == PushType.COMPARE:
            self._on_compare_response(prog, resp)
        elif resp.code == Code.SUCCESS:  # TRUNCATE done: the follower is a prefix of our log
            self._matched(prog, resp.index)
            prog.restart(PushType.APPEND, resp.index + 1)
        else:
            prog.restart(PushType.COMPARE, prog.next_index)
        self._replicate(resp.local_id, prog, now)

    def _on_compare_response(self, prog: Progress, resp: PushResponse) -> None:
        compare_index = prog.next_index - 1
        if resp.code == Code.SUCCESS:
            if resp.end_index > compare_index:
                prog.state = PushType.TRUNCATE
            else:
                self._matched(prog, compare_index)
                prog.restart(PushType.APPEND, compare_index + 1)
            return
        if resp.code != Code.INCONSISTENT_STATE:
            return  # try again after the push timeout
        if resp.x_term != -1:
            prog.next_index = min(resp.x_index, compare_index)
        else:
            prog.next_index = min(compare_index, resp.end_index + 1)
        if resp.begin_index > prog.next_index:  # the follower lacks what we would compare
            prog.next_index = self.store.begin_index - 1

    def _matched(self, prog: Progress, index: int) -> None:
        if index > prog.match_index:
            prog.match_index = index
            self._advance_commit()

    def _advance_commit(self) -> None:
        if self.role is not Role.LEADER:
            return
        matches = [p.match_index for p in self.progress.values()]
        matches.append(self.persisted_index)
        matches.sort(reverse=True)
        candidate = matches[self.quorum - 1]
        if candidate > self.committed_index and self.store.term_at(candidate) == self.term:
            self._set_committed(candidate)

    def _set_committed(self, index: int) -> None:
        self.committed_index = index
        self._out.committed_index = index
        self._resolve_pending()
        if self.role is Role.LEADER and self._commit_push_at is None:
            self._commit_push_at = self._now + _COMMIT_LINGER_MS

    def _send_commit_updates(self) -> None:
        """Tell idle followers the commit index (busy ones learned it from APPEND pushes)."""
        self._commit_push_at = None
        for peer, prog in self.progress.items():
            if (
                prog.state is PushType.APPEND
                and prog.sent_commit < self.committed_index
                and prog.next_index > self.store.end_index
            ):
                self._push(peer, prog, PushType.COMMIT, prog.match_index)

    # ------------------------------------------------------------------ pending appends
    def _resolve_pending(self) -> None:
        pending = self._pending
        while pending and pending[0].last <= self.committed_index:
            p = pending.popleft()
            committed = self._entry_term(p.last) == p.term
            code = Code.SUCCESS if committed else Code.TERM_CHANGED
            self._out.completions.append(
                Completion(p.handle, code, p.positions if committed else None)
            )

    def _entry_term(self, index: int) -> int:
        if self.store.begin_index <= index <= self.store.end_index:
            return self.store.term_at(index)
        return -1

    def _drop_lost_pending(self) -> None:
        """After a truncation: appends whose first entry is gone can no longer commit."""
        kept = deque()
        for p in self._pending:
            if self._entry_term(p.first) != p.term:
                self._out.completions.append(Completion(p.handle, Code.TERM_CHANGED))
            else:
                kept.append(p)
        self._pending = kept

    def _expire_pending(self, now: float) -> None:
        pending = self._pending
        if not pending or pending[0].deadline_ms > now:
            return
        kept = deque()
        for p in pending:
            if p.deadline_ms <= now:
                self._out.completions.append(Completion(p.handle, Code.WAIT_QUORUM_ACK_TIMEOUT))
            else:
                kept.append(p)
        self._pending = kept

    # ------------------------------------------------------------------ follower replication
    def _on_push(self, req: PushRequest, now: float) -> None:
        code = self._accept_leader(req.leader_id, req.term, now)
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
        if self.transfer is not None:  # a transferee campaigns as soon as it has caught up
            self._check_transfer(now)

    def _answer_push(
        self, req: PushRequest, code: Code, index: int, defer_to: int = -1, **extra
    ) -> None:
        store = self.store
        resp = PushResponse(
            self.config.group,
            self.self_id,
            req.local_id,
            self.leader_id,
            self.term,
            code,
            req.type,
            index,
            store.begin_index,
            store.end_index,
            seq=req.seq,
            **extra,
        )
        if defer_to > self.persisted_index:
            self._deferred_acks.append((defer_to, resp))
        else:
            self._send(resp)

    def _flush_deferred_acks(self) -> None:
        acks = self._deferred_acks
        while acks and acks[0][0] <= self.persisted_index:
            self._send(acks.popleft()[1])

    def _learn_commit(self, leader_commit: int) -> None:
        known = min(leader_commit, self.leader_verified_index)
        if known > self.committed_index:
            self._set_committed(known)

    def _on_compare(self, req: PushRequest) -> None:
        store = self.store
        pre = req.pre_log_index
        self._reorder.clear()
        if pre > store.end_index or pre < store.begin_index - 1:
            self._answer_push(req, Code.INCONSISTENT_STATE, pre)
        elif store.term_at(pre) == req.pre_log_term:
            self.leader_verified_index = max(self.leader_verified_index, pre)
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
        store = self.store
        pre = req.pre_log_index
        self._reorder.clear()
        agrees = (
            store.begin_index - 1 <= pre <= store.end_index
            and store.term_at(pre) == req.pre_log_term
        )
        if not agrees:
            if req.reset_pos < 0:
                self._answer_push(req, Code.INCONSISTENT_STATE, pre)
                return
            store.reset(pre + 1, req.reset_pos, req.pre_log_term)
            self._after_truncation(pre)
        cut = self._first_disagreement(pre, req.term_runs, req.leader_end_index)
        if cut <= store.end_index:
            store.truncate(cut)
            self._after_truncation(cut - 1)
        self.leader_verified_index = cut - 1
        self._learn_commit(req.commit_index)
        self._answer_push(req, Code.SUCCESS, cut - 1, defer_to=cut - 1)

    def _after_truncation(self, new_end: int) -> None:
        self.persisted_index = min(self.persisted_index, new_end)
        self._deferred_acks = deque(a for a in self._deferred_acks if a[0] <= new_end)
        self._drop_lost_pending()

    def _first_disagreement(self, pre: int, term_runs: list, leader_end: int) -> int:
        """The first index after `pre` where our log leaves the leader's (whose runs are given)."""
        store = self.store
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
        store = self.store
        first = req.pre_log_index + 1
        if first > store.end_index + 1:
            if len(self._reorder) < _REORDER_BUFFER:
                self._reorder[first] = req
            else:
                self._answer_push(req, Code.INCONSISTENT_STATE, req.pre_log_index)
            return
        self._apply_append(req)
        while (nxt := self._reorder.pop(store.end_index + 1, None)) is not None:
            self._apply_append(nxt)

    def _apply_append(self, req: PushRequest) -> None:
        store = self.store
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
            try:
                store.append_encoded(blob)
            except (InconsistentAppend, codec.CorruptEntry):
                self._answer_push(req, Code.INCONSISTENT_STATE, pre)
                return
            self._after_local_append()
        self.leader_verified_index = max(self.leader_verified_index, last)
        self._learn_commit(req.commit_index)
        self._answer_push(req, Code.SUCCESS, last, defer_to=last)

    def _skip_held(self, blob: bytes, held: int) -> int | None:
        """Byte offset past the first `held` (>= 1) entries of `blob`, if they equal ours.

        Equal chainCrc at the last of them means equal logs up to it.
        """
        for n, (off, _t, size, index, _term, _pos, chain) in enumerate(codec.iter_entries(blob)):
            if n == held - 1:
                return off + size if self.store.get(index).chain_crc == chain else None
        return None

    # ------------------------------------------------------------------ leadership transfer
    def _on_transfer_request(self, req: LeadershipTransferRequest, now: float) -> None:
        if req.transferee_id != self.self_id:
            self._answer_transfer(req.local_id, req.seq, Code.UNEXPECTED_ARGUMENT)
            return
        if req.transfer_id != self.leader_id:
            self._answer_transfer(req.local_id, req.seq, Code.INCONSISTENT_LEADER)
            return
        if req.term != self.term:
            self._answer_transfer(req.local_id, req.seq, Code.INCONSISTENT_TERM)
            return
        self.transfer = _Transfer(
            self.self_id,
            now + self.config.leadership_transfer_wait_timeout_ms,
            reply_to=req.local_id,
            reply_seq=req.seq,
            take_index=req.take_leadership_ledger_index,
        )
        self._check_transfer(now)

    def _answer_transfer(self, to: str, seq: int, code: Code) -> None:
        self._send(
            LeadershipTransferResponse(
                self.config.group, self.self_id, to, self.leader_id, self.term, code, seq=seq
            )
        )

    def _check_transfer(self, now: float) -> None:
        t = self.transfer
        if t is None:
            return
        if t.handle is not None:  # old leader waiting for the transferee's answer
            if now >= t.deadline_ms:
                self.transfer = None
                self._out.completions.append(Completion(t.handle, Code.TIMEOUT))
            return
        if t.target_term < 0:  # transferee catching up
            if self.store.end_index >= t.take_index:
                t.target_term = self.term + 1
                t.deadline_ms = now + self._election_span_ms() * 3
                self.term_to_take_leadership = t.target_term
                self._change_to_candidate(t.target_term, now)
                self.need_increase_term_immediately = True
            elif now >= t.deadline_ms:
                self.transfer = None
                self._answer_transfer(t.reply_to, t.reply_seq, Code.TAKE_LEADERSHIP_FAILED)
        elif now >= t.deadline_ms:
            self.transfer = None
            self._answer_transfer(t.reply_to, t.reply_seq, Code.TAKE_LEADERSHIP_FAILED)

    def _on_role_change_for_transfer(self, now: float) -> None:
        """DLedger's TakeLeadershipTask.check: answer the old leader once the campaign ends."""
        t = self.transfer
        if t is None or t.handle is not None or t.target_term < 0:
            return
        code = None
        if self.role is Role.LEADER and self.term == t.target_term:
            code = Code.SUCCESS
        elif self.term > t.target_term:
            code = Code.EXPIRED_TERM
        elif self.role is Role.FOLLOWER:
            code = Code.TAKE_LEADERSHIP_FAILED
        if code is not None:
            self.transfer = None
            self._answer_transfer(t.reply_to, t.reply_seq, code)

    def _on_transfer_response(self, resp: LeadershipTransferResponse, now: float) -> None:
        t = self.transfer
        if t is None or t.handle is None or resp.local_id != t.transferee:
            return
        self.transfer = None
        self._out.completions.append(Completion(t.handle, Code(resp.code)))

    def _check_preferred_leader(self, now: float) -> None:
        preferred = self.config.preferred_leader_ids
        if not preferred or self.self_id in preferred:
            return
        window = self.config.heartbeat_interval_ms * self.config.max_heartbeat_leak
        best = None
        for peer in preferred:
            prog = self.progress.get(peer)
            if prog is None or now - self.last_ack_ms.get(peer, float("-inf")) > window:
                continue
            lag = self.store.end_index - prog.match_index
            if lag < self.config.max_leadership_transfer_wait_index and (
                best is None or lag < best[0]
            ):
                best = (lag, peer)
        if best is not None:
            self.transfer_leadership(-1, best[1], now)

    _HANDLERS = {
        VoteRequest: _on_vote_request,
        VoteResponse: _on_vote_response,
        HeartBeatRequest: _on_heartbeat,
        HeartBeatResponse: _on_heartbeat_response,
        PushRequest: _on_push,
        PushResponse: _on_push_response,
        LeadershipTransferRequest: _on_transfer_request,
        LeadershipTransferResponse: _on_transfer_response,
    }
