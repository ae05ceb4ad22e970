"""DLedger's election: the vote round a candidate tallies, the campaign, the voter.

The table in `VoteRound.parse` is DLedger's `DLedgerLeaderElector.maintainAsCandidate`,
first matching rule wins; `early_stop` is its condition for not waiting out the round.
A round first re-votes in the current term and only a WAIT_TO_VOTE_NEXT result moves
to the next term; voters check the log before the term, and a voter with a live
leader answers REJECT_ALREADY_HAS_LEADER.
"""

from __future__ import annotations

import math

import attrs
from raftmq.dledger.codes import ParseResult, Role, VoteResult
from raftmq.dledger.core.messages import VoteRequest, VoteResponse

_BIGGER_LEDGER = (VoteResult.REJECT_EXPIRED_LEDGER_TERM, VoteResult.REJECT_SMALL_LEDGER_END_INDEX)
_TERM_HINTS = (VoteResult.REJECT_EXPIRED_VOTE_TERM, VoteResult.REJECT_TERM_SMALL_THAN_LEDGER)


def is_quorum(count: int, peer_count: int) -> bool:
    return count >= peer_count // 2 + 1


@attrs.define(slots=True)
class VoteRound:
    term: int
    seq: int
    deadline_ms: float
    peer_count: int
    results: dict[str, VoteResult] = attrs.Factory(dict)
    known_max_term: int = -1

    def record(self, voter: str, result: VoteResult, voter_term: int) -> None:
        self.results[voter] = result
        if result in _TERM_HINTS:
            self.known_max_term = max(self.known_max_term, voter_term)

    def count(self, *results: VoteResult) -> int:
        return sum(1 for r in self.results.values() if r in results)

    def early_stop(self) -> bool:
        accepted = self.count(VoteResult.ACCEPT)
        return (
            self.count(VoteResult.REJECT_ALREADY_HAS_LEADER) > 0
            or is_quorum(accepted, self.peer_count)
            or is_quorum(accepted + self.count(VoteResult.REJECT_TERM_NOT_READY), self.peer_count)
            or len(self.results) >= self.peer_count
        )

    def parse(self) -> ParseResult:
        """DLedger's parse of a finished round (the caller applies the timing of each result)."""
        n = self.peer_count
        valid = len(self.results) - self.count(VoteResult.UNKNOWN)
        accepted = self.count(VoteResult.ACCEPT)
        if self.known_max_term > self.term:
            return ParseResult.WAIT_TO_VOTE_NEXT
        if self.count(VoteResult.REJECT_ALREADY_HAS_LEADER):
            return ParseResult.WAIT_TO_REVOTE
        if not is_quorum(valid, n):
            return ParseResult.WAIT_TO_REVOTE
        if not is_quorum(valid - self.count(*_BIGGER_LEDGER), n):
            return ParseResult.WAIT_TO_REVOTE
        if is_quorum(accepted, n):
            return ParseResult.PASSED
        if is_quorum(accepted + self.count(VoteResult.REJECT_TERM_NOT_READY), n):
            return ParseResult.REVOTE_IMMEDIATELY
        return ParseResult.WAIT_TO_VOTE_NEXT

    def backoff_ms(self, result: ParseResult, lease_ms: float, max_vote_ms: float) -> float:
        """Extra wait before the next round on top of the random vote gap."""
        if result is ParseResult.WAIT_TO_REVOTE:
            if self.count(VoteResult.REJECT_ALREADY_HAS_LEADER):
                return lease_ms
            valid = len(self.results) - self.count(VoteResult.UNKNOWN)
            if is_quorum(valid, self.peer_count):  # others have newer logs: let them win
                return max_vote_ms
        return 0.0


class Election:
    """The candidate's campaign and the voter's answer, as DLedger's leader elector has them.

    Owns the campaign's state: the highest term heard of (`known_max_term`), whether to
    move to the next term at once, the last round's result, when the next round starts
    and the round in progress. The term and vote are the replica's: it changes them
    (`next_term`, `vote`), and saves them before anything that depends on them leaves.
    The round, when the next one is due and whether to move on at once decide its two
    timers' deadlines (the campaign, the round's end): setting any of them writes those
    into the replica's timer table.
    """

    def __init__(self, replica, term: int, vote_for: str | None, now_ms: float) -> None:
        self._r = replica
        self._due_ms = replica.timers.due_ms
        self._round: VoteRound | None = None
        self._next_vote_ms = math.inf
        self._need_increase_term_immediately = False
        # No round of our own in this term before this time: a candidate whose vote
        # request moved us into its term (REJECT_TERM_NOT_READY) is owed the round it
        # revotes in.
        self._yield_term = -1
        self._yield_until_ms = -math.inf
        cfg = replica.config
        self.known_max_term = term
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        # A restart that finds our own vote for this term: we may have led it, and a crash
        # may have cost us entries of it that followers kept, so we must never lead it
        # again (a win in it counts as WAIT_TO_VOTE_NEXT). We do not skip ahead to the next
        # term at once either: a live leader would be deposed by our higher term.
        self.never_lead_term = term if vote_for == cfg.self_id else -1
        self.next_vote_ms = now_ms + replica.rand(0, cfg.max_vote_interval_ms)
        self.vote_rounds_started = 0  # for monitoring (dledger.metrics)

    # ------------------------------------------------------------------ the timers' deadlines
    @property
    def round(self) -> VoteRound | None:
        """The vote round in progress."""
        return self._round

    @round.setter
    def round(self, vote_round: VoteRound | None) -> None:
        self._round = vote_round
        self._rearm()

    @property
    def next_vote_ms(self) -> float:
        """When the next round starts (after the vote gap)."""
        return self._next_vote_ms

    @next_vote_ms.setter
    def next_vote_ms(self, at_ms: float) -> None:
        self._next_vote_ms = at_ms
        self._rearm()

    @property
    def need_increase_term_immediately(self) -> bool:
        """Move to the next term at the next campaign, without waiting out a gap."""
        return self._need_increase_term_immediately

    @need_increase_term_immediately.setter
    def need_increase_term_immediately(self, at_once: bool) -> None:
        self._need_increase_term_immediately = at_once
        self._rearm()

    def _rearm(self) -> None:
        """A campaign is due when no round runs (at once if asked to move on at once);
        a round ends at its deadline."""
        due_ms = self._due_ms
        vote_round = self._round
        if vote_round is not None:
            due_ms["campaign"] = math.inf
            due_ms["vote round"] = vote_round.deadline_ms
        else:
            at_once = self._need_increase_term_immediately
            due_ms["campaign"] = -math.inf if at_once else self._next_vote_ms
            due_ms["vote round"] = math.inf

    # ------------------------------------------------------------------ role changes
    def become_candidate(self, term: int, was_candidate: bool, now_ms: float) -> None:
        """DLedger's changeRoleToCandidate, our part: remember the term seen (nextTerm
        adopts it later), drop any round, and time the next one."""
        r = self._r
        self.known_max_term = max(self.known_max_term, term)
        self.round = None
        if not was_candidate:
            self.last_parse_result = ParseResult.WAIT_TO_REVOTE
            # Our own timeout: campaign now. A newer term heard from someone else: that
            # node is campaigning; give it a vote gap before competing with it.
            self.next_vote_ms = now_ms if term <= r.term else now_ms + self.vote_gap_ms()

    def forget_round(self) -> None:
        self.round = None

    def campaign_at_once(self) -> None:
        """A newer term was heard of: campaign in the next term at the next tick."""
        self.need_increase_term_immediately = True

    # ------------------------------------------------------------------ candidate
    def campaign(self, now_ms: float) -> None:
        """The vote gap ran out: move to the next term if the last round says so, then
        start a round (or, after adopting a newer term, wait one more gap)."""
        r = self._r
        if (
            self.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
            or self.need_increase_term_immediately
            or self.known_max_term > r.term  # a round in a term known to be over is wasted
        ):
            r.next_term(self.known_max_term)
            self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        if not r.is_voter:  # a learner or a removed member waits to hear a leader
            self.need_increase_term_immediately = False
            self.next_vote_ms = now_ms + self.vote_gap_ms()
            return
        if self.need_increase_term_immediately:
            self.need_increase_term_immediately = False
            gap_ms = self.vote_gap_ms()
            if r.term == self._yield_term:
                gap_ms = max(gap_ms, self._yield_until_ms - now_ms)
            self.next_vote_ms = now_ms + gap_ms
            return
        self._start_round(now_ms)

    def vote_gap_ms(self) -> float:
        r = self._r
        cfg = r.config
        if r.transfers.taking_leadership():
            return r.rand(
                cfg.min_take_leadership_vote_interval_ms, cfg.max_take_leadership_vote_interval_ms
            )
        return r.rand(cfg.min_vote_interval_ms, cfg.max_vote_interval_ms)

    def _start_round(self, now_ms: float) -> None:
        r = self._r
        cfg = r.config
        wait_ms = 2 * cfg.heartbeat_interval_ms + r.rand(0, cfg.max_vote_interval_ms)
        self.round = VoteRound(r.term, next(r.seqs), now_ms + wait_ms, r.peer_count)
        self.vote_rounds_started += 1
        request = VoteRequest(
            cfg.group,
            r.self_id,
            r.self_id,
            r.self_id,
            r.term,
            r.store.end_index,
            r.store.end_term,
            seq=self.round.seq,
        )
        self.round.record(r.self_id, self._vote_on(request, now_ms), r.term)
        for peer in r.voter_peers:
            r.send(attrs.evolve(request, remote_id=peer))
        self._maybe_finish_round(now_ms)

    def _maybe_finish_round(self, now_ms: float) -> None:
        if self.round is not None and self.round.early_stop():
            self.finish_round(now_ms)

    def finish_round(self, now_ms: float) -> None:
        r = self._r
        vote_round, self.round = self.round, None
        if r.role is not Role.CANDIDATE or vote_round.term != r.term:
            return
        result = vote_round.parse()
        if result is ParseResult.PASSED and vote_round.term == self.never_lead_term:
            result = ParseResult.WAIT_TO_VOTE_NEXT
        accepted = [v for v, got in vote_round.results.items() if got is VoteResult.ACCEPT]
        if result is ParseResult.PASSED and not r.members.current.is_quorum(accepted):
            result = ParseResult.WAIT_TO_REVOTE  # the configuration changed during the round
        self.last_parse_result = result
        if result is ParseResult.PASSED:
            r.become_leader(vote_round, now_ms)
            return
        if result is ParseResult.REVOTE_IMMEDIATELY:
            self.next_vote_ms = now_ms
            return
        if result is ParseResult.WAIT_TO_VOTE_NEXT and vote_round.known_max_term > r.term:
            self.known_max_term = max(self.known_max_term, vote_round.known_max_term)
        extra_ms = vote_round.backoff_ms(result, r.lease_ms, r.config.max_vote_interval_ms)
        self.next_vote_ms = now_ms + self.vote_gap_ms() + extra_ms

    def send_failed(self, msg: VoteRequest, now_ms: float) -> None:
        if self.round and msg.seq == self.round.seq:
            self.round.record(msg.remote_id, VoteResult.UNKNOWN, -1)
            self._maybe_finish_round(now_ms)

    def on_vote_response(self, resp: VoteResponse, now_ms: float) -> None:
        if self.round is None or resp.seq != self.round.seq:
            return
        self.round.record(resp.local_id, VoteResult(resp.vote_result), resp.term)
        self._maybe_finish_round(now_ms)

    # ------------------------------------------------------------------ voter
    def on_vote_request(self, req: VoteRequest, now_ms: float) -> None:
        r = self._r
        result = self._vote_on(req, now_ms)
        r.send(
            VoteResponse(
                r.config.group,
                r.self_id,
                req.local_id,
                r.leader_id,
                self._vote_answer_term(result),
                result,
                seq=req.seq,
            )
        )

    def _vote_answer_term(self, result: VoteResult) -> int:
        if result is VoteResult.REJECT_TERM_SMALL_THAN_LEDGER:
            return self._r.store.end_term
        return self._r.term

    def _vote_on(self, req: VoteRequest, now_ms: float) -> VoteResult:
        """DLedger's handleVote, checks in its order (log before term)."""
        r = self._r
        store = r.store
        from_self = req.local_id == r.self_id
        if req.leader_id not in r.members.current.ids:
            return VoteResult.REJECT_UNKNOWN_LEADER
        if not from_self and req.leader_id == r.self_id:
            return VoteResult.REJECT_UNEXPECTED_LEADER
        if req.ledger_end_term < store.end_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if req.ledger_end_term == store.end_term and req.ledger_end_index < store.end_index:
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        if req.term < r.term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if req.term == r.term:
            if r.vote_for is not None and r.vote_for != req.leader_id:
                if r.leader_id is not None:
                    return VoteResult.REJECT_ALREADY_HAS_LEADER
                return VoteResult.REJECT_ALREADY_VOTED
        else:
            r.change_to_candidate(req.term, now_ms, campaign_at_once=True)
            # DLedger makes the candidate ask twice; its own vote gaps (300-1000 ms by
            # default) outlast that second round trip, but our short ones (50-150 ms) do
            # not under load: we would start our own round in its term first and split
            # the vote (a leadership transfer then failed). So wait out the longest round
            # it may need to revote in.
            cfg = r.config
            self._yield_term = req.term
            self._yield_until_ms = now_ms + 2 * cfg.heartbeat_interval_ms + cfg.max_vote_interval_ms
            return VoteResult.REJECT_TERM_NOT_READY
        if req.term < store.end_term:
            return VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
        if (
            not from_self
            and r.transfers.taking_leadership()
            and r.self_id in r.config.preferred_leader_ids
            and req.ledger_end_term == store.end_term
            and store.end_index >= req.ledger_end_index
        ):
            return VoteResult.REJECT_TAKING_LEADERSHIP
        r.vote(req.leader_id)
        return VoteResult.ACCEPT
