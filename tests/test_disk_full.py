"""A full disk is a refusal, not a failure: DLedger's DISK_FULL.

Segments are preallocated, so a full disk shows when a new one is created (ENOSPC
from fallocate, DiskFull here) or when the driver's disk check finds the filesystem
over diskFullRatio. Either way the store is left as it was, the leader answers
DISK_FULL without appending, a follower answers a push DISK_FULL without acknowledging
it, the group commits on the replicas that can write, and everyone resumes when
there is room again. The simulator's file layer (`SimFileSystem.full`) plays the disk;
the Raft checker runs after every event.
"""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest
from raftmq.broker.store.consumequeue import ENTRY, ConsumeQueueTable
from raftmq.dledger.codes import Code, EntryType, Role
from raftmq.dledger.sim.cluster import SimCluster
from raftmq.dledger.sim.disk import FileStores, SimFileSystem
from raftmq.dledger.store.file import FileLogStore

from jepsen import disk as ballast
from raftmq.disk.filesystem import DiskFull
from raftmq.protocol import message as codec
from raftmq.remoting import ResponseCode
from tests.helpers import create_topic, group, wait_for

SEGMENT_BYTES = 4096
BODY = b"x" * 200  # about 16 entries a segment


def _store(fs: SimFileSystem) -> FileLogStore:
    return FileLogStore(Path("/d"), SEGMENT_BYTES, 32 * 64, fs=fs)


def test_no_room_for_a_new_segment_leaves_the_log_as_it_was():
    fs = SimFileSystem()
    store = _store(fs)
    store.append_leader(1, [(EntryType.NORMAL, BODY)] * 15)  # the first segment nearly full
    store.sync_plan().run()
    before = (store.end_index, store.end_pos, store.end_chain, store.generation)
    fs.full = True
    with pytest.raises(DiskFull):
        store.append_leader(1, [(EntryType.NORMAL, BODY)] * 4)  # rolls to a second segment
    assert (store.end_index, store.end_pos, store.end_chain, store.generation) == before
    assert fs.names(Path("/d/data")) == ["00000000000000000000"]
    store.sync_plan().run()  # what is written and what is durable still agree
    fs.full = False
    placed = store.append_leader(1, [(EntryType.NORMAL, BODY)] * 4)
    assert [index for index, _pos in placed] == [15, 16, 17, 18]
    assert placed[-1][1] >= SEGMENT_BYTES  # in the new segment


def test_a_follower_store_refuses_a_leaders_entries_it_has_no_room_for():
    leader_fs, follower_fs = SimFileSystem(), SimFileSystem()
    leader = FileLogStore(Path("/l"), SEGMENT_BYTES, 32 * 64, fs=leader_fs)
    follower = FileLogStore(Path("/f"), SEGMENT_BYTES, 32 * 64, fs=follower_fs)
    leader.append_leader(1, [(EntryType.NORMAL, BODY)] * 40)
    blob, count = leader.read_encoded(0, 10 << 20)  # one segment's worth
    assert follower.append_encoded(blob) == count
    follower_fs.full = True
    blob, _count = leader.read_encoded(count, 10 << 20)
    with pytest.raises(DiskFull):
        follower.append_encoded(blob)
    assert follower.end_index == count - 1
    follower_fs.full = False
    assert follower.append_encoded(blob) > 0


def _cluster(seed: int, **config) -> SimCluster:
    cluster = SimCluster(
        3, random.Random(seed), segment_size=SEGMENT_BYTES, stores=FileStores,
        config_overrides=config,
    )  # fmt: skip
    cluster.run_until_leader(settle_ms=300)
    return cluster


def _append(cluster: SimCluster, n: int) -> list[int]:
    handles = [cluster.client_append(body=BODY) for _ in range(n)]
    cluster.run_until(cluster.now_ms + 1000)
    return handles


def _outcomes(cluster: SimCluster, handles: list[int]) -> list:
    return [cluster.checker.outcomes.get(h) for h in handles]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_follower_with_a_full_disk_acknowledges_nothing_and_the_quorum_commits(seed):
    cluster = _cluster(seed)
    leader = cluster.leader()
    full, other = [n for n in cluster.ids if n != leader.id]
    cluster.stores.disks[full].full = True
    handles = _append(cluster, 60)  # several segments: the full one stops at its first roll
    assert _outcomes(cluster, handles) == [Code.SUCCESS] * 60
    stuck = cluster.nodes[full]
    assert stuck.replica.disk_full and stuck.store.end_index < leader.store.end_index
    assert leader.replica.replication.progress[full].match_index <= stuck.store.end_index
    assert cluster.nodes[other].store.end_index == leader.store.end_index
    # room again (the driver's disk check says so): it catches up by itself
    cluster.stores.disks[full].full = False
    stuck.replica.set_disk_full(False, cluster.now_ms)
    cluster.run_until(cluster.now_ms + 1000)
    assert stuck.store.end_index == leader.store.end_index
    assert stuck.replica.committed_index == leader.replica.committed_index


def test_a_leader_over_its_disk_full_ratio_refuses_appends_and_resumes():
    """With no member to hand over to (every follower's disk full too), it leads on,
    refusing appends, and takes them again once there is room."""
    cluster = _cluster(4)
    leader = cluster.leader()
    for node in cluster.nodes.values():
        node.replica.set_disk_full(True, cluster.now_ms)
    end = leader.store.end_index
    refused = _append(cluster, 5)
    assert _outcomes(cluster, refused) == [Code.DISK_FULL] * 5
    assert leader.store.end_index == end, "a refused append wrote nothing"
    cluster.run_until(cluster.now_ms + 3000)  # placement checks every second
    assert cluster.leader() is leader  # it still leads and serves reads
    for node in cluster.nodes.values():
        node.replica.set_disk_full(False, cluster.now_ms)
    assert _outcomes(cluster, _append(cluster, 5)) == [Code.SUCCESS] * 5


@pytest.mark.parametrize("seed", [4, 6, 7])
def test_a_leader_over_its_disk_full_ratio_hands_over_to_a_member_with_room(seed):
    """DLedger keeps a full leader leading, refusing every append; here it hands over
    at its next placement check (every second) to a voter whose disk is not full, and
    the group takes appends again, committed by the two members with room."""
    cluster = _cluster(seed)
    leader = cluster.leader()
    leader.replica.set_disk_full(True, cluster.now_ms)
    assert _outcomes(cluster, _append(cluster, 3)) == [Code.DISK_FULL] * 3
    cluster.run_until(cluster.now_ms + 2000)
    assert cluster.leader().id != leader.id
    assert _outcomes(cluster, _append(cluster, 5)) == [Code.SUCCESS] * 5


@pytest.mark.parametrize("full_one", [0, 1])
def test_a_follower_whose_disk_is_full_does_not_take_over(full_one):
    """Asked to take over, a follower over its own diskFullRatio refuses (DISK_FULL): as
    leader it could append nothing. The full leader turns to the other follower.
    (Either follower full: the leader asks one of them first.)"""
    cluster = _cluster(9)
    leader = cluster.leader()
    followers = sorted(n for n in cluster.ids if n != leader.id)
    full_follower, roomy = followers[full_one], followers[1 - full_one]
    cluster.nodes[full_follower].replica.set_disk_full(True, cluster.now_ms)
    leader.replica.set_disk_full(True, cluster.now_ms)
    leaders = set()
    for _ in range(45):
        cluster.run_until(cluster.now_ms + 100)
        leaders.add(cluster.leader().id)
    assert cluster.leader().id == roomy
    assert full_follower not in leaders


def test_a_follower_that_stores_nothing_stops_holding_back_retention():
    """A follower whose disk is full answers heartbeats but stores none of what it
    lacks: after followerStallTimeoutMs the leader's retention floor no longer waits
    for it (it is named in `stalled_followers`); once it stores again, it does."""
    cluster = _cluster(8, follower_stall_timeout_ms=5000)
    leader = cluster.leader()
    stuck = next(n for n in cluster.ids if n != leader.id)
    keep_ms = 3600_000.0
    cluster.stores.disks[stuck].full = True
    _append(cluster, 60)
    lacking = leader.replica.replication.progress[stuck].match_index + 1
    assert leader.replica.retention_floor(cluster.now_ms, keep_ms) == lacking
    cluster.run_until(cluster.now_ms + 3000)
    assert leader.replica.retention_floor(cluster.now_ms, keep_ms) == lacking
    assert leader.replica.stalled_followers == frozenset()
    cluster.run_until(cluster.now_ms + 3000)  # 6 s without progress
    floor = leader.replica.retention_floor(cluster.now_ms, keep_ms)
    assert floor == leader.replica.committed_index + 1 > lacking
    assert leader.replica.stalled_followers == {stuck}
    cluster.stores.disks[stuck].full = False
    cluster.nodes[stuck].replica.set_disk_full(False, cluster.now_ms)
    cluster.run_until(cluster.now_ms + 1000)
    leader.replica.retention_floor(cluster.now_ms, keep_ms)
    assert leader.replica.stalled_followers == frozenset()


def test_a_leader_with_no_room_for_a_new_segment_refuses_and_resumes():
    cluster = _cluster(5)
    leader = cluster.leader()
    cluster.stores.disks[leader.id].full = True
    handles = _append(cluster, 40)
    outcomes = _outcomes(cluster, handles)
    refused = outcomes.index(Code.DISK_FULL)
    assert outcomes[:refused] == [Code.SUCCESS] * refused  # what fitted its segment
    assert set(outcomes[refused:]) == {Code.DISK_FULL}
    assert leader.store.end_index == cluster.nodes[leader.id].replica.committed_index
    cluster.stores.disks[leader.id].full = False
    leader.replica.set_disk_full(False, cluster.now_ms)
    assert _outcomes(cluster, _append(cluster, 20)) == [Code.SUCCESS] * 20


def test_a_new_leader_with_no_room_for_its_noop_appends_it_when_room_returns():
    cluster = _cluster(6)
    old = cluster.leader()
    # an entry that leaves 10 bytes of the segment: too few for the next leader's NOOP
    room = SEGMENT_BYTES - old.store.end_pos % SEGMENT_BYTES
    handle = cluster.client_append(body=b"y" * (room - 48 - 10))
    cluster.run_until(cluster.now_ms + 300)  # committed, and every replica holds it
    assert _outcomes(cluster, [handle]) == [Code.SUCCESS]
    for node in cluster.ids:
        cluster.stores.disks[node].full = True
    cluster.crash(old.id)
    new, _ms = cluster.run_until_leader(not_id=old.id, settle_ms=300)
    assert new.replica.disk_full and new.store.end_term < new.replica.term  # no NOOP yet
    for node in cluster.ids:
        cluster.stores.disks[node].full = False
        if cluster.nodes[node].alive:
            cluster.nodes[node].replica.set_disk_full(False, cluster.now_ms)
    cluster.run_until(cluster.now_ms + 500)
    assert new.replica.role is Role.LEADER and new.store.end_term == new.replica.term
    assert new.replica.committed_index == new.store.end_index


@pytest.mark.slow
@pytest.mark.requires("tmpfs")
async def test_a_broker_on_a_full_disk_refuses_sends_serves_pulls_and_resumes(nursery, tmp_path):
    """A real filesystem filled to the last byte under a running broker (one member,
    so its own disk is the quorum): sends are refused with RocketMQ's code and remark
    and store nothing, pulls still answer, and sends work again once there is room."""
    disk = tmp_path / "disk"
    ballast.mount_tmpfs(disk, 24 << 20)
    try:
        g = await group(nursery, disk, nodes=1)
        await create_topic(g, "T", 1)
        broker = g.master()
        assert (await g.send(broker, "T", b"before")).code == ResponseCode.SUCCESS
        ballast.fill(disk, 0)
        await wait_for(lambda: broker.dledger.replica.disk_full, 2.0)
        refused = await g.send(broker, "T", b"refused")
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert refused.remark == (
            "service not available now. It may be caused by one of the following reasons: "
            "the broker's disk is full [CL:  1.00 CQ:  1.00 INDEX:  1.00], messages are put "
            "to the slave, message store has been shut down, etc."
        )
        pulled = await g.pull(broker, "T", 0, 0)
        assert [m.body for m in codec.decode_all(pulled.body)] == [b"before"]
        ballast.free(disk)
        await wait_for(lambda: not broker.dledger.replica.disk_full, 2.0)
        after = await g.send(broker, "T", b"after")
        assert after.code == ResponseCode.SUCCESS and after.ext_fields["queueOffset"] == "1"
        await wait_for(lambda: broker.store.max_offset("T", 0) == 2)
        pulled = await g.pull(broker, "T", 0, 0)
        assert [m.body for m in codec.decode_all(pulled.body)] == [b"before", b"after"]
    finally:
        ballast.unmount(disk)


@pytest.mark.requires("tmpfs")
def test_consumequeue_entries_a_full_disk_cut_short_are_written_once_there_is_room(tmp_path):
    """A write short of room writes part of what it was given: the checkpoint's next
    try must write the rest, not drop it (the file would then miss entries and every
    later one would sit at the wrong offset), and nothing twice."""
    disk = tmp_path / "disk"
    ballast.mount_tmpfs(disk, 1 << 20)
    try:
        ballast.fill(disk, 8192)
        queues = ConsumeQueueTable(disk / "consumequeue")
        queue = queues.find_or_create("T", 0)
        entries = [(100 * k, 100, k) for k in range(1000)]  # 20,000 bytes
        for offset, (physical, size, tags) in enumerate(entries):
            queue.append(offset, physical, size, tags)
        with pytest.raises(OSError) as no_room:
            queues.sync_plan([("T", 0)])()
        assert no_room.value.errno == errno.ENOSPC
        ballast.free(disk)
        queues.sync_plan([("T", 0)])()()
        assert queue.durable
        (path,) = (disk / "consumequeue" / "T" / "0").iterdir()
        assert path.read_bytes() == b"".join(ENTRY.pack(*entry) for entry in entries)
    finally:
        ballast.unmount(disk)


@pytest.mark.requires("tmpfs")
def test_a_real_filesystem_with_no_room_for_a_segment_refuses_and_leaves_no_file(tmp_path):
    disk = tmp_path / "disk"
    ballast.mount_tmpfs(disk, 1 << 20)
    try:
        store = FileLogStore(disk / "log", 64 << 10, 32 * 256)  # the first segments fit
        store.append_leader(1, [(EntryType.NORMAL, b"z" * 1000)] * 60)  # just short of 64 KiB
        ballast.fill(disk, 16 << 10)
        with pytest.raises(DiskFull):
            store.append_leader(1, [(EntryType.NORMAL, b"z" * 1000)] * 10)
        assert store.end_index == 59
        assert sorted(p.name for p in (disk / "log" / "data").iterdir()) == [f"{0:020d}"]
        ballast.free(disk)
        assert [i for i, _pos in store.append_leader(1, [(EntryType.NORMAL, b"z")])] == [60]
        store.sync_plan().run()
        store.close()
    finally:
        ballast.unmount(disk)
