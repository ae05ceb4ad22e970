"""Consumed offsets and queue allocation: what a push consumer commits and which queues
each group member takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.allocate import allocate_averagely
from raftmq.client.offsets import QueueOffsets
from raftmq.client.route import MessageQueue


def test_offset_waits_for_the_oldest_message_still_in_the_handler():
    offsets = QueueOffsets(10)
    assert offsets.consumed == 10
    offsets.pulled([10, 11, 12], next_begin_offset=13)
    assert (offsets.consumed, offsets.next_pull) == (10, 13)
    offsets.done([12])
    offsets.done([11])
    assert offsets.consumed == 10  # 10 is still being consumed
    offsets.done([10])
    assert offsets.consumed == 13


def test_filtered_messages_count_as_consumed():
    offsets = QueueOffsets(0)
    offsets.pulled([2], next_begin_offset=5)  # 0, 1, 3, 4 did not match the tags
    assert offsets.consumed == 2
    offsets.done([2])
    assert offsets.consumed == 5
    offsets.pulled([], next_begin_offset=9)
    assert offsets.consumed == 9


def test_reset_drops_what_was_in_flight():
    offsets = QueueOffsets(0)
    offsets.pulled([0, 1], next_begin_offset=2)
    offsets.reset(7)
    assert (offsets.consumed, offsets.next_pull) == (7, 7)


def test_a_pull_while_the_last_is_in_the_handler_breaks_the_invariant():
    """The commit rule covers one pull's messages finishing out of order; a queue pulled
    again before they are done would be a push loop gone wrong, stopped here."""
    offsets = QueueOffsets(0)
    offsets.pulled([0, 1], next_begin_offset=2)
    offsets.done([1])
    with pytest.raises(AssertionError, match=r"\[0\] in the handler"):
        offsets.pulled([2], next_begin_offset=3)


@given(st.data())
def test_committed_offset_never_passes_an_unfinished_message(data):
    batch = data.draw(st.integers(1, 20))
    offsets = QueueOffsets(0)
    offsets.pulled(range(batch), next_begin_offset=batch)
    order = data.draw(st.permutations(range(batch)))
    finished: set[int] = set()
    for offset in order:
        before = offsets.consumed
        offsets.done([offset])
        finished.add(offset)
        assert offsets.consumed >= before
        assert all(o in finished for o in range(offsets.consumed))
    assert offsets.consumed == batch


def queues(n: int, topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, "broker-a", i) for i in range(n)]


def test_allocation_gives_contiguous_blocks_extra_queues_first():
    mqs = queues(8)
    members = ["c", "a", "b"]
    assert allocate_averagely(mqs, members, "a") == mqs[0:3]
    assert allocate_averagely(mqs, members, "b") == mqs[3:6]
    assert allocate_averagely(mqs, members, "c") == mqs[6:8]
    assert allocate_averagely(mqs, members, "stranger") == []
    assert allocate_averagely(queues(2), members, "c") == []


@given(st.integers(0, 40), st.integers(1, 10), st.randoms())
def test_every_queue_goes_to_exactly_one_member(n, m, rnd):
    mqs = queues(n)
    members = [f"10.0.0.{i}@{i}" for i in range(m)]
    shuffled = mqs[:]
    rnd.shuffle(shuffled)  # members may list queues and ids in any order
    taken = [mq for cid in members for mq in allocate_averagely(shuffled, members[::-1], cid)]
    assert sorted(taken) == mqs
    sizes = [len(allocate_averagely(mqs, members, cid)) for cid in members]
    assert max(sizes) - min(sizes) <= 1
