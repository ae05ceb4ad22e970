"""FileLogStore on disk: DLedger's DLedgerMappedFileStoreTest, plus torn writes and retention.

Most tests write DLedger's abnormal-recovery fixture: 100 entries of 1 KiB in
10 KiB data segments (nine entries and a filler per segment, so 12 files) and
512-byte index segments (16 index entries each, so 7 files), then damage the
files behind the store's back and reopen it.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store import recovery
from raftmq.dledger.store.base import StoreClosed
from raftmq.dledger.store.file import FileLogStore, StoreCorruption
from raftmq.dledger.store.memory import MemoryLogStore
from raftmq.dledger.store.scan import NoFastStart
from raftmq.dledger.store.sync import sync_concurrently

SEGMENT_BYTES = 10 * 1024
INDEX_SEGMENT_BYTES = 32 * 16
ENTRY_BYTES = 1024
PER_SEGMENT = 9  # 9 * 1024 + 1024 + 8 > 10240
COUNT = 100
NORMAL = EntryType.NORMAL


def body(n: int, size: int = ENTRY_BYTES - codec.HEADER_SIZE) -> bytes:
    """Never a zero byte, so a zeroed stretch of a file is always damage."""
    return bytes((n * 7 + k) % 251 + 1 for k in range(size))


def term_of(n: int) -> int:
    return 1 + n // 30


def open_store(path: Path, **kwargs) -> FileLogStore:
    kwargs.setdefault("segment_size", SEGMENT_BYTES)
    kwargs.setdefault("index_segment_size", INDEX_SEGMENT_BYTES)
    return FileLogStore(path, **kwargs)


def fill(store, count: int = COUNT, start: int = 0) -> None:
    for n in range(start, start + count):
        store.append_leader(term_of(n), [(NORMAL, body(n))])


def state(store) -> tuple:
    return (store.begin_index, store.end_index, store.end_term, store.end_pos, store.end_chain)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def data_file(path: Path, seg: int) -> Path:
    return path / "data" / f"{seg * SEGMENT_BYTES:020d}"


def entry_pos(index: int) -> int:
    return (index // PER_SEGMENT) * SEGMENT_BYTES + (index % PER_SEGMENT) * ENTRY_BYTES


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def read(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def flip(path: Path, offset: int) -> None:
    patch(path, offset, bytes([read(path, offset, 1)[0] ^ 0x10]))


@pytest.fixture
def written(tmp_path) -> tuple[Path, tuple, list[codec.Entry]]:
    """The 100-entry fixture, closed; returns (dir, state, entries)."""
    store = open_store(tmp_path / "s")
    fill(store)
    snapshot = state(store), [store.get(i) for i in range(COUNT)]
    store.close()
    return tmp_path / "s", *snapshot


@pytest.fixture
def reference() -> MemoryLogStore:
    """The same log in memory: what any prefix of the fixture should look like."""
    store = MemoryLogStore(SEGMENT_BYTES)
    fill(store)
    return store


def prefix_state(reference: MemoryLogStore, end_index: int) -> tuple:
    reference.truncate(end_index + 1)
    return state(reference)


# ------------------------------------------------------------------------------ layout
def test_segments_are_preallocated_and_named_by_their_start_offset(written):
    path, (_b, end_index, _t, end_pos, _c), _entries = written
    assert (end_index, end_pos) == (99, 11 * SEGMENT_BYTES + ENTRY_BYTES)
    assert names(path / "data") == [f"{i * SEGMENT_BYTES:020d}" for i in range(12)]
    assert names(path / "index") == [f"{i * INDEX_SEGMENT_BYTES:020d}" for i in range(7)]
    for p in (*(path / "data").iterdir(), *(path / "index").iterdir()):
        expected = SEGMENT_BYTES if p.parent.name == "data" else INDEX_SEGMENT_BYTES
        assert p.stat().st_size == expected
    # the filler at the end of segment 0, then entry 9 at the start of segment 1
    assert codec.BLANK_HEADER.unpack(read(data_file(path, 0), 9 * ENTRY_BYTES, 8)) == (
        -1,
        SEGMENT_BYTES - 9 * ENTRY_BYTES,
    )
    # index entry i at byte 32 * i of the index space: 9 in file 0, 16 first in file 512
    assert codec.INDEX_ENTRY.unpack(read(path / "index" / f"{0:020d}", 32 * 9, 32)) == (
        NORMAL,
        SEGMENT_BYTES,
        ENTRY_BYTES,
        9,
        1,
    )
    second = path / "index" / f"{INDEX_SEGMENT_BYTES:020d}"
    assert codec.INDEX_ENTRY.unpack(read(second, 0, 32)) == (
        NORMAL,
        entry_pos(16),
        ENTRY_BYTES,
        16,
        1,
    )
    assert not (path / "begin").exists()


def test_a_closed_store_says_so_instead_of_reading_nothing(written):
    """Its owner closes it on the way out, a disk failure included, while other tasks
    still unwind: they get a defined error (it used to be KeyError from a cleared table)."""
    path, _snapshot, _entries = written
    store = open_store(path)
    store.close()
    assert store.closed
    for read_after_close in (
        lambda: store.pos_at(0),
        lambda: store.get(0),
        lambda: store.read_at(0, 8),
        lambda: store.read_encoded(0, 1 << 20),
        lambda: store.append_leader(9, [(NORMAL, body(0))]),
        lambda: store.truncate(50),
    ):
        with pytest.raises(StoreClosed):
            read_after_close()
    assert names(path / "data") == [f"{i * SEGMENT_BYTES:020d}" for i in range(12)]


# ------------------------------------------------------------------------------ recovery
def test_normal_recovery_restores_the_same_log(written):
    path, snapshot, entries = written
    store = open_store(path)
    try:
        assert state(store) == snapshot
        assert [store.get(i) for i in range(COUNT)] == entries
        assert [store.term_at(i) for i in range(COUNT)] == [term_of(n) for n in range(COUNT)]
        assert store.first_index_of_term(75) == 60
        assert store.recovery.truncated_bytes == 0
        assert store.recovery.cut_pos is None and store.recovery.index_entries_rewritten == 0
        # no checkpoint: the scan starts at the third-to-last data segment (entry 81)
        assert (store.recovery.trusted_entries, store.recovery.verified_entries) == (81, 19)
        assert store.append_leader(4, [(NORMAL, body(100))]) == [(100, entry_pos(100))]
    finally:
        store.close()


def test_a_follower_log_written_by_append_encoded_recovers(tmp_path, reference):
    store = open_store(tmp_path / "f")
    while store.end_index < reference.end_index:
        store.append_encoded(reference.read_encoded(store.end_index + 1, 5000)[0])
    store.close()
    store = open_store(tmp_path / "f")
    try:
        assert state(store) == state(reference)
        assert store.recovery.cut_pos is None
    finally:
        store.close()


def test_deleting_the_last_two_data_files_shrinks_the_log_and_its_index(written, reference):
    path, _snapshot, entries = written
    data_file(path, 11).unlink()
    data_file(path, 10).unlink()
    store = open_store(path)
    try:
        # DLedger's numbers: 10 files left, ledger end 89
        assert len(names(path / "data")) == 10
        assert store.end_index == 89
        assert state(store) == prefix_state(reference, 89)
        assert [store.get(i) for i in range(90)] == entries[:90]
        # index entries 90.. are gone: 6 index files, and the slots after 89 zeroed
        assert names(path / "index") == [f"{i * INDEX_SEGMENT_BYTES:020d}" for i in range(6)]
        last_index_file = path / "index" / f"{5 * INDEX_SEGMENT_BYTES:020d}"
        assert read(last_index_file, 32 * (90 - 80), 32 * 6) == bytes(32 * 6)
        # the filler that pointed at the missing file went too (it is past the end):
        # [-1][1024] has its last non-zero byte at offset 6
        assert store.recovery.truncated_bytes == 7
        assert store.append_leader(4, [(NORMAL, body(90))]) == [(90, entry_pos(90))]
    finally:
        store.close()


def test_losing_committed_entries_refuses_to_start(written):
    path, _snapshot, _entries = written
    data_file(path, 11).unlink()
    data_file(path, 10).unlink()
    with pytest.raises(StoreCorruption) as info:
        open_store(path, committed_index=95)
    assert info.value.path == str(data_file(path, 10))
    assert info.value.offset == 0
    assert len(names(path / "index")) == 7  # nothing was changed


def test_deleting_every_data_file_leaves_an_empty_log(written):
    path, _snapshot, _entries = written
    for p in (path / "data").iterdir():
        p.unlink()
    store = open_store(path)
    try:
        assert state(store) == (0, -1, -1, 0, 0)
        assert names(path / "index") == []
        assert store.append_leader(1, [(NORMAL, body(0))]) == [(0, 0)]
    finally:
        store.close()


def test_a_torn_last_entry_is_cut(written, reference):
    path, _snapshot, entries = written
    pos = entry_pos(99) - 11 * SEGMENT_BYTES
    patch(data_file(path, 11), pos + ENTRY_BYTES // 2, bytes(ENTRY_BYTES // 2))
    store = open_store(path)
    try:
        assert state(store) == prefix_state(reference, 98)
        # entry 99 opened segment 11, so segment 10's filler after 98 goes too
        assert store.recovery.truncated_bytes == ENTRY_BYTES // 2 + 7
        assert store.recovery.cut_pos == entry_pos(99)
        assert not store.recovery.valid_data_after_cut
        # the segment holding only the torn entry is gone, and so is its index entry
        assert not data_file(path, 11).exists()
        assert read(path / "index" / f"{6 * INDEX_SEGMENT_BYTES:020d}", 32 * 3, 32) == bytes(32)
        assert [store.get(i) for i in range(99)] == entries[:99]
    finally:
        store.close()
    store = open_store(path)  # a second recovery finds a clean log
    try:
        assert store.end_index == 98 and store.recovery.truncated_bytes == 0
    finally:
        store.close()


def test_a_torn_entry_inside_a_segment_is_zeroed_on_disk(written, reference):
    path, _snapshot, _entries = written
    store = open_store(path)
    store.truncate(96)
    store.close()
    offset = entry_pos(95) - 10 * SEGMENT_BYTES
    patch(data_file(path, 10), offset + 700, bytes(ENTRY_BYTES - 700))
    store = open_store(path)
    try:
        assert state(store) == prefix_state(reference, 94)
        assert store.recovery.truncated_bytes == 700
        assert read(data_file(path, 10), offset, SEGMENT_BYTES - offset) == bytes(
            SEGMENT_BYTES - offset
        )
    finally:
        store.close()


def test_data_after_a_lost_page_is_scrubbed_so_it_cannot_come_back(written, reference):
    # Writeback out of order: the page holding entry 95's header never reached the
    # disk, the pages after it did. The log ends at 94 and 96..98 must go, or
    # re-receiving an identical 95 would silently revive them.
    path, _snapshot, _entries = written
    offset = entry_pos(95) - 10 * SEGMENT_BYTES
    patch(data_file(path, 10), offset, bytes(codec.HEADER_SIZE))
    store = open_store(path)
    try:
        assert state(store) == prefix_state(reference, 94)
        assert store.recovery.cut_pos == entry_pos(95)
        # counted from the end to the last non-zero byte: 95's zeroed header included,
        # plus segment 11, which held only entry 99
        filler_end = PER_SEGMENT * ENTRY_BYTES + 7
        assert store.recovery.truncated_bytes == (filler_end - offset) + ENTRY_BYTES
        assert read(data_file(path, 10), offset, SEGMENT_BYTES - offset) == bytes(
            SEGMENT_BYTES - offset
        )
    finally:
        store.close()


def test_a_header_without_its_body_is_cut(written, reference):
    path, _snapshot, _entries = written
    pos = entry_pos(98) - 10 * SEGMENT_BYTES
    patch(data_file(path, 10), pos + codec.HEADER_SIZE, bytes(ENTRY_BYTES - codec.HEADER_SIZE))
    data_file(path, 11).unlink()
    store = open_store(path)
    try:
        assert state(store) == prefix_state(reference, 97)
    finally:
        store.close()


def test_a_flipped_byte_in_the_last_entry_is_cut(written, reference):
    path, _snapshot, _entries = written
    flip(data_file(path, 11), codec.HEADER_SIZE + 100)
    store = open_store(path)
    try:
        assert state(store) == prefix_state(reference, 98)
        assert "bodyCrc" in store.recovery.reason
    finally:
        store.close()


def test_a_flipped_header_byte_breaks_the_chain_and_is_cut(written, reference):
    path, _snapshot, _entries = written
    flip(data_file(path, 11), 17)  # the term field of entry 99
    store = open_store(path)
    try:
        assert state(store) == prefix_state(reference, 98)
        assert "chainCrc" in store.recovery.reason
    finally:
        store.close()


def test_damage_inside_the_committed_log_refuses_to_start(written):
    # entry 75 is in segment 8 (72..80), where the scan starts for committed index 80
    path, _snapshot, _entries = written
    seg, offset = divmod(entry_pos(75), SEGMENT_BYTES)
    flip(data_file(path, seg), offset + codec.HEADER_SIZE + 3)
    with pytest.raises(StoreCorruption) as info:
        open_store(path, committed_index=80)
    assert info.value.path == str(data_file(path, seg))
    assert info.value.offset == offset
    assert str(data_file(path, seg)) in str(info.value) and f"offset {offset}" in str(info.value)
    assert len(names(path / "data")) == 12  # refused before changing anything


def test_damage_past_the_committed_index_is_cut_and_reported(written, reference):
    path, _snapshot, _entries = written
    seg, offset = divmod(entry_pos(50), SEGMENT_BYTES)
    flip(data_file(path, seg), offset + codec.HEADER_SIZE + 3)
    store = open_store(path, committed_index=40)
    try:
        assert state(store) == prefix_state(reference, 49)
        assert store.recovery.valid_data_after_cut  # damage, not a torn write
        assert len(names(path / "data")) == seg + 1
        assert store.recovery.truncated_bytes > 40 * ENTRY_BYTES
    finally:
        store.close()


@pytest.mark.parametrize("directory", ["data", "index"])
@pytest.mark.parametrize("delta", [1, -32])
def test_a_file_of_the_wrong_size_refuses_to_start(written, directory, delta):
    path, _snapshot, _entries = written
    victim = sorted((path / directory).iterdir())[3]
    os.truncate(victim, victim.stat().st_size + delta)
    with pytest.raises(StoreCorruption) as info:
        open_store(path)
    assert info.value.path == str(victim)


def test_a_store_opened_with_another_segment_size_refuses_to_start(written):
    path, _snapshot, _entries = written
    with pytest.raises(StoreCorruption):
        open_store(path, segment_size=2 * SEGMENT_BYTES)


def test_a_damaged_or_missing_index_is_rebuilt_from_the_data(written):
    path, snapshot, entries = written
    patch(path / "index" / f"{INDEX_SEGMENT_BYTES:020d}", 32 * (30 - 16), b"\x7f" * 32)
    (path / "index" / f"{5 * INDEX_SEGMENT_BYTES:020d}").unlink()
    store = open_store(path)
    try:
        assert state(store) == snapshot
        assert store.recovery.index_entries_rewritten == COUNT - 30
        assert [store.get(i) for i in range(COUNT)] == entries
        assert len(names(path / "index")) == 7
    finally:
        store.close()


def test_a_missing_front_segment_starts_the_log_at_the_first_entry_found(written):
    path, snapshot, entries = written
    data_file(path, 0).unlink()
    data_file(path, 1).unlink()
    store = open_store(path)
    try:
        assert store.recovery.derived_begin
        assert (store.begin_index, store.term_at(17)) == (18, -1)
        assert state(store)[1:] == snapshot[1:]
        assert store.get(18) == entries[18]
    finally:
        store.close()
    store = open_store(path)
    try:
        assert store.begin_index == 18 and not store.recovery.derived_begin
    finally:
        store.close()


# ------------------------------------------------------------------------------ fast start
def varied_fill(store, count: int, first_term: int, seed: int = 7) -> None:
    """`count` entries of assorted sizes and types in batches, the term jumping now and then."""
    rng = random.Random(seed)
    term, n = first_term, 0
    while n < count:
        if rng.random() < 0.15:
            term += rng.choice((1, 1, 2, 5))
        items = [
            (rng.choice((NORMAL, NORMAL, NORMAL, EntryType.NOOP)), body(n + k, rng.randint(0, 900)))
            for k in range(min(rng.randint(1, 4), count - n))
        ]
        store.append_leader(term, items)
        n += len(items)


def make_layout(path: Path, layout: str) -> None:
    store = open_store(path)
    try:
        if layout == "reset_mid_segment":  # DLedger's resetOffset: an unused segment prefix
            store.reset(1000, 3 * SEGMENT_BYTES + 560, 7)
        elif layout == "reset_first_entry_rolls":  # the first segment holds only a filler
            store.reset(10, SEGMENT_BYTES - 100, 1)
        varied_fill(store, 400, first_term=store.end_term + 1)
        if layout == "after_retention":
            assert store.delete_expired(150, 0, now_s=time.time() + 10) > 0
    finally:
        store.close()


def everything(store: FileLogStore) -> tuple:
    """All a reader can see of the store, plus the bookkeeping recovery set up."""
    indexes = range(store.begin_index, store.end_index + 1)
    return (
        state(store),
        store.term_at(store.begin_index - 1),
        [store.term_at(i) for i in indexes],
        [store.first_index_of_term(i) for i in indexes],
        [store.pos_at(i) for i in indexes],
        [store.get(i) for i in indexes],
        [store.read_encoded(i, 3000) for i in indexes],
        dict(store.synced_lengths),
        {s: seg.written_bytes for s, seg in store.data_segments.items()},
        (store.recovery.cut_pos, store.recovery.truncated_bytes, store.recovery.dropped_files),
        store.recovery.index_entries_rewritten,
    )


def open_with_full_scan(path: Path, **kwargs) -> FileLogStore:
    """Open the way recovery did before fast starts: checking every entry."""

    def refuse(*_args):
        raise NoFastStart("full scan for comparison")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(recovery, "plan_fast_start", refuse)
        store = open_store(path, **kwargs)
    assert store.recovery.trusted_entries == 0
    return store


@pytest.mark.parametrize(
    "layout", ["from_zero", "reset_mid_segment", "reset_first_entry_rolls", "after_retention"]
)
@pytest.mark.parametrize("committed", ["near_end", "middle", "none"])
def test_a_fast_start_recovers_what_a_full_scan_does(tmp_path, layout, committed):
    path = tmp_path / "s"
    make_layout(path, layout)
    full = open_with_full_scan(path)
    try:
        expected = everything(full)
        begin, end = full.begin_index, full.end_index
        assert full.recovery.verified_entries == end - begin + 1
    finally:
        full.close()
    committed_index = {"near_end": end - 3, "middle": (begin + end) // 2, "none": -1}[committed]
    store = open_store(path, committed_index=committed_index)
    try:
        assert everything(store) == expected
        report = store.recovery
        assert report.full_scan_reason is None
        assert report.trusted_entries + report.verified_entries == end - begin + 1
        start = begin + report.trusted_entries  # the first entry the scan checked
        if committed_index >= 0:  # the start of the segment holding the committed entry
            anchor = store.pos_at(committed_index)
            assert store.pos_at(start) == anchor - anchor % SEGMENT_BYTES
        else:  # DLedger's rule: the third-to-last data segment
            assert store.pos_at(start) == int(names(path / "data")[-3])
        assert store.pos_at(start - 1) < store.pos_at(start) - store.pos_at(start) % SEGMENT_BYTES
        # the trusted prefix spans several segments and several term changes
        assert report.trusted_entries > 50
        assert len({store.term_at(i) for i in range(begin, start)}) >= 4
        # and the log goes on where it ended
        store.append_leader(store.end_term + 1, [(NORMAL, b"after")])
        assert store.get(store.end_index).body == b"after"
    finally:
        store.close()


def test_damage_in_the_trusted_prefix_is_not_found_at_startup(written):
    """The trade-off: with committed index 95, entries 0..89 (segments 0..9) are trusted."""
    path, snapshot, entries = written
    seg, offset = divmod(entry_pos(5), SEGMENT_BYTES)
    flip(data_file(path, seg), offset + codec.HEADER_SIZE + 3)
    store = open_store(path, committed_index=95)
    try:
        assert state(store) == snapshot
        report = store.recovery
        assert (report.trusted_entries, report.verified_entries) == (90, 10)
        assert report.cut_pos is None and report.full_scan_reason is None
        # reads do not check bodyCrc either: the damaged body comes back as stored
        damaged = store.get(5)
        assert damaged.body != entries[5].body and damaged.chain_crc == entries[5].chain_crc
        # a follower checks what it receives and refuses it
        follower = MemoryLogStore(SEGMENT_BYTES)
        follower.append_encoded(store.read_encoded(0, 5 * ENTRY_BYTES)[0])
        with pytest.raises(codec.CorruptEntry, match="bodyCrc"):
            follower.append_encoded(store.read_encoded(5, ENTRY_BYTES)[0])
    finally:
        store.close()


def test_the_same_damage_after_the_starting_point_is_found_as_before(written, reference):
    path, _snapshot, _entries = written
    seg, offset = divmod(entry_pos(93), SEGMENT_BYTES)
    flip(data_file(path, seg), offset + codec.HEADER_SIZE + 3)
    with pytest.raises(StoreCorruption) as info:  # segment 10 (90..98) is checked
        open_store(path, committed_index=95)
    assert (info.value.path, info.value.offset) == (str(data_file(path, seg)), offset)
    assert len(names(path / "data")) == 12
    store = open_store(path)  # no checkpoint: from segment 9 (81..), the damage is cut
    try:
        assert state(store) == prefix_state(reference, 92)
        assert "bodyCrc" in store.recovery.reason
        assert (store.recovery.trusted_entries, store.recovery.verified_entries) == (81, 12)
    finally:
        store.close()


def index_file(path: Path, index: int) -> Path:
    return path / "index" / f"{32 * index // INDEX_SEGMENT_BYTES * INDEX_SEGMENT_BYTES:020d}"


def patch_index(path: Path, index: int, **fields) -> None:
    """Rewrite fields (magic, pos, size, index, term) of one index entry."""
    where = 32 * index % INDEX_SEGMENT_BYTES
    old = codec.INDEX_ENTRY.unpack(read(index_file(path, index), where, 32))
    new = dict(zip(("magic", "pos", "size", "index", "term"), old, strict=True)) | fields
    patch(index_file(path, index), where, codec.INDEX_ENTRY.pack(*new.values()))


@pytest.mark.parametrize(
    ("damage", "rewritten"),
    [
        ("no_index_file_for_the_committed_entry", 20),  # entries 80..95 lose their file
        ("committed_entry_indexed_elsewhere", 5),
        ("entry_before_the_start_misindexed", 11),
        ("entry_before_the_start_not_indexed", 11),
        ("no_index_at_all", COUNT),
    ],
)
def test_a_bad_index_at_the_starting_point_falls_back_to_a_full_scan(written, damage, rewritten):
    # committed index 95: the fast start would check from 90 (segment 10), seeded by 89
    path, snapshot, entries = written
    if damage == "no_index_file_for_the_committed_entry":
        index_file(path, 95).unlink()
    elif damage == "committed_entry_indexed_elsewhere":
        patch_index(path, 95, pos=entry_pos(40))
    elif damage == "entry_before_the_start_misindexed":
        patch_index(path, 89, term=2)
    elif damage == "entry_before_the_start_not_indexed":
        patch(index_file(path, 89), 32 * 89 % INDEX_SEGMENT_BYTES, bytes(32))
    else:
        for p in (path / "index").iterdir():
            p.unlink()
    store = open_store(path, committed_index=95)
    try:
        report = store.recovery
        assert report.full_scan_reason is not None
        assert (report.trusted_entries, report.verified_entries) == (0, COUNT)
        assert state(store) == snapshot
        assert report.index_entries_rewritten == rewritten
        assert [store.get(i) for i in range(COUNT)] == entries
        assert [store.term_at(i) for i in range(COUNT)] == [term_of(n) for n in range(COUNT)]
    finally:
        store.close()
    store = open_store(path, committed_index=95)  # repaired: the next start is fast again
    try:
        assert store.recovery.full_scan_reason is None
        assert store.recovery.verified_entries == 10
    finally:
        store.close()


def test_a_seed_whose_chain_does_not_continue_falls_back_and_finds_the_damage(written):
    # entry 89's chainCrc field is flipped: its bodyCrc and index entry still check
    # out, so the fast start seeds with it, and entry 90 fails to chain onto it
    path, _snapshot, _entries = written
    seg, offset = divmod(entry_pos(89), SEGMENT_BYTES)
    flip(data_file(path, seg), offset + codec.CHAIN_OFFSET + 1)
    with pytest.raises(StoreCorruption) as info:
        open_store(path, committed_index=95)
    assert (info.value.path, info.value.offset) == (str(data_file(path, seg)), offset)
    assert "chainCrc mismatch at index 89" in info.value.reason


def test_a_missing_filler_in_the_trusted_prefix_falls_back_to_a_full_scan(written):
    # a zeroed filler reads as the end of the data to a full scan, as before
    path, _snapshot, _entries = written
    patch(data_file(path, 3), PER_SEGMENT * ENTRY_BYTES, bytes(8))
    with pytest.raises(StoreCorruption) as info:
        open_store(path, committed_index=95)
    assert "the log would end at 35" in str(info.value)


# ------------------------------------------------------------------------------ truncation
@pytest.mark.parametrize(
    "cut",
    [
        50,  # the middle of a segment
        45,  # the first entry of a segment: the end moves back before a filler
        99,  # the last entry
        100,  # just after the end: nothing to drop
        0,  # everything
    ],
)
def test_truncate_then_reopen(written, reference, cut):
    path, _snapshot, entries = written
    store = open_store(path)
    store.truncate(cut)
    expected = prefix_state(reference, cut - 1)
    assert state(store) == expected
    end_segment = store.end_pos // SEGMENT_BYTES
    assert len(names(path / "data")) == (end_segment + 1 if cut else 1)
    index_files = -(-32 * cut // INDEX_SEGMENT_BYTES)
    assert len(names(path / "index")) == index_files
    # the dropped bytes are zero on disk, so no later recovery brings them back
    tail = data_file(path, end_segment)
    if cut < COUNT:
        assert read(tail, store.end_pos % SEGMENT_BYTES, 1024) == bytes(1024)
    store.close()
    store = open_store(path)
    try:
        assert state(store) == expected
        assert store.recovery.cut_pos is None
        assert [store.get(i) for i in range(cut)] == entries[:cut]
        store.append_leader(9, [(NORMAL, b"after")])
        reference.append_leader(9, [(NORMAL, b"after")])
        assert state(store) == state(reference)
    finally:
        store.close()


def test_the_store_asserts_that_nothing_committed_is_truncated(written):
    """The index the opener vouched for as committed is a floor for truncation: cutting
    at or below it would drop an entry a quorum may rely on, a bug in the caller."""
    path, _snapshot, _entries = written
    store = open_store(path, committed_index=80)
    try:
        with pytest.raises(AssertionError, match="committed index 80"):
            store.truncate(80)
        store.truncate(81)
        assert store.end_index == 80
    finally:
        store.close()


def test_entries_appended_after_a_truncation_do_not_resurrect_old_ones(written, reference):
    path, _snapshot, _entries = written
    store = open_store(path)
    store.truncate(50)
    store.append_leader(9, [(NORMAL, body(50))])  # same size and place as the old entry 50
    expected = state(store)
    store.close()
    store = open_store(path)
    try:
        assert state(store) == expected  # not the old 51..99, whose bytes are gone
    finally:
        store.close()


# ------------------------------------------------------------------------------ reset
def test_reset_then_reopen(tmp_path):
    path = tmp_path / "s"
    store = open_store(path)
    fill(store, 30)
    begin_pos = 3 * SEGMENT_BYTES + 560  # DLedger's resetOffset case: a blank prefix
    store.reset(200, begin_pos, 7)
    assert names(path / "data") == [] and names(path / "index") == []
    store.close()
    store = open_store(path)
    assert state(store) == (200, 199, 7, begin_pos, 0)
    assert store.term_at(199) == 7
    placed = store.append_leader(8, [(NORMAL, body(n, 500)) for n in range(25)])
    assert placed[0] == (200, begin_pos)
    expected, entries = state(store), [store.get(i) for i in range(200, 225)]
    store.close()
    assert names(path / "data")[0] == f"{3 * SEGMENT_BYTES:020d}"
    store = open_store(path)
    try:
        assert state(store) == expected
        assert [store.get(i) for i in range(200, 225)] == entries
        assert store.term_at(199) == 7
    finally:
        store.close()


def test_after_reset_and_reopen_the_first_chain_is_still_trusted(tmp_path, reference):
    store = open_store(tmp_path / "s")
    store.reset(10, reference.pos_at(10), reference.term_at(9))
    store.close()
    store = open_store(tmp_path / "s")
    try:
        store.append_encoded(reference.read_encoded(10, 50_000)[0])
        assert store.end_chain == reference.get(store.end_index).chain_crc
    finally:
        store.close()


def test_reset_where_the_first_entry_rolls_then_reopen(tmp_path):
    store = open_store(tmp_path / "s")
    store.reset(10, SEGMENT_BYTES - 100, 1)
    assert store.append_leader(1, [(NORMAL, body(0))]) == [(10, SEGMENT_BYTES)]
    expected = state(store)
    store.close()
    store = open_store(tmp_path / "s")
    try:
        assert state(store) == expected
    finally:
        store.close()


# ------------------------------------------------------------------------------ retention
def age(path: Path, seconds: float) -> None:
    when = time.time() - seconds
    for p in (path / "data").iterdir():
        os.utime(p, (when, when))


def test_retention_deletes_old_segments_below_the_kept_index(written):
    path, snapshot, entries = written
    age(path, 7200)
    store = open_store(path)
    try:
        # segments 0..3 hold 0..35; segment 4 holds 36..44, which includes 40
        assert store.delete_expired(keep_from_index=40, older_than_s=3600) == 4
        assert names(path / "data")[0] == f"{4 * SEGMENT_BYTES:020d}"
        assert (store.begin_index, store.term_at(35)) == (36, term_of(35))
        assert state(store)[1:] == snapshot[1:]
        with pytest.raises(IndexError):
            store.get(35)
        assert store.first_index_of_term(40) == 36
        # index files wholly below entry 36 (entries 0..31) are gone
        assert names(path / "index")[0] == f"{2 * INDEX_SEGMENT_BYTES:020d}"
        assert store.delete_expired(keep_from_index=40, older_than_s=3600) == 0
    finally:
        store.close()
    store = open_store(path)
    try:
        assert (store.begin_index, store.term_at(35)) == (36, term_of(35))
        assert state(store)[1:] == snapshot[1:]
        assert [store.get(i) for i in range(36, COUNT)] == entries[36:]
    finally:
        store.close()


def test_retention_keeps_young_files_and_the_last_segment(written):
    path, snapshot, _entries = written
    store = open_store(path)
    try:
        assert store.delete_expired(keep_from_index=COUNT, older_than_s=3600) == 0
        assert store.delete_expired(COUNT, 3600, now_s=time.time() + 7200) == 11
        assert names(path / "data") == [f"{11 * SEGMENT_BYTES:020d}"]
        assert store.begin_index == 99 and state(store)[1:] == snapshot[1:]
        store.append_leader(4, [(NORMAL, body(100))])
        assert store.get(100).body == body(100)
    finally:
        store.close()


def test_retention_interrupted_before_the_deletions_is_finished_by_recovery(written):
    path, snapshot, _entries = written
    saved = path.parent / "saved"
    shutil.copytree(path / "data", saved)
    store = open_store(path)
    assert store.delete_expired(20, 0, now_s=time.time() + 10) == 2
    store.close()
    for name in names(saved)[:2]:  # as if the crash came before the unlinks
        shutil.copy(saved / name, path / "data" / name)
    store = open_store(path)
    try:
        assert store.begin_index == 18 and state(store)[1:] == snapshot[1:]
        assert len(store.recovery.dropped_files) == 2
        assert names(path / "data")[0] == f"{2 * SEGMENT_BYTES:020d}"
    finally:
        store.close()


# ------------------------------------------------------------------------------ durability
def test_synced_lengths_follow_completed_plans(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        assert store.synced_lengths == {}
        fill(store, 20)  # segments 0 and 1 full, segment 2 holds 18 and 19
        plan = store.sync_plan()
        assert store.synced_lengths == {}  # nothing vouched for until the fsyncs return
        plan.run()
        full = PER_SEGMENT * ENTRY_BYTES + 8
        assert store.synced_lengths == {
            str(data_file(tmp_path / "s", 0)): full,
            str(data_file(tmp_path / "s", 1)): full,
            str(data_file(tmp_path / "s", 2)): 2 * ENTRY_BYTES,
        }
        fill(store, 1, start=20)
        plan = store.sync_plan()
        assert plan.end_index == 20
        plan.run()
        assert store.synced_lengths[str(data_file(tmp_path / "s", 2))] == 3 * ENTRY_BYTES
    finally:
        store.close()


def test_a_plan_taken_before_a_truncation_vouches_only_for_what_remains(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        fill(store, 25)  # segment 2 holds 18..24
        plan = store.sync_plan()
        store.truncate(20)
        store.truncate(11)  # drops segment 2 entirely
        plan.run()
        assert store.synced_lengths == {
            str(data_file(tmp_path / "s", 0)): PER_SEGMENT * ENTRY_BYTES + 8,
            str(data_file(tmp_path / "s", 1)): 2 * ENTRY_BYTES,
        }
    finally:
        store.close()


def test_a_dropped_plan_leaves_its_work_to_the_next(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        fill(store, 3)
        plan = store.sync_plan()
        del plan  # never run
        plan = store.sync_plan()
        plan.run()
        assert store.synced_lengths == {str(data_file(tmp_path / "s", 0)): 3 * ENTRY_BYTES}
    finally:
        store.close()


def test_a_plan_runs_in_a_thread_while_the_owner_appends(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        done = []
        for _round in range(20):
            store.append_leader(1, [(NORMAL, body(n)) for n in range(3)])
            plan = store.sync_plan()
            worker = threading.Thread(target=lambda p=plan: done.append(p.run()))
            worker.start()
            for n in range(2):  # appends (and segment rolls) meanwhile
                store.append_leader(1, [(NORMAL, body(n))])
            worker.join()
        assert len(done) == 20
        store.sync_plan().run()
        synced = dict(store.synced_lengths)
        expected = state(store)
    finally:
        store.close()
    store = open_store(tmp_path / "s")
    try:  # every byte in use was vouched for, no more
        assert state(store) == expected
        assert store.synced_lengths == synced
        assert len(synced) == 100 * ENTRY_BYTES // (PER_SEGMENT * ENTRY_BYTES) + 1
    finally:
        store.close()


def test_recovery_starts_from_synced_lengths_of_what_is_on_disk(written):
    path, _snapshot, _entries = written
    store = open_store(path)
    try:
        assert store.synced_lengths[str(data_file(path, 11))] == ENTRY_BYTES
        assert store.synced_lengths[str(data_file(path, 0))] == PER_SEGMENT * ENTRY_BYTES + 8
        assert store.sync_plan().end_index == 99
    finally:
        store.close()


def test_a_plans_fsyncs_run_at_once_and_all_finish_before_it_returns():
    """Data and index fsyncs overlap; a failing one is raised only after every other
    has finished, so no handle is closed under a running fsync."""
    started = threading.Barrier(3, timeout=5)
    finished = []

    class Handle:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def sync(self):
            started.wait()  # all three are inside sync at once, or this times out
            time.sleep(0.01)
            finished.append(self.name)
            if self.fail:
                raise OSError(5, "EIO")

    sync_concurrently([Handle("a"), Handle("b"), Handle("c")])
    assert sorted(finished) == ["a", "b", "c"]
    finished.clear()
    with pytest.raises(OSError):
        sync_concurrently([Handle("a"), Handle("b", fail=True), Handle("c")])
    assert sorted(finished) == ["a", "b", "c"]
