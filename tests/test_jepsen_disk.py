"""The disk faults against a real FileLogStore: lose what was not fsynced, keep a torn
tail, damage synced data. Recovery must give back exactly the synced prefix, or more
when a tail survived, or refuse to start when damage reaches what it was told is
committed — never a log that silently misses a committed entry."""

import json
import random

import pytest
from raftmq.broker.store.consumequeue import ENTRY, ENTRY_SIZE
from raftmq.broker.store.messagestore import DISPATCH_CHECKPOINT
from raftmq.dledger.codes import EntryType
from raftmq.dledger.server import SYNCED_LENGTHS_FILE
from raftmq.dledger.store.file import FileLogStore, StoreCorruption

from jepsen import disk
from jepsen.__main__ import main as jepsen_main

SEGMENT = 1 << 20
INDEX_SEGMENT = 32 * 1024


def _write(base, synced: int, unsynced: int) -> None:
    """`synced` entries fsynced (and recorded, as a replica with recordSyncedLengths
    does), then `unsynced` more written to the page cache only."""
    store = FileLogStore(base, SEGMENT, INDEX_SEGMENT)
    for n in range(synced):
        store.append_leader(1, [(EntryType.NORMAL, f"synced-{n}".encode() * 8)])
    store.sync_plan().run()
    (base / SYNCED_LENGTHS_FILE).write_text(json.dumps(store.synced_lengths_now()))
    for n in range(unsynced):
        store.append_leader(1, [(EntryType.NORMAL, f"unsynced-{n}".encode() * 8)])
    store.close()


def _reopen(base, committed_index: int = -1) -> FileLogStore:
    return FileLogStore(base, SEGMENT, INDEX_SEGMENT, committed_index=committed_index)


def test_losing_unsynced_writes_leaves_exactly_the_synced_prefix(tmp_path):
    _write(tmp_path, synced=20, unsynced=15)
    assert _reopen(tmp_path).end_index == 34  # SIGKILL alone loses nothing
    report = disk.lose_unsynced(tmp_path, random.Random(1), torn=False)
    assert [r["kept"] for r in report.values()] == [0]
    store = _reopen(tmp_path)
    assert store.end_index == 19
    assert store.get(19).body.startswith(b"synced-19")


def test_a_torn_tail_keeps_a_prefix_of_the_unsynced_entries(tmp_path):
    _write(tmp_path, synced=20, unsynced=15)
    report = disk.lose_unsynced(tmp_path, random.Random(7), torn=True)
    (kept,) = [r["kept"] for r in report.values()]
    assert kept > 0
    store = _reopen(tmp_path)
    assert 19 <= store.end_index <= 34
    for index in range(20, store.end_index + 1):  # whatever survived is whole
        assert store.get(index).body.startswith(f"unsynced-{index - 20}".encode())


def test_no_record_means_nothing_is_cut(tmp_path):
    _write(tmp_path, synced=5, unsynced=5)
    (tmp_path / SYNCED_LENGTHS_FILE).unlink()
    assert disk.lose_unsynced(tmp_path, random.Random(1), torn=False) == {}
    assert _reopen(tmp_path).end_index == 9


@pytest.mark.parametrize("mode", ["truncate", "bitflip"])
def test_damage_to_committed_entries_is_a_clean_refusal(tmp_path, mode):
    _write(tmp_path, synced=40, unsynced=0)
    disk.corrupt(tmp_path, random.Random(3), mode)
    with pytest.raises(StoreCorruption) as refused:
        _reopen(tmp_path, committed_index=39)
    assert "data" in str(refused.value)


@pytest.mark.parametrize("mode", ["truncate", "bitflip"])
def test_damage_past_the_committed_hint_is_cut(tmp_path, mode):
    _write(tmp_path, synced=40, unsynced=0)
    disk.corrupt(tmp_path, random.Random(3), mode)
    store = _reopen(tmp_path, committed_index=-1)
    assert store.end_index < 39
    for index in range(store.end_index + 1):
        assert store.get(index).body.startswith(f"synced-{index}".encode())


def test_wiping_the_log_keeps_term_and_vote(tmp_path):
    _write(tmp_path, synced=3, unsynced=0)
    (tmp_path / "currterm").write_text("currTerm=4\nvoteLeader=n1\n")
    disk.wipe_log(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["currterm"]
    assert _reopen(tmp_path).end_index == -1


def test_queue_files_lose_only_what_the_dispatch_checkpoint_does_not_cover(tmp_path):
    """Entries for messages before the checkpoint position survive every cut; what
    comes after is cut at a random point, each file on its own."""
    for name in ("0", "1"):
        queue_dir = tmp_path / "consumequeue" / "T" / name
        queue_dir.mkdir(parents=True)
        entries = b"".join(ENTRY.pack(100 * k, 100, 0) for k in range(10))
        (queue_dir / f"{0:020d}").write_bytes(entries)
    (tmp_path / DISPATCH_CHECKPOINT).write_text(json.dumps({"position": 400}))
    sizes = set()
    for seed in range(20):
        for path in (tmp_path / "consumequeue").glob("*/*/*"):
            path.write_bytes(b"".join(ENTRY.pack(100 * k, 100, 0) for k in range(10)))
        lost = disk.lose_unsynced_queues(tmp_path, random.Random(seed))
        files = sorted((tmp_path / "consumequeue").glob("*/*/*"))
        assert all(f.stat().st_size >= 4 * ENTRY_SIZE for f in files)
        assert lost == sum(10 - f.stat().st_size // ENTRY_SIZE for f in files)
        sizes.update(f.stat().st_size for f in files)
    assert min(sizes) < 10 * ENTRY_SIZE and len(sizes) > 5  # cuts happen, anywhere after


def test_disk_full_faults_without_root_are_one_line_and_status_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    status = jepsen_main(["run", "--faults", "disk-full", "--dir", str(tmp_path), "--quiet"])
    assert status == 2
    err = capsys.readouterr().err
    assert err == "jepsen: disk-full faults mount a tmpfs for each store: run as root\n"
