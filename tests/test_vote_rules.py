"""DLedger's VoteRequestTest, ported: one `Replica` fed VoteRequests directly.

Each test names the rule of our digest of DLedger's election rules (section numbers)
it pins down: §1.4 is the voter's `handleVote` (checks in DLedger's order, the log
before the term), §1.3 the candidate's parse table (`VoteRound.parse`), plus our two
documented departures: the hard state leaves with the vote, and a follower that
learned its leader from a heartbeat records it as its vote.
"""

import pytest
from raftmq.dledger.codes import Code, ParseResult, Role, VoteResult
from raftmq.dledger.core.election import VoteRound
from raftmq.dledger.core.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    VoteRequest,
    VoteResponse,
)

from tests.helpers import GROUP, make_replica


def vote(replica, candidate, term, end_index, end_term, now_ms=0.0, sender=None):
    """Deliver one VoteRequest; return (the VoteResponse, the whole Output)."""
    req = VoteRequest(
        GROUP, sender or candidate, replica.self_id, candidate, term, end_index, end_term, seq=7
    )
    replica.receive(req, now_ms)
    out = replica.take_output()
    [resp] = [m for m in out.messages if isinstance(m, VoteResponse)]
    assert resp.seq == 7 and resp.remote_id == (sender or candidate)
    return resp, out


def heartbeat(replica, leader, term, now_ms=0.0):
    replica.receive(HeartBeatRequest(GROUP, leader, replica.self_id, leader, term, seq=3), now_ms)
    out = replica.take_output()
    [resp] = [m for m in out.messages if isinstance(m, HeartBeatResponse)]
    return resp, out


# ---------------------------------------------------------------- §1.4 every VoteResult


def test_1_4_step1_requester_not_a_peer_is_reject_unknown_leader():
    r = make_replica(term=1)
    resp, out = vote(r, "n9", 1, -1, -1)
    assert resp.vote_result is VoteResult.REJECT_UNKNOWN_LEADER
    assert r.vote_for is None and out.hard_state is None


def test_1_3_step2_self_vote_is_accept_and_persists_vote_for_self():
    """The candidate's own vote is a local handleVote(self=true): ACCEPT, voteFor=self."""
    r = make_replica(term=3)
    r.tick(1000.0)
    out = r.take_output()
    assert r.vote_for == "n0"
    assert out.hard_state == (3, "n0")
    requests = [m for m in out.messages if isinstance(m, VoteRequest)]
    assert sorted(m.remote_id for m in requests) == ["n1", "n2"]
    assert all(m.term == 3 and m.leader_id == "n0" for m in requests)
    # the self-vote counted as an ACCEPT: one more ACCEPT is a quorum of 3
    seq = requests[0].seq
    r.receive(VoteResponse(GROUP, "n1", "n0", None, 3, VoteResult.ACCEPT, seq=seq), 1000.0)
    assert r.role is Role.LEADER and r.term == 3


def test_1_4_step7_peer_with_equal_log_and_term_is_accepted():
    r = make_replica(term=2, log_terms=(1, 2))
    resp, out = vote(r, "n1", 2, 1, 2)
    assert resp.vote_result is VoteResult.ACCEPT
    assert resp.term == 2
    assert r.vote_for == "n1"
    # asking again in the same term is answered the same way (voteFor == requester)
    resp, out = vote(r, "n1", 2, 1, 2)
    assert resp.vote_result is VoteResult.ACCEPT
    assert out.hard_state is None  # nothing changed, nothing to persist


def test_1_4_step2_request_naming_me_as_leader_from_a_peer_is_reject_unexpected_leader():
    r = make_replica(term=1)
    resp, _ = vote(r, "n0", 1, -1, -1, sender="n1")
    assert resp.vote_result is VoteResult.REJECT_UNEXPECTED_LEADER
    assert r.vote_for is None


def test_1_4_step4_lower_term_is_reject_expired_vote_term_carrying_my_term():
    r = make_replica(term=5)
    resp, out = vote(r, "n1", 3, -1, -1)
    assert resp.vote_result is VoteResult.REJECT_EXPIRED_VOTE_TERM
    assert resp.term == 5
    assert r.term == 5 and r.vote_for is None and out.hard_state is None


def test_1_4_step4_same_term_other_vote_no_leader_is_reject_already_voted():
    r = make_replica(term=2)
    assert vote(r, "n1", 2, -1, -1)[0].vote_result is VoteResult.ACCEPT
    resp, out = vote(r, "n2", 2, -1, -1)
    assert resp.vote_result is VoteResult.REJECT_ALREADY_VOTED
    assert r.vote_for == "n1" and out.hard_state is None


def test_1_4_step4_same_term_other_vote_with_known_leader_is_reject_already_has_leader():
    r = make_replica(term=2)
    assert vote(r, "n1", 2, -1, -1)[0].vote_result is VoteResult.ACCEPT
    assert heartbeat(r, "n1", 2)[0].code == Code.SUCCESS
    assert r.role is Role.FOLLOWER and r.leader_id == "n1"
    resp, _ = vote(r, "n2", 2, -1, -1)
    assert resp.vote_result is VoteResult.REJECT_ALREADY_HAS_LEADER
    assert resp.leader_id == "n1"


def test_1_4_step3_older_last_entry_term_is_reject_expired_ledger_term():
    r = make_replica(term=2, log_terms=(1, 2))
    resp, _ = vote(r, "n1", 2, 5, 1)  # a longer log does not help: the last term decides
    assert resp.vote_result is VoteResult.REJECT_EXPIRED_LEDGER_TERM
    assert r.vote_for is None


def test_1_4_step3_same_last_term_shorter_log_is_reject_small_ledger_end_index():
    r = make_replica(term=2, log_terms=(1, 2, 2))
    resp, _ = vote(r, "n1", 2, 1, 2)
    assert resp.vote_result is VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert r.vote_for is None


def test_1_4_step4_higher_term_is_reject_term_not_ready_then_adopted_at_next_step():
    """The voter does not vote in a term it has not adopted; its next step adopts it."""
    r = make_replica(term=1, log_terms=(1,))
    resp, out = vote(r, "n1", 3, 0, 1)
    assert resp.vote_result is VoteResult.REJECT_TERM_NOT_READY
    assert resp.term == 1  # still my old term
    assert r.term == 1 and r.vote_for is None
    assert out.hard_state is None
    assert r.election.need_increase_term_immediately
    r.tick(0.0)  # nextTerm(): jumps straight to the known max term
    out = r.take_output()
    assert r.term == 3 and r.vote_for is None
    assert out.hard_state == (3, None)
    assert not any(isinstance(m, VoteRequest) for m in out.messages)  # catching up, not voting
    resp, out = vote(r, "n1", 3, 0, 1)
    assert resp.vote_result is VoteResult.ACCEPT
    assert out.hard_state == (3, "n1")


def test_a_voter_moved_into_a_candidates_term_leaves_it_the_round_it_revotes_in():
    """Our vote gaps (50-150 ms) are shorter than DLedger's: a voter that answered
    TERM_NOT_READY must not start its own round in that term before the candidate's
    second request can arrive (the longest round: two heartbeats and a vote gap), or it
    splits the vote; a leadership transfer failed so under load."""
    r = make_replica(term=1, log_terms=(1,))
    resp, _ = vote(r, "n1", 2, 0, 1, now_ms=1000.0)
    assert resp.vote_result is VoteResult.REJECT_TERM_NOT_READY
    cfg = r.config
    hold_ms = 2 * cfg.heartbeat_interval_ms + cfg.max_vote_interval_ms
    assert cfg.max_vote_interval_ms < hold_ms
    for now_ms in (1000.0, 1000.0 + cfg.max_vote_interval_ms, 1000.0 + hold_ms - 1):
        r.tick(now_ms)
        out = r.take_output()
        assert not any(isinstance(m, VoteRequest) for m in out.messages), now_ms
    assert r.term == 2 and r.vote_for is None
    resp, _ = vote(r, "n1", 2, 0, 1, now_ms=1000.0 + hold_ms - 1)  # the late revote
    assert resp.vote_result is VoteResult.ACCEPT


def test_a_voter_moved_into_a_term_whose_candidate_went_quiet_campaigns_after_the_hold():
    r = make_replica(term=1, log_terms=(1,))
    vote(r, "n1", 2, 0, 1, now_ms=1000.0)
    cfg = r.config
    r.tick(1000.0)
    r.tick(1000.0 + 2 * cfg.heartbeat_interval_ms + cfg.max_vote_interval_ms)
    requests = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    assert requests and {m.term for m in requests} == {2}


def test_the_hold_is_for_the_candidates_term_only_a_transferee_campaigns_at_once():
    """A voter held in term 2, then asked to take leadership, campaigns in term 3 after
    the short take-leadership gap: the hold owed term 2's candidate does not apply."""
    r = make_replica("n1", term=1, log_terms=(1,))
    vote(r, "n2", 2, 0, 1, now_ms=1000.0)
    r.tick(1000.0)
    heartbeat(r, "n0", 2, now_ms=1001.0)
    assert r.role is Role.FOLLOWER and r.term == 2
    r.receive(
        LeadershipTransferRequest(
            GROUP, "n0", "n1", "n0", 2, transfer_id="n0", transferee_id="n1",
            take_leadership_ledger_index=r.store.end_index, seq=9,
        ),
        1002.0,
    )  # fmt: skip
    r.take_output()
    r.tick(1002.0 + r.config.max_take_leadership_vote_interval_ms)
    requests = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    assert requests and {m.term for m in requests} == {3}


def test_1_4_step4_higher_term_vote_makes_a_follower_a_candidate():
    r = make_replica(term=2, log_terms=(1,))
    heartbeat(r, "n1", 2)
    assert r.role is Role.FOLLOWER
    resp, out = vote(r, "n2", 4, 0, 1)
    assert resp.vote_result is VoteResult.REJECT_TERM_NOT_READY
    assert r.role is Role.CANDIDATE and r.leader_id is None
    assert (2, Role.CANDIDATE) in out.role_changes


def test_1_4_step5_term_below_my_last_entry_term_is_reject_term_small_than_ledger():
    """The answer carries my ledgerEndTerm, so the candidate's next term jumps to it."""
    r = make_replica(term=1, log_terms=(1, 3))
    resp, _ = vote(r, "n1", 1, 1, 3)
    assert resp.vote_result is VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
    assert resp.term == 3
    assert r.vote_for is None


def test_1_3_term_small_than_ledger_answer_moves_the_candidate_to_that_term():
    candidate = make_replica("n1", term=1, log_terms=(1, 3))
    voters = {p: make_replica(p, term=1, log_terms=(1, 3)) for p in ("n0", "n2")}
    candidate.tick(1000.0)
    requests = [m for m in candidate.take_output().messages if isinstance(m, VoteRequest)]
    for req in requests:
        voters[req.remote_id].receive(req, 1000.0)
        [resp] = voters[req.remote_id].take_output().messages
        assert resp.vote_result is VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
        candidate.receive(resp, 1000.0)
    assert candidate.election.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
    assert candidate.role is Role.CANDIDATE
    candidate.tick(candidate.next_deadline_ms())
    assert candidate.term == 3  # nextTerm() jumped to knownMaxTermInGroup
    round_requests = [m for m in candidate.take_output().messages if isinstance(m, VoteRequest)]
    assert round_requests and all(m.term == 3 for m in round_requests)


def test_1_4_step3_log_check_before_term_check_stale_candidate_does_not_raise_my_term():
    """A lagging node with a high term is rejected by log and cannot inflate my term."""
    r = make_replica(term=2, log_terms=(1, 2, 2))
    resp, _out = vote(r, "n1", 9, 7, 1)
    assert resp.vote_result is VoteResult.REJECT_EXPIRED_LEDGER_TERM
    assert resp.term == 2
    r.tick(0.0)
    assert r.term == 2 and r.election.known_max_term == 2
    assert not r.election.need_increase_term_immediately
    resp, _ = vote(r, "n1", 9, 1, 2)  # shorter log in the same last term
    assert resp.vote_result is VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert r.term == 2


def test_1_6_taking_leadership_rejects_rivals_without_a_strictly_longer_log():
    """REJECT_TAKING_LEADERSHIP: a preferred transferee campaigning at term+1 keeps rivals off."""
    r = make_replica(term=2, log_terms=(1, 2), preferred_leader_ids=("n0",))
    heartbeat(r, "n1", 2)
    r.receive(
        LeadershipTransferRequest(
            GROUP,
            "n1",
            "n0",
            "n1",
            2,
            transfer_id="n1",
            transferee_id="n0",
            take_leadership_ledger_index=1,
            seq=11,
        ),
        0.0,
    )
    r.take_output()
    assert r.role is Role.CANDIDATE and r.transfers.term_to_take_leadership == 3
    r.tick(0.0)  # adopts term 3
    r.take_output()
    assert r.term == 3
    resp, _ = vote(r, "n2", 3, 1, 2)
    assert resp.vote_result is VoteResult.REJECT_TAKING_LEADERSHIP
    resp, _ = vote(r, "n2", 3, 2, 2)  # strictly longer: let it win
    assert resp.vote_result is VoteResult.ACCEPT


# ---------------------------------------------------------------- our departures


def test_hard_state_leaves_in_the_same_output_as_the_accept():
    """Term and vote are made durable before (with) the ACCEPT: a crash cannot take it back."""
    r = make_replica(term=1, log_terms=(1,))
    resp, out = vote(r, "n2", 1, 0, 1)
    assert resp.vote_result is VoteResult.ACCEPT
    assert resp in out.messages
    assert out.hard_state == (1, "n2")


def test_hard_state_of_an_adopted_term_precedes_the_accept_in_it():
    r = make_replica(term=1)
    vote(r, "n2", 4, -1, -1)  # TERM_NOT_READY
    r.tick(0.0)
    assert r.take_output().hard_state == (4, None)
    resp, out = vote(r, "n2", 4, -1, -1)
    assert resp.vote_result is VoteResult.ACCEPT and out.hard_state == (4, "n2")


def test_follower_that_learned_its_leader_from_a_heartbeat_records_it_as_its_vote():
    """Closes DLedger's two-leaders-in-one-term window (§1.4 single-vote caveat)."""
    r = make_replica(term=2)
    resp, out = heartbeat(r, "n1", 2)
    assert resp.code == Code.SUCCESS
    assert r.role is Role.FOLLOWER and r.vote_for == "n1"
    assert out.hard_state == (2, "n1")
    resp, _ = vote(r, "n2", 2, -1, -1)
    assert resp.vote_result is VoteResult.REJECT_ALREADY_HAS_LEADER


def test_follower_via_higher_term_heartbeat_path_also_records_its_vote():
    """Higher-term heartbeat -> TERM_NOT_READY -> nextTerm -> next heartbeat -> FOLLOWER."""
    r = make_replica(term=1)
    assert heartbeat(r, "n1", 2)[0].code == Code.TERM_NOT_READY
    r.tick(0.0)
    assert r.term == 2 and r.vote_for is None
    assert heartbeat(r, "n1", 2, now_ms=1.0)[0].code == Code.SUCCESS
    assert r.vote_for == "n1"
    resp, _ = vote(r, "n2", 2, -1, -1, now_ms=2.0)
    assert resp.vote_result is VoteResult.REJECT_ALREADY_HAS_LEADER


# ---------------------------------------------------------------- §1.3 the parse table


def tally(*answers, term=5, known_terms=None):
    """A finished round of 3 peers: answers for n0 (self), n1, n2; None = no answer."""
    vote_round = VoteRound(term, 1, 0.0, 3)
    for voter, result in zip(("n0", "n1", "n2"), answers, strict=False):
        if result is not None:
            vote_round.record(voter, result, (known_terms or {}).get(voter, term))
    return vote_round


A = VoteResult.ACCEPT
LEAK_MS, MAX_VOTE_MS = 300.0, 150.0


def test_1_3_row1_known_max_term_above_round_term_is_wait_to_vote_next_even_with_quorum():
    vote_round = tally(A, A, VoteResult.REJECT_EXPIRED_VOTE_TERM, known_terms={"n2": 9})
    assert vote_round.known_max_term == 9
    assert vote_round.parse() is ParseResult.WAIT_TO_VOTE_NEXT
    assert vote_round.backoff_ms(ParseResult.WAIT_TO_VOTE_NEXT, LEAK_MS, MAX_VOTE_MS) == 0


def test_1_3_row1_term_small_than_ledger_also_raises_known_max_term():
    vote_round = tally(A, VoteResult.REJECT_TERM_SMALL_THAN_LEDGER, None, known_terms={"n1": 7})
    assert vote_round.known_max_term == 7
    assert vote_round.parse() is ParseResult.WAIT_TO_VOTE_NEXT


def test_1_3_row1_only_term_hint_answers_raise_known_max_term():
    vote_round = tally(A, A, VoteResult.REJECT_ALREADY_VOTED, known_terms={"n1": 9, "n2": 9})
    assert vote_round.known_max_term == -1
    assert vote_round.parse() is ParseResult.PASSED


def test_1_3_row2_already_has_leader_is_wait_to_revote_with_heartbeat_leak_backoff():
    vote_round = tally(A, A, VoteResult.REJECT_ALREADY_HAS_LEADER)  # beats the quorum row
    result = vote_round.parse()
    assert result is ParseResult.WAIT_TO_REVOTE
    assert vote_round.backoff_ms(result, LEAK_MS, MAX_VOTE_MS) == LEAK_MS


def test_1_3_row3_no_quorum_of_valid_answers_is_wait_to_revote_without_backoff():
    vote_round = tally(A, VoteResult.UNKNOWN, None)  # partitioned: timeouts are UNKNOWN
    result = vote_round.parse()
    assert result is ParseResult.WAIT_TO_REVOTE
    assert vote_round.backoff_ms(result, LEAK_MS, MAX_VOTE_MS) == 0


def test_1_3_row4_bigger_ledgers_block_quorum_is_wait_to_revote_with_max_vote_backoff():
    vote_round = tally(
        A, VoteResult.REJECT_EXPIRED_LEDGER_TERM, VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    )
    result = vote_round.parse()
    assert result is ParseResult.WAIT_TO_REVOTE
    assert vote_round.backoff_ms(result, LEAK_MS, MAX_VOTE_MS) == MAX_VOTE_MS


def test_1_3_row5_quorum_of_accepts_is_passed():
    assert tally(A, A, VoteResult.UNKNOWN).parse() is ParseResult.PASSED
    assert tally(A, VoteResult.REJECT_ALREADY_VOTED, A).parse() is ParseResult.PASSED


def test_1_3_row6_accepts_plus_term_not_ready_quorum_is_revote_immediately():
    vote_round = tally(A, VoteResult.REJECT_TERM_NOT_READY, VoteResult.REJECT_ALREADY_VOTED)
    assert vote_round.parse() is ParseResult.REVOTE_IMMEDIATELY


def test_1_3_row7_otherwise_is_wait_to_vote_next():
    vote_round = tally(VoteResult.REJECT_ALREADY_VOTED, VoteResult.REJECT_ALREADY_VOTED, A)
    assert vote_round.parse() is ParseResult.WAIT_TO_VOTE_NEXT


@pytest.mark.parametrize(
    ("answers", "stops"),
    [
        ((A, VoteResult.REJECT_ALREADY_HAS_LEADER), True),
        ((A, A), True),
        ((A, VoteResult.REJECT_TERM_NOT_READY), True),
        ((A, VoteResult.REJECT_ALREADY_VOTED, VoteResult.UNKNOWN), True),  # all answered
        ((A, VoteResult.REJECT_ALREADY_VOTED), False),
        ((VoteResult.REJECT_ALREADY_VOTED,), False),
    ],
)
def test_1_3_step3_round_stops_early_when_the_outcome_is_known(answers, stops):
    assert tally(*answers).early_stop() is stops
