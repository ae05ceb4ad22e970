"""The leader's dispatcher: what it pushes to each follower, and the commit rule.

DLedger HEAD's `DLedgerEntryPusher`, one `Progress` per follower: COMPARE to find
where the logs agree, TRUNCATE to cut a follower's disagreeing suffix (or restart a
follower left behind retention at our beginning, after a snapshot of the application's
state: core.snapshot), then pipelined APPENDs. Raft's
commit rule: an entry is committed once a quorum holds it durably and it belongs
to the leader's own term.
"""

from __future__ import annotations

import math

from raftmq.dledger.codes import Code, PushType, Role
from raftmq.dledger.core.fsync_health import UNKNOWN_US
from raftmq.dledger.core.messages import (
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    PushRequest,
    PushResponse,
)
from raftmq.dledger.core.progress import Progress
from raftmq.dledger.core.snapshot import SnapshotSend

# A new commit index waits this long for an APPEND push to carry it before a COMMIT
# push goes out alone: under load it rides along for free, idle it arrives promptly.
COMMIT_LINGER_MS = 2.0


class LeaderReplication:
    """The leader's side of replication: one `Progress` per follower (`progress`), and
    when a COMMIT push is due. The log, the commit index and the persisted index are
    the replica's: read there; the commit index moves through `Replica.set_committed`.
    Writes its two timers' deadlines into the replica's timer table: the COMMIT push,
    and replication's, the earliest of each follower's (`_due_ms_by_peer`), which is
    worked out again whenever that follower's progress moves or the log grows (every
    leader append is followed by `replicate_all`). The pushes one event makes are sent
    together at its end (`_send_pushes`), one hand-over to the replica per event
    rather than one per push.
    """

    def __init__(self, replica) -> None:
        self._r = replica
        self._due_ms = replica.timers.due_ms
        self.progress: dict[str, Progress] = {}
        self._due_ms_by_peer: dict[str, float] = {}
        self._pushes: list = []  # requests made by the event being handled, in order
        self._set_commit_push(math.inf)
        self._rearm_all()

    # ------------------------------------------------------------------ role changes
    def start_leading(self) -> None:
        """A new leader knows nothing of its followers: it COMPAREs at its own end."""
        r = self._r
        window = r.config.max_pending_pushes
        self.progress = {p: Progress.for_new_leader(r.store.end_index, window) for p in r.peers}
        self._rearm_all()

    def members_changed(self) -> None:
        """A leader's configuration changed: a new member is probed from our end, as
        every follower is when a leader starts; a removed one is no longer replicated to."""
        r = self._r
        window = r.config.max_pending_pushes
        old, self.progress = self.progress, {}
        for peer in r.peers:
            self.progress[peer] = old.get(peer) or Progress.for_new_leader(
                r.store.end_index, window
            )
        self._rearm_all()

    def stop_leading(self) -> None:
        self.progress.clear()
        self._rearm_all()
        self._set_commit_push(math.inf)

    def peer_answered(self, peer: str, verified_index: int, now_ms: float) -> None:
        """`peer` answered a beat, knowing its log agrees with ours up to
        `verified_index`: replication to it resumes if a push had failed, and starts
        again with a COMPARE if it has forgotten what it acknowledged (it restarted),
        so that it learns our commit index with nothing written."""
        prog = self.progress.get(peer)
        if prog is not None and (prog.resume() or prog.forgotten(verified_index)):
            self._replicate(peer, prog, now_ms)
            self._rearm(peer, prog)
            self._send_pushes()

    def send_failed(self, msg: PushRequest) -> None:
        prog = self.progress.get(msg.remote_id)
        if prog is None:  # removed since
            return
        prog.stall()
        self._rearm(msg.remote_id, prog)

    # ------------------------------------------------------------------ the timers' deadlines
    def _rearm(self, peer: str, prog: Progress) -> None:
        """`peer`'s progress moved: when the leader next has something to send it or a
        push to it times out, and so the earliest of all."""
        r = self._r
        due_ms = prog.deadline_ms(r.store.end_index, r.config.max_push_timeout_ms)
        by_peer = self._due_ms_by_peer
        by_peer[peer] = math.inf if due_ms is None else due_ms
        self._due_ms["replication"] = min(by_peer.values())

    def _rearm_all(self) -> None:
        self._due_ms_by_peer.clear()
        self._due_ms["replication"] = math.inf
        for peer, prog in self.progress.items():
            self._rearm(peer, prog)

    def _set_commit_push(self, at_ms: float) -> None:
        self._due_ms["commit push"] = at_ms

    def peer_fsyncs(self, peer: str, p99_us: int) -> None:
        """`peer`'s own fsyncs' p99 as it reported it (core.fsync_health)."""
        prog = self.progress.get(peer)
        if prog is not None:
            prog.fsync_p99_us = p99_us

    def fsync_p99_us(self, peer: str) -> int:
        """`peer`'s own fsyncs' p99 at its last heartbeat answer; UNKNOWN_US if none."""
        prog = self.progress.get(peer)
        return UNKNOWN_US if prog is None else prog.fsync_p99_us

    def disk_full(self, peer: str) -> bool:
        """Whether `peer` last answered DISK_FULL and has stored nothing of ours since."""
        prog = self.progress.get(peer)
        return prog is not None and prog.disk_full

    def match_index(self, peer: str) -> int | None:
        """How far `peer` holds our log durably, if it is a follower of ours."""
        prog = self.progress.get(peer)
        return None if prog is None else prog.match_index

    # ------------------------------------------------------------------ pushes
    def log_grew(self, now_ms: float) -> None:
        """Entries were appended to our log: push them to every follower, and commit
        them at once if that is already a quorum (a group of one, or acks that do not
        wait for the disk)."""
        self.replicate_all(now_ms)
        self.advance_commit(now_ms)

    def replicate_all(self, now_ms: float) -> None:
        if self._r.role is not Role.LEADER:
            return
        for peer, prog in self.progress.items():
            self._replicate(peer, prog, now_ms)
            self._rearm(peer, prog)
        self._send_pushes()

    def _send_pushes(self) -> None:
        """Hand the replica the pushes this event made, in the order they were made."""
        if self._pushes:
            self._r.send_all(self._pushes)
            self._pushes = []

    def _push(self, peer: str, prog: Progress, push_type: PushType, pre_index: int, **extra) -> int:
        r = self._r
        seq = next(r.seqs)
        self._pushes.append(
            PushRequest(
                r.config.group,
                r.self_id,
                peer,
                r.self_id,
                r.term,
                push_type,
                pre_index,
                r.store.term_at(pre_index),
                r.committed_index,
                seq=seq,
                **extra,
            )
        )
        prog.sent_commit = r.committed_index
        return seq

    def _replicate(self, peer: str, prog: Progress, now_ms: float) -> None:
        if prog.stalled:
            return
        store = self._r.store
        cfg = self._r.config
        timeout_ms = cfg.max_push_timeout_ms
        if prog.state is PushType.APPEND:
            if now_ms >= prog.inflight.oldest_sent_ms + timeout_ms:  # inf: none out
                prog.resend_unacknowledged()
            while prog.next_index <= store.end_index and not prog.inflight.full:
                blob, count = store.read_encoded(prog.next_index, cfg.max_batch_push_bytes)
                pre = prog.next_index - 1
                seq = self._push(peer, prog, PushType.APPEND, pre, entries=blob, count=count)
                prog.appended(seq, count, now_ms)
            assert prog.next_index <= store.end_index + 1, (prog.next_index, store.end_index)
            return
        if prog.probing:
            if now_ms < prog.probe_sent_ms + timeout_ms:
                return
            prog.probe_timed_out()
        if prog.state is PushType.COMPARE:
            pre = prog.next_index - 1
            if pre < store.begin_index - 1:
                if self._r.snapshot_source is not None and prog.needs_snapshot(store.begin_index):
                    self._send_snapshot(peer, prog, now_ms)
                    return
                self._send_truncate(peer, prog, now_ms, reset=True)
                return
            prog.probe_sent(self._push(peer, prog, PushType.COMPARE, pre), now_ms)
        else:
            self._send_truncate(peer, prog, now_ms, reset=False)

    def _send_truncate(self, peer: str, prog: Progress, now_ms: float, reset: bool) -> None:
        """TRUNCATE after `next_index - 1`, or reset a follower we left behind to our start."""
        store = self._r.store
        prog.become_probe(PushType.TRUNCATE, store.begin_index if reset else prog.next_index)
        pre = prog.next_index - 1
        reset_pos, members = -1, ""
        if reset:
            reset_pos = store.get(store.begin_index).pos if not store.empty else store.end_pos
            # the configuration in force at `pre` if an entry we no longer hold set it:
            # one still in our log reaches the follower with the entries, and a
            # start-up one (index -1) is every member's own dLegerPeers
            state = self._r.members.truncated(pre)
            if 0 <= state.current.index <= pre:
                members = state.text()
        seq = self._push(
            peer,
            prog,
            PushType.TRUNCATE,
            pre,
            term_runs=self._term_runs(pre + 1, store.end_index),
            leader_end_index=store.end_index,
            reset_pos=reset_pos,
            members=members,
        )
        prog.probe_sent(seq, now_ms)

    def _send_snapshot(self, peer: str, prog: Progress, now_ms: float) -> None:
        """The next chunk of the snapshot `peer` needs before its log can restart at our
        beginning (core.snapshot), taking one from the application if none is under way
        or retention moved our beginning past the one that is."""
        r = self._r
        begin = r.store.begin_index
        sending = prog.snapshot
        if sending is None or sending.index < begin - 1:
            # the application's state is of committed entries, though not always of
            # ones we know are (a restarted leader learns its commit index anew)
            index, data = r.snapshot_source()
            if index < begin - 1:  # the application lags our beginning: try again later
                prog.snapshot = None
                prog.stall()
                return
            sending = prog.snapshot = SnapshotSend(index, data)
        chunk = sending.chunk(r.config.max_batch_push_bytes)
        seq = next(r.seqs)
        self._pushes.append(
            InstallSnapshotRequest(
                r.config.group,
                r.self_id,
                peer,
                r.self_id,
                r.term,
                sending.index,
                len(sending.data),
                sending.acked_bytes,
                chunk,
                seq=seq,
            )
        )
        prog.probe_sent(seq, now_ms)

    def on_snapshot_response(self, resp: InstallSnapshotResponse, now_ms: float) -> None:
        self._answered(self._on_snapshot_response, resp, now_ms)

    def _on_snapshot_response(self, resp: InstallSnapshotResponse, now_ms: float) -> None:
        prog = self.progress.get(resp.local_id)
        if prog is None or resp.term != self._r.term:
            return
        sending = prog.snapshot
        if sending is None or resp.index != sending.index or not prog.probe_answered(resp.seq):
            return
        total = len(sending.data)
        if resp.code not in (Code.SUCCESS, Code.INCONSISTENT_STATE) or not (
            0 <= resp.offset <= total
        ):
            prog.snapshot = None  # refused (its disk): a new one at its next beat
            prog.stall()
            return
        if resp.code == Code.SUCCESS and resp.offset == total:
            prog.snapshot_installed()
        else:  # the next chunk, or where the follower stands (it lost what it had)
            sending.acked_bytes = resp.offset
        self._replicate(resp.local_id, prog, now_ms)

    def _term_runs(self, low: int, high: int) -> list[tuple[int, int]]:
        """[(first index, term)] of our log over [low, high], oldest first."""
        store = self._r.store
        runs = []
        i = high
        while i >= low:
            first = max(low, store.first_index_of_term(i))
            runs.append((first, store.term_at(i)))
            i = first - 1
        runs.reverse()
        return runs

    # ------------------------------------------------------------------ answers
    def on_push_response(self, resp: PushResponse, now_ms: float) -> None:
        self._answered(self._on_push_response, resp, now_ms)

    def _answered(self, handle, resp, now_ms: float) -> None:
        """A follower's answer, to a push or a snapshot chunk: `handle` it while we lead
        in its term or a later one (a later one ends our leadership), then rearm the
        follower's timer and send what that made."""
        r = self._r
        if r.role is Role.LEADER:
            if resp.term > r.term:
                r.change_to_candidate(resp.term, now_ms)
            else:
                handle(resp, now_ms)
        prog = self.progress.get(resp.local_id)
        if prog is not None:
            self._rearm(resp.local_id, prog)
        self._send_pushes()

    def _on_push_response(self, resp: PushResponse, now_ms: float) -> None:
        r = self._r
        store = r.store
        prog = self.progress.get(resp.local_id)
        if prog is None or resp.index > store.end_index:  # vouching for what we never sent
            return
        if resp.code == Code.TERM_NOT_READY:  # it adopts our term at its next step: retry then
            prog.become_probe(PushType.COMPARE, max(prog.match_index + 1, store.begin_index))
            return
        if resp.term != r.term:
            return
        if resp.type == PushType.APPEND:
            if not prog.inflight.free(resp.seq):
                return
            if resp.code == Code.SUCCESS:
                self._matched(prog, resp.index, now_ms)
                self._replicate(resp.local_id, prog, now_ms)
            elif resp.code == Code.INCONSISTENT_STATE:
                # from our beginning at the lowest, unless its log ends before that
                next_index = min(max(prog.match_index + 1, store.begin_index), resp.end_index + 1)
                prog.become_probe(PushType.COMPARE, next_index)
                self._replicate(resp.local_id, prog, now_ms)
            elif resp.code == Code.DISK_FULL:  # it wrote nothing: try again at its next beat
                prog.stall()
                prog.disk_full = True
            return
        if resp.type == PushType.COMMIT or not prog.probe_answered(resp.seq):
            return
        if resp.code == Code.DISK_FULL:  # a reset found no room
            prog.stall()
            prog.disk_full = True
            return
        if resp.type == PushType.COMPARE:
            self._on_compare_response(prog, resp, now_ms)
        elif resp.code == Code.SUCCESS:  # TRUNCATE done: the follower is a prefix of our log
            self._matched(prog, resp.index, now_ms)
            prog.become_replicate(resp.index + 1)
            prog.log_reset()
        else:
            # A refused TRUNCATE: compare again, but at the follower's next heartbeat
            # answer, not at once; resent at once, a refusal that repeats (a reset that
            # would cut its committed entries) became a loop at network speed.
            prog.become_probe(PushType.COMPARE, prog.next_index)
            prog.stall()
            return
        self._replicate(resp.local_id, prog, now_ms)

    def _on_compare_response(self, prog: Progress, resp: PushResponse, now_ms: float) -> None:
        store = self._r.store
        compare_index = prog.next_index - 1
        if resp.code == Code.SUCCESS:
            if resp.end_index > compare_index:
                prog.become_probe(PushType.TRUNCATE, prog.next_index)
            else:
                self._matched(prog, compare_index, now_ms)
                prog.become_replicate(compare_index + 1)
            return
        if resp.code != Code.INCONSISTENT_STATE:
            return  # try again after the push timeout
        if resp.begin_index > store.end_index + 1:
            # No follower's log begins past our end: it deletes only what it knows is
            # committed, and we hold that. The peer's word only: try again after the
            # push timeout (comparing there read a term we do not hold).
            return
        if resp.x_term != -1:
            next_index = min(resp.x_index, compare_index)
        else:
            next_index = min(compare_index, resp.end_index + 1)
        if resp.begin_index > next_index:
            # The follower lacks what we would compare: compare where its log begins (it
            # knows the term before its first entry), or, if ours begins later still,
            # restart it at our beginning. Jumping to our beginning when the follower's
            # lies past it (its retention went further than ours) sent it a reset that
            # would cut its committed entries, which it refuses, again and again.
            next_index = max(resp.begin_index, store.begin_index - 1)
        prog.become_probe(PushType.COMPARE, next_index)

    def _matched(self, prog: Progress, index: int, now_ms: float) -> None:
        assert index <= self._r.store.end_index, (index, self._r.store.end_index)
        if prog.matched(index):
            self.advance_commit(now_ms)

    # ------------------------------------------------------------------ commit
    def advance_commit(self, now_ms: float) -> None:
        """Raft's commit rule: the highest index a quorum holds durably (our own
        persisted index counted), once it is of our own term. A new commit index is
        told to idle followers after COMMIT_LINGER_MS."""
        r = self._r
        if r.role is not Role.LEADER:
            return
        matches = [self.progress[p].match_index for p in r.voter_peers]
        if r.is_voter:
            matches.append(r.persisted_index)
        matches.sort(reverse=True)
        candidate = matches[r.quorum - 1]
        if candidate > r.committed_index and r.store.term_at(candidate) == r.term:
            r.set_committed(candidate)
            if not r.is_voter:  # a leader removing itself: rare, so off the send's walk
                r.leave_if_removed(now_ms)
                if r.role is not Role.LEADER:
                    return
            if self._due_ms["commit push"] == math.inf:
                self._set_commit_push(now_ms + COMMIT_LINGER_MS)

    def send_commit_updates(self, now_ms: float) -> None:
        """Tell idle followers the commit index (busy ones learned it from APPEND pushes)."""
        r = self._r
        self._set_commit_push(math.inf)
        for peer, prog in self.progress.items():
            if (
                prog.state is PushType.APPEND
                and prog.sent_commit < r.committed_index
                and prog.next_index > r.store.end_index
            ):
                self._push(peer, prog, PushType.COMMIT, prog.match_index)
        self._send_pushes()
