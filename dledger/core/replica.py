"""One DLedger replica as a deterministic state machine (no I/O, no clock, no threads).

The driver feeds it events — `tick(now_ms)`, `receive(message, now_ms)`, `append(...)`,
`persisted(index, generation, now_ms)`, `transfer_leadership(...)` — and after each
one takes an `Output` of effects to carry out (through `output.Handoff`). Time is
milliseconds supplied by the caller and randomness comes from the `random.Random`
it is given, so the simulator replays any schedule exactly.

The protocol lives beside this module, one part each, and `Replica` puts them
together over one shared state: `election` (campaign and vote, after DLedger's
`DLedgerLeaderElector`), `heartbeat` (beats and the lease), `replication` (the
leader's dispatcher and the commit rule, after DLedger HEAD's `DLedgerEntryPusher`),
`follower` (its `EntryHandler`), `pending` (client appends awaiting commit) and
`transfer` (leadership transfer). What is done because time passed is one table,
`_TIMERS`, from which both `tick` and `next_deadline_ms` are derived.

Two departures from DLedger, both for safety: term and vote are durable before any
message that depends on them leaves (see `Output`), and a follower that learns its
leader from a heartbeat records it as its vote, closing DLedger's two-leaders-in-one-
term window. Replication uses Raft's commit rule: an entry is committed once a quorum
holds it durably and it belongs to the leader's own term; a new leader appends a
NOOP so inherited entries commit promptly.
"""

from __future__ import annotations

import random
from collections import deque

from raftmq.dledger.codes import Code, EntryType, ParseResult, Role, VoteResult
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.core import timers
from raftmq.dledger.core.election import Election, VoteRound, is_quorum
from raftmq.dledger.core.follower import FollowerReplication
from raftmq.dledger.core.heartbeat import HeartbeatRound, Heartbeats
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
from raftmq.dledger.core.output import Output
from raftmq.dledger.core.pending import PendingAppends
from raftmq.dledger.core.progress import Progress
from raftmq.dledger.core.replication import LeaderReplication
from raftmq.dledger.core.timers import Timer
from raftmq.dledger.core.transfer import LeadershipTransfer, Transfer
from raftmq.dledger.store.base import DiskFull, LogStore


class Replica(Election, Heartbeats, LeaderReplication, FollowerReplication, LeadershipTransfer):
    """The state all parts share, the events a driver feeds, and the role changes."""

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
        self._other_members = frozenset(self.peers)
        self.peer_count = len(config.peer_ids)
        self.term = term
        self.vote_for = vote_for
        # (term, vote) as last handed to the driver to make durable (`_save_hard_state`)
        self._hard_state = (term, vote_for)
        self.role = Role.CANDIDATE
        self.leader_id: str | None = None
        self.committed_index = -1
        self.persisted_index = store.end_index  # what survived a restart is on disk
        # DLedger's isDiskFull: set by the driver's disk check, or by a segment that
        # found no room; appends are refused (DISK_FULL) while it holds.
        self.disk_full = False
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
        # when each peer last answered a beat of this leader's term: the beat's send time
        self.last_ack_ms: dict[str, float] = {}
        self._beats_sent_ms: dict[int, float] = {}  # seq -> send time, for a lease's span
        self._hb_round: HeartbeatRound | None = None
        self.last_send_heartbeat_ms = float("-inf")
        self._pending = PendingAppends()
        self._next_preferred_check_ms = now_ms
        self._commit_push_at_ms: float | None = None
        self._now_ms = now_ms
        # follower
        self.leader_verified_index = -1  # our log agrees with the leader's up to here
        self._deferred_acks: deque[tuple[int, PushResponse]] = deque()
        self._reorder: dict[int, PushRequest] = {}
        # transfer
        self.transfer: Transfer | None = None
        self.term_to_take_leadership = -1
        # counted for monitoring (dledger.metrics), at rare events only
        self.vote_rounds_started = 0
        self.elections_won = 0
        self.leaders_seen = 0  # leaders recognised (ourselves included), one per term at most

    # ------------------------------------------------------------------ public surface
    def take_output(self) -> Output:
        out, self._out = self._out, Output()
        return out

    @property
    def quorum(self) -> int:
        return self.peer_count // 2 + 1

    @property
    def lease_ms(self) -> float:
        """maxHeartBeatLeak beats: how long a follower waits for its leader, and how
        long a leader leads without hearing a quorum."""
        return self.config.heartbeat_interval_ms * self.config.max_heartbeat_leak

    def next_deadline_ms(self) -> float:
        """The earliest time `tick` has something to do."""
        return timers.next_deadline_ms(self, self._TIMERS)

    def tick(self, now_ms: float) -> None:
        self._now_ms = now_ms
        timers.fire_due(self, self._TIMERS, now_ms)
        self._check_invariants()

    def receive(self, msg, now_ms: float) -> None:
        """Handle a peer message. An answer (negative KIND) naming a sender that is not
        another member is dropped: a stranger's vote or beat must not count toward a
        quorum or a lease. Requests from strangers get DLedger's refusals."""
        if msg.KIND < 0 and msg.local_id not in self._other_members:
            return
        self._now_ms = now_ms
        handler = self._HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, msg, now_ms)
        self._check_invariants()

    def send_failed(self, msg, now_ms: float) -> None:
        """The transport could not deliver `msg` (connection refused or reset)."""
        if isinstance(msg, VoteRequest) and self._round and msg.seq == self._round.seq:
            self._round.record(msg.remote_id, VoteResult.UNKNOWN, -1)
            self._maybe_finish_round(now_ms)
        elif isinstance(msg, HeartBeatRequest) and self._hb_round and msg.seq == self._hb_round.seq:
            self._hb_round.answers[msg.remote_id] = Code.NETWORK_ERROR
        elif isinstance(msg, PushRequest) and self.role is Role.LEADER and msg.term == self.term:
            self.progress[msg.remote_id].stall()
        self._check_invariants()

    def append(self, handle: int, bodies: list[bytes], now_ms: float) -> Code:
        """Append one client request's entries as leader; see `append_batch`."""
        return self.append_batch([(handle, bodies)], now_ms)[0]

    def append_batch(self, requests: list[tuple[int, list[bytes]]], now_ms: float) -> list[Code]:
        """Append several client requests at once (one store write, one push per follower).

        Returns, per request, SUCCESS when accepted for replication — its outcome then
        arrives as a Completion — or the code to answer with at once.
        """
        self._now_ms = now_ms
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
        assert self.role is Role.LEADER, self.role  # only a leader appends, in its own term
        try:
            positions = self.store.append_leader(self.term, items)
        except DiskFull:  # nothing was written: refuse, and wait for the disk check
            self.disk_full = True
            return [Code.DISK_FULL if code is Code.SUCCESS else code for code in codes]
        self._after_local_append()
        deadline = now_ms + self.config.max_wait_ack_time_ms
        offset = 0
        for handle, count in accepted:
            self._pending.add(handle, self.term, positions[offset : offset + count], deadline)
            offset += count
        self._replicate_all(now_ms)
        self._advance_commit()
        self._check_invariants()
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
        if self.disk_full:
            return Code.DISK_FULL
        return Code.SUCCESS

    def set_disk_full(self, full: bool, now_ms: float) -> None:
        """The driver's disk check: whether the store's filesystem is over diskFullRatio.
        Back under it, a leader whose NOOP found no room appends it now, so that what
        it inherited commits."""
        self._now_ms = now_ms
        self.disk_full = full
        if not full and self.role is Role.LEADER and self.store.end_term < self.term:
            self._append_noop()
            self._replicate_all(now_ms)
            self._advance_commit()
        self._check_invariants()

    def retention_floor(self, now_ms: float, keep_ms: float) -> int:
        """The lowest index retention may not delete past.

        Nothing uncommitted, and nothing a follower heard from within `keep_ms` still
        lacks. A follower silent for longer is not waited for: when it returns, the
        leader finds its next entry gone and restarts its log at the leader's beginning
        (a TRUNCATE with reset), as DLedger 0.3.1.2 does.
        """
        floor = self.committed_index + 1
        if self.role is Role.LEADER:
            for peer, prog in self.progress.items():
                if now_ms <= self.last_ack_ms.get(peer, float("-inf")) + keep_ms:
                    floor = min(floor, prog.match_index + 1)
        return floor

    def persisted(self, index: int, generation: int, now_ms: float) -> None:
        """The driver's fsync covering entries up to `index` of store `generation` completed."""
        self._now_ms = now_ms
        if generation != self.store.generation or index <= self.persisted_index:
            return
        self.persisted_index = min(index, self.store.end_index)
        self._flush_deferred_acks()
        if self.role is Role.LEADER:
            self._advance_commit()
        self._check_invariants()

    # ------------------------------------------------------------------ shared by the parts
    def _rand(self, low: float, high: float) -> float:
        return low + self.rng.random() * (high - low)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, msg) -> None:
        self._out.messages.append(msg)

    def _answer_header(self, to: str) -> tuple:
        """DLedger's base fields of an answer from us to `to`: group, sender, receiver,
        the leader we know and our term."""
        return (self.config.group, self.self_id, to, self.leader_id, self.term)

    def _save_hard_state(self) -> None:
        """Hand (term, vote) to the driver to make durable. Election safety as far as one
        replica can tell: its term never goes back, and in a term it votes once (a vote,
        once given, is never changed for another)."""
        term, vote = self._hard_state
        assert self.term > term or (self.term == term and vote in (None, self.vote_for)), (
            (term, vote),
            (self.term, self.vote_for),
        )
        self._hard_state = self._out.hard_state = (self.term, self.vote_for)

    def _after_local_append(self) -> None:
        if self.config.ack_after_fsync:
            self._out.needs_sync = True
        else:
            self.persisted_index = self.store.end_index

    def _entry_term(self, index: int) -> int:
        """The term of our entry at `index`, or -1 if we do not hold it."""
        if self.store.begin_index <= index <= self.store.end_index:
            return self.store.term_at(index)
        return -1

    def _pending_due_ms(self) -> float | None:
        return self._pending.deadline_ms

    def _expire_pending(self, now_ms: float) -> None:
        self._out.completions.extend(self._pending.expire(now_ms))

    def _check_invariants(self) -> None:
        """After every event: what is committed, counted as durable or known to agree
        with the leader is in our log; a leader neither counts nor sends past its end;
        no term or vote changed without being handed to the driver to make durable."""
        end = self.store.end_index
        assert self.committed_index <= end, (self.committed_index, end)
        assert self.persisted_index <= end, (self.persisted_index, end)
        assert self.leader_verified_index <= end, (self.leader_verified_index, end)
        assert self._hard_state == (self.term, self.vote_for), self._hard_state
        assert self.role is Role.LEADER or not self.progress, self.role
        for peer, prog in self.progress.items():
            assert prog.match_index <= end and prog.next_index <= end + 1, (peer, prog, end)

    def _set_role(self, role: Role, now_ms: float) -> None:
        if role is self.role:
            return
        self.role = role
        self._out.role_changes.append((self.term, role))
        self._on_role_change_for_transfer(now_ms)

    # ------------------------------------------------------------------ term and role changes
    def _change_to_candidate(self, term: int, now_ms: float) -> None:
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
            self.next_vote_ms = now_ms if term <= self.term else now_ms + self._vote_gap_ms()
        self._set_role(Role.CANDIDATE, now_ms)

    def _next_term(self) -> int:
        if self.known_max_term > self.term:
            self.term = self.known_max_term
        else:
            self.term += 1
        self.vote_for = None
        self.leader_verified_index = -1
        self._save_hard_state()
        return self.term

    def _change_to_follower(self, leader: str, now_ms: float) -> None:
        if self.role is Role.LEADER:
            self._leave_leadership()
        self.leader_id = leader
        self.leaders_seen += 1
        self.last_leader_heartbeat_ms = now_ms
        self._round = None
        if self.vote_for is None:
            # DLedger leaves the vote empty here and may then accept a second candidate
            # in this term; recording the leader closes that window.
            self.vote_for = leader
            self._save_hard_state()
        self._set_role(Role.FOLLOWER, now_ms)

    def _become_leader(self, votes: VoteRound, now_ms: float) -> None:
        """Election safety: only a candidate, in the term its round was for, with a
        quorum of that term's votes (each voter gives one per term), and not in a term
        it may have led before a restart."""
        assert self.role is Role.CANDIDATE and self.leader_id is None, (self.role, self.leader_id)
        assert votes.term == self.term != self._never_lead_term, (votes.term, self.term)
        assert is_quorum(votes.count(VoteResult.ACCEPT), self.peer_count), votes.results
        window = self.config.max_pending_pushes
        self.leader_id = self.self_id
        self.elections_won += 1
        self.leaders_seen += 1
        self.progress = {
            p: Progress.for_new_leader(self.store.end_index, window) for p in self.peers
        }
        self.last_ack_ms = dict.fromkeys(self.peers, now_ms)
        self.last_send_heartbeat_ms = float("-inf")
        self._next_preferred_check_ms = now_ms + self.config.check_preferred_leader_interval_ms
        self._set_role(Role.LEADER, now_ms)
        self._append_noop()
        timers.fire_due(self, self._LEADER_TIMERS, now_ms)  # heartbeats and COMPAREs go out now
        self._advance_commit()

    def _append_noop(self) -> None:
        """A NOOP of our own term lets everything inherited commit without waiting for a
        client. On a disk with no room for it, `set_disk_full` appends it later."""
        assert self.role is Role.LEADER, self.role
        try:
            self.store.append_leader(self.term, [(EntryType.NOOP, b"")])
        except DiskFull:
            self.disk_full = True
            return
        self._after_local_append()

    def _leave_leadership(self) -> None:
        self.progress.clear()
        self._hb_round = None
        self._commit_push_at_ms = None

    _HANDLERS = {
        VoteRequest: Election._on_vote_request,
        VoteResponse: Election._on_vote_response,
        HeartBeatRequest: Heartbeats._on_heartbeat,
        HeartBeatResponse: Heartbeats._on_heartbeat_response,
        PushRequest: FollowerReplication._on_push,
        PushResponse: LeaderReplication._on_push_response,
        LeadershipTransferRequest: LeadershipTransfer._on_transfer_request,
        LeadershipTransferResponse: LeadershipTransfer._on_transfer_response,
    }

    # Everything a replica does because time passed, in the order a tick does it: the
    # role's own timers first, then those of every role. See `timers`.
    _LEADER_TIMERS = (
        Timer(
            "heartbeat round",
            Role.LEADER,
            Heartbeats._heartbeat_round_due_ms,
            Heartbeats._finish_heartbeat_round,
        ),
        Timer("heartbeat", Role.LEADER, Heartbeats._heartbeat_due_ms, Heartbeats._send_heartbeats),
        Timer(
            "commit push",
            Role.LEADER,
            LeaderReplication._commit_push_due_ms,
            LeaderReplication._send_commit_updates,
        ),
        Timer("lease", Role.LEADER, Heartbeats._lease_expiry_ms, Heartbeats._lose_lease),
        Timer(
            "preferred leader",
            Role.LEADER,
            LeadershipTransfer._preferred_check_due_ms,
            LeadershipTransfer._check_preferred_leader,
        ),
        Timer(
            "replication",
            Role.LEADER,
            LeaderReplication._replication_due_ms,
            LeaderReplication._replicate_all,
        ),
    )
    _TIMERS = (
        *_LEADER_TIMERS,
        Timer("leader lost", Role.FOLLOWER, Heartbeats._leader_lost_ms, Heartbeats._lose_leader),
        Timer("campaign", Role.CANDIDATE, Election._campaign_due_ms, Election._campaign),
        Timer("vote round", Role.CANDIDATE, Election._round_due_ms, Election._finish_round),
        Timer("pending appends", None, _pending_due_ms, _expire_pending),
        Timer(
            "transfer",
            None,
            LeadershipTransfer._transfer_due_ms,
            LeadershipTransfer._check_transfer,
        ),
    )
