"""Controller-mode replication (AutoSwitch HA) between stores in one process, over
loopback TCP: a slave catching up from empty, from behind, and from a diverged tail
after a failover; the SyncStateSet growing and shrinking through the controller's
answers, and the #5663 schedule (the controller takes a set, the answer is lost)."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest
import trio
from raftmq.broker.metawriter import meta_message
from raftmq.broker.replicas_manager import controller_links_to_change
from raftmq.broker.send import _append_failure
from raftmq.broker.store import classic_log
from raftmq.broker.store.autoswitch import (
    AlterRefused,
    AlterUnknown,
    AutoSwitchConfig,
    AutoSwitchMaster,
    AutoSwitchSlave,
    SyncStateSet,
)
from raftmq.broker.store.autoswitch_wire import (
    Ack,
    Handshake,
    HandshakeReply,
    MasterReader,
    SlaveReader,
    Transfer,
)
from raftmq.broker.store.classic_commitlog import ClassicCommitLog, PutPolicy, PutStatus
from raftmq.broker.store.epoch_file import EPOCH_FILE, EpochEntry, EpochFile
from raftmq.broker.store.ha_link import HAConfig
from raftmq.broker.store.messagestore import MessageStore
from raftmq.broker.store.metadata import TopicConfig
from raftmq.dledger.codes import Code

from raftmq.protocol import message as codec
from raftmq.remoting import ResponseCode
from tests.helpers import wait_for
from tests.test_classic_ha import FILE_BYTES, closed_by_peer, open_log, record
from tests.test_classic_store import put as put_records

LINK = HAConfig(heartbeat_interval_s=5.0, housekeeping_interval_s=20.0, transfer_batch_bytes=1000)


class Store:
    """One broker's store: its CommitLog, its epoch file and the put path on them."""

    def __init__(self, root: Path, broker_id: int) -> None:
        self.root = root
        self.broker_id = broker_id
        self.log = open_log(root)
        self.epochs = EpochFile(root / EPOCH_FILE)

    def files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted((self.root / "commitlog").iterdir())}

    def slave(self, config: AutoSwitchConfig, port: int) -> AutoSwitchSlave:
        return AutoSwitchSlave(
            self.log, self.epochs, config, self.broker_id, lambda: f"127.0.0.1:{port}"
        )


class Controller:
    """The controller's side of CONTROLLER_ALTER_SYNC_STATE_SET for one group: it takes a
    set proposed with the current epochs (2001 otherwise) and answers, or takes it
    and the answer is lost on the way back."""

    def __init__(self, master_id: int) -> None:
        self.members = frozenset({master_id})
        self.epoch = 0
        self.lose_answers = False
        self.lose_requests = False

    async def alter(self, new_set, master_epoch, sync_state_set_epoch):
        if self.lose_requests:
            raise AlterUnknown("no answer within 3 s")
        if sync_state_set_epoch != self.epoch:
            raise AlterRefused(f"CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH {self.epoch}")
        self.members, self.epoch = frozenset(new_set), self.epoch + 1
        if self.lose_answers:
            raise AlterUnknown("no answer within 3 s")
        return self.members, self.epoch


async def serve(nursery, store: Store, config: AutoSwitchConfig, controller=None, epoch=1):
    """`store` as master in `epoch`; its put path waits as `config` says."""
    controller = controller or Controller(store.broker_id)
    commitlog = ClassicCommitLog(store.log, PutPolicy(False, 5.0, 1.0, slave_timeout_s=1.0))
    master = AutoSwitchMaster(
        store.log, store.epochs, config, store.broker_id, controller.alter, commitlog.on_slave_ack
    )
    commitlog.replication = master
    master.begin(epoch)
    await nursery.start(commitlog.run)
    port = await nursery.start(master.serve, "127.0.0.1", 0)
    return master, commitlog, port


async def put(commitlog: ClassicCommitLog, first: int, count: int = 1):
    """Put records first.. one after the other; the status the last was answered with."""
    for n in range(first, first + count):
        status, _placed = await put_records(commitlog, [record(n)])
    return status


async def start_slave(
    nursery, store: Store, config, port
) -> tuple[AutoSwitchSlave, trio.CancelScope]:
    slave = store.slave(config, port)
    scope = trio.CancelScope()

    async def run():
        with scope:
            await slave.run()

    nursery.start_soon(run)
    return slave, scope


class Pair:
    """A (brokerId 1) serving as master, B (brokerId 2) its slave."""

    async def start(self, nursery, tmp_path, config, controller=None, messages: int = 0):
        self.a, self.b = Store(tmp_path / "a", 1), Store(tmp_path / "b", 2)
        self.controller = controller or Controller(1)
        self.master, self.commitlog, self.port = await serve(
            nursery, self.a, config, self.controller
        )
        if messages:
            await put(self.commitlog, 0, messages)
        _slave, self.slave_scope = await start_slave(nursery, self.b, config, self.port)
        return self

    async def slave_leaves_the_set_stays(self) -> None:
        """B stops; the controller has moved on, so the shrink A proposes is refused."""
        self.controller.epoch += 1
        self.slave_scope.cancel()
        await wait_for(lambda: not self.master.connections)


async def test_an_empty_slave_catches_up_at_once_byte_for_byte(tmp_path):
    """The first ack follows the handshake (RocketMQ's waits for the 5 s heartbeat), and
    the slave's files and epochs end up the master's."""
    config = AutoSwitchConfig(link=LINK)
    a, b = Store(tmp_path / "a", 1), Store(tmp_path / "b", 2)
    async with trio.open_nursery() as nursery:
        master, commitlog, port = await serve(nursery, a, config)
        await put(commitlog, 0, 40)  # several files
        master.begin(2)
        await put(commitlog, 40, 10)
        slave, _scope = await start_slave(nursery, b, config, port)
        await wait_for(lambda: b.log.write_pos == a.log.write_pos, timeout_s=2.0)
        assert b.epochs.entries == a.epochs.entries
        assert [e.epoch for e in a.epochs.entries] == [1, 2]
        assert b.files() == a.files()
        assert slave.confirm_offset == a.log.write_pos
        await put(commitlog, 50, 5)  # and follows
        await wait_for(lambda: b.log.write_pos == a.log.write_pos, timeout_s=2.0)
        assert b.files() == a.files()
        nursery.cancel_scope.cancel()


async def test_batches_stay_within_a_file_and_an_epoch(tmp_path):
    """What a slave written from the protocol's description reads from our master."""
    config = AutoSwitchConfig(link=LINK)
    a = Store(tmp_path / "a", 1)
    async with trio.open_nursery() as nursery:
        master, commitlog, port = await serve(nursery, a, config)
        await put(commitlog, 0, 15)
        master.begin(3)
        await put(commitlog, 15, 30)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(Handshake(False, False, 7).encode())
        reader = SlaveReader(LINK.transfer_batch_bytes)
        frames = []
        while not frames:
            frames = reader.feed(await stream.receive_some(1 << 16))
        reply = frames.pop(0)
        assert reply == HandshakeReply(a.log.write_pos, tuple(a.epochs.entries))
        await stream.send_all(Ack(0).encode())
        copied = 0
        bounds = {e.start_offset for e in a.epochs.entries} | set(range(0, 1 << 20, FILE_BYTES))
        while copied < a.log.write_pos:
            frames += reader.feed(await stream.receive_some(1 << 16))
            for frame in frames:
                assert frame.offset == copied
                assert 0 < len(frame.body) <= LINK.transfer_batch_bytes
                assert not any(copied < b < copied + len(frame.body) for b in bounds), frame.offset
                assert a.epochs.entry_at(copied, a.log.write_pos).epoch == frame.epoch
                copied += len(frame.body)
            frames = []
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def frames_from(stream: trio.SocketStream, reader) -> list:
    frames: list = []
    while not frames:
        data = await stream.receive_some(1 << 16)
        assert data, "the peer closed the connection"
        frames = reader.feed(data)
    return frames


@pytest.mark.slow  # waits out haHousekeepingInterval
async def test_an_idle_link_carries_heartbeats_and_a_silent_slave_is_dropped(tmp_path):
    link = HAConfig(heartbeat_interval_s=0.2, housekeeping_interval_s=1.0)
    a = Store(tmp_path, 1)
    async with trio.open_nursery() as nursery:
        master, commitlog, port = await serve(nursery, a, AutoSwitchConfig(link=link))
        await put(commitlog, 0, 3)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(Handshake(False, False, 2).encode() + Ack(0).encode())
        reader = SlaveReader(link.transfer_batch_bytes)
        frames = await frames_from(stream, reader)
        while frames[-1] != Transfer(a.log.write_pos, 1, 0, a.log.write_pos):  # a heartbeat
            frames += await frames_from(stream, reader)
        assert b"".join(f.body for f in frames[1:]) == a.log.read_at(0, a.log.write_pos)
        start = trio.current_time()
        assert await closed_by_peer(stream)  # the slave says nothing: dropped after 1 s
        assert 0.5 < trio.current_time() - start < 2.0
        await wait_for(lambda: not master.connections)
        nursery.cancel_scope.cancel()


ONE_RECORD = len(record(0))


@pytest.mark.parametrize(
    "bad_frame",
    [
        Transfer(ONE_RECORD + 8, 1, 0, 0, b"x"),  # not where the slave's log ends
        HandshakeReply(ONE_RECORD, ()),  # a second reply: the wrong state
        Transfer(ONE_RECORD, 0, 0, 0),  # an epoch older than the slave's
    ],
)
async def test_our_slave_acks_at_once_and_drops_a_master_out_of_line(tmp_path, bad_frame):
    """Against a master written from the protocol's description: the slave's first ack
    follows the reply at once (no 5 s wait), and a frame out of line ends the link."""
    b = Store(tmp_path, 2)
    b.epochs.append(EpochEntry(1, 0))
    await put(ClassicCommitLog(b.log, PutPolicy(False, 5.0, 1.0)), 0)
    config = AutoSwitchConfig(link=LINK)
    links = []

    async def master(stream: trio.SocketStream) -> None:
        reader = MasterReader()
        assert await frames_from(stream, reader) == [Handshake(False, False, 2)]
        await stream.send_all(HandshakeReply(ONE_RECORD, (EpochEntry(1, 0),)).encode())
        with trio.fail_after(1):  # RocketMQ's slave waits haSendHeartbeatInterval (5 s)
            assert await frames_from(stream, reader) == [Ack(ONE_RECORD)]
        await stream.send_all(bad_frame.encode())
        links.append(await closed_by_peer(stream))

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, master, listeners)
        await start_slave(nursery, b, config, listeners[0].socket.getsockname()[1])
        await wait_for(lambda: links)
        assert links == [True] and b.log.write_pos == ONE_RECORD
        nursery.cancel_scope.cancel()


async def test_a_slave_behind_resumes_where_it_is(tmp_path):
    config = AutoSwitchConfig(link=LINK)
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config, messages=20)
        a, b, commitlog, port = pair.a, pair.b, pair.commitlog, pair.port
        await wait_for(lambda: b.log.write_pos == a.log.write_pos, timeout_s=2.0)
        pair.slave_scope.cancel()
        behind = b.log.write_pos
        await put(commitlog, 20, 20)
        await start_slave(nursery, b, config, port)
        await wait_for(lambda: b.log.write_pos == a.log.write_pos, timeout_s=2.0)
        assert b.log.write_pos > behind
        assert b.files() == a.files()
        nursery.cancel_scope.cancel()


async def fail_over_with_a_tail(tmp_path, all_ack: bool, first_of_tail: bytes | None = None):
    """A, master in epoch 1, writes past what B (in its set) copied and dies; B is
    elected in epoch 2 and writes other messages at the same offsets. Returns A, B,
    where their logs part, where A's ended, and the config."""
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=all_ack)
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config, messages=20)
        a, b = pair.a, pair.b
        await wait_for(lambda: pair.master.sync_state.members == {1, 2})
        await wait_for(lambda: b.log.write_pos == a.log.write_pos, timeout_s=2.0)
        await pair.slave_leaves_the_set_stays()
        common = b.log.write_pos
        tail = [record(n) for n in range(20, 32)]  # stored on A, never acknowledged
        if first_of_tail is not None:
            tail[0] = first_of_tail
        pair.commitlog.put_nowait(tail, lambda status, placed: None)
        nursery.cancel_scope.cancel()  # A dies
    assert a.log.write_pos > common
    return a, b, common, a.log.write_pos, config


async def test_a_diverged_tail_is_cut_back_to_the_common_point(tmp_path, caplog):
    """A comes back as B's slave: it cuts exactly its unacknowledged tail and ends with
    B's files, byte for byte."""
    a, b, common, a_end, config = await fail_over_with_a_tail(tmp_path, all_ack=True)
    async with trio.open_nursery() as nursery:
        _master_b, commitlog_b, port_b = await serve(nursery, b, config, epoch=2)
        await put(commitlog_b, 1000, 5)  # other messages at the same offsets
        with caplog.at_level(logging.WARNING, "raftmq.broker.store.autoswitch"):
            await start_slave(nursery, a, config, port_b)
            await wait_for(lambda: a.log.write_pos == b.log.write_pos, timeout_s=2.0)
        assert f"cutting the log from {a_end} to {common}" in caplog.text
        assert a.epochs.entries == b.epochs.entries == [EpochEntry(1, 0), EpochEntry(2, common)]
        assert a.files() == b.files()
        nursery.cancel_scope.cancel()


async def test_a_tail_already_dispatched_is_cut_with_its_queues(tmp_path):
    """Without allAckInSyncStateSet the master confirms what it wrote alone, and its
    ConsumeQueue and key index took the tail. Back as B's slave, A cuts them with its
    log (its queue ends where B's did), then takes B's messages at the offsets B gave
    them."""
    a, b, _common, _a_end, config = await fail_over_with_a_tail(tmp_path, all_ack=False)
    async with trio.open_nursery() as nursery:
        commitlog_a = ClassicCommitLog(a.log, PutPolicy(False, 5.0, 1.0))
        store_a = MessageStore(a.log, a.root, {}, [1000], commitlog=commitlog_a)
        a.log.add_cut_handler(store_a.cut_back)
        await nursery.start(store_a.run)
        await wait_for(lambda: store_a.dispatch_behind() == 0)
        assert store_a.queues.find("T", 0).max_offset == 32  # A's tail is consumable
        _master_b, commitlog_b, port_b = await serve(nursery, b, config, epoch=2)
        store_b = MessageStore(b.log, b.root, {}, [1000], commitlog=commitlog_b)
        await nursery.start(store_b.run)
        await wait_for(store_b.caught_up)
        store_b.take_over_offsets()  # as a new master does (broker.promotion)
        await put(commitlog_b, 1000, 5)  # other messages at A's tail's offsets
        slave, _scope = await start_slave(nursery, a, config, port_b)
        await wait_for(lambda: a.log.write_pos == b.log.write_pos, timeout_s=2.0)
        await wait_for(lambda: store_a.queues.find("T", 0).max_offset == 25)
        assert slave.refusal is None
        held = store_a.get_message("T", 0, 20, 32).records
        assert [codec.decode(r)[0].body[:5] for r in held] == [
            b"%05d" % n for n in range(1000, 1005)
        ]
        nursery.cancel_scope.cancel()


def topic_record(name: str) -> bytes:
    """The META_TOPIC record of a new topic `name`."""
    return meta_message("topic", 0, ("127.0.0.1", 1), config=TopicConfig(name).to_json())


async def test_metadata_from_a_cut_tail_is_undone_and_the_masters_applied(tmp_path):
    """A's tail begins with a topic it created alone: once cut, the topic is gone from
    its metadata, and the topic B created at the same META_TOPIC offset is there."""
    a, b, _common, _a_end, config = await fail_over_with_a_tail(
        tmp_path, all_ack=False, first_of_tail=topic_record("OnlyOnA")
    )
    async with trio.open_nursery() as nursery:
        commitlog_a = ClassicCommitLog(a.log, PutPolicy(False, 5.0, 1.0))
        store_a = MessageStore(a.log, a.root, {}, [1000], commitlog=commitlog_a)
        a.log.add_cut_handler(store_a.cut_back)
        await nursery.start(store_a.run)
        await wait_for(lambda: "OnlyOnA" in store_a.metadata.topics)
        _master_b, commitlog_b, port_b = await serve(nursery, b, config, epoch=2)
        store_b = MessageStore(b.log, b.root, {}, [1000], commitlog=commitlog_b)
        await nursery.start(store_b.run)
        await wait_for(store_b.caught_up)
        store_b.take_over_offsets()
        await put_records(commitlog_b, [topic_record("OnB")])
        await start_slave(nursery, a, config, port_b)
        await wait_for(lambda: "OnB" in store_a.metadata.topics)
        assert "OnlyOnA" not in store_a.metadata.topics
        nursery.cancel_scope.cancel()


async def test_three_stores_end_identical_after_a_failover(tmp_path):
    """A master, B and C slaves; C stops early, A writes a tail only it holds and dies;
    B is elected and writes. C (behind) and A (diverged) both follow B and all three
    logs and epoch files end the same."""
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=True)
    c = Store(tmp_path / "c", 3)
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config, messages=10)
        a, b, master = pair.a, pair.b, pair.master
        _slave, c_scope = await start_slave(nursery, c, config, pair.port)
        await wait_for(lambda: master.sync_state.members == {1, 2, 3})
        c_scope.cancel()  # C leaves the set
        await wait_for(lambda: master.sync_state.members == {1, 2})
        assert await put(pair.commitlog, 10, 10) is Code.SUCCESS  # on A and B
        assert c.log.write_pos < b.log.write_pos == a.log.write_pos
        await pair.slave_leaves_the_set_stays()
        pair.commitlog.put_nowait([record(n) for n in range(20, 30)], lambda *answer: None)
        nursery.cancel_scope.cancel()  # A dies with a tail only it holds
    assert a.log.write_pos > b.log.write_pos
    async with trio.open_nursery() as nursery:
        _master_b, commitlog_b, port_b = await serve(nursery, b, config, epoch=2)
        await put(commitlog_b, 1000, 10)
        await start_slave(nursery, a, config, port_b)
        await start_slave(nursery, c, config, port_b)
        await wait_for(lambda: a.log.write_pos == c.log.write_pos == b.log.write_pos)
        assert a.files() == b.files() == c.files()
        assert a.epochs.entries == b.epochs.entries == c.epochs.entries
        nursery.cancel_scope.cancel()


async def test_the_set_grows_with_a_caught_up_slave_and_shrinks_without_it(tmp_path):
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=True, max_not_caught_up_s=15)
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config, messages=10)
        a, b, master, commitlog = pair.a, pair.b, pair.master, pair.commitlog
        controller, scope = pair.controller, pair.slave_scope
        await wait_for(lambda: master.sync_state.members == {1, 2})
        assert controller.members == {1, 2} and master.sync_state.epoch == 1
        info = master.runtime_info()
        assert info["inSyncSlaveNums"] == 1 and info["haConnectionInfo"][0]["inSync"]
        assert await put(commitlog, 10) is Code.SUCCESS  # acknowledged by both
        assert b.log.write_pos == a.log.write_pos
        now = trio.current_time()
        assert not master.lagging(now)
        assert master.lagging(now + 16) == {2}  # not caught up for haMaxTimeSlaveNotCatchup
        scope.cancel()  # a dropped connection leaves the set at once
        await wait_for(lambda: master.sync_state.members == {1})
        assert controller.members == {1} and master.sync_state.epoch == 2
        assert await put(commitlog, 11) is Code.SUCCESS  # the master alone
        nursery.cancel_scope.cancel()


async def test_a_restarted_store_serves_what_was_confirmed_before_any_master_speaks(
    tmp_path, monkeypatch
):
    """The confirmOffset is in the CommitLog checkpoint (RocketMQ's StoreCheckpoint
    keeps it): B, killed and started again with no master to follow, dispatches what
    the set held, not only what its ConsumeQueues had written; as a master (A, whose
    slave has not come back) it starts from it too, not from 0."""
    monkeypatch.setattr(classic_log, "CHECKPOINT_INTERVAL_S", 0.0)
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=True)
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config)
        a, b, master, commitlog = pair.a, pair.b, pair.master, pair.commitlog
        await wait_for(lambda: master.sync_state.members == {1, 2})
        assert await put(commitlog, 0, 3) is Code.SUCCESS
        confirmed = master.confirm_offset
        assert confirmed == a.log.write_pos
        assert await put(commitlog, 3) is Code.SUCCESS  # its frame carries the confirmOffset
        await wait_for(lambda: b.log.confirmed() >= confirmed)
        for store in (a, b):
            store.log.flush_plan()[1]()  # durable, with a checkpoint
        pair.slave_scope.cancel()
        nursery.cancel_scope.cancel()
    for root, broker_id in ((tmp_path / "b", 2), (tmp_path / "a", 1)):
        again = Store(root, broker_id)  # no close: as after SIGKILL
        slave = again.slave(config, 1)  # its master's address answers nothing
        assert confirmed <= slave.confirm_offset <= again.log.write_pos
        if broker_id == 1:
            both = SyncStateSet(1, frozenset({1, 2}), 1)
            master = AutoSwitchMaster(
                again.log, again.epochs, config, 1, Controller(1).alter, sync_state_set=both
            )
            master.begin(2)  # B is not back: nothing more confirmed, nothing less
            assert confirmed <= master.confirm_offset <= again.log.write_pos
        store = MessageStore(
            again.log,
            root,
            {},
            [1000],
            commitlog=ClassicCommitLog(again.log, PutPolicy(False, 5, 1)),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            await store.wait_dispatch(0.5)
            held = store.get_message("T", 0, 0, 32).records
            assert len(held) >= 3
            nursery.cancel_scope.cancel()
    restarted = Store(tmp_path / "a2", 1)
    assert AutoSwitchSlave(restarted.log, restarted.epochs, config, 1, str).confirm_offset == 0


@pytest.mark.slow  # waits out slaveTimeout or RECONNECT_S
async def test_a_member_without_a_connection_holds_the_confirm_offset(tmp_path):
    """#6662: with B in the set but gone, nothing more is confirmed; a put waits for B
    and is answered FLUSH_SLAVE_TIMEOUT, stored."""
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=True)
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config)
        a, master, commitlog = pair.a, pair.master, pair.commitlog
        await wait_for(lambda: master.sync_state.members == {1, 2})
        assert await put(commitlog, 0) is Code.SUCCESS
        confirmed = master.confirm_offset
        await pair.slave_leaves_the_set_stays()
        assert await put(commitlog, 1) is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert master.confirm_offset == confirmed < a.log.write_pos
        nursery.cancel_scope.cancel()


async def test_the_controllers_set_ends_the_doubt_of_a_lost_proposal(tmp_path):
    """The request was lost: the set read from the controller (GET_REPLICA_INFO) says
    it was not taken, and the next ack proposes again."""
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=True)
    controller = Controller(1)
    controller.lose_requests = True
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config, controller)
        master, commitlog = pair.master, pair.commitlog
        await wait_for(lambda: master.sync_state.effective == {1, 2})
        assert master.sync_state.members == {1} and controller.members == {1}
        controller.lose_requests = False
        master.known(controller.members, controller.epoch)
        assert master.sync_state.effective == {1}
        await put(commitlog, 0)  # B's ack of it proposes again
        await wait_for(lambda: master.sync_state.members == {1, 2})
        nursery.cancel_scope.cancel()


async def test_epochs_go_with_deleted_files_and_a_slave_starts_after_them(tmp_path):
    config = AutoSwitchConfig(link=LINK)
    a, b = Store(tmp_path / "a", 1), Store(tmp_path / "b", 2)
    async with trio.open_nursery() as nursery:
        master, commitlog, port = await serve(nursery, a, config)
        await put(commitlog, 0, 20)
        second = master.begin(2)
        await put(commitlog, 20, 30)
        assert a.log.delete_expired(0, now_s=2e9) == 2
        assert a.log.min_offset == 2 * FILE_BYTES > second.start_offset
        assert a.epochs.entries == [second]
        await start_slave(nursery, b, config, port)
        await wait_for(lambda: b.log.write_pos == a.log.write_pos, timeout_s=2.0)
        assert b.files() == a.files() and b.epochs.entries == [second]
        nursery.cancel_scope.cancel()


@pytest.mark.slow  # waits out slaveTimeout
async def test_consumers_see_only_what_every_member_holds(tmp_path):
    """readUnCommitted=false: on the master the ConsumeQueues stop at the confirmOffset;
    a put the absent member has not taken is stored but not consumable until it has."""
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=True)
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config)
        a, master, commitlog = pair.a, pair.master, pair.commitlog
        store = MessageStore(a.log, a.root, {}, [1000], commitlog=commitlog)
        await nursery.start(store.run)

        async def consumable() -> int:
            await store.wait_dispatch(0.2)
            return len(store.get_message("T", 0, 0, 32).records)

        await wait_for(lambda: master.sync_state.members == {1, 2})
        assert await put(commitlog, 0) is Code.SUCCESS
        assert await consumable() == 1
        await pair.slave_leaves_the_set_stays()
        assert await put(commitlog, 1, 2) is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert await consumable() == 1
        await start_slave(nursery, pair.b, config, pair.port)
        await wait_for(lambda: master.confirm_offset == a.log.write_pos)
        await wait_for(lambda: store.dispatch_behind() == 0)
        assert await consumable() == 3
        nursery.cancel_scope.cancel()


@pytest.mark.slow  # waits out slaveTimeout or RECONNECT_S
async def test_a_lost_answer_keeps_the_proposed_member_counted(tmp_path):
    """#5663: the controller takes {A, B}, its answer is lost, A goes on. Every put A
    acknowledges is on B, whom the controller may elect when A dies."""
    config = AutoSwitchConfig(link=LINK, all_ack_in_sync_state_set=True)
    controller = Controller(1)
    controller.lose_answers = True
    acknowledged = []
    async with trio.open_nursery() as nursery:
        pair = await Pair().start(nursery, tmp_path, config, controller)
        a, b, master, commitlog = pair.a, pair.b, pair.master, pair.commitlog
        scope = pair.slave_scope
        await wait_for(lambda: controller.members == {1, 2})
        assert master.sync_state.members == {1} and master.sync_state.effective == {1, 2}
        for n in range(5):
            if await put(commitlog, n) is Code.SUCCESS:
                acknowledged.append(a.log.write_pos)
        scope.cancel()  # B goes; the shrink A proposes is refused (a stale epoch)
        await wait_for(lambda: not master.connections)
        await trio.sleep(0.1)
        if await put(commitlog, 5) is Code.SUCCESS:  # FLUSH_SLAVE_TIMEOUT: stored, not acked
            acknowledged.append(a.log.write_pos)
        nursery.cancel_scope.cancel()  # A dies
    assert controller.members == {1, 2}  # B may be elected
    assert len(acknowledged) == 5
    assert max(acknowledged) <= b.log.write_pos


async def test_too_few_in_sync_replicas_or_a_fenced_epoch_refuse_puts(tmp_path):
    """Refused before they are stored; the send is answered SYSTEM_ERROR "in-sync
    replicas not enough" or SERVICE_NOT_AVAILABLE (the client retries elsewhere)."""
    config = AutoSwitchConfig(link=LINK, min_in_sync_replicas=2)
    a = Store(tmp_path / "a", 1)
    async with trio.open_nursery() as nursery:
        master, commitlog, _port = await serve(nursery, a, config)
        refused = (PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, None)
        assert await put_records(commitlog, [record(0)]) == refused
        config.min_in_sync_replicas = 1
        assert await put(commitlog, 0) is Code.SUCCESS
        end = a.log.write_pos
        master.fence("broker 2 elected in epoch 2")
        assert await put_records(commitlog, [record(1)]) == (PutStatus.FENCED, None)
        assert a.log.write_pos == end
        nursery.cancel_scope.cancel()
    answer = _append_failure(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, str)
    assert answer == (ResponseCode.SYSTEM_ERROR, "in-sync replicas not enough")
    assert _append_failure(PutStatus.FENCED, str)[0] == ResponseCode.SERVICE_NOT_AVAILABLE


@pytest.mark.slow  # waits out slaveTimeout or RECONNECT_S
async def test_in_sync_replicas_counts_brokers_not_connections(tmp_path):
    """inSyncReplicas=3: one slave connected twice is one copy (RocketMQ counts two)."""
    config = AutoSwitchConfig(link=LINK, in_sync_replicas=3)
    a, b, c = Store(tmp_path / "a", 1), Store(tmp_path / "b", 2), Store(tmp_path / "c", 2)
    async with trio.open_nursery() as nursery:
        master, commitlog, port = await serve(nursery, a, config)
        await start_slave(nursery, b, config, port)
        await start_slave(nursery, c, config, port)  # brokerId 2 again
        await wait_for(lambda: len(master.connections) == 2)
        assert await put(commitlog, 0) is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert b.log.write_pos == c.log.write_pos == a.log.write_pos
        nursery.cancel_scope.cancel()


@pytest.mark.slow  # waits out slaveTimeout or RECONNECT_S
async def test_a_slave_the_master_does_not_vouch_for_stops_and_says_why(tmp_path):
    """Data but no epochs (a classic slave's unrelated log): RocketMQ copies on after it."""
    config = AutoSwitchConfig(link=LINK)
    a, b = Store(tmp_path / "a", 1), Store(tmp_path / "b", 2)
    async with trio.open_nursery() as nursery:
        _master, commitlog, port = await serve(nursery, a, config)
        await put(commitlog, 0, 10)
        ClassicCommitLog(b.log, PutPolicy(False, 5.0, 1.0)).put_nowait(
            [record(500)], lambda status, placed: None
        )
        slave, _scope = await start_slave(nursery, b, config, port)
        await wait_for(lambda: slave.refusal is not None)
        assert "no epochs but" in slave.runtime_info()["haClientRuntimeInfo"]["refusal"]
        await trio.sleep(1.5)  # past RECONNECT_S: it does not try again by itself
        assert slave.refusals == 1
        slave.master_given()
        await wait_for(lambda: slave.refusals == 2)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("address", [b"127.0.0.1:30912", b"10.0.0.1:1"])
async def test_a_rocketmq_5_0_slave_is_refused_with_a_reason(tmp_path, caplog, address):
    config = AutoSwitchConfig(link=LINK)
    async with trio.open_nursery() as nursery:
        master, _commitlog, port = await serve(nursery, Store(tmp_path, 1), config)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(struct.pack(">ihhi", 1, 0, 0, len(address)) + address)
        assert await closed_by_peer(stream)
        await wait_for(lambda: not master.connections)
        assert "5.0.0/5.1.0 handshake" in caplog.text
        nursery.cancel_scope.cancel()


def test_brokers_follow_the_controllers_list_but_keep_other_addresses_for_the_same_members():
    """A broker dialling the controllers' own addresses follows their leader's list; one
    whose controllerAddr names proxies keeps them until the members change (following
    at once dropped every proxied link two seconds after start in the fault-injection
    runs, and the controllers declared the brokers dead)."""
    own = frozenset({"h:1", "h:2", "h:3"})
    proxies = frozenset({"p:1", "p:2", "p:3"})
    nothing = (frozenset(), frozenset())
    assert controller_links_to_change(own, own, None) == nothing
    replaced = frozenset({"h:1", "h:2", "h:4"})
    assert controller_links_to_change(own, replaced, own) == ({"h:4"}, {"h:3"})
    stale = frozenset({"h:1", "h:9"})  # configured before a replacement it never saw
    assert controller_links_to_change(stale, own, None) == ({"h:2", "h:3"}, {"h:9"})
    assert controller_links_to_change(proxies, own, None) == nothing
    assert controller_links_to_change(proxies, own, own) == nothing
    assert controller_links_to_change(proxies, replaced, own) == (replaced, proxies)
