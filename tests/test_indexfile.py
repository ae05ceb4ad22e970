"""The key index (raftmq.broker.store.indexfile): RocketMQ's IndexFile layout, lookups
with collisions, roll-over, retention, and recovery after a crash."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from raftmq.broker.store import indexfile
from raftmq.broker.store.indexfile import (
    ENTRY_SIZE,
    HEADER_SIZE,
    IndexFile,
    IndexService,
    build_key,
    key_hash,
)

from raftmq.protocol.message import java_string_hash

T0_MS = 1_700_000_000_000


def test_layout_is_rocketmqs(tmp_path):
    file = IndexFile(tmp_path / "20240101000000000", slot_num=7, index_num=4)
    assert file.path.stat().st_size == HEADER_SIZE + 7 * 4 + 4 * ENTRY_SIZE
    assert file.put("T#k", 1000, T0_MS)
    assert file.put("T#k", 2000, T0_MS + 2500)
    file.flush()
    raw = file.path.read_bytes()
    assert struct.unpack_from(">qqqqii", raw, 0) == (T0_MS, T0_MS + 2500, 1000, 2000, 1, 3)
    slot = key_hash("T#k") % 7
    assert struct.unpack_from(">i", raw, HEADER_SIZE + 4 * slot) == (2,)
    second = HEADER_SIZE + 7 * 4 + 2 * ENTRY_SIZE
    assert struct.unpack_from(">iqii", raw, second) == (key_hash("T#k"), 2000, 2, 1)
    assert file.put("T#x", 3000, T0_MS)
    assert not file.put("T#y", 4000, T0_MS)  # entry 0 unused: 3 entries fill 4
    file.close()


def test_key_hash_is_abs_of_java_hash():
    assert key_hash("T#k") == abs(java_string_hash("T#k"))
    assert build_key("T", "k") == "T#k"


keys = st.text(alphabet="abc", min_size=1, max_size=3)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(keys, min_size=1, max_size=3), min_size=1, max_size=40))
def test_put_get_round_trip_with_collisions_and_rolls(tmp_path_factory, messages):
    """Every message is found under each of its keys, across rolled files, with only 3
    slots (collisions everywhere: the hash is checked, the key is the caller's)."""
    root = tmp_path_factory.mktemp("index")
    service = IndexService(root, slot_num=3, index_num=6)
    expected: dict[str, set[int]] = {}
    for n, words in enumerate(messages):
        phys = 100 * (n + 1)
        service.dispatch("T", phys, T0_MS + n * 1000, words)
        for word in words:
            expected.setdefault(word, set()).add(phys)
    for word, offsets in expected.items():
        hits, _end_ms, _end_phy = service.query("T", word, 64, 0, 2**63 - 1)
        same_hash = {w for w in expected if key_hash(build_key("T", w)) == key_hash("T#" + word)}
        wanted = set().union(*(expected[w] for w in same_hash))
        assert set(hits) == wanted if len(wanted) <= 64 else set(hits) <= wanted
        assert offsets <= set(hits)
    service.close()


def test_time_range_and_max_num(tmp_path):
    service = IndexService(tmp_path, slot_num=11, index_num=100)
    for n in range(10):
        service.dispatch("T", 100 * (n + 1), T0_MS + n * 1000, ["k"])
    hits, end_ms, end_phy = service.query("T", "k", 64, T0_MS + 3000, T0_MS + 5000)
    assert sorted(hits) == [400, 500, 600]
    assert (end_ms, end_phy) == (T0_MS + 9000, 1000)
    hits, *_ = service.query("T", "k", 2, 0, 2**63 - 1)
    assert hits == [1000, 900]  # the newest first
    assert service.query("T", "other", 64, 0, 2**63 - 1)[0] == []


def test_replay_is_not_indexed_twice(tmp_path):
    service = IndexService(tmp_path, slot_num=11, index_num=100)
    service.dispatch("T", 100, T0_MS, ["u1", "k"])
    service.dispatch("T", 100, T0_MS, ["u1", "k"])
    assert service.query("T", "k", 64, 0, 2**63 - 1)[0] == [100]


def test_retention_deletes_leading_files_never_the_last(tmp_path):
    service = IndexService(tmp_path, slot_num=5, index_num=3)  # 2 entries a file
    for n in range(6):
        service.dispatch("T", 100 * (n + 1), T0_MS + n, ["k"])
    assert len(service.files) == 3
    service.trim(350)
    assert [f.end_phy_offset for f in service.files] == [400, 600]
    service.trim(10_000)
    assert len(service.files) == 1


@settings(max_examples=30, deadline=None)
@given(
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=7),
)
def test_torn_file_after_crash_recovered_by_redispatch(
    tmp_path_factory, synced, extra, resume, stale_slots
):
    """A crash after a checkpoint: entries after it may be torn (here: garbage), slots
    may hold what the checkpoint flushed or a later entry's number (the first
    `stale_slots` slots are put back as the checkpoint left them), the dispatcher
    resumes at a position at or before the checkpoint's; recovery followed by
    dispatching again gives what an uninterrupted run gives."""
    root = tmp_path_factory.mktemp("index")
    resume = min(resume, synced)
    messages = [(100 * (n + 1), T0_MS + n * 1000, [f"u{n}", f"k{n % 4}"]) for n in range(60)]
    service = IndexService(root, slot_num=7, index_num=9)
    for phys, ts, words in messages[:synced]:
        service.dispatch("T", phys, ts, words)
    service.sync_plan()()
    synced_file = service.files[-1] if service.files else None
    synced_count = synced_file.index_count if synced_file else 1
    slots_end = HEADER_SIZE + 4 * stale_slots
    flushed_slots = bytes(synced_file._map[HEADER_SIZE:slots_end]) if synced_file else b""
    for phys, ts, words in messages[synced : synced + extra]:
        service.dispatch("T", phys, ts, words)
    if synced_file is not None:  # tear what the checkpoint did not flush
        synced_file._map[HEADER_SIZE:slots_end] = flushed_slots
        for number in range(synced_count, synced_file.index_count):
            pos = synced_file._entry_pos(number)
            synced_file._map[pos : pos + ENTRY_SIZE] = b"\xff" * ENTRY_SIZE
    service.close()

    resume_phy = 100 * (resume + 1)  # dispatch resumes with message `resume`
    recovered = IndexService(root, slot_num=7, index_num=9)
    recovered.recover(resume_phy)
    for phys, ts, words in messages[resume:]:
        recovered.dispatch("T", phys, ts, words)

    reference = IndexService(tmp_path_factory.mktemp("reference"), slot_num=7, index_num=9)
    for phys, ts, words in messages:
        reference.dispatch("T", phys, ts, words)
    for n in range(60):
        for word in (f"u{n}", f"k{n % 4}"):
            got = sorted(recovered.query("T", word, 64, 0, 2**63 - 1)[0])
            assert got == sorted(reference.query("T", word, 64, 0, 2**63 - 1)[0]), word
    recovered.close()
    reference.close()


def test_blocks_are_reserved_as_entries_are_added_not_all_at_once(tmp_path, monkeypatch):
    """A full disk must not meet a hole of the map (a SIGBUS), so the blocks an entry
    goes to are reserved before it is written; but only a step ahead: the whole file
    at RocketMQ's default sizes would be ~420 MB on disk before the first message."""
    monkeypatch.setattr(indexfile, "RESERVE_STEP_BYTES", 4096)
    slot_num, index_num = 1024, 100_000  # a 2 MB file
    file = IndexFile(tmp_path / "20240101000000000", slot_num, index_num)
    entries_at = HEADER_SIZE + slot_num * 4

    def on_disk_bytes() -> int:
        return file.path.stat().st_blocks * 512

    assert file.path.stat().st_size == entries_at + index_num * ENTRY_SIZE
    assert entries_at + ENTRY_SIZE <= on_disk_bytes() <= entries_at + 4096 + 8192
    for n in range(1, 1001):  # 20 kB of entries: the reservation follows
        assert file.put(f"T#k{n}", n, T0_MS)
        assert on_disk_bytes() >= entries_at + (n + 1) * ENTRY_SIZE
    assert on_disk_bytes() <= entries_at + 1001 * ENTRY_SIZE + 4096 + 8192
    assert file.select("T#k500", 4, T0_MS, T0_MS) == [500]
    file.close()
    reopened = IndexFile(file.path, slot_num, index_num)  # reserves what it holds again
    assert reopened.index_count == 1001 and reopened.select("T#k1000", 4, 0, T0_MS) == [1000]
    reopened.close()
