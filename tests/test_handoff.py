"""The one hand-off from the core to a driver (`core.output.Handoff`): no message
leaves before the term and vote it depends on are durable, and effects leave in the
order the core produced them. The trio server and the simulator both rely on it."""

from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.output import Completion, Handoff, Output


class Core:
    """A stand-in replica whose outputs are queued by the test."""

    def __init__(self) -> None:
        self.outputs: list[Output] = []

    def take_output(self) -> Output:
        return self.outputs.pop(0) if self.outputs else Output()


class Recorder:
    """Effects that record what was done; saves complete when the test says so."""

    def __init__(self, saves_at_once: bool = False) -> None:
        self.done: list = []
        self.saves_at_once = saves_at_once
        self.handoff: Handoff | None = None
        self.on_complete = None

    def save_hard_state(self, term, vote_for):
        self.done.append(("save", term, vote_for))
        if self.saves_at_once:
            self.handoff.hard_state_saved()

    def send(self, msg):
        self.done.append(("send", msg))

    def sync(self):
        self.done.append(("sync",))

    def role_changed(self, term, role):
        self.done.append(("role", term, role))

    def committed(self, index):
        self.done.append(("commit", index))

    def completed(self, completion):
        self.done.append(("complete", completion.handle))
        if self.on_complete:
            self.on_complete()


def wired(saves_at_once=False):
    core, effects = Core(), Recorder(saves_at_once)
    handoff = Handoff(core, effects)
    effects.handoff = handoff
    return core, effects, handoff


def test_an_output_without_hard_state_is_carried_out_at_once_in_order():
    core, effects, handoff = wired()
    core.outputs.append(
        Output(
            messages=["m1", "m2"],
            needs_sync=True,
            completions=[Completion(7, Code.SUCCESS)],
            role_changes=[(3, Role.LEADER)],
            committed_index=4,
        )
    )
    handoff.drain()
    assert effects.done == [
        ("send", "m1"),
        ("send", "m2"),
        ("sync",),
        ("role", 3, Role.LEADER),
        ("commit", 4),
        ("complete", 7),
    ]
    handoff.drain()  # nothing new
    assert len(effects.done) == 6 and not handoff.saving


def test_messages_wait_for_their_term_and_vote_and_later_outputs_wait_behind_them():
    core, effects, handoff = wired()
    core.outputs += [Output(hard_state=(2, "n1"), messages=["vote"]), Output(messages=["later"])]
    handoff.drain()
    assert effects.done == [("save", 2, "n1")] and handoff.saving
    handoff.drain()  # no hard state of its own, but it may not overtake the vote
    assert effects.done == [("save", 2, "n1")]
    handoff.hard_state_saved()
    assert effects.done == [("save", 2, "n1"), ("send", "vote"), ("send", "later")]
    assert not handoff.saving


def test_outputs_held_during_a_save_go_out_behind_one_save_of_the_latest_hard_state():
    core, effects, handoff = wired()
    core.outputs += [
        Output(hard_state=(2, None), messages=["a"]),
        Output(hard_state=(2, "n0"), messages=["b"]),
        Output(hard_state=(3, None), messages=["c"]),
    ]
    for _ in range(3):
        handoff.drain()
    handoff.hard_state_saved()
    assert effects.done == [("save", 2, None), ("send", "a"), ("save", 3, None)]
    handoff.hard_state_saved()
    assert effects.done[3:] == [("send", "b"), ("send", "c")]


def test_a_save_that_completes_at_once_releases_at_once():
    core, effects, handoff = wired(saves_at_once=True)
    core.outputs += [Output(hard_state=(5, "n2"), messages=["ack"]), Output(messages=["next"])]
    handoff.drain()
    handoff.drain()
    assert effects.done == [("save", 5, "n2"), ("send", "ack"), ("send", "next")]


def test_an_effect_that_feeds_the_core_is_carried_out_after_the_current_ones():
    core, effects, handoff = wired()
    core.outputs.append(
        Output(completions=[Completion(1, Code.SUCCESS), Completion(2, Code.SUCCESS)])
    )

    def append_again():  # a completion's callback appends: the core has a new output
        effects.on_complete = None
        core.outputs.append(Output(messages=["push"]))
        handoff.drain()

    effects.on_complete = append_again
    handoff.drain()
    assert effects.done == [("complete", 1), ("complete", 2), ("send", "push")]
