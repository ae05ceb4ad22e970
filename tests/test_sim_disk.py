"""The simulated file layer, and the real FileLogStore under generated crashes.

`SimFileSystem` keeps durable and volatile bytes apart and tears the difference at a
crash; `FileStores` runs each replica's log as a FileLogStore on one, so recovery
meets the same crashes the core does. The Raft checker runs after every event, and
each crash checks that recovery kept every entry its replica had been told was
fsynced. As in test_sim_properties, the simulator's seed is a plain integer.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from raftmq.dledger.codes import EntryType
from raftmq.dledger.sim import disk
from raftmq.dledger.sim.checks import InvariantViolation
from raftmq.dledger.sim.cluster import NetworkConditions
from raftmq.dledger.sim.disk import FileStores, SimFileSystem
from raftmq.dledger.sim.schedule import Fault, Schedule, run
from raftmq.dledger.store.file import FileLogStore

from tests.helpers import fault_lists

SEGMENT_BYTES = 4096
INDEX_SEGMENT_BYTES = 32 * 64
DATA = Path("/d")


def segment(fs: SimFileSystem, name: str = "00000000000000000000", create: bool = True):
    return fs.open_segment(DATA / name, 64, create=create)


def test_synced_bytes_survive_a_crash_and_unsynced_ones_may_not():
    def crash(seed: int) -> bytes:
        fs = SimFileSystem()
        file = segment(fs)
        fs.sync_dir(DATA)
        file.map[0:4] = b"kept"
        file.handle.sync()
        file.map[4:8] = b"lost"
        fs.crash(random.Random(seed))
        return segment(fs, create=False).map[0:8]

    # always the synced bytes; then none, all, or a prefix of the rest: a torn write
    assert {crash(seed) for seed in range(40)} == {
        b"kept\0\0\0\0",
        b"keptl\0\0\0",
        b"keptlo\0\0",
        b"keptlos\0",
        b"keptlost",
    }


def test_a_file_whose_directory_was_not_synced_is_gone_after_a_crash():
    fs = SimFileSystem()
    file = segment(fs)
    file.map[0:4] = b"data"
    file.handle.sync()  # its bytes are durable, its name is not
    fs.crash(random.Random(0))
    assert fs.names(DATA) == []
    with pytest.raises(FileNotFoundError):
        segment(fs, create=False)


def test_an_unlink_not_made_durable_is_undone_by_a_crash():
    fs = SimFileSystem()
    file = segment(fs)
    fs.sync_dir(DATA)
    file.map[0:4] = b"data"
    file.handle.sync()
    fs.unlink(file.path)
    assert fs.names(DATA) == []
    fs.crash(random.Random(0))
    assert segment(fs, create=False).map[0:4] == b"data"


def test_the_file_store_recovers_exactly_what_it_synced():
    """The store's own fsyncs (data, index, directories) cover what a plan vouches for."""
    fs = SimFileSystem()
    base = Path("/s")
    store = FileLogStore(base, SEGMENT_BYTES, INDEX_SEGMENT_BYTES, fs=fs)
    for n in range(300):
        store.append_leader(1, [(EntryType.NORMAL, b"x%d" % n)])
        if n == 199:
            store.sync_plan().run()
    expected = [store.chain_at(i) for i in range(200)]
    fs.crash(random.Random(3))
    recovered = FileLogStore(base, SEGMENT_BYTES, INDEX_SEGMENT_BYTES, committed_index=199, fs=fs)
    assert 199 <= recovered.end_index < 300
    assert [recovered.chain_at(i) for i in range(200)] == expected


def test_group_commits_leave_the_index_to_recovery_and_the_checkpoint():
    """A group commit fsyncs the data alone: a crash may take index entries it covered,
    and recovery rebuilds them from the data; `index_sync_plan`, which the server runs
    before saving a checkpoint, makes them durable so recovery may trust them."""
    base = Path("/s")
    big_segment = 1 << 20  # no new segment (and no directory fsync) after the first plan

    def crash_after(index_synced: bool, seed: int):
        fs = SimFileSystem()
        store = FileLogStore(base, big_segment, 32 * 1024, fs=fs)
        store.append_leader(1, [(EntryType.NORMAL, b"first")])
        store.sync_plan().run()  # the new segments' directories, and the index with them
        for n in range(200):
            store.append_leader(1, [(EntryType.NORMAL, b"x%d" % n)])
            store.sync_plan().run()
        if index_synced:
            store.index_sync_plan().run()
        chains = [store.chain_at(i) for i in range(201)]
        fs.crash(random.Random(seed))
        recovered = FileLogStore(base, big_segment, 32 * 1024, committed_index=200, fs=fs)
        assert recovered.end_index == 200
        assert [recovered.chain_at(i) for i in range(201)] == chains
        assert [recovered.get(i).body for i in range(1, 201)] == [b"x%d" % n for n in range(200)]
        return recovered.recovery

    reports = [crash_after(False, seed) for seed in range(8)]
    assert any(r.index_entries_rewritten for r in reports)
    for seed in range(8):
        assert crash_after(True, seed).index_entries_rewritten == 0


# ------------------------------------------------------------------ replicas on file stores
KINDS = ("crash", "restart", "partition", "heal", "pause", "resume")


@st.composite
def crash_schedules(draw, size: int = 3):
    faults = draw(fault_lists(KINDS, size, 3000, size, 16))
    conditions = NetworkConditions(
        drop=draw(st.sampled_from([0.0, 0.01, 0.1])), max_delay_ms=draw(st.sampled_from([1, 5]))
    )
    append_every_ms = draw(st.sampled_from([1.0, 5.0]))
    return Schedule(size, tuple(faults), conditions, append_every_ms, duration_ms=3000.0)


@given(crash_schedules(), st.integers(0, 2**32 - 1))
def test_replicas_on_file_stores_stay_safe_through_torn_crashes(schedule, seed):
    cluster = run(schedule, random.Random(seed), stores=FileStores)
    note(f"leader changes: {cluster.checker.leader_changes}, acked: {len(cluster.checker.acked)}")


def test_a_quiet_run_on_file_stores_acknowledges_nearly_everything():
    cluster = run(Schedule(3, ()), random.Random(7), stores=FileStores)
    assert len(cluster.checker.acked) > 500
    assert all(isinstance(n.store, FileLogStore) for n in cluster.nodes.values())


def test_crashes_without_directory_fsyncs_lose_fsynced_entries(monkeypatch):
    """Negative control: a store whose directory fsyncs do nothing loses new segment
    files in a crash, with entries its replica had been told were durable."""

    def forgetful(self, directory):  # the create or unlink stays in the volatile directory
        return disk._SimHandle(lambda: None)

    monkeypatch.setattr(SimFileSystem, "dir_handle", forgetful)
    faults = tuple(
        Fault(float(t + dt), kind, (0, 1, 2))
        for t in range(200, 3000, 300)
        for kind, dt in (("crash", 0), ("restart", 50))
    )
    with pytest.raises(InvariantViolation, match="recovery lost fsynced index"):
        run(Schedule(3, faults, append_every_ms=1.0), random.Random(1), stores=FileStores)
