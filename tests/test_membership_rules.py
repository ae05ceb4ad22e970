"""Membership change in the core, on the deterministic simulated group: a member joins as
a learner and is promoted by a second change, one change at a time, through the log;
a removed member never counts in a quorum, a removed leader steps down, and the
configuration is saved with the term and vote (docs/membership.md)."""

import random

import attrs
import pytest
from raftmq.broker.store.commitlog import dispatch_rows
from raftmq.dledger.codes import Code, EntryType, Role
from raftmq.dledger.core.membership import MEMBERS_PREFIX, Change, Members, MemberState
from raftmq.dledger.server import saved_members
from raftmq.dledger.sim.cluster import SimCluster
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.meta import TermVoteFile

from tests.helpers import make_replica

HB = 100.0  # DLedgerConfig.heartbeat_interval_ms default


def settled(size: int, spares: int = 0, seed: int = 0) -> tuple[SimCluster, object]:
    """A group of `size` with a leader whose NOOP has committed."""
    cluster = SimCluster(size, random.Random(seed), spares=spares)
    leader, _ = cluster.run_until_leader(2000, settle_ms=5 * HB)
    return cluster, leader


def change(cluster: SimCluster, kind: Change, member: str, run_ms: float = 5 * HB) -> Code:
    handle = cluster.change_members(kind, member)
    assert handle is not None
    cluster.run_until(cluster.now_ms + run_ms)
    return cluster.member_changes[handle]


def commits(cluster: SimCluster, run_ms: float = 5 * HB) -> bool:
    handle = cluster.client_append()
    cluster.run_until(cluster.now_ms + run_ms)
    return cluster.checker.outcomes.get(handle) is Code.SUCCESS


def test_a_member_joins_as_a_learner_catches_up_and_votes_once_promoted():
    cluster, leader = settled(3, spares=1)
    for _ in range(20):
        cluster.client_append()
    cluster.run_until(cluster.now_ms + 2 * HB)
    joined = cluster.add_member()
    cluster.run_until(cluster.now_ms + 5 * HB)
    learner = cluster.nodes[joined].replica
    assert learner.members.current.learners == (joined,)
    assert not learner.is_voter and learner.role is not Role.LEADER
    assert learner.store.end_index == leader.store.end_index  # caught up as a learner
    assert leader.replica.quorum == 2  # a learner does not change the quorum
    assert change(cluster, Change.PROMOTE, joined) is Code.SUCCESS
    for node in cluster.nodes.values():
        assert node.replica.members.current.voters == ("n0", "n1", "n2", joined)
    assert leader.replica.quorum == 3
    assert commits(cluster)


def test_a_removed_member_never_counts_toward_a_quorum():
    """Three voters, one removed, one crashed: the removed one still runs and would take
    appends, but the leader's quorum is of the two voters left, so nothing commits."""
    cluster, leader = settled(3)
    removed, other = [n for n in cluster.ids if n != leader.id]
    assert change(cluster, Change.REMOVE, removed) is Code.SUCCESS
    assert leader.replica.members.current.voters == tuple(n for n in cluster.ids if n != removed)
    cluster.crash(other)
    assert not commits(cluster)
    cluster.restart(other)
    cluster.run_until(cluster.now_ms + 5 * HB)
    assert commits(cluster)


def test_a_removed_follower_does_not_disrupt_the_group():
    """Cut off when its removal was appended, it times out and campaigns in ever higher
    terms as a voter of its old configuration; the members refuse it as unknown."""
    cluster, leader = settled(3)
    removed = next(n for n in cluster.ids if n != leader.id)
    cluster.partition([[removed], [n for n in cluster.ids if n != removed]])
    assert change(cluster, Change.REMOVE, removed) is Code.SUCCESS
    term = leader.replica.term
    cluster.heal()
    cluster.run_until(cluster.now_ms + 20 * HB)
    assert cluster.leader() is leader and leader.replica.term == term
    assert commits(cluster)


def test_a_leader_that_removes_itself_steps_down_once_it_commits():
    cluster, leader = settled(3)
    assert change(cluster, Change.REMOVE, leader.id, run_ms=2 * HB) is Code.SUCCESS
    assert leader.replica.role is not Role.LEADER and not leader.replica.is_voter
    new, took_ms = cluster.run_until_leader(2000, not_id=leader.id, settle_ms=2 * HB)
    assert took_ms < HB, took_ms  # handed over: no lease (3 beats) waited out
    assert new.replica.members.current.voters == tuple(n for n in cluster.ids if n != leader.id)
    cluster.run_until(cluster.now_ms + 20 * HB)
    assert leader.replica.role is not Role.LEADER  # never campaigns again
    assert commits(cluster)


def test_one_change_at_a_time_and_only_after_an_entry_of_the_leaders_term_commits():
    cluster, leader = settled(3, spares=2)
    first = cluster.add_member()
    # the first change is appended, not yet committed: a second one waits
    handle = cluster.change_members(Change.REMOVE, "n1" if leader.id != "n1" else "n2")
    assert cluster.member_changes[handle] is Code.LEADER_NOT_READY
    cluster.run_until(cluster.now_ms + 5 * HB)
    assert first in leader.replica.members.current.learners
    fresh = make_replica("n0")  # a leader of nothing yet committed
    assert fresh.change_members(1, Change.REMOVE, "n1", "", 0.0) is Code.NOT_LEADER


def test_a_change_that_does_not_apply_is_a_value_error_naming_it():
    cluster, leader = settled(3)
    with pytest.raises(ValueError, match="already a member"):
        leader.replica.change_members(99, Change.ADD_LEARNER, "n1", "h:1", cluster.now_ms)
    with pytest.raises(ValueError, match="not a learner"):
        leader.replica.change_members(99, Change.PROMOTE, "n1", "", cluster.now_ms)
    with pytest.raises(ValueError, match="bad peer"):
        leader.replica.change_members(99, Change.ADD_LEARNER, "n9", "nohost", cluster.now_ms)
    one = Members.initial({"n0": "h:1"})
    with pytest.raises(ValueError, match="last voter"):
        one.changed(Change.REMOVE, "n0", "", 5)


def test_a_restarted_member_uses_the_saved_configuration_not_its_peers():
    cluster, leader = settled(3, spares=1)
    joined = cluster.add_member()
    cluster.run_until(cluster.now_ms + 5 * HB)
    assert change(cluster, Change.PROMOTE, joined) is Code.SUCCESS
    follower = next(n for n in cluster.ids if n not in (leader.id, joined))
    cluster.crash(follower)
    cluster.restart(follower)
    assert cluster.nodes[follower].replica.members.current.voters == ("n0", "n1", "n2", joined)
    assert cluster.nodes[follower].replica.quorum == 3


def test_an_unsynced_configuration_a_crash_took_is_not_in_force(tmp_path):
    """The configuration is saved before its entry is durable; a restart whose log lost
    the entry goes back to the prior (committed) configuration."""
    first = Members.initial({"n0": "h:1", "n1": "h:2", "n2": "h:3"})
    added = first.changed(Change.ADD_LEARNER, "n3", "h:4", 7)
    state = MemberState(first, first).appended(added)
    assert state.truncated(6) == MemberState(first, first)
    assert state.truncated(7) is state
    replica = make_replica("n0", log_terms=(1, 1, 1), members=state)
    assert replica.members.current == first
    # ... and saves that, or a log grown past index 7 would bring the lost one back
    assert replica.ready().members == MemberState(first, first)


def test_the_configuration_is_saved_with_the_term_and_vote(tmp_path, caplog):
    first = Members.initial({"n0": "h:1", "n1": "h:2", "n2": "h:3"})
    state = MemberState(first, first).appended(first.changed(Change.ADD_LEARNER, "n3", "h:4", 9))
    saved = TermVoteFile(tmp_path / "currterm")
    saved.save(4, "n1", state.text())
    saved.save(5, None)  # a later save of term and vote keeps it
    again = TermVoteFile(tmp_path / "currterm")
    assert again.load() == (5, None)
    replica = make_replica("n0")
    members = saved_members(replica.config, again.members_text)
    assert members == state
    assert "differ from the configuration in force" in caplog.text
    with pytest.raises(ValueError, match="unreadable saved configuration"):
        saved_members(replica.config, "9|n0-h:1|n0-h:1\n9|n0-h:1|")


def test_a_configuration_entry_is_a_noop_the_broker_dispatch_skips():
    members = Members.initial({"n0": "h:1"})
    blob, _chain = codec.encode(EntryType.NOOP, 0, 1, 0, members.body(), 0)
    (row,), error = dispatch_rows(blob, 0)
    assert error is None and row == (0, None)
    assert blob.find(MEMBERS_PREFIX) > 0
    assert Members.from_body(codec.decode(blob).body, 0) == attrs.evolve(members, index=0)
