"""Deterministic simulation: hypothesis generates fault schedules for 3 and 5 replicas;
Raft's safety properties are checked after every event, progress after healing.
Saves of term and vote take no time or a drawn latency, so crashes also meet
messages held back behind a save.

On failure hypothesis prints the shrunk schedule and the seed of the simulator's own
random source (message delays, drops, fsync latency): `run(schedule, Random(seed))`
replays it exactly. The seed is drawn as a plain integer rather than routing every
simulated coin flip through hypothesis: a run flips hundreds of thousands of them,
which hypothesis cannot record at a usable speed; the schedule itself still shrinks.
`RAFTMQ_HYPOTHESIS_PROFILE=long` runs thousands of examples.
"""

import random

import pytest
from hypothesis import given, note
from raftmq.dledger.sim.schedule import Schedule, run

from tests.helpers import SIM_SEEDS, schedules


@given(schedules(3), SIM_SEEDS)
def test_three_replicas_stay_safe_and_recover(schedule, seed):
    cluster = run(schedule, random.Random(seed))
    note(f"leader changes: {cluster.checker.leader_changes}, acked: {len(cluster.checker.acked)}")


@pytest.mark.slow  # five replicas per example; three run in the fast tier
@given(schedules(5), SIM_SEEDS)
def test_five_replicas_stay_safe_and_recover(schedule, seed):
    run(schedule, random.Random(seed))


@given(schedules(3, spares=2), SIM_SEEDS)
def test_three_replicas_changing_members_stay_safe_and_recover(schedule, seed):
    """Adds, promotions and removals (the leader's own too) among the faults: the
    checker also demands that each commit is held by a quorum of the leader's voters."""
    cluster = run(schedule, random.Random(seed))
    note(f"members at the end: {cluster.members()}")


def test_a_quiet_run_acknowledges_nearly_everything():
    """The checks are not vacuous: without faults, appends succeed and are checked."""
    cluster = run(Schedule(3, ()), random.Random(7))
    acked = len(cluster.checker.acked)
    assert acked > 500, acked
    assert cluster.checker.leader_changes == 1
