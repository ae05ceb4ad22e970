"""The controller's state machine (`raftmq.controller.replicas`), fed requests directly.

RocketMQ 5's rules (`ReplicasInfoManager`, `DefaultElectPolicy`): the epochs each event
moves, the order in which an AlterSyncStateSet is checked and what fences it, brokerId
claims that a retry with the same check code may repeat, and the election order — plus
the comparison RocketMQ gets wrong for offsets 2 GiB apart. Property tests drive random
requests and check that the tables stay consistent and that replaying the log of events
rebuilds them exactly (what a restarted controller does).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from raftmq.controller import events
from raftmq.controller.liveness import BrokerLiveInfo, Liveness
from raftmq.controller.replicas import ReplicasInfo, Result

from raftmq.remoting.codes import ResponseCode as R

CLUSTER, GROUP = "DefaultCluster", "broker-a"
GiB = 1 << 30


class Group:
    """A state machine, the log of what it applied, and which brokers are alive."""

    def __init__(self, unclean: bool = False) -> None:
        self.state = ReplicasInfo(enable_elect_unclean_master=unclean)
        self.log: list[bytes] = []
        self.live: dict[int, BrokerLiveInfo] = {}

    def alive(self, cluster: str, name: str, broker_id: int) -> bool:
        return broker_id in self.live

    def info(self, cluster: str, name: str, broker_id: int) -> BrokerLiveInfo | None:
        return self.live.get(broker_id)

    def commit(self, result: Result) -> Result:
        """What the leader does with a result: its events through the log, applied."""
        for event in result.events:
            entry = events.encode(event)
            self.log.append(entry)
            self.state.apply(events.decode(entry))
        return result

    def heartbeat(self, broker_id: int, epoch: int = 0, max_offset: int = 0, priority=2**31 - 1):
        self.live[broker_id] = BrokerLiveInfo(
            CLUSTER, GROUP, broker_id, f"10.0.0.{broker_id}:10911", 0, 10_000, epoch, max_offset,
            0, priority,
        )  # fmt: skip

    def join(self, broker_id: int, check: str | None = None) -> Result:
        check = check or f"10.0.0.{broker_id}:10911;{broker_id}"
        result = self.commit(self.state.apply_broker_id(CLUSTER, GROUP, broker_id, check))
        self.heartbeat(broker_id)
        return result

    def elect(self, broker_id: int | None = -1, designate: bool = False) -> Result:
        return self.commit(
            self.state.elect_master(GROUP, broker_id, designate, self.alive, self.info)
        )

    def alter(self, new_set, master=None, master_epoch=None, set_epoch=None) -> Result:
        s = self.state.sync_states[GROUP]
        return self.commit(
            self.state.alter_sync_state_set(
                GROUP,
                s.master_broker_id if master is None else master,
                s.master_epoch if master_epoch is None else master_epoch,
                frozenset(new_set),
                s.sync_state_set_epoch if set_epoch is None else set_epoch,
                self.alive,
            )
        )

    @property
    def sync(self):
        return self.state.sync_states[GROUP]


def two_in_sync() -> Group:
    """Brokers 1 (master) and 2 in the SyncStateSet: masterEpoch 1, syncStateSetEpoch 2."""
    g = Group()
    g.join(1), g.join(2)
    assert g.elect(1).code == R.SUCCESS
    assert g.alter({1, 2}).code == R.SUCCESS
    return g


# ---------------------------------------------------------------- epochs


def test_first_election_takes_the_broker_that_asks_and_moves_both_epochs():
    g = Group()
    g.join(1), g.join(2)
    result = g.elect(2)
    assert result.code == R.SUCCESS
    assert result.header["masterBrokerId"] == "2" and result.header["masterEpoch"] == "1"
    assert json.loads(result.body)["syncStateSet"] == [2]
    assert (g.sync.master_broker_id, g.sync.master_epoch) == (2, 1)
    assert (g.sync.sync_state_set, g.sync.sync_state_set_epoch) == ({2}, 1)


def test_a_first_election_for_an_id_that_is_no_member_elects_no_one():
    g = Group()
    g.join(1)
    assert g.elect(2).code == R.CONTROLLER_ELECT_MASTER_FAILED
    assert g.sync.master_broker_id is None and g.sync.master_epoch == 0


def test_alter_moves_only_the_sync_state_set_epoch():
    g = two_in_sync()
    assert (g.sync.master_epoch, g.sync.sync_state_set, g.sync.sync_state_set_epoch) == (
        1,
        {1, 2},
        2,
    )


def test_electing_no_one_clears_the_master_moves_its_epoch_and_keeps_the_set():
    g = two_in_sync()
    g.live.clear()
    result = g.elect(-1)  # the controller asks: the master's heartbeats stopped
    assert result.code == R.CONTROLLER_MASTER_NOT_AVAILABLE
    assert g.sync.master_broker_id is None and g.sync.master_epoch == 2
    assert (g.sync.sync_state_set, g.sync.sync_state_set_epoch) == ({1, 2}, 2)
    g.heartbeat(2)
    assert g.elect(2).code == R.SUCCESS  # a broker asks again later: re-elected
    assert (g.sync.master_broker_id, g.sync.master_epoch, g.sync.sync_state_set_epoch) == (2, 3, 3)


def test_the_controller_asking_for_a_group_never_elected_changes_nothing():
    """RocketMQ would raise masterEpoch here, and the group's first broker could then
    never be elected from its empty SyncStateSet."""
    g = Group()
    g.join(1)
    del g.live[1]
    assert g.elect(-1).code == R.CONTROLLER_MASTER_NOT_AVAILABLE
    g.heartbeat(1)
    assert g.elect(1).code == R.SUCCESS and g.sync.master_epoch == 1


def test_a_broker_asking_when_no_one_can_be_elected_changes_nothing():
    g = two_in_sync()
    g.live.clear()
    before = g.state.snapshot()
    assert g.elect(2).code == R.CONTROLLER_ELECT_MASTER_FAILED
    assert g.state.snapshot() == before


# ---------------------------------------------------------------- alter: order and fencing


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (dict(new_set={1, 2}), R.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),  # unchanged
        (dict(new_set={2}, master=2), R.CONTROLLER_INVALID_MASTER),
        (dict(new_set={1}, master_epoch=0), R.CONTROLLER_FENCED_MASTER_EPOCH),
        (dict(new_set={1}, master_epoch=2), R.CONTROLLER_FENCED_MASTER_EPOCH),
        (dict(new_set={1}, set_epoch=1), R.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
        (dict(new_set={1, 2, 9}), R.CONTROLLER_INVALID_REPLICAS),
        (dict(new_set={1, 2, 3}), R.CONTROLLER_BROKER_NOT_ALIVE),
        (dict(new_set={2, 3}), R.CONTROLLER_BROKER_NOT_ALIVE),
        (dict(new_set={2}), R.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),  # lacks the master
    ],
)
def test_alter_is_refused_and_changes_nothing(change, code):
    g = two_in_sync()
    g.join(3)
    del g.live[3]
    before = g.state.snapshot()
    result = g.alter(**change)
    assert result.code == code and result.remark and not result.events
    assert g.state.snapshot() == before


def test_alter_checks_the_master_epoch_before_the_set_epoch():
    """A deposed master carries both stale epochs: it hears it lost the master role."""
    g = two_in_sync()
    result = g.alter({1}, master_epoch=0, set_epoch=0)
    assert result.code == R.CONTROLLER_FENCED_MASTER_EPOCH


def test_an_alter_from_an_old_master_is_fenced_after_an_election():
    g = two_in_sync()
    stale = (g.sync.master_epoch, g.sync.sync_state_set_epoch)
    del g.live[1]
    assert g.elect(-1).code == R.SUCCESS and g.sync.master_broker_id == 2
    g.heartbeat(1)
    result = g.alter({1, 2}, master=1, master_epoch=stale[0], set_epoch=stale[1])
    assert result.code == R.CONTROLLER_INVALID_MASTER
    result = g.alter({1, 2}, master=2, master_epoch=stale[0], set_epoch=stale[1])
    assert result.code == R.CONTROLLER_FENCED_MASTER_EPOCH


def test_alter_of_an_unknown_group():
    g = Group()
    result = g.state.alter_sync_state_set("nope", 1, 1, frozenset({1}), 1, g.alive)
    assert result.code == R.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED


# ---------------------------------------------------------------- brokerIds


def test_apply_broker_id_is_idempotent_with_the_same_check_code():
    g = Group()
    first = g.join(1, "10.0.0.1:10911;100")
    again = g.join(1, "10.0.0.1:10911;100")  # the reply was lost; the broker retries
    assert first.code == again.code == R.SUCCESS
    assert g.state.replicas[GROUP].brokers == {1: ("10.0.0.1:10911", "10.0.0.1:10911;100")}
    assert g.state.replicas[GROUP].next_assign_broker_id == 2
    other = g.state.apply_broker_id(CLUSTER, GROUP, 1, "10.0.0.9:10911;200")
    assert other.code == R.CONTROLLER_BROKER_ID_INVALID and not other.events


def test_a_new_group_accepts_only_id_1():
    g = Group()
    result = g.state.apply_broker_id(CLUSTER, GROUP, 2, "a:1;1")
    assert result.code == R.CONTROLLER_BROKER_ID_INVALID
    assert g.state.next_broker_id(CLUSTER, GROUP).header["nextBrokerId"] == "1"


def test_next_id_skips_an_id_taken_out_of_turn():
    g = Group()
    g.join(1), g.join(5)
    assert g.state.next_broker_id(CLUSTER, GROUP).header["nextBrokerId"] == "6"


class Broker:
    """A broker's side of RocketMQ's five brokerId steps (`ReplicasManager.register`),
    with its two files; `crash_after` names the step after which it dies once."""

    def __init__(self, name: str) -> None:
        self.address = f"{name}:10911"
        self.temp: tuple[int, str] | None = None  # brokerIdentity-temp
        self.identity: int | None = None  # brokerIdentity
        self.starts = 0

    def start(self, g: Group, crash_after: int | None, lose_reply: bool) -> bool:
        """One start; False if it crashed."""
        self.starts += 1
        if self.identity is None:
            while True:
                if self.temp is None:
                    next_id = int(g.state.next_broker_id(CLUSTER, GROUP).header["nextBrokerId"])
                    if crash_after == 1:
                        return False
                    self.temp = (next_id, f"{self.address};{self.starts}")
                    if crash_after == 2:
                        return False
                broker_id, check = self.temp
                result = g.commit(g.state.apply_broker_id(CLUSTER, GROUP, broker_id, check))
                if crash_after == 3 or (lose_reply and result.code == R.SUCCESS):
                    return False  # committed, but the broker never heard
                if result.code == R.SUCCESS:
                    break
                assert result.code == R.CONTROLLER_BROKER_ID_INVALID
                self.temp = None  # taken by someone else: start again at step 1
            self.identity = self.temp[0]
            if crash_after == 4:
                return False  # identity written, temp file not yet deleted
            self.temp = None
        g.heartbeat(self.identity)
        result = g.commit(
            g.state.register_broker(CLUSTER, GROUP, self.identity, self.address, g.alive)
        )
        return result.code == R.SUCCESS and crash_after != 5


STEPS = st.sampled_from([None, 1, 2, 3, 4, 5])


@given(crashes=st.lists(st.tuples(st.integers(0, 2), STEPS, st.booleans()), max_size=12))
def test_brokers_crashing_after_any_step_end_with_distinct_ids(crashes):
    g = Group()
    brokers = [Broker(f"10.0.0.{i}") for i in range(3)]
    for who, crash_after, lose_reply in crashes:
        brokers[who].start(g, crash_after, lose_reply)
    for broker in brokers:
        assert broker.start(g, None, False)
    ids = [b.identity for b in brokers]
    assert len(set(ids)) == 3
    table = g.state.replicas[GROUP].brokers
    for broker in brokers:
        assert table[broker.identity][0] == broker.address
    # an id a crashed broker claimed and abandoned may stay in the table, never twice
    assert g.state.replicas[GROUP].next_assign_broker_id > max(table)


# ---------------------------------------------------------------- election order


def test_election_prefers_epoch_then_offset_then_priority_then_lowest_id():
    g = two_in_sync()
    g.join(3), g.alter({1, 2, 3})
    del g.live[1]
    g.heartbeat(2, epoch=1, max_offset=500)
    g.heartbeat(3, epoch=1, max_offset=500)
    assert g.elect(-1).header["masterBrokerId"] == "2"  # full tie: lowest id


@pytest.mark.parametrize(
    ("two", "three", "winner"),
    [
        (dict(epoch=1, max_offset=900), dict(epoch=2, max_offset=100), 3),
        (dict(epoch=2, max_offset=100), dict(epoch=2, max_offset=900), 3),
        (dict(epoch=2, max_offset=900, priority=5), dict(epoch=2, max_offset=900, priority=1), 3),
        (dict(epoch=2, max_offset=3 * GiB), dict(epoch=2, max_offset=GiB), 2),
        (dict(epoch=2, max_offset=0), dict(epoch=2, max_offset=2 * GiB + 1), 3),
        (dict(epoch=2, max_offset=5 * GiB, priority=9), dict(epoch=2, max_offset=GiB), 2),
    ],
)
def test_election_order(two, three, winner):
    g = two_in_sync()
    g.join(3), g.alter({1, 2, 3})
    del g.live[1]
    g.heartbeat(2, **two)
    g.heartbeat(3, **three)
    assert g.elect(-1).header["masterBrokerId"] == str(winner)


def test_the_live_old_master_stays_unless_another_is_designated():
    g = two_in_sync()
    result = g.elect(2)
    assert result.code == R.CONTROLLER_MASTER_STILL_EXIST and result.header["masterBrokerId"] == "1"
    result = g.elect(2, designate=True)
    assert result.code == R.SUCCESS and g.sync.master_broker_id == 2


def test_a_designated_broker_outside_the_live_set_is_not_elected():
    g = two_in_sync()
    g.join(3)
    assert g.elect(3, designate=True).code == R.CONTROLLER_ELECT_MASTER_FAILED
    del g.live[2]
    assert g.elect(2, designate=True).code == R.CONTROLLER_ELECT_MASTER_FAILED
    assert g.sync.master_broker_id == 1


@pytest.mark.parametrize("unclean", [False, True])
def test_unclean_election_only_when_enabled(unclean):
    g = Group(unclean=unclean)
    g.join(1), g.join(2), g.join(3)
    g.elect(1)
    del g.live[1]
    del g.live[2]  # broker 3 is alive but never joined the SyncStateSet
    result = g.elect(-1)
    if unclean:
        assert result.code == R.SUCCESS and g.sync.master_broker_id == 3
    else:
        assert result.code == R.CONTROLLER_MASTER_NOT_AVAILABLE and g.sync.master_broker_id is None


def test_rocketmq_comparator_would_order_offsets_2_gib_apart_wrongly():
    """The negative control of the 2 GiB rows above: Java's `(int) (o2 - o1)`."""

    def java_int(n: int) -> int:
        return (n + 2**31) % 2**32 - 2**31

    assert java_int(0 - (2 * GiB + 1)) > 0  # Java: the member with 0 bytes sorts first


# ---------------------------------------------------------------- liveness


def test_liveness_expires_by_timeout_and_by_closed_channel_and_never_goes_back():
    live = Liveness(started_ms=0)
    chan = object()

    def beat(broker_id, at_ms, epoch, offset, channel=None):
        info = BrokerLiveInfo(CLUSTER, GROUP, broker_id, "a:1", at_ms, 1000, epoch, offset)
        info.channel = channel
        live.heartbeat(info)

    beat(1, 0, epoch=2, offset=500)
    beat(1, 10, epoch=1, offset=900)  # an older heartbeat overtaken on the way
    assert (live.get(CLUSTER, GROUP, 1).epoch, live.get(CLUSTER, GROUP, 1).max_offset) == (2, 500)
    assert live.get(CLUSTER, GROUP, 1).last_update_ms == 10
    beat(2, 0, 1, 1, channel=chan)
    assert live.alive(CLUSTER, GROUP, 1, 1010) and not live.alive(CLUSTER, GROUP, 1, 1011)
    assert [i.broker_id for i in live.channel_closed(chan, 5)] == [2]
    assert live.closed_ms == {(CLUSTER, GROUP, 2): 5}
    assert [i.broker_id for i in live.expire(1011)] == [1]
    assert live.brokers == {}


# ---------------------------------------------------------------- whole histories

requests = st.one_of(
    st.tuples(st.just("join"), st.integers(1, 4)),
    st.tuples(st.just("elect"), st.sampled_from([-1, 1, 2, 3, 4]), st.booleans()),
    st.tuples(st.just("alter"), st.sets(st.integers(1, 4), max_size=4), st.booleans()),
    st.tuples(st.just("beat"), st.integers(1, 4), st.integers(0, 3), st.integers(0, 5 * GiB)),
    st.tuples(st.just("die"), st.integers(1, 4)),
    st.tuples(st.just("clean"), st.sampled_from(["", "1", "2;3"]), st.booleans()),
)


@given(st.lists(requests, max_size=40), st.booleans())
def test_any_history_keeps_the_tables_consistent_and_replays_to_the_same_state(history, unclean):
    g = Group(unclean=unclean)
    last_epochs: tuple[int, int] | None = None
    for request in history:
        kind = request[0]
        if kind == "join":
            g.join(request[1])
        elif kind == "elect":
            g.elect(request[1], request[2])
        elif kind == "alter" and GROUP in g.state.sync_states:
            stale = request[2]
            g.alter(request[1], master_epoch=0 if stale else None)
        elif kind == "beat":
            g.heartbeat(request[1], request[2], request[3])
        elif kind == "die":
            g.live.pop(request[1], None)
        elif kind == "clean":
            g.commit(g.state.clean_broker_data(CLUSTER, GROUP, request[1], request[2], g.alive))
            if GROUP not in g.state.sync_states:
                last_epochs = None
        if GROUP in g.state.sync_states and GROUP in g.state.replicas:
            s, members = g.sync, g.state.replicas[GROUP].brokers
            assert s.sync_state_set <= set(members)
            assert s.master_broker_id is None or s.master_broker_id in s.sync_state_set
            # a master is cleared only where there was one: a new group stays electable
            assert s.master_epoch == 0 or s.sync_state_set
            epochs = (s.master_epoch, s.sync_state_set_epoch)
            if last_epochs is not None:
                assert epochs[0] >= last_epochs[0] and epochs[1] >= last_epochs[1]
            last_epochs = epochs
    replayed = ReplicasInfo(enable_elect_unclean_master=unclean)
    for entry in g.log:
        replayed.apply(events.decode(entry))
    assert replayed.snapshot() == g.state.snapshot()


@given(st.binary(max_size=64))
def test_an_entry_that_is_not_an_event_decodes_to_none_or_value_error(blob):
    try:
        event = events.decode(blob)
    except ValueError:
        return
    assert event is None or events.decode(events.encode(event)) == event
