"""Fault schedules as data, and the runner that plays one against a simulated group.

A schedule is a list of timed faults; the runner keeps a workload going (by default
a client appending to whichever replica leads), plays the faults, then heals
everything and checks that the group converges with every acknowledged append
intact. A failing schedule is printed in full, so it can be replayed as a
regression case.
"""

from __future__ import annotations

import random

import attrs
from raftmq.dledger.codes import Code
from raftmq.dledger.core.membership import Change
from raftmq.dledger.sim.checks import InvariantViolation
from raftmq.dledger.sim.cluster import NetworkConditions, SimCluster, Variant
from raftmq.dledger.sim.disk import MemoryStores


@attrs.frozen
class Fault:
    at_ms: float
    # crash | restart | pause | resume | partition | one_way | heal, and the leader's
    # membership changes: add (a spare joins as a learner) | promote (its first
    # learner) | remove (the first of `nodes`, which may be the leader itself)
    kind: str
    nodes: tuple[int, ...] = ()  # indexes into the nodes (partition: the first group)
    keep_unsynced: int = 0  # crash: unsynced entries that survive (a partly flushed page cache)


@attrs.frozen
class Schedule:
    size: int
    faults: tuple[Fault, ...]
    conditions: NetworkConditions = attrs.field(factory=NetworkConditions)
    append_every_ms: float = 10.0
    duration_ms: float = 6000.0
    heal_ms: float = 4000.0
    hard_state_fsync_ms: tuple[float, float] | None = None  # see SimCluster
    slow_fsync_chance: float = 0.0  # see SimCluster
    spares: int = 0  # nodes that `add` faults start (see SimCluster)


class Appends:
    """The default workload: raw appends to whichever replica leads.

    A workload is built on the cluster and offers `step()` (one client action per
    `append_every_ms`), `probe(node_id)` (one request after healing; returns a
    callable telling whether it was acknowledged) and `check_final()` (its own
    checks once the group has converged), so a model layered on the log (a broker)
    reuses this runner.
    """

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def step(self) -> None:
        self.cluster.client_append()

    def probe(self, node_id: str):
        handle = self.cluster.client_append(node_id)
        return lambda: self.cluster.checker.outcomes.get(handle) is Code.SUCCESS

    def check_final(self) -> None:
        """Nothing beyond the Raft checker's own final checks."""


def run(
    schedule: Schedule,
    rng: random.Random,
    variant: Variant | None = None,
    workload=Appends,
    stores=MemoryStores,
) -> SimCluster:
    """Play `schedule` with `workload(cluster)` on logs kept by `stores` (`sim.disk`);
    raises InvariantViolation on any safety or liveness failure."""
    cluster = SimCluster(
        schedule.size,
        rng,
        schedule.conditions,
        variant,
        stores=stores,
        hard_state_fsync_ms=schedule.hard_state_fsync_ms,
        slow_fsync_chance=schedule.slow_fsync_chance,
        spares=schedule.spares,
    )
    client = workload(cluster)
    ids = cluster.ids
    faults = sorted(schedule.faults, key=lambda f: f.at_ms)
    step_ms = schedule.append_every_ms
    t = 0.0
    while t < schedule.duration_ms:
        while faults and faults[0].at_ms <= t:
            _apply(cluster, faults.pop(0), ids)
        client.step()
        t += step_ms
        cluster.run_until(t)
    _converge(cluster, schedule.heal_ms, client)
    return cluster


def _apply(cluster: SimCluster, fault: Fault, ids: list[str]) -> None:
    nodes = [ids[i % len(ids)] for i in fault.nodes]
    if fault.kind == "crash":
        for n in nodes:
            cluster.crash(n, fault.keep_unsynced)
    elif fault.kind == "restart":
        for n in nodes:
            cluster.restart(n)
    elif fault.kind == "pause":
        for n in nodes:
            cluster.pause(n)
    elif fault.kind == "resume":
        for n in nodes:
            cluster.resume(n)
    elif fault.kind == "partition":
        cluster.partition([nodes, [n for n in ids if n not in nodes]])
    elif fault.kind == "one_way" and len(nodes) >= 2 and nodes[0] != nodes[1]:
        cluster.block_one_way(nodes[0], nodes[1])
    elif fault.kind == "heal":
        cluster.heal()
    elif fault.kind == "add":
        cluster.add_member()
    elif fault.kind == "promote" and (leader := cluster.leader()) is not None:
        learners = leader.replica.members.current.learners
        if learners:
            cluster.change_members(Change.PROMOTE, learners[0])
    elif fault.kind == "remove":
        cluster.change_members(Change.REMOVE, nodes[0])


def _converge(cluster: SimCluster, heal_ms: float, client) -> None:
    """Heal every fault, then demand progress: a leader, a new committed append, equal logs."""
    cluster.heal()
    cluster.conditions = NetworkConditions()
    for node_id in cluster.ids:
        cluster.resume(node_id)
        cluster.restart(node_id)
    cluster.run_until(cluster.now_ms + heal_ms)
    leader = cluster.leader()
    if leader is None:
        raise InvariantViolation(f"no leader {heal_ms:.0f} ms after healing")
    acknowledged = client.probe(leader.id)
    cluster.run_until(cluster.now_ms + heal_ms / 2)
    if not acknowledged():
        raise InvariantViolation(f"a request to leader {leader.id} after healing did not commit")
    target = leader.replica.committed_index
    for node in (cluster.nodes[n] for n in cluster.members()):
        if node.replica.committed_index < target:
            raise InvariantViolation(
                f"{node.id} did not catch up: committed {node.replica.committed_index} < {target}"
            )
    cluster.checker.check_final()
    client.check_final()
