"""The broker-level simulation: a real message store on every simulated replica, a
producer and two consumer groups, through hypothesis-generated fault schedules for 3
and 5 replicas (jepsen.sim_broker lists the checks).

A failure prints the shrunk schedule and the seed; `run_broker(schedule, seed)`
replays it exactly. The ci profile runs a third of the Raft-level examples (each run
here carries a broker per replica); `RAFTMQ_HYPOTHESIS_PROFILE=long` runs hundreds.
"""

import pytest
from hypothesis import given, note, settings
from raftmq.broker.promotion import Promotion
from raftmq.dledger.codes import Role
from raftmq.dledger.sim.cluster import NetworkConditions, Variant
from raftmq.dledger.sim.schedule import Fault, Schedule

from jepsen.sim_broker import run_broker
from tests.helpers import SIM_SEEDS, majority_power_cut, schedules

EXAMPLES = settings(max_examples=max(6, settings.default.max_examples // 3))


def summary(model) -> str:
    return (
        f"masters: {model.masters}, sent: {len(model.sent)}, acked: {len(model.acked)},"
        f" pulled: {len(model.pulled)}, offsets acked: {model.committed}"
    )


@EXAMPLES
@given(schedules(3), SIM_SEEDS)
def test_three_brokers_keep_messages_and_offsets(schedule, seed):
    note(summary(run_broker(schedule, seed)))


@pytest.mark.slow  # five brokers per example
@EXAMPLES
@given(schedules(5), SIM_SEEDS)
def test_five_brokers_keep_messages_and_offsets(schedule, seed):
    note(summary(run_broker(schedule, seed)))


def test_a_leader_behind_a_paused_and_partitioned_stretch_dispatches_in_time_to_serve():
    """Slow fsyncs, a pause and partitions left n1 leading a log of ~2,500 batched
    entries, ~800 of them undispatched at the heal; dispatching at most 16 per event
    of its replica (a heartbeat's every 100 ms), it was not yet master when the probe
    came 4 s later. Found by hypothesis (long profile)."""
    faults = (
        Fault(0.0, "crash", (0,)),
        Fault(12.0, "pause", (1,)),
        Fault(12.0, "partition", (2,)),
        Fault(62.0, "resume", (1,)),
        Fault(665.0, "restart", (0,)),
        Fault(1032.0, "partition", (0,)),
        Fault(2642.0, "resume", (0, 1)),
        Fault(5523.0, "crash", (1,)),
    )
    conditions = NetworkConditions(drop=0.0, duplicate=0.0, min_delay_ms=0.1, max_delay_ms=0.5)
    model = run_broker(Schedule(3, faults, conditions, slow_fsync_chance=0.3), 0)
    assert model.masters >= 2, summary(model)


# n1 leads term 0, appends its NOOP and stops before reading the acknowledgments; n3
# leads term 1 and commits sends; n1 is resumed at the end. Found by hypothesis.
RESUMED_LEADER = Schedule(
    5,
    (Fault(0.0, "heal", (0,)), Fault(70.0, "pause", (1,)), Fault(0.0, "heal", (0,))),
    NetworkConditions(drop=0.0, duplicate=0.0, min_delay_ms=0.1, max_delay_ms=20.0),
    hard_state_fsync_ms=(1.0, 10.0),
)
RESUMED_LEADER_SEED = 4729


def test_a_leader_resumed_after_a_newer_one_committed_does_not_become_master():
    """Resumed, n1 read the old answers (its NOOP commits, its log is caught up) and,
    counting them as heard now, held a lease and became a master missing every
    acknowledged message."""
    model = run_broker(RESUMED_LEADER, RESUMED_LEADER_SEED)
    assert model.acked, summary(model)


class _LeaseAlwaysHeld:
    """A replica whose lease is never checked: whatever leads may act for the group."""

    def __init__(self, replica) -> None:
        self._replica = replica

    def __getattr__(self, name: str):
        return getattr(self._replica, name)

    def holds_lease(self, now_ms: float) -> bool:
        return self._replica.role is Role.LEADER


def test_a_promotion_that_skips_the_lease_makes_the_resumed_leader_a_master_and_the_model_says_so(
    monkeypatch,
):
    """Negative control: the simulation runs the broker's own promotion, so breaking
    it there (no lease check) lets the resumed leader become a master missing what was
    acknowledged, and the broker model catches it."""
    real_try_lead = Promotion.try_lead

    def try_lead_without_lease(self, replica, term: int, now_ms: float):
        return real_try_lead(self, _LeaseAlwaysHeld(replica), term, now_ms)

    monkeypatch.setattr(Promotion, "try_lead", try_lead_without_lease)
    with pytest.raises(AssertionError, match=r"new master \(term 0\) n1 lost acknowledged"):
        run_broker(RESUMED_LEADER, RESUMED_LEADER_SEED)


def test_a_late_truncate_leaves_no_follower_behind():
    """Drops, duplicates and delays to 20 ms: a TRUNCATE reached n3 behind the APPEND
    after it and cut an entry n3 had acknowledged; the leader never sent it again, and
    n3 waited for it until the run ended. Found by hypothesis."""
    conditions = NetworkConditions(drop=0.1, duplicate=0.1, min_delay_ms=0.1, max_delay_ms=20.0)
    schedule = Schedule(5, (), conditions, hard_state_fsync_ms=(1.0, 10.0))
    assert run_broker(schedule, 1957).acked


def test_a_quiet_run_checks_real_traffic():
    """Not vacuous: without faults nearly every send is acknowledged, pulled and
    committed as an offset, and every check sees it."""
    model = run_broker(Schedule(3, ()), 7)
    assert len(model.acked) > 500, summary(model)
    assert len(model.pulled) > 500, summary(model)
    assert model.masters == 1
    assert len(model.committed) == 8 and min(model.committed.values()) > 100, summary(model)


def test_offsets_and_messages_survive_master_kills():
    """Two leaders lose power in turn: the reads of consumer offsets after each failover
    are checked against what was acknowledged before it."""
    model = run_broker(
        Schedule(
            3,
            (
                Fault(1500, "crash", (0, 1, 2)),
                Fault(1550, "restart", (0, 1, 2)),
                Fault(3000, "crash", (0,)),
                Fault(3200, "crash", (1,)),
                Fault(3400, "restart", (0, 1)),
            ),
            duration_ms=5000,
        ),
        3,
    )
    assert model.masters >= 3, summary(model)
    assert len(model.acked) > 300 and model.read, summary(model)


ACK_BEFORE_FSYNC = Variant(ack_before_fsync=True)
SCHEDULE = majority_power_cut(isolated=2)


@pytest.mark.parametrize("seed", range(3))
def test_ack_before_fsync_loses_acknowledged_messages_and_the_model_says_so(seed):
    """Negative control: page-cache acks and a power cut of the two replicas that acked.
    The Raft checker only records here, so what fails is the broker model's own check."""
    with pytest.raises(AssertionError, match=r"lost acknowledged b'm\d+' at queue \d offset \d+"):
        run_broker(SCHEDULE, seed, ACK_BEFORE_FSYNC, raft_checks=False)


@pytest.mark.parametrize("seed", range(3))
def test_same_power_cut_with_fsync_before_ack_keeps_every_message(seed):
    model = run_broker(SCHEDULE, seed, raft_checks=False)
    assert model.cluster.checker.violations == []
    assert model.masters >= 2 and len(model.acked) > 150, summary(model)
