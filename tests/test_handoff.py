"""The core's `Ready` (`core.output`): no message leaves before the term and vote it
depends on are durable (`Handoff`), and a driver carries out Readies in the order the
core made them, even when an effect feeds the core again. The trio server and the
simulator both take it."""

import random

from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.output import Completion, Handoff, Output
from raftmq.dledger.sim.cluster import SimCluster


def test_an_output_without_hard_state_is_released_at_once_with_the_deadline():
    handoff = Handoff()
    out = Output(
        messages=["m1", "m2"],
        needs_sync=True,
        completions=[Completion(7, Code.SUCCESS)],
        role_changes=[(3, Role.LEADER)],
        committed_index=4,
    )
    ready = handoff.ready(out, 250.0)
    assert ready.outputs == [out] and ready.save is None and ready.next_deadline_ms == 250.0
    ready = handoff.ready(Output(), 300.0)  # nothing new
    assert ready.outputs == [] and ready.save is None and not handoff.saving


def test_messages_wait_for_their_term_and_vote_and_later_outputs_wait_behind_them():
    handoff = Handoff()
    vote, later = Output(hard_state=(2, "n1"), messages=["vote"]), Output(messages=["later"])
    ready = handoff.ready(vote, 0.0)
    assert ready.outputs == [] and ready.save == (2, "n1") and handoff.saving
    ready = handoff.ready(later, 0.0)  # no hard state of its own, but it may not overtake
    assert ready.outputs == [] and ready.save is None
    handoff.hard_state_saved()
    ready = handoff.ready(Output(), 0.0)
    assert ready.outputs == [vote, later] and ready.save is None and not handoff.saving


def test_outputs_held_during_a_save_go_out_behind_one_save_of_the_latest_hard_state():
    handoff = Handoff()
    a = Output(hard_state=(2, None), messages=["a"])
    b = Output(hard_state=(2, "n0"), messages=["b"])
    c = Output(hard_state=(3, None), messages=["c"])
    assert handoff.ready(a, 0.0).save == (2, None)
    assert handoff.ready(b, 0.0).save is None and handoff.ready(c, 0.0).save is None
    handoff.hard_state_saved()
    ready = handoff.ready(Output(), 0.0)
    assert ready.outputs == [a] and ready.save == (3, None)  # carried out, then saved
    handoff.hard_state_saved()
    assert handoff.ready(Output(), 0.0).outputs == [b, c]


def test_a_save_that_completes_at_once_releases_with_the_next_ready():
    handoff = Handoff()
    ack, following = Output(hard_state=(5, "n2"), messages=["ack"]), Output(messages=["next"])
    assert handoff.ready(ack, 0.0).save == (5, "n2")
    handoff.hard_state_saved()
    assert handoff.ready(following, 0.0).outputs == [ack, following]


class Recording(SimCluster):
    """A simulated group that records, in order, what its members send."""

    def __init__(self, *args) -> None:
        self.done: list = []
        super().__init__(*args)

    def _send(self, src, msg):
        self.done.append(("send", src, type(msg).__name__))
        super()._send(src, msg)


class AppendOnFirstCompletion:
    """An observer whose first completion appends again: an effect that feeds the core
    while a Ready is being carried out."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.fed = False

    def after_event(self, node) -> None:
        """Nothing to do between events."""

    def completed(self, node_id, handle, code, positions) -> None:
        self.cluster.done.append(("complete", node_id, handle))
        if not self.fed:
            self.fed = True
            self.cluster.client_append(node_id)


def test_a_ready_made_by_an_effect_is_carried_out_after_the_current_one():
    cluster = Recording(3, random.Random(3))
    leader, _ = cluster.run_until_leader()
    cluster.run_until(cluster.now_ms + 300)
    followers = [n for n in cluster.ids if n != leader.id]
    for follower in followers:  # the pushes of both appends are lost: resent as one
        cluster.block_one_way(leader.id, follower)
    first, second = cluster.client_append(), cluster.client_append()
    cluster.run_until(cluster.now_ms + 20)
    cluster.heal()
    cluster.done = []
    cluster.observers.append(AppendOnFirstCompletion(cluster))
    cluster.run_until(cluster.now_ms + 1000)  # one answer commits both
    done = [d for d in cluster.done if d[1] == leader.id and d[-1] != "HeartBeatRequest"]
    done = done[done.index(("complete", leader.id, first)) :]  # after the resent pushes
    assert done[:3] == [
        ("complete", leader.id, first),
        ("complete", leader.id, second),  # before the pushes of the append the first made
        ("send", leader.id, "PushRequest"),
    ], done
