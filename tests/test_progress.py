"""The leader's per-follower tracking: `Progress` moves between probing (COMPARE,
TRUNCATE) and pipelining (APPEND) only through its transitions, and `Inflights`
bounds the APPENDs outstanding, as etcd's `tracker/` does."""

import math

import pytest
from raftmq.dledger.codes import PushType
from raftmq.dledger.core.progress import Inflights, Progress

TIMEOUT = 1000.0


def test_inflights_hold_at_most_capacity_and_free_in_any_order():
    window = Inflights(3)
    for seq, sent in ((1, 10.0), (2, 11.0), (3, 12.0)):
        assert not window.full
        window.add(seq, sent)
    assert window.full and len(window) == 3 and window.oldest_sent_ms == 10.0
    assert window.free(2)  # answers come back out of order
    assert not window.full and window.oldest_sent_ms == 10.0
    assert window.free(1)
    assert window.oldest_sent_ms == 12.0
    assert not window.free(1)  # a duplicate answer is not ours any more
    assert not window.free(99)
    window.clear()
    assert not window and not window.full and window.oldest_sent_ms == math.inf  # none out


def test_inflights_refuse_a_push_beyond_capacity():
    window = Inflights(1)
    window.add(1, 0.0)
    with pytest.raises(AssertionError):
        window.add(2, 0.0)


def test_a_new_leader_probes_at_its_own_last_entry():
    prog = Progress.for_new_leader(end_index=9, window=4)
    assert prog.state is PushType.COMPARE and prog.next_index == 10
    assert prog.match_index == -1 and not prog.probing
    assert prog.deadline_ms(9, TIMEOUT) == -math.inf  # a COMPARE is due at once


def test_one_probe_at_a_time_answered_by_its_own_seq_or_timed_out():
    prog = Progress.for_new_leader(9, 4)
    prog.probe_sent(7, now_ms=100.0)
    assert prog.probing and prog.deadline_ms(9, TIMEOUT) == 100.0 + TIMEOUT
    with pytest.raises(AssertionError):
        prog.probe_sent(8, now_ms=101.0)
    assert not prog.probe_answered(6)  # an answer to an earlier probe
    assert prog.probe_answered(7)
    assert not prog.probing and not prog.probe_answered(7)
    prog.probe_sent(8, now_ms=200.0)
    prog.probe_timed_out()
    assert not prog.probing and prog.deadline_ms(9, TIMEOUT) == -math.inf


def test_replicating_pipelines_appends_until_the_window_is_full():
    prog = Progress.for_new_leader(9, 2)
    assert prog.matched(4) and not prog.matched(3) and prog.match_index == 4
    prog.become_replicate(5)
    assert prog.state is PushType.APPEND and prog.deadline_ms(9, TIMEOUT) == -math.inf
    prog.appended(seq=1, count=3, now_ms=50.0)
    prog.appended(seq=2, count=2, now_ms=60.0)
    assert prog.next_index == 10 and prog.inflight.full
    # nothing more to send: due when the oldest push times out
    assert prog.deadline_ms(9, TIMEOUT) == 50.0 + TIMEOUT
    assert prog.inflight.free(1)
    assert prog.deadline_ms(12, TIMEOUT) == -math.inf  # room again and entries to send
    prog.resend_unacknowledged()
    assert prog.state is PushType.APPEND and prog.next_index == 5 and not prog.inflight


def test_appends_are_only_sent_while_replicating():
    prog = Progress.for_new_leader(9, 2)
    with pytest.raises(AssertionError):
        prog.appended(seq=1, count=1, now_ms=0.0)
    with pytest.raises(AssertionError):
        prog.become_probe(PushType.APPEND, 3)


def test_a_probe_forgets_what_was_in_flight():
    prog = Progress.for_new_leader(9, 4)
    prog.become_replicate(5)
    prog.appended(seq=1, count=3, now_ms=0.0)
    prog.become_probe(PushType.COMPARE, 6)
    assert prog.state is PushType.COMPARE and prog.next_index == 6 and not prog.inflight
    assert not prog.inflight.free(1)  # its answer will be ignored


@pytest.mark.parametrize(
    ("state", "expected_next"),
    [(PushType.APPEND, 5), (PushType.COMPARE, 8), (PushType.TRUNCATE, 5)],
)
def test_an_undeliverable_push_stalls_until_a_heartbeat_answer(state, expected_next):
    prog = Progress.for_new_leader(9, 4)
    prog.matched(4)
    if state is PushType.APPEND:
        prog.become_replicate(5)
        prog.appended(seq=1, count=3, now_ms=0.0)
    else:
        prog.become_probe(state, 8)
        prog.probe_sent(1, now_ms=0.0)
    prog.stall()
    # resend from what it is known to hold (a COMPARE keeps comparing where it was)
    assert prog.state is PushType.COMPARE and prog.next_index == expected_next
    assert prog.stalled and not prog.probing and not prog.inflight
    assert prog.deadline_ms(9, TIMEOUT) is None  # nothing goes out until it answers
    assert prog.resume() and not prog.resume()
    assert prog.deadline_ms(9, TIMEOUT) == -math.inf


def test_a_follower_that_forgot_what_it_acknowledged_is_compared_again_once_idle():
    """A heartbeat answer says how far the follower knows its log agrees with ours;
    below what it acknowledged (it restarted), a caught-up follower is compared again at
    our end. While APPENDs are out, their answers settle it, and a follower that knows
    as much as it acknowledged is left alone."""
    prog = Progress.for_new_leader(end_index=9, window=4)
    prog.become_replicate(10)
    assert prog.matched(9)
    assert not prog.forgotten(verified_index=9)
    prog.appended(seq=1, count=1, now_ms=0.0)  # entry 10 out
    assert not prog.forgotten(verified_index=-1)
    assert prog.inflight.free(1) and prog.matched(10)
    assert prog.forgotten(verified_index=-1)
    assert prog.state is PushType.COMPARE and prog.next_index == 11 and prog.match_index == 10
    assert not prog.forgotten(verified_index=-1)  # probing already
