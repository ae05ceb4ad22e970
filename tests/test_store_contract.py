"""The LogStore contract, run against the memory store and the file store alike.

The simulator uses MemoryLogStore, or FileLogStore on its simulated disk, and real
nodes use FileLogStore on the operating system's, so any difference between them
visible through the interface (positions, chains, what a rejected append leaves
behind) would make the simulation lie.
"""

from __future__ import annotations

import itertools

import pytest
from raftmq.dledger.codes import EntryType
from raftmq.dledger.sim.disk import SimFileSystem
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.base import InconsistentAppend, LogStore
from raftmq.dledger.store.file import FileLogStore
from raftmq.dledger.store.memory import MemoryLogStore

SEGMENT_BYTES = 1024
INDEX_SEGMENT_BYTES = 32 * 16
KINDS = ("memory", "file", "simulated-file")
NORMAL = EntryType.NORMAL


@pytest.fixture
def make(tmp_path):
    """make(kind) -> a fresh store; each file store gets its own directory."""
    stores: list[LogStore] = []
    counter = itertools.count()

    def factory(kind: str) -> LogStore:
        if kind == "memory":
            store: LogStore = MemoryLogStore(SEGMENT_BYTES)
        else:
            store = FileLogStore(
                tmp_path / f"store{next(counter)}",
                segment_size=SEGMENT_BYTES,
                index_segment_size=INDEX_SEGMENT_BYTES,
                fs=SimFileSystem() if kind == "simulated-file" else None,
            )
        stores.append(store)
        return store

    yield factory
    for store in stores:
        store.close()


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


def body(n: int, size: int) -> bytes:
    return bytes((n * 7 + k) % 251 + 1 for k in range(size))


def fill(store: LogStore, terms_and_sizes: list[tuple[int, int]]) -> None:
    """Append one entry per (term, body size), as a leader would across term changes."""
    for n, (term, size) in enumerate(terms_and_sizes):
        store.append_leader(term, [(NORMAL, body(n, size))])


def replicate(leader: LogStore, follower: LogStore, max_bytes: int = 700) -> None:
    while follower.end_index < leader.end_index:
        blob, count = leader.read_encoded(follower.end_index + 1, max_bytes)
        assert count >= 1
        assert follower.append_encoded(blob) == count


def state(store: LogStore) -> tuple:
    return (store.begin_index, store.end_index, store.end_term, store.end_pos, store.end_chain)


def entries(store: LogStore) -> list[codec.Entry]:
    return [store.get(i) for i in range(store.begin_index, store.end_index + 1)]


# 27 entries over several terms and segments (terms never decrease along a log)
_ROUND = [(1, 10), (1, 300), (1, 500), (2, 0), (2, 900), (2, 40), (3, 600), (3, 600), (5, 100)]
MIXED = [(term + 5 * k, size) for k in range(3) for term, size in _ROUND]


# ------------------------------------------------------------------------------ positions
def test_batch_positions_are_48_per_entry_plus_the_bodies_before(make, kind):
    store = make(kind)
    sizes = [10, 20, 30, 40, 50]
    placed = store.append_leader(1, [(NORMAL, body(n, s)) for n, s in enumerate(sizes)])
    expected = [sum(48 + s for s in sizes[:i]) for i in range(len(sizes))]
    assert placed == list(enumerate(expected))
    assert [store.get(i).pos for i in range(5)] == expected
    assert store.end_pos == 48 * 5 + sum(sizes)
    assert (store.end_index, store.end_term) == (4, 1)


def test_an_entry_that_does_not_fit_rolls_to_the_next_segment(make, kind):
    store = make(kind)
    # 348-byte entries: two fit (696 + 348 + 8 > 1024), the third starts at 1024
    placed = store.append_leader(1, [(NORMAL, body(n, 300)) for n in range(4)])
    assert placed == [(0, 0), (1, 348), (2, 1024), (3, 1372)]
    # an entry leaving exactly the 8 bytes a filler needs still fits
    end = store.end_pos
    room = SEGMENT_BYTES - end % SEGMENT_BYTES
    placed = store.append_leader(1, [(NORMAL, body(9, room - 8 - 48))])
    assert placed == [(4, end)]
    placed = store.append_leader(1, [(NORMAL, b"")])
    assert placed == [(5, 2048)]
    assert store.get(4).body == body(9, room - 8 - 48)


def test_an_entry_larger_than_a_segment_is_refused(make, kind):
    store = make(kind)
    with pytest.raises(ValueError):
        store.append_leader(1, [(NORMAL, bytes(SEGMENT_BYTES - 48 - 7))])
    assert store.empty and store.end_index == -1


def test_entries_read_back_as_written(make, kind):
    store = make(kind)
    fill(store, MIXED)
    for n, (term, size) in enumerate(MIXED):
        e = store.get(n)
        assert (e.index, e.term, e.type, e.body) == (n, term, NORMAL, body(n, size))
        assert store.term_at(n) == term
    store.append_leader(15, [(EntryType.NOOP, b"")])
    assert store.get(store.end_index).type == EntryType.NOOP
    with pytest.raises(IndexError):
        store.get(store.end_index + 1)
    with pytest.raises(IndexError):
        store.term_at(store.end_index + 1)


def test_read_encoded_returns_at_least_one_entry_and_respects_max_bytes(make, kind):
    store = make(kind)
    store.append_leader(1, [(NORMAL, body(n, 52)) for n in range(6)])  # 100 bytes each
    blob, count = store.read_encoded(0, 10)
    assert count == 1 and len(blob) == 100
    blob, count = store.read_encoded(1, 350)
    assert count == 3 and len(blob) == 300
    assert [e[3] for e in codec.iter_entries(blob)] == [1, 2, 3]


# ------------------------------------------------------------------------------ replication
@pytest.mark.parametrize(("leader_kind", "follower_kind"), list(itertools.product(KINDS, KINDS)))
def test_replication_reproduces_the_leaders_log(make, leader_kind, follower_kind):
    leader, follower = make(leader_kind), make(follower_kind)
    fill(leader, MIXED)
    replicate(leader, follower)
    assert state(follower) == state(leader)
    assert entries(follower) == entries(leader)
    assert [follower.term_at(i) for i in range(len(MIXED))] == [t for t, _ in MIXED]
    # and it keeps following
    leader.append_leader(16, [(NORMAL, body(n, 333)) for n in range(5)])
    replicate(leader, follower, max_bytes=10_000)
    assert state(follower) == state(leader)


def test_memory_and_file_leaders_agree_byte_for_byte(make):
    mem, disk = make("memory"), make("file")
    fill(mem, MIXED)
    fill(disk, MIXED)
    assert state(mem) == state(disk)
    for i in range(len(MIXED)):
        assert mem.read_encoded(i, 1)[0] == disk.read_encoded(i, 1)[0]


def rejected(store: LogStore, blob: bytes, error: type[Exception]) -> None:
    before = state(store)
    with pytest.raises(error):
        store.append_encoded(blob)
    assert state(store) == before


def test_append_encoded_rejects_a_wrong_index_without_writing(make, kind):
    leader, follower = make("memory"), make(kind)
    fill(leader, MIXED[:4])
    replicate(leader, follower)
    rejected(follower, leader.read_encoded(3, 1000)[0], InconsistentAppend)  # a resend of 3
    leader.append_leader(2, [(NORMAL, b"a"), (NORMAL, b"b")])
    rejected(follower, leader.read_encoded(5, 1000)[0], InconsistentAppend)  # a gap
    replicate(leader, follower)
    assert state(follower) == state(leader)


def test_append_encoded_rejects_a_wrong_pos(make, kind):
    leader, follower = make("memory"), make(kind)
    fill(leader, MIXED[:3])
    replicate(leader, follower)
    leader.append_leader(1, [(NORMAL, b"x" * 20)])
    blob = bytearray(leader.read_encoded(3, 1000)[0])
    blob[codec.POS_OFFSET : codec.POS_OFFSET + 8] = (follower.end_pos + 16).to_bytes(8, "big")
    rejected(follower, bytes(blob), InconsistentAppend)


def test_append_encoded_rejects_a_chain_that_does_not_continue_ours(make, kind):
    leader, follower = make("memory"), make(kind)
    leader.append_leader(1, [(NORMAL, b"leader's entry 0")])
    follower.append_leader(1, [(NORMAL, b"another entry 0!")])  # same size, same pos
    leader.append_leader(1, [(NORMAL, b"entry 1")])
    rejected(follower, leader.read_encoded(1, 1000)[0], codec.CorruptEntry)


def test_append_encoded_rejects_a_damaged_body_and_writes_nothing_of_the_batch(make, kind):
    leader, follower = make("memory"), make(kind)
    fill(leader, MIXED[:6])
    blob = bytearray(leader.read_encoded(0, 100_000)[0])
    offsets = [e[0] for e in codec.iter_entries(blob)]
    blob[offsets[2] + codec.HEADER_SIZE] ^= 0x40  # third entry's first body byte
    rejected(follower, bytes(blob), codec.CorruptEntry)
    assert follower.empty
    rejected(follower, bytes(blob[: offsets[1] + 20]), codec.CorruptEntry)  # torn in transit
    replicate(leader, follower)
    assert state(follower) == state(leader)
    assert entries(follower) == entries(leader)


def test_append_encoded_rejects_a_damaged_size_field_as_corrupt(make, kind):
    leader, follower = make("memory"), make(kind)
    leader.append_leader(1, [(NORMAL, b"x" * 100)])
    blob = bytearray(leader.read_encoded(0, 1000)[0])
    blob[4:8] = (SEGMENT_BYTES * 4).to_bytes(4, "big")
    rejected(follower, bytes(blob), codec.CorruptEntry)


def test_append_encoded_rejects_a_term_going_backwards(make, kind):
    leader, follower = make("memory"), make(kind)
    leader.append_leader(3, [(NORMAL, b"x")])
    replicate(leader, follower)
    other = make("memory")
    other.append_leader(3, [(NORMAL, b"x")])
    other.append_leader(2, [(NORMAL, b"y")])  # no store checks this on a memory leader
    rejected(follower, other.read_encoded(1, 100)[0], InconsistentAppend)


# ------------------------------------------------------------------------------ truncation
@pytest.mark.parametrize("cut", [0, 1, 5, 6, 13, 26, 27])
def test_truncate_then_append_matches_a_log_that_never_had_the_tail(make, kind, cut):
    store, reference = make(kind), make(kind)
    fill(store, MIXED)
    fill(reference, MIXED[:cut])
    generation = store.generation
    store.truncate(cut)
    assert store.generation > generation
    assert state(store) == state(reference)
    assert store.term_at(cut - 1) == reference.term_at(cut - 1)
    tail = [(NORMAL, body(n, 60 * n)) for n in range(1, 9)]
    assert store.append_leader(17, tail) == reference.append_leader(17, tail)
    assert state(store) == state(reference)
    assert entries(store) == entries(reference)


def test_truncate_where_the_next_entry_rolled_puts_the_end_before_the_filler(make, kind):
    store = make(kind)
    store.append_leader(1, [(NORMAL, body(n, 300)) for n in range(3)])  # entry 2 rolled to 1024
    store.truncate(2)
    assert store.end_pos == 696
    assert store.append_leader(2, [(NORMAL, b"small")]) == [(2, 696)]


def test_truncate_beyond_the_end_only_bumps_the_generation(make, kind):
    store = make(kind)
    fill(store, MIXED[:4])
    before, generation = state(store), store.generation
    store.truncate(store.end_index + 1)
    assert state(store) == before and store.generation == generation + 1
    with pytest.raises(IndexError):
        store.truncate(store.begin_index - 1)


def test_a_follower_truncates_and_takes_the_new_leaders_entries(make, kind):
    old, new, follower = make("memory"), make("memory"), make(kind)
    fill(old, MIXED[:8])
    replicate(old, follower)
    fill(new, MIXED[:5])
    new.append_leader(6, [(NORMAL, body(n, 77)) for n in range(6)])
    follower.truncate(5)
    replicate(new, follower)
    assert state(follower) == state(new)
    assert entries(follower) == entries(new)


# ------------------------------------------------------------------------------ reset
def test_reset_starts_an_empty_log_at_the_given_index_and_pos(make, kind):
    store = make(kind)
    fill(store, MIXED[:5])
    generation = store.generation
    store.reset(50, 4500, 3)
    assert store.generation > generation
    assert store.empty
    assert state(store) == (50, 49, 3, 4500, 0)
    assert store.term_at(49) == 3
    with pytest.raises(IndexError):
        store.get(49)
    assert store.append_leader(4, [(NORMAL, b"x" * 100)]) == [(50, 4500)]
    assert store.get(50).body == b"x" * 100 and store.term_at(50) == 4


def test_after_reset_near_a_segment_end_the_first_entry_rolls(make, kind):
    store = make(kind)
    store.reset(7, 3 * SEGMENT_BYTES - 100, 2)
    assert store.append_leader(2, [(NORMAL, b"x" * 60), (NORMAL, b"y")]) == [
        (7, 3 * SEGMENT_BYTES),
        (8, 3 * SEGMENT_BYTES + 108),
    ]


def test_after_reset_the_first_chain_is_trusted_then_checked(make, kind):
    leader, follower = make("memory"), make(kind)
    fill(leader, MIXED)
    pos = leader.get(10).pos
    leader_after = make("memory")  # a leader whose log begins at 10 (retention)
    leader_after.reset(10, pos, leader.term_at(9))
    leader_after.append_encoded(leader.read_encoded(10, 100_000)[0])
    follower.append_leader(1, [(NORMAL, b"stale")])
    follower.reset(10, pos, leader.term_at(9))
    replicate(leader_after, follower)
    assert state(follower)[1:] == state(leader)[1:]
    assert entries(follower) == entries(leader)[10:]
    # a damaged chain after the first entry is still caught
    other = make(kind)
    other.reset(10, pos, leader.term_at(9))
    blob = bytearray(leader.read_encoded(10, 100_000)[0])
    second = [e[0] for e in codec.iter_entries(blob)][1]
    blob[second + codec.CHAIN_OFFSET] ^= 1
    rejected(other, bytes(blob), codec.CorruptEntry)


def test_reset_refuses_a_first_entry_with_an_older_term(make, kind):
    leader, follower = make("memory"), make(kind)
    leader.reset(10, 2048, 1)
    leader.append_leader(1, [(NORMAL, b"x")])
    follower.reset(10, 2048, 2)
    rejected(follower, leader.read_encoded(10, 100)[0], InconsistentAppend)


def test_truncate_to_the_beginning_after_reset(make, kind):
    store = make(kind)
    store.reset(20, 3000, 2)
    store.append_leader(3, [(NORMAL, body(n, 400)) for n in range(4)])
    store.truncate(20)
    assert state(store) == (20, 19, 2, 3000, 0)
    assert store.append_leader(4, [(NORMAL, b"again")]) == [(20, 3000)]


# ------------------------------------------------------------------------------ terms
def test_first_index_of_term(make, kind):
    store = make(kind)
    for term, count in [(1, 2), (2, 3), (5, 1), (6, 4)]:
        store.append_leader(term, [(NORMAL, b"e")] * count)
    expected = [0, 0, 2, 2, 2, 5, 6, 6, 6, 6]
    assert [store.first_index_of_term(i) for i in range(10)] == expected
    store.truncate(8)
    store.append_leader(7, [(NORMAL, b"f")])
    assert [store.first_index_of_term(i) for i in range(6, 9)] == [6, 6, 8]


def test_first_index_of_term_stops_at_the_beginning(make, kind):
    store = make(kind)
    store.reset(50, 0, 4)
    store.append_leader(4, [(NORMAL, b"e")] * 3)
    assert store.first_index_of_term(52) == 50
    assert store.term_at(49) == 4


def test_term_before_the_log(make, kind):
    store = make(kind)
    assert store.term_at(-1) == -1
    assert (store.end_index, store.end_term) == (-1, -1)
    with pytest.raises(IndexError):
        store.term_at(0)
    store.append_leader(2, [(NORMAL, b"x")])
    assert store.term_at(-1) == -1 and store.term_at(0) == 2


# ------------------------------------------------------------------------------ sync plans
def test_sync_plan_reports_the_end_and_generation_it_covers(make, kind):
    store = make(kind)
    fill(store, MIXED[:5])
    plan = store.sync_plan()
    assert (plan.end_index, plan.generation) == (4, store.generation)
    store.append_leader(3, [(NORMAL, b"later")])  # written after the plan was taken
    plan.run()
    store.truncate(2)
    assert store.sync_plan().generation == store.generation != plan.generation
    store.sync_plan().run()  # nothing dirty is fine too
    store.sync_plan().run()
