"""DLedger's vote round: the tally a candidate keeps and the rule that parses it.

The table in `parse` is DLedger's `DLedgerLeaderElector.maintainAsCandidate`, first
matching rule wins; `early_stop` is its condition for not waiting out the round.
"""

from __future__ import annotations

import attrs

from raftmq.dledger.codes import ParseResult, VoteResult

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

    def backoff_ms(
        self, result: ParseResult, heartbeat_leak_ms: float, max_vote_ms: float
    ) -> float:
        """Extra wait before the next round on top of the random vote gap."""
        if result is ParseResult.WAIT_TO_REVOTE:
            if self.count(VoteResult.REJECT_ALREADY_HAS_LEADER):
                return heartbeat_leak_ms
            valid = len(self.results) - self.count(VoteResult.UNKNOWN)
            if is_quorum(valid, self.peer_count):  # others have newer logs: let them win
                return max_vote_ms
        return 0.0
