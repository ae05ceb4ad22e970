"""DLedger's election: the vote round a candidate tallies, the campaign, the voter.

The table in `VoteRound.parse` is DLedger's `DLedgerLeaderElector.maintainAsCandidate`,
first matching rule wins; `early_stop` is its condition for not waiting out the round.
A round first re-votes in the current term and only a WAIT_TO_VOTE_NEXT result moves
to the next term; voters check the log before the term, and a voter with a live
leader answers REJECT_ALREADY_HAS_LEADER.
"""

from __future__ import annotations

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

    Part of `Replica`; the state it keeps (`known_max_term`, `last_parse_result`,
    `next_vote_ms`, the round in progress) is initialised there.
    """

    # ------------------------------------------------------------------ candidate
    def _campaign_due_ms(self) -> float | None:
        if self._round is not None:
            return None
        return float("-inf") if self.need_increase_term_immediately else self.next_vote_ms

    def _campaign(self, now_ms: float) -> None:
        """The vote gap ran out: move to the next term if the last round says so, then
        start a round (or, after adopting a newer term, wait one more gap)."""
        if (
            self.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
            or self.need_increase_term_immediately
            or self.known_max_term > self.term  # a round in a term known to be over is wasted
        ):
            self._next_term()
            self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        if self.need_increase_term_immediately:
            self.need_increase_term_immediately = False
            self.next_vote_ms = now_ms + self._vote_gap_ms()
            return
        self._start_round(now_ms)

    def _round_due_ms(self) -> float | None:
        return self._round.deadline_ms if self._round is not None else None

    def _vote_gap_ms(self) -> float:
        cfg = self.config
        if self._taking_leadership():
            return self._rand(
                cfg.min_take_leadership_vote_interval_ms, cfg.max_take_leadership_vote_interval_ms
            )
        return self._rand(cfg.min_vote_interval_ms, cfg.max_vote_interval_ms)

    def _taking_leadership(self) -> bool:
        return self.term_to_take_leadership == self.term

    def _start_round(self, now_ms: float) -> None:
        cfg = self.config
        wait = 2 * cfg.heartbeat_interval_ms + self._rand(0, cfg.max_vote_interval_ms)
        self._round = VoteRound(self.term, self._next_seq(), now_ms + wait, self.peer_count)
        self.vote_rounds_started += 1
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
        self._round.record(self.self_id, self._vote_on(request, now_ms), self.term)
        for peer in self.peers:
            self._send(attrs.evolve(request, remote_id=peer))
        self._maybe_finish_round(now_ms)

    def _maybe_finish_round(self, now_ms: float) -> None:
        if self._round is not None and self._round.early_stop():
            self._finish_round(now_ms)

    def _finish_round(self, now_ms: float) -> None:
        vote_round, self._round = self._round, None
        if self.role is not Role.CANDIDATE or vote_round.term != self.term:
            return
        result = vote_round.parse()
        if result is ParseResult.PASSED and vote_round.term == self._never_lead_term:
            result = ParseResult.WAIT_TO_VOTE_NEXT
        self.last_parse_result = result
        if result is ParseResult.PASSED:
            self._become_leader(vote_round, now_ms)
            return
        if result is ParseResult.REVOTE_IMMEDIATELY:
            self.next_vote_ms = now_ms
            return
        if result is ParseResult.WAIT_TO_VOTE_NEXT and vote_round.known_max_term > self.term:
            self.known_max_term = max(self.known_max_term, vote_round.known_max_term)
        extra = vote_round.backoff_ms(result, self.lease_ms, self.config.max_vote_interval_ms)
        self.next_vote_ms = now_ms + self._vote_gap_ms() + extra

    def _on_vote_response(self, resp: VoteResponse, now_ms: float) -> None:
        if self._round is None or resp.seq != self._round.seq:
            return
        self._round.record(resp.local_id, VoteResult(resp.vote_result), resp.term)
        self._maybe_finish_round(now_ms)

    # ------------------------------------------------------------------ voter
    def _on_vote_request(self, req: VoteRequest, now_ms: float) -> None:
        result = self._vote_on(req, now_ms)
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

    def _vote_on(self, req: VoteRequest, now_ms: float) -> VoteResult:
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
            self._change_to_candidate(req.term, now_ms)
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
