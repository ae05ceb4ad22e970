"""Partition shapes as Jepsen grudges: pure functions of the node list and a seeded rng.

A grudge maps a node to the set of nodes whose traffic it drops. With TCP, a drop
either way kills the connection both ways, so `ProxyNet.apply` cuts a pair if either
side holds a grudge against the other; every shape here is symmetric anyway (b in
grudge[a] exactly when a in grudge[b]), so the dict reads the same either way.
Every node gets a key, with an empty set if it drops nothing.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "bridge",
    "describe",
    "halves",
    "isolate",
    "isolate_leader",
    "majorities_ring",
    "majority",
    "majority_connected",
]

Grudge = dict[str, set[str]]


def majority(n: int) -> int:
    """The smallest quorum of n nodes."""
    return n // 2 + 1


def _components(nodes: Sequence[str], parts: Iterable[Iterable[str]]) -> Grudge:
    """Complete partition: each node drops every node outside its part."""
    part_of = {node: frozenset(part) for part in parts for node in part}
    return {node: set(nodes) - part_of[node] for node in nodes}


def _unique(nodes: Sequence[str]) -> list[str]:
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"duplicate node ids in {list(nodes)}")
    return list(nodes)


def isolate(nodes: Sequence[str], node: str) -> Grudge:
    """`node` alone on one side, everyone else together on the other."""
    nodes = _unique(nodes)
    if node not in nodes:
        raise ValueError(f"{node!r} is not one of {nodes}")
    return _components(nodes, [[node], [n for n in nodes if n != node]])


def isolate_leader(nodes: Sequence[str], leader: str) -> Grudge:
    """Cut the current leader off alone: it may go on believing it leads (a zombie)
    while the rest elect a new one. The same shape as `isolate`; the name is the
    nemesis's, which has to find the leader first."""
    return isolate(nodes, leader)


def halves(nodes: Sequence[str], rng: random.Random) -> Grudge:
    """A random majority and the minority, completely cut from each other.

    With an even count the split is n/2 + 1 against n/2 - 1 rather than Jepsen's
    n/2 against n/2, so one side can always elect a leader.
    """
    shuffled = _unique(nodes)
    if len(shuffled) < 2:
        raise ValueError("halves needs at least 2 nodes")
    rng.shuffle(shuffled)
    m = majority(len(shuffled))
    return _components(shuffled, [shuffled[:m], shuffled[m:]])


def majorities_ring(nodes: Sequence[str], rng: random.Random) -> Grudge:
    """Every node sees a majority (itself included), and no two see the same one.

    The nodes go round a ring in random order and each stays connected to its k
    nearest neighbours on both sides, k the least with 2k + 1 >= majority: for 4
    and 5 nodes that is the exact ring (each node sees only its two neighbours),
    for 6 and 7 each also sees the nodes two steps away. A view is then an arc of
    2k + 1 consecutive nodes centred on its owner, so the views differ, and the
    shape is symmetric (Jepsen's stochastic version for n > 5 is not).

    With 3 nodes (or fewer) the only majority-sized arcs already cover everyone: a
    ring is full connectivity, and no symmetric 3-node shape gives every node a
    distinct majority. That is a ValueError rather than a silent no-op fault; pick
    `bridge`, the nearest 3-node shape (every pair but one connected).

    No majority is fully connected here (the largest fully connected set is k + 1
    consecutive nodes), so `majority_connected` is False: a leader can still reach
    a majority, but the nodes it cannot reach keep timing out and raising the term
    through the nodes it shares with them. Progress under a ring is a liveness
    question (pre-vote, check-quorum), not one the availability checker should
    demand an answer to.
    """
    ring = _unique(nodes)
    n = len(ring)
    k = majority(n) // 2  # the least k with 2k + 1 >= majority
    if 2 * k + 1 >= n:
        raise ValueError(f"a majorities ring needs at least 4 nodes, got {n}")
    rng.shuffle(ring)
    grudge: Grudge = {}
    for i, node in enumerate(ring):
        seen = {ring[(i + d) % n] for d in range(-k, k + 1)}
        grudge[node] = set(ring) - seen
    return grudge


def bridge(nodes: Sequence[str], rng: random.Random) -> Grudge:
    """Two halves cut from each other, plus one random node connected to both.

    The bridge node and the larger half form a fully connected majority, so a
    leader there can make progress, but the other half can still reach the bridge
    node and disturb it with higher terms.
    """
    shuffled = _unique(nodes)
    if len(shuffled) < 3:
        raise ValueError("a bridge needs at least 3 nodes")
    rng.shuffle(shuffled)
    middle, rest = shuffled[0], shuffled[1:]
    half = len(rest) // 2
    left, right = set(rest[:half]), set(rest[half:])
    grudge: Grudge = {middle: set()}
    grudge.update({node: set(right) for node in left})
    grudge.update({node: set(left) for node in right})
    return grudge


def _connected(grudge: Mapping[str, Iterable[str]], a: str, b: str) -> bool:
    return b not in grudge.get(a, ()) and a not in grudge.get(b, ())


def _fully_connected(grudge: Mapping[str, Iterable[str]], group: Iterable[str]) -> bool:
    return all(_connected(grudge, a, b) for a, b in itertools.combinations(group, 2))


def majority_connected(nodes: Sequence[str], grudge: Mapping[str, Iterable[str]]) -> bool:
    """Whether some majority of `nodes` is fully connected (every pair can talk).

    That is the condition under which a Raft group is expected to elect a leader
    and go on committing: a leader needs only a star to a majority, but a majority
    in which some pair cannot talk leaves a member that keeps timing out and
    campaigning (the ring). True for no fault, `isolate`, `halves` and `bridge`;
    False for `majorities_ring` and for splits with no majority side.

    Checks every majority-sized subset: fine for the 3 to 9 nodes a run uses.
    """
    grudge = {node: set(dropped) for node, dropped in grudge.items()}
    return any(
        _fully_connected(grudge, group)
        for group in itertools.combinations(nodes, majority(len(nodes)))
    )


def describe(grudge: Mapping[str, Iterable[str]]) -> str:
    """A short text for the history and the plots.

    A complete partition prints its sides: "n0|n1,n2". Any other shape (ring,
    bridge) prints what each node drops, after a "!": "n0!n2,n3 n1!n3,n4 ...".
    No fault is "healthy".
    """
    grudge = {node: set(dropped) for node, dropped in grudge.items()}
    nodes = sorted(set(grudge).union(*grudge.values()))
    if not any(grudge.values()):
        return "healthy"
    sides = {frozenset(n for n in nodes if _connected(grudge, node, n)) for node in nodes}
    disjoint = sum(map(len, sides)) == len(nodes)
    if disjoint and all(_fully_connected(grudge, side) for side in sides):
        return "|".join(sorted(",".join(sorted(side)) for side in sides))
    drops = [(node, sorted(grudge[node])) for node in nodes if grudge.get(node)]
    return " ".join(f"{node}!{','.join(dropped)}" for node, dropped in drops)
