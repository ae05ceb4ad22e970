"""The leader plan: which DLedger groups hand leadership over, and to whom, so that no
host leads more than its share of a cluster's groups (`leader_moves`).

With N broker groups spread over N machines, each machine should lead one group: a
leader does the appends, fsyncs and pushes of its group, so two leaders on one machine
halve what that machine gives each. A host is the host of a member's DLedger peer
address. The plan is a function of the groups' members and leaders alone, so every
broker that computes it from the same view finds the same moves (what lets each group's
leader move only its own group without two deciders fighting).
"""

from __future__ import annotations

import math
from collections import Counter

import attrs


@attrs.frozen
class GroupLeader:
    """One DLedger group as its members report it: its leader and each voter's host."""

    group: str
    broker_addr: str  # a broker of the group, to ask
    leader: str | None  # its leader's member id, None while it has none
    hosts: dict[str, str]  # voter id -> host of its DLedger peer address


@attrs.frozen
class Move:
    group: str
    broker_addr: str
    leader: str
    to: str


def host_of(address: str) -> str:
    """The host of a `host:port` address (an IPv6 literal in brackets included)."""
    return address.rpartition(":")[0].strip("[]")


def leader_moves(groups: list[GroupLeader]) -> list[Move]:
    """The moves, fewest first found, after which no host leads more than
    ceil(groups with a leader / hosts) groups, where each group can move only to its
    own voters; a group whose leader's host is within its share stays. Deterministic:
    groups are taken by name, a target is the least loaded host (then its name)."""
    led = [g for g in groups if g.leader is not None and g.leader in g.hosts]
    hosts = sorted({host for g in led for host in g.hosts.values()})
    if not hosts:
        return []
    share = math.ceil(len(led) / len(hosts))
    load = Counter({host: 0 for host in hosts})
    load.update(g.hosts[g.leader] for g in led)
    moves = []
    for g in sorted(led, key=lambda g: g.group):
        here = g.hosts[g.leader]
        if load[here] <= share:
            continue
        targets = [(load[h], h, member) for member, h in sorted(g.hosts.items()) if h != here]
        if not targets:
            continue
        count, there, member = min(targets)
        if count + 1 > share:
            continue  # every other host of this group is at its share already
        assert load[here] > share >= load[there] + 1, (load, here, there)
        load[here] -= 1
        load[there] += 1
        moves.append(Move(g.group, g.broker_addr, g.leader, member))
    return moves


def group_leader(group: str, broker_addr: str, members: dict) -> GroupLeader:
    """A group as DLEDGER_MEMBERS answers it (`{"voters", "peers", "leaderId", ...}`)."""
    peers = members["peers"]
    hosts = {m: host_of(peers[m]) for m in members["voters"] if m in peers}
    return GroupLeader(group, broker_addr, members["leaderId"], hosts)
