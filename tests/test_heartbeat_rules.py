"""DLedger's HeartbeatRequestTest, ported, plus the timing rules of §1.2 and §1.5.

A heartbeat carries only the base fields; the follower's checks run in DLedger's
order (UNKNOWN_MEMBER, UNEXPECTED_MEMBER, EXPIRED_TERM, SUCCESS / follow,
INCONSISTENT_LEADER, TERM_NOT_READY), and the leader reacts to the answers.
Time is driven by `tick(now_ms)`; the defaults are a 100 ms beat and a leak of 3.
"""

from raftmq.dledger.codes import Code, Role, VoteResult
from raftmq.dledger.core.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    VoteRequest,
    VoteResponse,
)
from raftmq.dledger.core.replica import Replica

from tests.helpers import GROUP, make_replica


def heartbeat(replica, leader, term, now_ms=0.0):
    replica.receive(HeartBeatRequest(GROUP, leader, replica.self_id, leader, term, seq=3), now_ms)
    out = replica.take_output()
    [resp] = [m for m in out.messages if isinstance(m, HeartBeatResponse)]
    assert resp.seq == 3 and resp.remote_id == leader
    return resp


def make_leader(term=1, now_ms=1000.0) -> Replica:
    """n0 wins a round in `term` with n1's vote; the output is drained."""
    r = make_replica(term=term)
    r.tick(now_ms)
    [req, *_] = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    r.receive(VoteResponse(GROUP, "n1", "n0", None, term, VoteResult.ACCEPT, seq=req.seq), now_ms)
    assert r.role is Role.LEADER and r.term == term
    return r


def sent_heartbeats(out) -> list[HeartBeatRequest]:
    return [m for m in out.messages if isinstance(m, HeartBeatRequest)]


def answer(leader, peer, code, term=None, seq=None, now_ms=1000.0):
    leader.receive(
        HeartBeatResponse(
            GROUP,
            peer,
            leader.self_id,
            None,
            leader.term if term is None else term,
            code,
            seq=seq if seq is not None else 0,
        ),
        now_ms,
    )


# ---------------------------------------------------------------- follower side (§1.5)


def test_1_5_leader_not_a_peer_is_unknown_member():
    r = make_replica(term=1)
    assert heartbeat(r, "n9", 1).code == Code.UNKNOWN_MEMBER
    assert r.role is Role.CANDIDATE and r.leader_id is None


def test_1_5_leader_id_is_me_is_unexpected_member():
    r = make_replica(term=1)
    r.receive(HeartBeatRequest(GROUP, "n1", "n0", "n0", 1, seq=3), 0.0)
    [resp] = r.take_output().messages
    assert resp.code == Code.UNEXPECTED_MEMBER


def test_1_5_lower_term_is_expired_term_with_my_term():
    r = make_replica(term=5)
    resp = heartbeat(r, "n1", 3)
    assert resp.code == Code.EXPIRED_TERM and resp.term == 5
    assert r.role is Role.CANDIDATE


def test_1_5_equal_term_no_leader_known_follows_and_is_success():
    r = make_replica(term=2)
    resp = heartbeat(r, "n1", 2)
    assert resp.code == Code.SUCCESS and resp.leader_id == "n1"
    assert r.role is Role.FOLLOWER and r.leader_id == "n1"


def test_1_5_equal_term_same_leader_is_success_and_refreshes_the_timeout():
    r = make_replica(term=2)
    heartbeat(r, "n1", 2, now_ms=0.0)
    assert heartbeat(r, "n1", 2, now_ms=250.0).code == Code.SUCCESS
    r.tick(500.0)  # 250 ms after the last beat: still inside 3 x 100 ms
    assert r.role is Role.FOLLOWER


def test_1_5_equal_term_different_leader_is_inconsistent_leader():
    r = make_replica(term=2)
    heartbeat(r, "n1", 2)
    resp = heartbeat(r, "n2", 2)
    assert resp.code == Code.INCONSISTENT_LEADER and resp.leader_id == "n1"
    assert r.leader_id == "n1" and r.role is Role.FOLLOWER


def test_1_5_higher_term_is_term_not_ready_then_success_on_the_next_beat_after_a_tick():
    r = make_replica(term=1)
    resp = heartbeat(r, "n1", 2, now_ms=0.0)
    assert resp.code == Code.TERM_NOT_READY and resp.term == 1
    assert r.term == 1 and r.role is Role.CANDIDATE
    r.tick(1.0)  # the maintainer's nextTerm() adopts the term
    assert r.term == 2
    resp = heartbeat(r, "n1", 2, now_ms=2.0)
    assert resp.code == Code.SUCCESS and resp.term == 2
    assert r.role is Role.FOLLOWER and r.leader_id == "n1"


def test_1_5_higher_term_heartbeat_makes_a_follower_of_another_leader_a_candidate():
    r = make_replica(term=1)
    heartbeat(r, "n1", 1)
    assert heartbeat(r, "n2", 3).code == Code.TERM_NOT_READY
    assert r.role is Role.CANDIDATE and r.leader_id is None


# ---------------------------------------------------------------- follower timeout (§1.2)


def test_1_2_follower_becomes_candidate_after_max_heartbeat_leak_intervals_in_same_term():
    r = make_replica(term=4)
    heartbeat(r, "n1", 4, now_ms=0.0)
    timeout = r.lease_ms
    assert r.next_deadline_ms() == timeout
    r.tick(timeout - 0.5)
    assert r.role is Role.FOLLOWER
    r.tick(timeout)
    out = r.take_output()
    assert r.role is Role.CANDIDATE and r.term == 4 and r.leader_id is None
    assert (4, Role.CANDIDATE) in out.role_changes
    assert out.hard_state is None  # no term change yet: it first re-votes in the same term


# ---------------------------------------------------------------- leader side (§1.5)


def test_1_5_leader_sends_heartbeats_every_interval():
    r = make_leader(now_ms=1000.0)
    out = r.take_output()
    assert sorted(m.remote_id for m in sent_heartbeats(out)) == ["n1", "n2"]
    r.tick(1050.0)
    assert not sent_heartbeats(r.take_output())
    r.tick(1000.0 + r.config.heartbeat_interval_ms)
    beats = sent_heartbeats(r.take_output())
    assert sorted(m.remote_id for m in beats) == ["n1", "n2"] and beats[0].term == 1


def test_1_5_expired_term_answer_with_bigger_term_makes_the_leader_a_candidate():
    r = make_leader(term=1)
    [beat, *_] = sent_heartbeats(r.take_output())
    answer(r, "n1", Code.EXPIRED_TERM, term=9, seq=beat.seq)
    out = r.take_output()
    assert r.role is Role.CANDIDATE and r.leader_id is None
    assert (1, Role.CANDIDATE) in out.role_changes
    assert r.election.known_max_term == 9  # changeRoleToCandidate(9): nextTerm() will jump there
    # DLedger would first re-vote in term 1, a round it cannot win; we go straight to 9
    r.tick(r.next_deadline_ms())
    requests = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    assert requests and {req.term for req in requests} == {9}
    assert r.term == 9


def test_1_5_leader_with_quorum_of_heartbeat_answers_keeps_leading():
    r = make_leader(now_ms=1000.0)
    hb = r.config.heartbeat_interval_ms
    now_ms = 1000.0
    for _ in range(20):
        for beat in sent_heartbeats(r.take_output()):
            if beat.remote_id == "n1":  # one follower of two is a quorum with me
                answer(r, "n1", Code.SUCCESS, seq=beat.seq, now_ms=now_ms + 1)
        now_ms += hb
        r.tick(now_ms)
    assert r.role is Role.LEADER and r.term == 1


def test_1_5_leader_steps_down_in_same_term_after_max_heartbeat_leak_intervals_unheard():
    start = 1000.0
    r = make_leader(term=3, now_ms=start)
    window = r.lease_ms
    stepped_down_at = None
    now_ms = start
    while now_ms < start + 10 * window:
        now_ms += 5.0
        r.tick(now_ms)
        if r.role is not Role.LEADER:
            stepped_down_at = now_ms
            break
    out = r.take_output()
    assert stepped_down_at is not None
    assert window < stepped_down_at - start <= window + 5.0
    assert r.role is Role.CANDIDATE and r.term == 3
    assert (3, Role.CANDIDATE) in out.role_changes


def test_1_5_inconsistent_leader_answer_without_quorum_makes_the_leader_a_candidate():
    r = make_leader(term=2)
    beats = sent_heartbeats(r.take_output())
    answer(r, "n1", Code.INCONSISTENT_LEADER, seq=beats[0].seq)
    r.send_failed(next(b for b in beats if b.remote_id == "n2"), 1000.0)
    r.tick(1000.0)
    assert r.role is Role.CANDIDATE and r.term == 2


def test_1_5_success_plus_term_not_ready_quorum_resends_heartbeats_at_once():
    r = make_leader(term=2)
    beats = sent_heartbeats(r.take_output())
    by_peer = {b.remote_id: b for b in beats}
    answer(r, "n1", Code.TERM_NOT_READY, term=1, seq=by_peer["n1"].seq, now_ms=1001.0)
    r.send_failed(by_peer["n2"], 1001.0)
    r.tick(1001.0)  # the round is complete: 1 SUCCESS (me) + 1 TERM_NOT_READY is a quorum
    assert r.role is Role.LEADER
    resent = sent_heartbeats(r.take_output())
    assert sorted(m.remote_id for m in resent) == ["n1", "n2"]  # not waiting out the beat
    assert resent[0].seq != by_peer["n1"].seq


def test_1_5_no_quorum_without_term_not_ready_waits_for_the_next_beat():
    r = make_leader(term=2)
    beats = sent_heartbeats(r.take_output())
    for beat in beats:
        r.send_failed(beat, 1001.0)
    r.tick(1001.0)
    assert r.role is Role.LEADER  # the lease (3 beats) has not run out yet
    assert not sent_heartbeats(r.take_output())
    assert r.next_deadline_ms() == 1000.0 + r.config.heartbeat_interval_ms
