"""Partition shapes: properties over 3..7 nodes and a truth table for majority_connected."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jepsen.partitions import (
    bridge,
    describe,
    halves,
    isolate,
    isolate_leader,
    majorities_ring,
    majority,
    majority_connected,
)

node_lists = st.integers(3, 7).map(lambda n: [f"n{i}" for i in range(n)])
seeds = st.integers(0, 2**32 - 1)


def check_grudge(nodes, grudge):
    """Well formed: every node a key, no one drops itself, symmetric."""
    assert set(grudge) == set(nodes)
    for node, dropped in grudge.items():
        assert node not in dropped
        assert dropped <= set(nodes)
        for other in dropped:
            assert node in grudge[other], f"{node} drops {other} but not the reverse"


def view(grudge, node):
    """The nodes `node` can talk to, itself included."""
    return {n for n in grudge if n not in grudge[node]}


def sides(grudge):
    return {frozenset(view(grudge, node)) for node in grudge}


def described_sides(grudge):
    return {frozenset(part.split(",")) for part in describe(grudge).split("|")}


@given(node_lists, st.data())
def test_isolate(nodes, data):
    node = data.draw(st.sampled_from(nodes))
    grudge = isolate(nodes, node)
    check_grudge(nodes, grudge)
    assert sides(grudge) == {frozenset([node]), frozenset(nodes) - {node}}
    assert isolate_leader(nodes, node) == grudge
    assert majority_connected(nodes, grudge)
    assert described_sides(grudge) == sides(grudge)


@given(node_lists, seeds)
def test_halves_split_into_a_majority_and_a_minority(nodes, seed):
    grudge = halves(nodes, random.Random(seed))
    check_grudge(nodes, grudge)
    m = majority(len(nodes))
    assert sorted(map(len, sides(grudge))) == [len(nodes) - m, m]
    assert majority_connected(nodes, grudge)
    assert halves(nodes, random.Random(seed)) == grudge  # the seed decides the split
    assert described_sides(grudge) == sides(grudge)


@given(st.integers(4, 7).map(lambda n: [f"n{i}" for i in range(n)]), seeds)
def test_majorities_ring_gives_each_node_its_own_majority(nodes, seed):
    grudge = majorities_ring(nodes, random.Random(seed))
    check_grudge(nodes, grudge)
    views = [frozenset(view(grudge, node)) for node in nodes]
    assert all(len(v) >= majority(len(nodes)) for v in views)
    assert len(set(views)) == len(nodes)
    assert not majority_connected(nodes, grudge)
    assert "|" not in describe(grudge)


@pytest.mark.parametrize("n", [4, 5])
def test_majorities_ring_is_the_exact_ring_for_four_and_five(n):
    nodes = [f"n{i}" for i in range(n)]
    grudge = majorities_ring(nodes, random.Random(0))
    # Each node talks to exactly two others, and those links form one cycle through all.
    neighbours = {node: view(grudge, node) - {node} for node in nodes}
    assert all(len(ns) == 2 for ns in neighbours.values())
    walk, previous = [nodes[0]], None
    while len(walk) <= n:
        step = next(m for m in sorted(neighbours[walk[-1]]) if m != previous)
        previous = walk[-1]
        walk.append(step)
    assert walk[-1] == walk[0] and set(walk) == set(nodes)


def test_majorities_ring_refuses_three_nodes():
    with pytest.raises(ValueError, match="at least 4"):
        majorities_ring(["a", "b", "c"], random.Random(0))


@given(node_lists, seeds)
def test_bridge_node_sees_everyone_and_the_halves_see_only_it(nodes, seed):
    grudge = bridge(nodes, random.Random(seed))
    check_grudge(nodes, grudge)
    [middle] = [node for node in nodes if not grudge[node]]
    rest = [node for node in nodes if node != middle]
    halves_ = {frozenset(view(grudge, node) - {middle}) for node in rest}
    assert len(halves_) == 2 and all(halves_)
    left, right = halves_
    assert left | right == set(rest) and not left & right
    assert majority_connected(nodes, grudge)


@given(node_lists, seeds)
def test_same_seed_same_shape(nodes, seed):
    for shape in (halves, bridge):
        assert shape(nodes, random.Random(seed)) == shape(nodes, random.Random(seed))
    if len(nodes) >= 4:
        ring = majorities_ring(nodes, random.Random(seed))
        assert ring == majorities_ring(nodes, random.Random(seed))


def cut(*pairs):
    """A symmetric grudge from "ab"-style pairs."""
    grudge = {}
    for a, b in pairs:
        grudge.setdefault(a, set()).add(b)
        grudge.setdefault(b, set()).add(a)
    return grudge


def everything_cut(nodes):
    return cut(*itertools.combinations(nodes, 2))


@pytest.mark.parametrize(
    ("nodes", "grudge", "expected"),
    [
        ("abc", {}, True),  # no fault
        ("abc", cut("ab", "ac"), True),  # a isolated, bc remain
        ("abc", cut("ab"), True),  # bridge through c
        ("abc", everything_cut("abc"), False),  # every node alone
        ("abcd", cut("ac", "ad", "bc", "bd"), False),  # 2|2: no side is a majority
        ("abcd", cut("ad"), True),  # abc
        ("abcd", cut("ac", "bd"), False),  # 4-ring: a star at best
        ("abcde", cut("ac", "ad", "bd", "be", "ce"), False),  # 5-ring
        ("abcde", cut("ad", "ae", "bd", "be"), True),  # bridge c: abc
        # a reaches b and c (a star over a majority) but b and c cannot talk.
        ("abcde", cut("bc", "ad", "ae", "bd", "be", "cd", "ce"), False),
        # one-sided grudge: d drops e only; a,b,c,d still fully connected
        ("abcde", {"d": {"e"}}, True),
    ],
)
def test_majority_connected_truth_table(nodes, grudge, expected):
    assert majority_connected(list(nodes), grudge) is expected


def test_describe():
    assert describe({}) == "healthy"
    assert describe({"a": set(), "b": set()}) == "healthy"
    assert describe(cut("ab", "ac")) == "a|b,c"
    assert describe({"c": {"a"}}) == "a|c"  # one-sided: still two sides
    assert describe({**cut("ab"), "c": set()}) == "a!b b!a"  # both see c: no clean split
