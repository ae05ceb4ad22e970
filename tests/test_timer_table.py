"""`tick` and `next_deadline_ms` come from one timer table (`core.timers`), so they
cannot disagree: a tick before the next deadline does nothing, and a tick at it does
something and moves the deadline on. The parts write their deadlines into the table
when their state changes; asking for the next one reads the table only."""

import copy
import math
import random

import attrs
import pytest
from raftmq.dledger.codes import Role
from raftmq.dledger.core.timers import Timer, TimerTable
from raftmq.dledger.sim.cluster import NetworkConditions
from raftmq.dledger.sim.schedule import Appends, Fault, Schedule, run


@attrs.define
class Clock:
    """A stand-in replica: a role and a log of the timers that fired."""

    role: Role = Role.LEADER
    fired: list = attrs.Factory(list)


def record(name, then=None):
    def fire(r, now_ms):
        r.fired.append((name, now_ms))
        if then:
            then(r)

    return fire


def step_down(r):
    r.role = Role.CANDIDATE


TIMERS = (
    Timer("beat", Role.LEADER, record("beat")),
    Timer("lease", Role.LEADER, record("lease", then=step_down)),
    Timer("after lease", Role.LEADER, record("after lease")),
    Timer("campaign", Role.CANDIDATE, record("campaign")),
    Timer("unarmed", None, record("unarmed")),
    Timer("any role", None, record("any role")),
)
DUE_MS = {"beat": 100.0, "lease": 50.0, "after lease": 0.0, "campaign": 0.0, "any role": 70.0}


def table() -> TimerTable:
    timers = TimerTable(TIMERS)
    timers.due_ms.update(DUE_MS)
    return timers


def test_next_deadline_is_the_earliest_armed_timer_of_the_role():
    assert table().next_deadline_ms(Role.LEADER) == 0.0
    assert table().next_deadline_ms(Role.FOLLOWER) == 70.0
    assert TimerTable(TIMERS[:1]).next_deadline_ms(Role.FOLLOWER) == math.inf


def test_due_timers_fire_in_table_order_and_a_role_lost_midway_stops_its_timers():
    r = Clock(Role.LEADER)
    timers = table()
    timers.fire_due(r, 80.0)
    # the lease stepped the leader down: its later timers and the candidate's wait
    assert r.fired == [("lease", 80.0), ("any role", 80.0)]
    r.fired.clear()
    timers.fire_due(r, 80.0)
    assert r.fired == [("campaign", 80.0), ("any role", 80.0)]


def test_a_misspelt_deadline_is_caught():
    timers = table()
    timers.due_ms["beta"] = 1.0
    with pytest.raises(AssertionError, match="beta"):
        timers.next_deadline_ms(Role.LEADER)


class DeadlineProbe:
    """A simulator observer: at sampled events, ticks copies of the replica just before
    and at its next deadline."""

    def __init__(self, cluster, every: int) -> None:
        self.cluster = cluster
        self.every = every
        self.events = 0
        self.checked = 0

    def after_event(self, node) -> None:
        self.events += 1
        if self.events % self.every:
            return
        replica = node.replica
        deadline = replica.next_deadline_ms()
        now_ms = self.cluster.now_ms
        if deadline == float("inf"):
            return
        if deadline > now_ms:
            early = copy.deepcopy(replica)
            early.take_output()
            before = _state(early)
            early.tick((now_ms + deadline) / 2)
            assert not early.take_output(), "a tick before the deadline did something"
            assert _state(early) == before
        due = max(now_ms, deadline)
        late = copy.deepcopy(replica)
        for _ in range(5):
            late.tick(due)
            if late.next_deadline_ms() > due:
                break
        else:
            raise AssertionError(f"{node.id} stays due at {due} ({late.role.name})")
        self.checked += 1

    def completed(self, node_id, handle, code, positions) -> None:
        """Outcomes are the checker's business."""


def _state(r):
    return (r.role, r.term, r.vote_for, r.committed_index, r.next_deadline_ms())


def test_ticks_agree_with_the_deadline_through_a_faulty_run():
    schedule = Schedule(
        3,
        (
            Fault(300, "partition", (0,)),
            Fault(900, "heal"),
            Fault(1200, "crash", (1,)),
            Fault(1500, "restart", (1,)),
            Fault(1800, "pause", (2,)),
            Fault(2100, "resume", (2,)),
        ),
        NetworkConditions(drop=0.05, duplicate=0.05, max_delay_ms=5.0),
        duration_ms=2500,
        heal_ms=1000,
    )
    probes = []

    def workload(cluster):
        probe = DeadlineProbe(cluster, every=11)
        cluster.observers.append(probe)
        probes.append(probe)
        return Appends(cluster)

    run(schedule, random.Random(11), workload=workload)
    assert probes[0].checked > 100
