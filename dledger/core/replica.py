"""One DLedger replica as a deterministic state machine (no I/O, no clock, no threads).

The driver feeds it events — `tick(now_ms)`, `receive(message, now_ms)`, `append(...)`,
`persisted(index, generation, now_ms)`, `hard_state_saved()`, `transfer_leadership(...)`
— and after each one takes, in one call, a `Ready` of everything to do (`ready()`:
the outputs it may carry out, the term and vote to save, the next deadline). Time is
milliseconds supplied by the caller and randomness comes from the `random.Random`
it is given, so the simulator replays any schedule exactly.

The protocol lives beside this module, one part each, composed into `Replica`:
`election` (campaign and vote, after DLedger's `DLedgerLeaderElector`), `heartbeat`
(beats and the lease), `replication` (the leader's dispatcher and the commit rule,
after DLedger HEAD's `DLedgerEntryPusher`), `follower` (its `EntryHandler`),
`pending` (client appends awaiting commit), `transfer` (leadership transfer) and
`snapshot` (the application's state for a follower restarted at our first entry).
Each part owns its own fields. The replica owns what they share — term and vote,
role and leader, the log and its commit and persisted indexes, the output — and
changes it only here: the role changes, `next_term` and `vote`, `set_committed`,
`log_truncated`, `after_local_append`, `out_of_room`. What is done because time
passed is one table, `_TIMERS` (`timers.TimerTable`), from which both `tick` and
`next_deadline_ms` are derived; each part writes its own timers' deadlines there when
its state changes, so asking for the next deadline asks no part.

Two departures from DLedger, both for safety: term and vote are durable before any
message that depends on them leaves (see `output.Handoff`), and a follower that learns its
leader from a heartbeat records it as its vote, closing DLedger's two-leaders-in-one-
term window. Replication uses Raft's commit rule: an entry is committed once a quorum
holds it durably and it belongs to the leader's own term; a new leader appends a
NOOP so inherited entries commit promptly.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from raftmq.dledger.codes import Code, EntryType, Role, VoteResult
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.core.election import Election, VoteRound
from raftmq.dledger.core.follower import FollowerReplication
from raftmq.dledger.core.fsync_health import FsyncLatency
from raftmq.dledger.core.heartbeat import Heartbeats
from raftmq.dledger.core.membership import Change, Members, MemberState
from raftmq.dledger.core.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    PushRequest,
    PushResponse,
    VoteRequest,
    VoteResponse,
)
from raftmq.dledger.core.output import Completion, Handoff, Output, Ready
from raftmq.dledger.core.pending import PendingAppends
from raftmq.dledger.core.replication import LeaderReplication
from raftmq.dledger.core.snapshot import SnapshotReceiver
from raftmq.dledger.core.timers import Timer, TimerTable
from raftmq.dledger.core.transfer import LeadershipTransfer
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.base import LogStore

from raftmq.disk.filesystem import DiskFull


class Replica:
    """The state the parts share, the events a driver feeds, and the role changes."""

    def __init__(
        self,
        config: DLedgerConfig,
        store: LogStore,
        rng: random.Random,
        term: int = 0,
        vote_for: str | None = None,
        now_ms: float = 0.0,
        members: MemberState | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.rng = rng
        self.self_id = config.self_id
        if members is None:
            learners = (config.self_id,) if config.join_as_learner else ()
            first = Members.initial(config.peers, learners)
            members = MemberState(first, first)
        # a configuration whose entry a crash took (written, not yet synced) is not in force
        self.members = members.truncated(store.end_index)
        self._members_view()
        self.term = term
        self.vote_for = vote_for
        # (term, vote) as last handed to the driver to make durable (`_save_hard_state`)
        self._hard_state = (term, vote_for)
        self._saved_members = self.members
        self.role = Role.CANDIDATE
        self.leader_id: str | None = None
        self.committed_index = -1
        self.persisted_index = store.end_index  # what survived a restart is on disk
        # DLedger's isDiskFull: set by the driver's disk check, or by a segment that
        # found no room; appends are refused (DISK_FULL) while it holds.
        self.disk_full = False
        # our own fsyncs' latency, as the driver reports them (`persisted`)
        self.fsync_latency = FsyncLatency(
            config.leader_slow_fsync_window_ms, enabled=config.leader_slow_fsync_ms > 0
        )
        # on a leader: follower -> (its match index, since when), as retention last saw
        # it; and the followers retention no longer waits for (`retention_floor`)
        self._progress_seen: dict[str, tuple[int, float]] = {}
        self.stalled_followers: frozenset[str] = frozenset()
        self._out = Output()
        self._handoff = Handoff()  # holds outputs behind the saves of term and vote
        if self.members is not members:  # the saved one's entry is gone: save the prior
            self._out.hard_state, self._out.members = self._hard_state, self.members
        self.seqs = itertools.count(1)  # numbers the requests we send (`next(r.seqs)`)
        self.timers = TimerTable(self._TIMERS)  # written by the parts below, from here on
        self.pending = PendingAppends(self.timers.due_ms)
        self.election = Election(self, term, vote_for, now_ms)
        self.heartbeats = Heartbeats(self, now_ms)
        self.replication = LeaderReplication(self)
        self.follower = FollowerReplication(self)
        self.transfers = LeadershipTransfer(self, now_ms)
        self.snapshots = SnapshotReceiver(self)
        # The application's snapshot as of an entry it applied, `() -> (index, bytes)`,
        # set by the driver: a follower the leader must restart at its first entry
        # gets one first (core.snapshot). None: restarted without one.
        self.snapshot_source: Callable[[], tuple[int, bytes]] | None = None
        # counted for monitoring (dledger.metrics), at rare events only
        self.elections_won = 0
        self.leaders_seen = 0  # leaders recognised (ourselves included), one per term at most

    # ------------------------------------------------------------------ public surface
    def ready(self) -> Ready:
        """Everything the driver has to do since the last Ready, in one record: the
        outputs it may carry out now (none that a save of term and vote still holds),
        the save to start, and the next deadline."""
        return self._handoff.ready(self.take_output(), self.next_deadline_ms())

    def hard_state_saved(self) -> None:
        """The save of term and vote the last Ready asked for is durable: what waited
        for it goes out with the next Ready."""
        self._handoff.hard_state_saved()

    def take_output(self) -> Output:
        """The effects of the events since the last take, none held back: what the
        protocol did, for tests of its rules (a driver takes `ready`)."""
        out, self._out = self._out, Output()
        return out

    @property
    def following(self) -> bool:
        """Not the leader: what this replica appends comes from a leader's pushes (the
        group-commit schedule fsyncs those on the loop, `core.group_commit`)."""
        return self.role is not Role.LEADER

    @property
    def lease_ms(self) -> float:
        """maxHeartBeatLeak beats: how long a follower waits for its leader, and how
        long a leader leads without hearing a quorum."""
        return self.config.heartbeat_interval_ms * self.config.max_heartbeat_leak

    def next_deadline_ms(self) -> float:
        """The earliest time `tick` has something to do."""
        return self.timers.next_deadline_ms(self.role)

    def tick(self, now_ms: float) -> None:
        self.timers.fire_due(self, now_ms)
        self._check_invariants()

    def receive(self, msg, now_ms: float) -> None:
        """Handle a peer message. An answer (negative KIND) naming a sender that is not
        another member is dropped: a stranger's vote or beat must not count toward a
        quorum or a lease. Requests from strangers get DLedger's refusals."""
        if msg.KIND < 0 and msg.local_id not in self._other_members:
            return
        if isinstance(msg, VoteResponse) and msg.local_id not in self.voters:
            return  # a learner's or a removed member's vote never counts
        handler = self._HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, msg, now_ms)
        self._check_invariants()

    def send_failed(self, msg, now_ms: float) -> None:
        """The transport could not deliver `msg` (connection refused or reset)."""
        if isinstance(msg, VoteRequest):
            self.election.send_failed(msg, now_ms)
        elif isinstance(msg, HeartBeatRequest):
            self.heartbeats.send_failed(msg)
        elif (
            isinstance(msg, PushRequest | InstallSnapshotRequest)
            and self.role is Role.LEADER
            and msg.term == self.term
        ):
            self.replication.send_failed(msg)
        self._check_invariants()

    def append(self, handle: int, bodies: list[bytes], now_ms: float) -> Code:
        """Append one client request's entries as leader; see `append_batch`."""
        return self.append_batch([(handle, bodies)], now_ms)[0]

    def append_batch(self, requests: list[tuple[int, list[bytes]]], now_ms: float) -> list[Code]:
        """Append several client requests at once (one store write, one push per follower).

        Returns, per request, SUCCESS when accepted for replication — its outcome then
        arrives as a Completion — or the code to answer with at once.
        """
        codes = []
        items = []
        accepted = []
        waiting = self.pending.waiting
        for handle, bodies in requests:
            code = self._admit(bodies, waiting + len(accepted))
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
            self.out_of_room()
            return [Code.DISK_FULL if code is Code.SUCCESS else code for code in codes]
        self.after_local_append()
        deadline_ms = now_ms + self.config.max_wait_ack_time_ms
        self.pending.add(self.term, accepted, positions, deadline_ms)
        self.replication.log_grew(now_ms)
        self._check_invariants()
        return codes

    def _admit(self, bodies: list[bytes], waiting: int) -> Code:
        """Whether one request may be appended now, `waiting` appends already pending."""
        if self.role is not Role.LEADER:
            return Code.NOT_LEADER
        if self.transfers.current is not None or not self.is_voter:
            # handing leadership over, or leaving: what we appended now would wait out
            # maxWaitAckTimeMs once we step down (no later leader answers it here)
            return Code.LEADER_TRANSFERRING
        if not bodies:
            return Code.REQUEST_WITH_EMPTY_BODYS
        if waiting >= self.config.max_pending_requests:
            return Code.LEADER_PENDING_FULL
        if self.disk_full:
            return Code.DISK_FULL
        return Code.SUCCESS

    def change_members(
        self, handle: int, change: Change, member: str, address: str, now_ms: float
    ) -> Code:
        """Admin: append the configuration with one member added as a learner, promoted
        to voter or removed (see `membership`). SUCCESS: its outcome arrives as a
        Completion once committed. Refused while we do not lead, hand over leadership,
        have not committed an entry of our own term (Raft's fix to single-step changes)
        or still wait for the last change to commit; a learner is promoted only once it
        is within maxLeadershipTransferWaitIndex entries of our end. ValueError, saying
        why in one line, for a change that does not apply to the configuration."""
        if self.role is not Role.LEADER:
            return Code.NOT_LEADER
        if self.transfers.current is not None:
            return Code.LEADER_TRANSFERRING
        current = self.members.current
        if (
            self.committed_index < 0
            or self.store.term_at(self.committed_index) != self.term
            or current.index > self.committed_index
        ):
            return Code.LEADER_NOT_READY
        members = current.changed(change, member, address, self.store.end_index + 1)
        if change is Change.PROMOTE:
            behind = self.store.end_index - self.replication.match_index(member)
            if behind >= self.config.max_leadership_transfer_wait_index:
                return Code.FALL_BEHIND_TOO_MUCH
        if self.disk_full:
            return Code.DISK_FULL
        try:
            positions = self.store.append_leader(self.term, [(EntryType.NOOP, members.body())])
        except DiskFull:
            self.out_of_room()
            return Code.DISK_FULL
        assert positions[0][0] == members.index, (positions, members.index)
        self.after_local_append()
        deadline_ms = now_ms + self.config.max_wait_ack_time_ms
        self.pending.add(self.term, [(handle, 1)], positions, deadline_ms)
        self._set_members(self.members.appended(members), now_ms)
        self.replication.log_grew(now_ms)
        self.replication.advance_commit(now_ms)  # a group of one commits at once
        self._check_invariants()
        return Code.SUCCESS

    def members_appended(self, blob: bytes) -> None:
        """Entries `blob` (as the store encodes them) were appended to our log as a
        follower: the configurations among them are in force from now on."""
        state = self.members
        for offset, etype, size, index, _term, _pos, _chain in codec.iter_entries(blob):
            if etype == EntryType.NOOP and size > codec.HEADER_SIZE:
                body = bytes(blob[offset + codec.HEADER_SIZE : offset + size])
                members = Members.from_body(body, index)
                if members is not None:
                    state = state.appended(members)
        if state is not self.members:
            self._set_members(state, now_ms=None)

    def members_reset(self, state: MemberState) -> None:
        """Our log was restarted at the leader's beginning, past the entries that set
        the configuration then in force: the leader's, `state`, is ours from now on."""
        assert self.role is Role.FOLLOWER, self.role
        if state != self.members:
            self._set_members(state, now_ms=None)

    def _set_members(self, state: MemberState, now_ms: float | None) -> None:
        """Put the configuration `state` in force now, and have it saved with the term
        and vote (before anything that follows it leaves); `now_ms` for a leader."""
        self.members = state
        self._members_view()
        if self.role is Role.LEADER:
            assert now_ms is not None
            self.replication.members_changed()
            self.heartbeats.members_changed(now_ms)
        self._save_hard_state()

    def _members_view(self) -> None:
        """Who we talk to and what a quorum is, from the configuration in force."""
        current = self.members.current
        self.voters = frozenset(current.voters)
        self.is_voter = self.self_id in self.voters
        self.peers = [p for p in current.ids if p != self.self_id]
        self.voter_peers = [p for p in current.voters if p != self.self_id]
        self._other_members = frozenset(self.peers)
        self.peer_count = len(current.voters)
        self.quorum = current.quorum
        self.known_members = frozenset(current.ids) | frozenset(self.members.prior.ids)

    def leave_if_removed(self, now_ms: float) -> None:
        """A leader whose own removal committed steps down, asking the voter furthest
        along to take over at once; not a voter, it never campaigns again. Called only
        once we are no longer a voter (the commit path checks that first)."""
        assert not self.is_voter, self.members
        if self.role is Role.LEADER and self.members.current.index <= self.committed_index:
            # Nothing is left to answer: no append was taken once the removal was
            # appended (`_admit`), and every one before it committed with it.
            assert not self.pending.waiting, self.pending.waiting
            self.transfers.hand_over()
            self.change_to_candidate(self.term, now_ms)

    def transfer_leadership(self, handle: int, transferee: str, now_ms: float) -> Code:
        """Admin: hand leadership to `transferee`; see `transfer`."""
        return self.transfers.transfer_leadership(handle, transferee, now_ms)

    def holds_lease(self, now_ms: float) -> bool:
        """Whether this replica leads with its lease at `now_ms`; see `heartbeat`."""
        return self.heartbeats.holds_lease(now_ms)

    def fsync_took(self, took_ms: float, now_ms: float) -> None:
        """One of our fsyncs completed, taking `took_ms` (kept only with
        leaderSlowFsyncMs set: the default send path does not go there)."""
        if self.fsync_latency.enabled:
            self.fsync_latency.record(took_ms, now_ms)

    def set_disk_full(self, full: bool, now_ms: float) -> None:
        """The driver's disk check: whether the store's filesystem is over diskFullRatio.
        Back under it, a leader whose NOOP found no room appends it now, so that what
        it inherited commits."""
        self.disk_full = full
        if not full and self.role is Role.LEADER and self.store.end_term < self.term:
            self._append_noop()
            self.replication.log_grew(now_ms)
        self._check_invariants()

    def retention_floor(self, now_ms: float, keep_ms: float) -> int:
        """The lowest index retention may not delete past.

        Nothing uncommitted, and nothing a follower heard from within `keep_ms` still
        lacks. A follower silent for longer is not waited for: when it returns, the
        leader finds its next entry gone and restarts its log at the leader's beginning
        (a TRUNCATE with reset), as DLedger 0.3.1.2 does. Nor is one that answers
        heartbeats but has lacked committed entries without storing any of them for
        followerStallTimeoutMs (`stalled_followers`): a full or stuck disk there would
        otherwise fill ours. Progress is seen at each call (the driver's retention turns).
        """
        floor = self.committed_index + 1
        if self.role is not Role.LEADER:
            self._progress_seen, self.stalled_followers = {}, frozenset()
            return floor
        stall_ms, stalled, seen_now = self.config.follower_stall_timeout_ms, set(), {}
        for peer, prog in self.replication.progress.items():
            seen = self._progress_seen.get(peer)
            caught_up = prog.match_index >= self.committed_index
            if caught_up or seen is None or seen[0] != prog.match_index:
                seen = (prog.match_index, now_ms)
            seen_now[peer] = seen
            if now_ms - seen[1] > stall_ms:
                stalled.add(peer)
            elif self.heartbeats.heard_within(peer, now_ms, keep_ms):
                floor = min(floor, prog.match_index + 1)
        self._progress_seen = seen_now
        self.stalled_followers = frozenset(stalled)
        return floor

    def snapshot_installed(self, index: int, ok: bool) -> None:
        """The driver installed the snapshot as of entry `index` an Output handed it (ok),
        or could not (the application kept its old state): the leader is answered."""
        self.snapshots.installed(index, ok)
        self._check_invariants()

    def persisted(
        self, index: int, generation: int, now_ms: float, took_ms: float | None = None
    ) -> None:
        """The driver's fsync covering entries up to `index` of store `generation`
        completed, taking `took_ms` when it synced anything (one call on the send path,
        not two)."""
        if took_ms is not None:
            self.fsync_took(took_ms, now_ms)
        if generation != self.store.generation or index <= self.persisted_index:
            return
        self.persisted_index = min(index, self.store.end_index)
        self.follower.flush_deferred_acks()
        if self.role is Role.LEADER:
            self.replication.advance_commit(now_ms)
        self._check_invariants()

    # ------------------------------------------------------------------ what the parts share
    def rand(self, low: float, high: float) -> float:
        return low + self.rng.random() * (high - low)

    def send(self, msg) -> None:
        self._out.messages.append(msg)

    def send_all(self, msgs: list) -> None:
        """Send `msgs`, in order (a round of pushes: one call, not one per push)."""
        self._out.messages += msgs

    def install_snapshot(self, index: int, data: bytes) -> None:
        """Have the driver install the application's snapshot as of entry `index`."""
        assert self._out.snapshot is None, "one snapshot at a time"
        self._out.snapshot = (index, data)

    def complete(self, completion: Completion) -> None:
        self._out.completions.append(completion)

    def answer_header(self, to: str) -> tuple:
        """DLedger's base fields of an answer from us to `to`: group, sender, receiver,
        the leader we know and our term."""
        return (self.config.group, self.self_id, to, self.leader_id, self.term)

    def out_of_room(self) -> None:
        """A write found no room for a new segment (and wrote nothing): refuse appends
        until the driver's disk check says there is room again (`set_disk_full`)."""
        self.disk_full = True

    def after_local_append(self) -> None:
        """Entries were written to our log: fsync them, or count them as durable at once
        when acks do not wait for the disk."""
        if self.config.ack_after_fsync:
            self._out.needs_sync = True
        else:
            self.persisted_index = self.store.end_index

    def entry_term(self, index: int) -> int:
        """The term of our entry at `index`, or -1 if we do not hold it."""
        if self.store.begin_index <= index <= self.store.end_index:
            return self.store.term_at(index)
        return -1

    def set_committed(self, index: int) -> None:
        """The commit index only rises, and only to an entry we hold: as leader, what
        Raft's commit rule found (`LeaderReplication.advance_commit`, where the
        followers' match indexes are); as follower, one our log agrees with the
        leader's up to. The appends it covers are answered (every entry past the commit
        index before is still in the log, so its term can be read there)."""
        assert self.committed_index < index <= self.store.end_index, (
            self.committed_index,
            index,
            self.store.end_index,
        )
        if self.role is not Role.LEADER:
            verified = self.follower.leader_verified_index
            assert index <= verified, (index, verified)
        self.committed_index = index
        self._out.committed_index = index
        self._out.completions.extend(self.pending.resolve(index, self.store.term_at))

    def log_truncated(self, new_end: int) -> None:
        """Our log was cut to end at `new_end`: what was durable past it is gone, and so
        are the appends waiting on entries there."""
        self.persisted_index = min(self.persisted_index, new_end)
        self._out.completions.extend(self.pending.drop_lost(self.entry_term))
        state = self.members.truncated(new_end)
        if state is not self.members:
            assert self.role is not Role.LEADER, "a leader never cuts its log"
            self._set_members(state, now_ms=None)

    def _expire_pending(self, now_ms: float) -> None:
        self._out.completions.extend(self.pending.expire(now_ms))

    def _check_invariants(self) -> None:
        """After every event: what is committed, counted as durable or known to agree
        with the leader is in our log; a leader neither counts nor sends past its end;
        no term or vote changed without being handed to the driver to make durable."""
        end = self.store.end_index
        assert self.committed_index <= end, (self.committed_index, end)
        assert self.persisted_index <= end, (self.persisted_index, end)
        verified = self.follower.leader_verified_index
        assert verified <= end, (verified, end)
        assert self._hard_state == (self.term, self.vote_for), self._hard_state
        assert self._saved_members is self.members, "a configuration in force is saved"
        progress = self.replication.progress
        assert self.role is Role.LEADER or not progress, self.role
        for peer, prog in progress.items():
            assert prog.match_index <= end and prog.next_index <= end + 1, (peer, prog, end)

    # ------------------------------------------------------------------ term, vote and role
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
        if self.members is not self._saved_members:
            self._saved_members = self._out.members = self.members

    def next_term(self, known_max_term: int) -> int:
        """Move to the highest term heard of, or the next one; no vote in it yet."""
        if known_max_term > self.term:
            self.term = known_max_term
        else:
            self.term += 1
        self.vote_for = None
        self.follower.new_term()
        self._save_hard_state()
        return self.term

    def vote(self, candidate: str) -> None:
        """Give our vote in this term to `candidate` (saved before the answer leaves)."""
        if self.vote_for != candidate:
            self.vote_for = candidate
            self._save_hard_state()

    def _set_role(self, role: Role) -> None:
        if role is self.role:
            return
        self.role = role
        self._out.role_changes.append((self.term, role))
        self.transfers.role_changed()

    def change_to_candidate(self, term: int, now_ms: float, campaign_at_once: bool = False) -> None:
        """DLedger's changeRoleToCandidate, having heard of `term`; `campaign_at_once`:
        move to the next term at the next campaign without waiting out a gap."""
        self.leader_id = None
        if self.role is Role.LEADER:
            self._leave_leadership()
        self.election.become_candidate(term, self.role is Role.CANDIDATE, now_ms)
        self._set_role(Role.CANDIDATE)
        if campaign_at_once:
            self.election.campaign_at_once()

    def change_to_follower(self, leader: str, now_ms: float) -> None:
        if self.role is Role.LEADER:
            self._leave_leadership()
        self.leader_id = leader
        self.leaders_seen += 1
        self.heartbeats.heard_leader(now_ms)
        self.election.forget_round()
        if self.vote_for is None:
            # DLedger leaves the vote empty here and may then accept a second candidate
            # in this term; recording the leader closes that window.
            self.vote(leader)
        self._set_role(Role.FOLLOWER)

    def become_leader(self, votes: VoteRound, now_ms: float) -> None:
        """Election safety: only a candidate, in the term its round was for, with a
        quorum of that term's votes (each voter gives one per term), and not in a term
        it may have led before a restart."""
        assert self.role is Role.CANDIDATE and self.leader_id is None, (self.role, self.leader_id)
        assert votes.term == self.term != self.election.never_lead_term, (votes.term, self.term)
        assert self.is_voter, self.members
        accepted = [v for v, result in votes.results.items() if result is VoteResult.ACCEPT]
        assert self.members.current.is_quorum(accepted), votes.results
        self.leader_id = self.self_id
        self.elections_won += 1
        self.leaders_seen += 1
        self.replication.start_leading()
        self.heartbeats.start_leading(now_ms)
        self.transfers.start_leading(now_ms)
        self._set_role(Role.LEADER)
        self._append_noop()
        # heartbeats and COMPAREs go out now
        self.timers.fire_due(self, now_ms, self._LEADER_TIMERS)
        self.replication.advance_commit(now_ms)

    def _append_noop(self) -> None:
        """A NOOP of our own term lets everything inherited commit without waiting for a
        client. On a disk with no room for it, `set_disk_full` appends it later."""
        assert self.role is Role.LEADER, self.role
        try:
            self.store.append_leader(self.term, [(EntryType.NOOP, b"")])
        except DiskFull:
            self.out_of_room()
            return
        self.after_local_append()

    def _leave_leadership(self) -> None:
        self.replication.stop_leading()
        self.heartbeats.stop_leading()

    # Each message type to the part that handles it.
    _HANDLERS = {
        VoteRequest: lambda r, msg, now_ms: r.election.on_vote_request(msg, now_ms),
        VoteResponse: lambda r, msg, now_ms: r.election.on_vote_response(msg, now_ms),
        HeartBeatRequest: lambda r, msg, now_ms: r.heartbeats.on_heartbeat(msg, now_ms),
        HeartBeatResponse: lambda r, msg, now_ms: r.heartbeats.on_heartbeat_response(msg, now_ms),
        PushRequest: lambda r, msg, now_ms: r.follower.on_push(msg, now_ms),
        PushResponse: lambda r, msg, now_ms: r.replication.on_push_response(msg, now_ms),
        LeadershipTransferRequest: lambda r, msg, now_ms: r.transfers.on_transfer_request(
            msg, now_ms
        ),
        LeadershipTransferResponse: lambda r, msg, now_ms: r.transfers.on_transfer_response(
            msg, now_ms
        ),
        InstallSnapshotRequest: lambda r, msg, now_ms: r.snapshots.on_request(msg, now_ms),
        InstallSnapshotResponse: lambda r, msg, now_ms: r.replication.on_snapshot_response(
            msg, now_ms
        ),
    }

    # Everything a replica does because time passed, in the order a tick does it: the
    # role's own timers first, then those of every role. See `timers`.
    _LEADER_TIMERS = (
        Timer(
            "heartbeat round",
            Role.LEADER,
            lambda r, now_ms: r.heartbeats.finish_round(now_ms),
        ),
        Timer(
            "heartbeat",
            Role.LEADER,
            lambda r, now_ms: r.heartbeats.send_heartbeats(now_ms),
        ),
        Timer(
            "commit push",
            Role.LEADER,
            lambda r, now_ms: r.replication.send_commit_updates(now_ms),
        ),
        Timer(
            "lease",
            Role.LEADER,
            lambda r, now_ms: r.heartbeats.lose_lease(now_ms),
        ),
        Timer(
            "leader placement",
            Role.LEADER,
            lambda r, now_ms: r.transfers.check_leader_placement(now_ms),
        ),
        Timer(
            "replication",
            Role.LEADER,
            lambda r, now_ms: r.replication.replicate_all(now_ms),
        ),
    )
    _TIMERS = (
        *_LEADER_TIMERS,
        Timer(
            "leader lost",
            Role.FOLLOWER,
            lambda r, now_ms: r.heartbeats.lose_leader(now_ms),
        ),
        Timer(
            "campaign",
            Role.CANDIDATE,
            lambda r, now_ms: r.election.campaign(now_ms),
        ),
        Timer(
            "vote round",
            Role.CANDIDATE,
            lambda r, now_ms: r.election.finish_round(now_ms),
        ),
        Timer(
            "pending appends",
            None,
            lambda r, now_ms: r._expire_pending(now_ms),
        ),
        Timer(
            "transfer",
            None,
            lambda r, now_ms: r.transfers.check_transfer(now_ms),
        ),
    )
