"""Fault schedules from a seed, and what the `client` kind does to the client proxies,
without processes: a stub stands in for the cluster and its client ProxyNet."""

from __future__ import annotations

import pytest

from jepsen.cluster import CLIENT
from jepsen.history import Recorder, faults
from jepsen.nemesis import KINDS, Nemesis, Step, plan

NODES = ["n0", "n1", "n2"]


def test_the_client_kind_is_planned_deterministically_from_the_seed():
    kinds = ["kill", "partition", "client"]
    assert plan(3, kinds, 300, 3) == plan(3, kinds, 300, 3)
    assert plan(3, kinds, 300, 3) != plan(4, kinds, 300, 3)
    steps = [s for seed in range(20) for s in plan(seed, ["client"], 60, 5)]
    targets, variants, (low, high) = KINDS["client"]
    assert {s.kind for s in steps} == {"client"}
    assert {s.variant for s in steps} == set(variants)
    assert {s.target for s in steps} == set(targets)
    assert all(low <= s.duration_s <= high for s in steps)
    assert "client" in {s.kind for s in plan(3, kinds, 300, 3)}


def test_an_unknown_kind_names_the_client_kind_among_the_known():
    with pytest.raises(ValueError, match="client"):
        plan(1, ["clients"], 60, 3)


class ClientNet:
    """Records what the nemesis asks of the client ProxyNet."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def apply(self, grudge):
        self.calls.append(("apply", grudge))

    def set_latency(self, ms, jitter_ms, links):
        self.calls.append(("latency", ms, jitter_ms, links))

    def reset(self, links):
        self.calls.append(("reset", links))

    def cut_after(self, links, n_bytes):
        self.calls.append(("cut", links, n_bytes))

    def cuts(self, links):
        return sum(call[0] == "cut" for call in self.calls)  # every cut bit at once

    def heal(self):
        self.calls.append(("heal",))


class Cluster:
    def __init__(self) -> None:
        self.ids = NODES
        self.controllers = ()
        self.net = None
        self.clients = ClientNet()
        self.slowing: dict = {}  # no disk faults here
        self.mounted: list = []
        self.out: set = set()  # no member set aside

    async def leader(self) -> str:
        return "n1"

    def running(self, node: str) -> bool:
        return True

    def resume(self, node: str) -> None:
        pass


@pytest.mark.parametrize(
    ("variant", "target", "first", "progress"),
    [
        ("blackhole", "leader", ("apply", {CLIENT: {"n1"}}), False),
        ("blackhole", "all", ("apply", {CLIENT: set(NODES)}), False),
        ("reset", "leader", ("reset", [(CLIENT, "n1")]), False),
        ("latency", "all", "latency", True),
        ("cut-mid-frame", "leader", "cut", True),
    ],
)
async def test_client_faults_drive_only_the_client_links_then_heal(
    tmp_path, variant, target, first, progress
):
    cluster = Cluster()
    with Recorder(tmp_path / "history.jsonl") as history:
        nemesis = Nemesis(cluster, history)
        await nemesis.play(Step(0.0, "client", target, variant, 0.0, seed=7))
        assert await nemesis.heal_all() == "nothing to restart"
    hit = ["n1"] if target == "leader" else NODES
    calls = cluster.clients.calls
    if isinstance(first, str):  # the amount is drawn from the step's seed
        assert calls[0][0] == first
        assert [(CLIENT, n) for n in hit] in calls[0]
    else:
        assert calls[0] == first
    assert calls[1:] == [("heal",), ("heal",)]  # at the fault's end, and by heal_all
    [fault] = faults(history.ops)
    assert (fault.kind, fault.targets, fault.stopped) == ("client", hit, True)
    assert fault.majority_ok is progress
    # A cut records whether a frame crossed the link while it was armed.
    cut = 1 if variant == "cut-mid-frame" else None
    assert nemesis.injected[0].get("cut_connections") == cut


def test_lose_master_comes_once_and_last():
    steps = plan(7, ["kill", "pause", "lose-master"], 40.0, 2)
    assert [s.kind for s in steps].count("lose-master") == 1
    assert steps[-1].kind == "lose-master" and steps[-1].at_s == 30.0
    assert all(s.at_s + s.duration_s <= 30.0 for s in steps[:-1]) and len(steps) > 2
    assert {s.target for s in steps[:-1]} <= {"leader", "one", "all"}  # two members
    assert [s.kind for s in plan(3, ["lose-master"], 20.0, 2)] == ["lose-master"]
