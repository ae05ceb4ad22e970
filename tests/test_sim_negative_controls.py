"""Negative controls: the simulator's safety checks can fail.

Each deliberately broken `Variant` must be caught by a handcrafted schedule, and the
same schedule must pass with the correct (default) behaviour, so a green simulation
run means something. The seeds are fixed, so every run replays exactly.
"""

import random
import re

import pytest
from raftmq.dledger.codes import Code
from raftmq.dledger.sim.checks import InvariantViolation
from raftmq.dledger.sim.cluster import SimCluster, Variant
from raftmq.dledger.sim.schedule import Fault, Schedule, run

from tests.helpers import majority_power_cut

HB = 100.0
ACK_BEFORE_FSYNC = Variant(ack_before_fsync=True)
FORGET_VOTE = Variant(forget_vote_on_crash=True)
SEND_BEFORE_HARD_STATE = Variant(send_before_hard_state=True)


def holds(store, index, chain):
    return store.begin_index <= index <= store.end_index and store.chain_at(index) == chain


def burst_then_crash_leader_and_follower(cluster) -> list[int]:
    """A lagging third replica is cut off; the leader and the other follower acknowledge a
    burst of appends; a few ms after the last acknowledgement both lose power (keeping
    nothing unsynced). Returns the indexes of acknowledged appends no replica still holds.
    Then everything restarts and heals, and progress is demanded."""
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    follower, laggard = [n for n in cluster.ids if n != leader.id]
    cluster.partition([[leader.id, follower], [laggard]])
    handles = []
    for _ in range(10):
        handles.append(cluster.client_append(leader.id))
        cluster.run_until(cluster.now_ms + 1)
    deadline = cluster.now_ms + 200
    while any(h not in cluster.checker.outcomes for h in handles) and cluster.now_ms < deadline:
        cluster.run_until(cluster.now_ms + 0.1)
    assert [cluster.checker.outcomes.get(h) for h in handles] == [Code.SUCCESS] * 10
    cluster.run_until(cluster.now_ms + 3)
    cluster.crash(leader.id, keep_unsynced=0)
    cluster.crash(follower, keep_unsynced=0)
    lost = sorted(
        index
        for index, chain in cluster.checker.acked.values()
        if not any(holds(node.store, index, chain) for node in cluster.nodes.values())
    )
    cluster.lost = lost
    cluster.heal()
    cluster.restart(leader.id)
    cluster.restart(follower)
    cluster.run_until(cluster.now_ms + 1500)
    h = cluster.client_append()
    cluster.run_until(cluster.now_ms + 500)
    assert cluster.checker.outcomes.get(h) is Code.SUCCESS
    cluster.checker.check_final()
    return lost


SEEDS = range(3)


@pytest.mark.parametrize("seed", SEEDS)
def test_ack_before_fsync_loses_acknowledged_appends_and_the_checker_says_so(seed):
    cluster = SimCluster(3, random.Random(seed), variant=ACK_BEFORE_FSYNC)
    with pytest.raises(InvariantViolation) as caught:
        burst_then_crash_leader_and_follower(cluster)
    message = str(caught.value)
    match = re.search(r"lacks (?:committed index|acknowledged append \d+ at) (\d+)", message)
    assert match, message
    lost_index = int(match.group(1))
    acked_at = {index for index, _ in cluster.checker.acked.values()}
    assert lost_index in acked_at, (message, sorted(acked_at))
    assert lost_index in cluster.lost  # no replica kept it through the power cut


@pytest.mark.parametrize("seed", SEEDS)
def test_same_crash_schedule_with_fsync_before_ack_keeps_every_acknowledged_append(seed):
    cluster = SimCluster(3, random.Random(seed))
    lost = burst_then_crash_leader_and_follower(cluster)
    assert lost == []
    assert len(cluster.checker.acked) >= 11


def violations(schedule, variant, seeds) -> dict[int, str]:
    found = {}
    for seed in seeds:
        try:
            run(schedule, random.Random(seed), variant)
        except InvariantViolation as e:
            found[seed] = str(e)
    return found


def test_schedule_run_catches_ack_before_fsync_and_passes_the_default():
    schedule = majority_power_cut(isolated=2)
    bad = violations(schedule, ACK_BEFORE_FSYNC, range(5))
    assert bad, "the page-cache-ack variant was never caught"
    assert all("lacks" in message for message in bad.values()), bad
    assert violations(schedule, None, range(5)) == {}


def test_forget_vote_on_crash_yields_two_leaders_in_one_term_and_the_default_does_not():
    """Everyone restarts at once; forgetting votes lets a second node win the old term."""
    schedule = Schedule(
        3,
        (Fault(1000, "crash", (0, 1, 2)), Fault(1050, "restart", (0, 1, 2))),
        duration_ms=1500,
        heal_ms=1000,
    )
    seeds = range(8)
    bad = violations(schedule, FORGET_VOTE, seeds)
    assert bad, "the forget-vote variant was never caught"
    assert any(re.search(r"two leaders in term \d+", message) for message in bad.values()), bad
    assert violations(schedule, None, seeds) == {}


def test_sending_before_the_term_and_vote_are_durable_yields_two_leaders_and_the_handoff_does_not():
    """Everyone loses power every 200 ms while saves of term and vote take 1-10 ms: a
    vote that left before its save completed is forgotten and given again."""
    faults = []
    for at in range(1000, 2400, 200):
        faults += [Fault(at, "crash", (0, 1, 2)), Fault(at + 30, "restart", (0, 1, 2))]
    schedule = Schedule(
        3, tuple(faults), duration_ms=2500, heal_ms=1000, hard_state_fsync_ms=(1.0, 10.0)
    )
    seeds = range(8)
    bad = violations(schedule, SEND_BEFORE_HARD_STATE, seeds)
    assert bad, "the send-before-hard-state variant was never caught"
    assert any(re.search(r"two leaders in term \d+", message) for message in bad.values()), bad
    assert violations(schedule, None, seeds) == {}
