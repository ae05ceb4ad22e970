"""Snapshots for a follower the leader restarts at its first entry (dledger.core.snapshot).

Retention deletes the head of the log; a follower whose next entry is gone (down
meanwhile, wiped, or new) gets the application's state as of an entry first, then the
log from the leader's beginning. In the simulator (the production core, a simulated
network and file store) a small application per replica applies committed entries,
key=value, and the state machines must agree once the follower is back; in the broker,
installing the metadata is atomic across a crash.
"""

from __future__ import annotations

import json
import random

import pytest
from raftmq.broker.store.messagestore import MessageStore
from raftmq.broker.store.metadata import TopicConfig, builtin_topics
from raftmq.dledger.codes import Code, EntryType
from raftmq.dledger.core.membership import Change
from raftmq.dledger.core.messages import HeartBeatRequest, InstallSnapshotRequest
from raftmq.dledger.core.snapshot import MAX_SNAPSHOT_BYTES
from raftmq.dledger.sim.cluster import NetworkConditions, SimCluster
from raftmq.dledger.sim.disk import FileStores

from tests.helpers import GROUP, OneReplicaLog, make_replica

SEGMENT_BYTES = 4096
FOREVER_S = 1e12  # a clock past every file's last write: retention may delete any


class Table:
    """One replica's application: key=value entries applied in log order as they commit.
    It survives its node's crashes (as the broker's metadata file does), and its snapshot
    is the table as of the last entry applied."""

    def __init__(self) -> None:
        self.applied_index = -1
        self.table: dict[str, str] = {}

    def snapshot(self) -> tuple[int, bytes]:
        return self.applied_index, json.dumps(self.table).encode()

    def install(self, index: int, data: bytes) -> None:
        if index > self.applied_index:
            self.table, self.applied_index = json.loads(data), index

    def catch_up(self, node) -> None:
        """Apply what committed since; a log restarted past us continues at its start."""
        store = node.store
        self.applied_index = max(self.applied_index, store.begin_index - 1)
        while self.applied_index < min(node.replica.committed_index, store.end_index):
            self.applied_index += 1
            entry = store.get(self.applied_index)
            if entry.type == EntryType.NORMAL:
                key, value = entry.body.decode().split("=")
                self.table[key] = value


class Tables:
    """A `Table` on every replica of `cluster`, kept up with each event; `snapshots`
    False: the replicas' logs are restarted without them (DLedger's way)."""

    def __init__(self, cluster: SimCluster, snapshots: bool = True) -> None:
        self.cluster = cluster
        self.snapshots = snapshots
        self.tables: dict[str, Table] = {}
        for node_id in cluster.ids:
            self.add(node_id)
        cluster.observers.append(self)

    def add(self, node_id: str) -> None:
        self.tables[node_id] = table = Table()
        if self.snapshots:
            self.cluster.set_state_machine(node_id, table)

    def after_event(self, node) -> None:
        self.tables[node.id].catch_up(node)

    def completed(self, node_id, handle, code, positions) -> None:
        pass

    def retention(self, node_id: str) -> int:
        """Retention on `node_id` down to what its application applied; files deleted."""
        node = self.cluster.nodes[node_id]
        keep_from = min(node.replica.committed_index, self.tables[node_id].applied_index) + 1
        return node.store.delete_expired(keep_from, 0, now_s=FOREVER_S)


def _cluster(seed: int, snapshots: bool = True, spares: int = 0, **config):
    cluster = SimCluster(
        3,
        random.Random(seed),
        segment_size=SEGMENT_BYTES,
        stores=FileStores,
        config_overrides=config,
        spares=spares,
    )
    return cluster, Tables(cluster, snapshots)


def _write_and_trim(cluster: SimCluster, tables: Tables) -> int:
    """Keys written once, then enough more that retention on every live replica deletes
    the entries that wrote them; the leader's beginning after."""
    for i in range(8):
        cluster.client_append(body=b"early%d=%d" % (i, i))
    for i in range(200):
        cluster.client_append(body=b"late%d=%d" % (i % 5, i) + b"." * 60)
        cluster.run_until(cluster.now_ms + 2)
    cluster.run_until(cluster.now_ms + 500)
    for node_id, node in cluster.nodes.items():
        if node.alive:
            assert tables.retention(node_id) >= 2
    return cluster.leader().store.begin_index


def _left_behind(seed: int, snapshots: bool = True, **config):
    """Three replicas; one down while keys are written and retention deletes the log's
    head on the others. (cluster, tables, its id, the leader's beginning)."""
    cluster, tables = _cluster(seed, snapshots, **config)
    leader, _ms = cluster.run_until_leader(settle_ms=300)
    behind = next(n for n in cluster.ids if n != leader.id)
    cluster.crash(behind)
    begin = _write_and_trim(cluster, tables)
    assert begin > cluster.nodes[behind].store.end_index + 1
    return cluster, tables, behind, begin


def _agree(cluster: SimCluster, tables: Tables) -> None:
    cluster.client_append(body=b"last=1")
    cluster.run_until(cluster.now_ms + 1000)
    leader = cluster.leader()
    end = leader.replica.committed_index
    assert all(t.applied_index == end for t in tables.tables.values()), (
        end,
        {n: t.applied_index for n, t in tables.tables.items()},
    )
    expected = tables.tables[leader.id].table
    assert {"early0", "late4", "last"} <= expected.keys()
    for node_id, table in tables.tables.items():
        assert table.table == expected, node_id


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_follower_behind_the_leaders_beginning_gets_a_snapshot_and_the_states_agree(seed):
    cluster, tables, behind, begin = _left_behind(seed)
    cluster.restart(behind)
    cluster.run_until(cluster.now_ms + 1000)
    assert cluster.nodes[behind].store.begin_index == begin
    _agree(cluster, tables)


@pytest.mark.parametrize("seed", [6, 7, 8, 9])
def test_a_snapshot_in_many_chunks_over_a_lossy_network_arrives_whole(seed):
    """Chunks lost, duplicated and reordered on the way (a chunk out at a time, each
    answered with what the follower holds), leaders changing meanwhile (the heartbeats
    are lost too): once the network heals, the follower has installed the leader's state
    and its log begins where the leader's does, and the states agree."""
    cluster, tables, behind, _begin = _left_behind(seed, max_batch_push_bytes=64)
    cluster.conditions = NetworkConditions(drop=0.3, duplicate=0.2, max_delay_ms=3.0)
    cluster.restart(behind)
    cluster.run_until(cluster.now_ms + 10_000)
    cluster.conditions = NetworkConditions()
    _agree(cluster, tables)
    assert cluster.nodes[behind].store.begin_index == cluster.leader().store.begin_index


def test_a_member_added_after_retention_deleted_the_logs_head_gets_a_snapshot():
    cluster, tables = _cluster(5, spares=1)
    cluster.run_until_leader(settle_ms=300)
    begin = _write_and_trim(cluster, tables)
    assert begin > 0
    new = cluster.add_member()
    tables.add(new)
    cluster.run_until(cluster.now_ms + 1000)
    assert cluster.nodes[new].store.begin_index == begin
    _agree(cluster, tables)


@pytest.mark.parametrize("snapshots", [True, False])
def test_a_member_restarted_past_the_configuration_entries_takes_the_leaders_configuration(
    snapshots,
):
    """Three members become n1, n2, n3 (n3 added, one of the first removed and stopped),
    and n4 is added with the dLegerPeers an operator copied from the original group's
    conf but is down before it hears from the group; retention then deletes every entry
    that carried a configuration. Back, its log restarts at the leader's beginning, after
    a snapshot or not (DLedger's way), and it must take the group's configuration, saved
    with its term and vote, not the one it started with, which names the removed member
    and not n3."""
    cluster, tables = _cluster(4, snapshots, spares=2)
    leader, _ms = cluster.run_until_leader(settle_ms=300)
    original = tuple(cluster.ids)
    added = cluster.add_member()
    tables.add(added)
    cluster.run_until(cluster.now_ms + 500)
    removed = next(n for n in original if n != leader.id)
    for kind, member in ((Change.PROMOTE, added), (Change.REMOVE, removed)):
        handle = cluster.change_members(kind, member)
        cluster.run_until(cluster.now_ms + 500)
        assert cluster.member_changes[handle] is Code.SUCCESS, (kind, member)
    cluster.crash(removed)
    del tables.tables[removed]
    new = cluster.add_member(peers=original)
    tables.add(new)
    cluster.crash(new)
    begin = _write_and_trim(cluster, tables)
    expected = leader.replica.members.current
    assert expected.index < begin, "retention deleted the configuration entries"
    assert expected.voters == tuple(n for n in (*original, added) if n != removed)
    assert expected.learners == (new,)
    cluster.restart(new)
    cluster.run_until(cluster.now_ms + 1000)
    node = cluster.nodes[new]
    assert node.store.begin_index == begin
    assert node.replica.members.current == expected
    assert node.members.current == expected  # saved with the term and vote
    cluster.crash(new)
    cluster.restart(new)
    assert cluster.nodes[new].replica.members.current == expected


def test_without_snapshots_the_follower_lacks_what_retention_deleted():
    """The control: the same run restarting the follower's log without a snapshot (as
    DLedger does) leaves its application without the keys written in the deleted range,
    which the agreement check catches."""
    cluster, tables, behind, _begin = _left_behind(1, snapshots=False)
    cluster.restart(behind)
    cluster.run_until(cluster.now_ms + 1000)
    with pytest.raises(AssertionError):
        _agree(cluster, tables)
    assert "early0" not in tables.tables[behind].table


def test_a_snapshot_goes_in_chunks_and_a_follower_crashed_midway_gets_it_again():
    """Chunks of maxBatchPushSize, one out at a time: the follower crashed while they
    arrive loses what it held; back, it answers with where it stands (nothing) and the
    leader sends the snapshot again from its start."""
    cluster, tables, behind, begin = _left_behind(2, max_batch_push_bytes=64)
    leader = cluster.leader()
    cluster.restart(behind)
    progress = leader.replica.replication.progress[behind]
    until_ms = cluster.now_ms + 5000  # the leader tries again at the follower's next beat
    while progress.snapshot is None or progress.snapshot.acked_bytes <= 64:
        assert cluster.now_ms < until_ms, "no snapshot under way"
        cluster.run_until(cluster.now_ms + 0.05)
    assert len(progress.snapshot.data) > 3 * 64  # several chunks still to come
    cluster.crash(behind)
    assert tables.tables[behind].applied_index < begin - 1  # nothing installed
    cluster.run_until(cluster.now_ms + 200)
    cluster.restart(behind)
    cluster.run_until(cluster.now_ms + 3000)
    assert cluster.nodes[behind].store.begin_index == begin
    _agree(cluster, tables)


def test_a_follower_refuses_a_snapshot_it_would_have_to_hold_unbounded():
    """A chunk's `total_bytes` is a peer's word: past MAX_SNAPSHOT_BYTES, or a chunk
    that runs past it, is refused, and nothing is gathered."""
    cluster = SimCluster(3, random.Random(4))
    leader, _ms = cluster.run_until_leader(settle_ms=300)
    follower = cluster.nodes[next(n for n in cluster.ids if n != leader.id)]
    head = ("sim", leader.id, follower.id, leader.id, leader.replica.term)
    for total, offset, data in ((MAX_SNAPSHOT_BYTES + 1, 0, b"x"), (4, 2, b"xyz"), (4, -1, b"")):
        follower.replica.receive(
            InstallSnapshotRequest(*head, 50, total, offset, data), cluster.now_ms
        )
        [answer] = follower.replica.take_output().messages
        assert (answer.code, answer.offset) == (Code.UNEXPECTED_ARGUMENT, 0)


def test_a_follower_answers_the_last_chunk_once_installed_and_a_resend_after():
    """The install takes its time (the server runs it in a task): a chunk resent meanwhile
    (the leader's push timeout) is not gathered again, the answer goes to the latest
    resend once the driver reports, and a resend after that finds it installed."""
    r = make_replica("n1", term=1)
    r.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 1, seq=1), 0.0)
    r.take_output()

    def chunk(offset: int, data: bytes, seq: int) -> None:
        r.receive(
            InstallSnapshotRequest(GROUP, "n0", "n1", "n0", 1, 30, 6, offset, data, seq=seq), 1.0
        )

    chunk(0, b"abc", 2)
    [answer] = r.take_output().messages
    assert (answer.code, answer.offset, answer.seq) == (Code.SUCCESS, 3, 2)
    chunk(3, b"def", 3)
    out = r.take_output()
    assert out.snapshot == (30, b"abcdef") and not out.messages
    chunk(3, b"def", 4)  # resent while the driver installs
    assert not r.take_output()
    r.snapshot_installed(30, True)
    [answer] = r.take_output().messages
    assert (answer.code, answer.offset, answer.seq) == (Code.SUCCESS, 6, 4)
    chunk(3, b"def", 5)
    out = r.take_output()
    assert out.snapshot is None
    assert [(a.code, a.offset) for a in out.messages] == [(Code.SUCCESS, 6)]


def _store(root) -> MessageStore:
    return MessageStore(OneReplicaLog(), root, builtin_topics("C", "b", 4), [1000])


async def test_installing_the_metadata_is_all_or_nothing_across_a_crash(tmp_path, monkeypatch):
    """A crash while the snapshot is written (here: before the rename that publishes
    it) leaves the old metadata for a restart; once written, a restart has the new.
    Bytes that are no snapshot change nothing."""
    follower = _store(tmp_path / "f")
    follower.metadata.topics["Old"] = TopicConfig("Old")
    follower.checkpoint_work()()
    leader = _store(tmp_path / "l")
    leader.metadata.topics["New"] = TopicConfig("New")
    leader.metadata.offsets[("CG", "New", 1)] = 7
    leader.metadata.applied_meta_offset = 12
    index, body = 40, leader.metadata.snapshot_bytes()

    def crash(*_args):
        raise OSError("power lost before the rename")

    with monkeypatch.context() as m:
        m.setattr("os.replace", crash)
        with pytest.raises(OSError):
            await follower.install_metadata_snapshot(index, body)
    restarted = _store(tmp_path / "f")
    assert "Old" in restarted.metadata.topics and "New" not in restarted.metadata.topics

    with pytest.raises(ValueError, match="malformed metadata snapshot"):
        await restarted.install_metadata_snapshot(index, b'{"topicConfigTable": 3}')
    assert "Old" in restarted.metadata.topics

    await restarted.install_metadata_snapshot(index, body)
    assert "Old" not in restarted.metadata.topics
    assert restarted.metadata.offsets == {("CG", "New", 1): 7}
    again = _store(tmp_path / "f")
    assert "New" in again.metadata.topics and "Old" not in again.metadata.topics
    assert (again.metadata.applied_meta_offset, again.metadata.offsets) == (
        12,
        {("CG", "New", 1): 7},
    )


async def test_a_checkpoint_never_writes_metadata_older_than_an_install_over_it(tmp_path):
    """A dispatch checkpoint captures the metadata as it begins and writes it once the
    queues are durable; an install in between is newer, and stays what a restart loads."""
    follower = _store(tmp_path / "f")
    follower.metadata.topics["Old"] = TopicConfig("Old")
    checkpoint = follower.checkpoint_work()  # captured now, run later
    leader = _store(tmp_path / "l")
    leader.metadata.topics["New"] = TopicConfig("New")
    await follower.install_metadata_snapshot(40, leader.metadata.snapshot_bytes())
    checkpoint()
    restarted = _store(tmp_path / "f")
    assert "New" in restarted.metadata.topics and "Old" not in restarted.metadata.topics


async def test_a_snapshot_older_than_what_dispatch_reached_is_not_installed(tmp_path):
    """Dispatch here is at or past the snapshot's entry: the state is newer than it."""
    store = _store(tmp_path)
    store.metadata.topics["Mine"] = TopicConfig("Mine")
    store.dispatched_index = 40
    theirs = _store(tmp_path / "other")
    theirs.metadata.topics["Theirs"] = TopicConfig("Theirs")
    await store.install_metadata_snapshot(40, theirs.metadata.snapshot_bytes())
    assert "Mine" in store.metadata.topics and "Theirs" not in store.metadata.topics
