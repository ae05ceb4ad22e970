"""Where DLedger groups lead: `leader_moves` plans the fewest moves that leave no host
leading more than its share, and `mqadmin transferDLedgerLeader` and
`balanceDLedgerLeaders`, or the leaders themselves (`enableAutoLeaderBalance`), carry
them out on real broker groups whose members listen on three loopback hosts, as three
machines would."""

from __future__ import annotations

import json
from collections import Counter

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from raftmq.broker.leader_balance import Unsettled, cluster_masters

from raftmq.client.admin import Admin
from raftmq.client.mqadmin.leaders import group_leaders
from raftmq.placement.leaders import GroupLeader, Move, leader_moves
from raftmq.tools.broker_local import LocalGroups
from tests.helpers import mqadmin

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
# one machine's loopback hosts: every peer connection comes from 127.0.0.1
ON_LOOPBACK = {"checkPeerHosts": "false"}
AUTO_INTERVAL_MS = 500


def spread(name: str, leader: str) -> GroupLeader:
    """A group of three members, n0 on the first host, n1 the second, n2 the third."""
    hosts = {f"n{i}": host for i, host in enumerate(HOSTS)}
    return GroupLeader(name, f"{name}-broker", leader, hosts)


def test_two_leaders_on_one_host_of_three_part():
    groups = [spread("a", "n0"), spread("b", "n0"), spread("c", "n1")]
    assert leader_moves(groups) == [Move("a", "a-broker", "n0", "n2")]  # the first by name
    assert leader_moves([spread("a", "n0"), spread("b", "n1"), spread("c", "n2")]) == []
    assert leader_moves([spread("a", None), spread("b", "n0")]) == []  # b alone is its share


@st.composite
def clusters(draw):
    hosts = [f"h{i}" for i in range(draw(st.integers(1, 4)))]
    groups = []
    for index in range(draw(st.integers(0, 6))):
        members = draw(st.integers(1, 5))
        placed = {f"n{i}": draw(st.sampled_from(hosts)) for i in range(members)}
        leader = draw(st.sampled_from([None, *placed]))
        groups.append(GroupLeader(f"g{index}", f"addr{index}", leader, placed))
    return groups


@given(clusters())
def test_moves_leave_no_host_over_its_share_that_could_be_relieved(groups):
    moves = leader_moves(groups)
    by_name = {g.group: g for g in groups}
    assert len({m.group for m in moves}) == len(moves), "a group moves once"
    leaders = {g.group: g.leader for g in groups if g.leader is not None}
    for move in moves:
        group = by_name[move.group]
        assert move.leader == group.leader and move.to in group.hosts
        assert group.hosts[move.to] != group.hosts[move.leader]
        leaders[move.group] = move.to
    load = Counter(by_name[g].hosts[m] for g, m in leaders.items())
    hosts = {h for g in groups if g.leader is not None for h in g.hosts.values()}
    share = -(-len(leaders) // len(hosts)) if hosts else 0
    for name, member in leaders.items():
        here = by_name[name].hosts[member]
        if load[here] > share:  # only where none of its group's other hosts had room
            assert all(load[h] >= share for h in by_name[name].hosts.values() if h != here)


@given(clusters())
def test_the_plan_is_stable_once_carried_out(groups):
    """Every leader computes the plan each interval: once its moves are made, the plan
    is empty (a balanced cluster yields no move), so automatic balancing settles."""
    moved = {m.group: m.to for m in leader_moves(groups)}
    after = [attrs.evolve(g, leader=moved.get(g.group, g.leader)) for g in groups]
    assert leader_moves(after) == []


def test_cluster_masters_hold_off_while_a_group_has_no_master():
    body = {
        "brokerAddrTable": {
            "a": {"brokerAddrs": {"0": "h1:10911", "1": "h2:10911"}},
            "b": {"brokerAddrs": {"1": "h3:10911"}},
        },
        "clusterAddrTable": {"C": ["a"], "D": ["a", "b"]},
    }
    assert cluster_masters(json.dumps(body).encode(), "C") == {"a": "h1:10911"}
    with pytest.raises(Unsettled, match="no master in b"):
        cluster_masters(json.dumps(body).encode(), "D")
    with pytest.raises(Unsettled, match="malformed"):
        cluster_masters(b'{"clusterAddrTable": []}', "C")


async def leaders_on_first_host(cluster: LocalGroups) -> None:
    """Both groups' leadership moved to n0, on 127.0.0.1, as restarts may leave it."""
    for group in cluster.groups:
        master = await group.wait_master()
        moved = await mqadmin(
            "transferDLedgerLeader", "-n", cluster.namesrv_addr,
            "-b", group.broker_addrs[master], "-m", "n0",
        )  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        assert b"n0 leads" in moved.stdout


async def spread_leaders(admin: Admin, cluster: LocalGroups) -> list[GroupLeader]:
    """The two groups, once they are led from two hosts (within ten balance intervals)."""
    with trio.fail_after(10 * AUTO_INTERVAL_MS / 1000):
        while True:
            groups = await group_leaders(admin, cluster.cluster_name)
            hosts = {g.hosts.get(g.leader) for g in groups}  # None: mid-election
            if len(groups) == 2 and None not in hosts and len(hosts) == 2:
                return groups
            await trio.sleep(0.05)


@pytest.mark.processes
async def test_leaders_spread_by_themselves_with_auto_leader_balance(tmp_path):
    """With enableAutoLeaderBalance, both groups led from one host: within a few
    intervals one group's leader hands over by itself (the other stays), leaving a
    leader per host, and the cluster stays so (the plan is then empty)."""
    conf = {
        **ON_LOOPBACK,
        "enableAutoLeaderBalance": "true",
        "autoLeaderBalanceIntervalMs": str(AUTO_INTERVAL_MS),
    }
    async with (
        LocalGroups(tmp_path, groups=2, hosts=HOSTS, extra_conf=conf) as cluster,
        Admin(cluster.namesrv_addr) as admin,
    ):
        # as elected at start (balanced by itself first if they happened to crowd)
        await spread_leaders(admin, cluster)
        await leaders_on_first_host(cluster)
        crowded = trio.current_time()
        groups = await spread_leaders(admin, cluster)
        print(f"spread {trio.current_time() - crowded:.2f} s after both led from one host")
        assert sorted(g.leader for g in groups).count("n0") == 1, groups
        await trio.sleep(3 * AUTO_INTERVAL_MS / 1000)  # and nothing moves again
        assert await group_leaders(admin, cluster.cluster_name) == groups


@pytest.mark.processes
async def test_mqadmin_moves_a_leader_and_balances_two_groups_over_three_hosts(tmp_path):
    """Both groups' leaders moved onto the first host with transferDLedgerLeader, then
    balanceDLedgerLeaders moves one away: each host leads at most one group, and the
    name server routes each group's master where its leader now is."""
    # enableAutoLeaderBalance is off by default: nothing moves by itself
    conf = {**ON_LOOPBACK, "autoLeaderBalanceIntervalMs": str(AUTO_INTERVAL_MS)}
    async with LocalGroups(tmp_path, groups=2, hosts=HOSTS, extra_conf=conf) as cluster:
        await leaders_on_first_host(cluster)
        async with Admin(cluster.namesrv_addr) as admin:
            with trio.fail_after(15):
                while {g.leader for g in await group_leaders(admin, cluster.cluster_name)} != {
                    "n0"
                }:
                    await trio.sleep(0.1)
            await trio.sleep(3 * AUTO_INTERVAL_MS / 1000)
            assert {g.leader for g in await group_leaders(admin, cluster.cluster_name)} == {"n0"}
        balanced = await mqadmin(
            "balanceDLedgerLeaders", "-n", cluster.namesrv_addr, "-c", cluster.cluster_name
        )
        assert balanced.returncode == 0, balanced.stderr
        assert balanced.stdout.count(b"moved") == 1, balanced.stdout
        async with Admin(cluster.namesrv_addr) as admin:
            groups = await group_leaders(admin, cluster.cluster_name)
            assert len({g.hosts[g.leader] for g in groups}) == 2, groups
            leader_of = {g.group: g.leader for g in groups}
            for group in cluster.groups:  # the master clients are routed to
                with trio.fail_after(10):
                    while await group.wait_master() != leader_of[group.broker_name]:
                        await trio.sleep(0.1)
            again = await mqadmin(
                "balanceDLedgerLeaders", "-n", cluster.namesrv_addr, "-c", cluster.cluster_name
            )
            assert b"balanced: no host" in again.stdout
