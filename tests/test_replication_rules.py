"""DLedger's AppendAndPushTest, CommitIndexTest and BatchPushTest, ported.

Cluster scenarios run on the deterministic simulator (§8.1's list); the rules of §3
that need exact control of what is delivered and when an fsync completes (the
own-term commit rule of §3.5, ack-after-persist, TRUNCATE by term runs, positions)
drive `Replica`s directly.
"""

import random

import attrs
from raftmq.dledger.codes import Code, EntryType, PushType, Role
from raftmq.dledger.config import PAGE_CACHE
from raftmq.dledger.core.messages import (
    HeartBeatRequest,
    PushRequest,
    PushResponse,
    VoteRequest,
    VoteResponse,
)
from raftmq.dledger.core.replica import Replica
from raftmq.dledger.sim.cluster import NetworkConditions, SimCluster
from raftmq.dledger.store import entry as codec
from raftmq.dledger.store.memory import MemoryLogStore

from tests.helpers import GROUP, make_replica

HB = 100.0


def filled_store(terms, segment_size=1 << 30, prefix="e") -> MemoryLogStore:
    store = MemoryLogStore(segment_size)
    for n, t in enumerate(terms):
        store.append_leader(t, [(EntryType.NORMAL, f"{prefix}{n}".encode())])
    store.sync_plan().run()  # all of it durable
    return store


def append_many(cluster, count, node_id=None, gap_ms=2.0):
    handles = []
    for _ in range(count):
        handles.append(cluster.client_append(node_id))
        cluster.run_until(cluster.now_ms + gap_ms)
    return handles


def outcomes(cluster, handles):
    return [cluster.checker.outcomes.get(h) for h in handles]


def indexes(cluster, handles):
    return [cluster.checker.acked[h][0] for h in handles]


# ---------------------------------------------------------------- AppendAndPushTest (§8.1)


def test_commit_index_propagates_to_a_follower_that_joins_late():
    cluster = SimCluster(3, random.Random(0))
    cluster.crash("n2")
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    handles = append_many(cluster, 10)
    cluster.run_until(cluster.now_ms + 20)
    assert outcomes(cluster, handles) == [Code.SUCCESS] * 10
    assert cluster.nodes["n2"].store.end_index == -1
    cluster.restart("n2")
    cluster.run_until(cluster.now_ms + 5 * HB)
    late = cluster.nodes["n2"]  # a restart boots a new node object
    assert late.replica.role is Role.FOLLOWER
    assert late.store.end_index == leader.store.end_index
    assert late.replica.committed_index == leader.replica.committed_index
    assert late.replica.committed_index >= max(indexes(cluster, handles))
    assert late.store.end_chain == leader.store.end_chain


def test_one_follower_offline_appends_still_commit_with_two_of_three():
    cluster = SimCluster(3, random.Random(1))
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    cluster.crash(next(n for n in cluster.ids if n != leader.id))
    handles = append_many(cluster, 10)
    cluster.run_until(cluster.now_ms + 20)
    assert outcomes(cluster, handles) == [Code.SUCCESS] * 10
    got = indexes(cluster, handles)
    assert got == list(range(got[0], got[0] + 10))
    assert cluster.leader() is leader


def test_both_followers_offline_appends_time_out_then_pending_full():
    """502 WAIT_QUORUM_ACK_TIMEOUT, then 503 LEADER_PENDING_FULL (maxPendingRequestsNum)."""
    cluster = SimCluster(
        3,
        random.Random(2),
        config_overrides={"max_pending_requests": 3, "max_wait_ack_time_ms": 150},
    )
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    for node_id in cluster.ids:
        if node_id != leader.id:
            cluster.crash(node_id)
    first = append_many(cluster, 3, gap_ms=1.0)
    assert outcomes(cluster, first) == [None] * 3  # waiting for a quorum
    end_before = leader.store.end_index
    cluster.run_until(cluster.now_ms + 150)
    assert outcomes(cluster, first) == [Code.WAIT_QUORUM_ACK_TIMEOUT] * 3
    assert leader.store.end_index == end_before  # a timed-out entry stays in the log
    assert leader.replica.role is Role.LEADER  # the lease (3 beats) has not run out
    second = append_many(cluster, 4, gap_ms=0.0)
    assert outcomes(cluster, second) == [None, None, None, Code.LEADER_PENDING_FULL]


def test_follower_down_then_up_pending_append_completes_after_it_returns():
    cluster = SimCluster(3, random.Random(3))
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    followers = [n for n in cluster.ids if n != leader.id]
    for node_id in followers:
        cluster.crash(node_id)
    [h] = append_many(cluster, 1)
    cluster.run_until(cluster.now_ms + 50)
    assert cluster.checker.outcomes.get(h) is None
    cluster.restart(followers[0])
    cluster.run_until(cluster.now_ms + 2 * HB)
    assert cluster.checker.outcomes[h] is Code.SUCCESS
    assert cluster.leader() is leader
    index = cluster.checker.acked[h][0]
    assert cluster.nodes[followers[0]].store.end_index >= index


def test_dropped_pushes_still_all_appends_succeed_with_consecutive_indexes():
    """Every message is lost with probability 0.3; resends fill the gaps.

    maxPushTimeOutMs is lowered from its 1000 ms default to a few beats: with the
    default, two lost resends in a row outlast maxWaitAckTimeMs (2.5 s) and the append
    answers 502 (about 1 seed in 10 under 30 % loss).
    """
    cluster = SimCluster(3, random.Random(4), config_overrides={"max_push_timeout_ms": 100})
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    cluster.conditions = NetworkConditions(drop=0.3)
    handles = append_many(cluster, 10, gap_ms=5.0)
    cluster.run_until(cluster.now_ms + 2000)
    assert outcomes(cluster, handles) == [Code.SUCCESS] * 10
    got = indexes(cluster, handles)
    assert got == list(range(got[0], got[0] + 10))
    assert cluster.checker.leaders_by_term == {leader.replica.term: leader.id}


def test_truncate_follower_with_extra_entries_is_cut_back_to_the_new_leaders_log():
    """n0 wrote 10 entries, n1 only the first 5; with n1 leading, n0 is truncated to 5
    and new entries continue after them (at 5 the new leader's NOOP, then 6, 7, ...)."""
    cluster = SimCluster(3, random.Random(5))
    terms = [1] * 10
    stores = {
        "n0": filled_store(terms, cluster.segment_size),
        "n1": filled_store(terms[:5], cluster.segment_size),
        "n2": filled_store(terms[:4], cluster.segment_size),
    }
    for node_id, store in stores.items():  # everyone voted for n0 in term 1
        cluster.crash(node_id)
        cluster.nodes[node_id].store = store
        cluster.nodes[node_id].hard_state = (1, "n0")
    prefix = [stores["n0"].chain_at(i) for i in range(5)]
    cluster.restart("n1")
    cluster.restart("n2")
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    assert leader.id == "n1" and leader.replica.term > 1
    handles = append_many(cluster, 3)
    cluster.run_until(cluster.now_ms + 20)
    assert outcomes(cluster, handles) == [Code.SUCCESS] * 3
    assert indexes(cluster, handles) == [6, 7, 8]
    assert leader.store.get(5).type is EntryType.NOOP
    cluster.restart("n0")
    cluster.run_until(cluster.now_ms + 5 * HB)
    n0 = cluster.nodes["n0"]
    assert n0.replica.role is Role.FOLLOWER and n0.replica.leader_id == "n1"
    assert n0.store.end_index == leader.store.end_index == 8
    assert [n0.store.chain_at(i) for i in range(5)] == prefix  # the agreeing prefix kept
    assert n0.store.term_at(5) == leader.replica.term
    assert n0.store.end_chain == leader.store.end_chain
    assert [n0.store.get(i).body for i in (6, 7, 8)] == [cluster.appends[h] for h in handles]
    assert n0.replica.committed_index == leader.replica.committed_index == 8


# ---------------------------------------------------------------- CommitIndexTest (§3.5)


class Wire:
    """Replicas joined by hand: outputs are collected, messages delivered on demand."""

    def __init__(self, replicas, now_ms=1000.0):
        self.replicas = replicas
        self.now_ms = now_ms
        self.queue: list = []
        self.commits: dict[str, list[int]] = {n: [] for n in replicas}

    def collect(self, node_id):
        out = self.replicas[node_id].take_output()
        self.queue.extend(out.messages)
        if out.committed_index is not None:
            self.commits[node_id].append(out.committed_index)
        return out

    def tick(self, node_id, ms=0.0):
        self.now_ms += ms
        self.replicas[node_id].tick(self.now_ms)
        self.collect(node_id)

    def sync(self, node_id):
        """An fsync covering everything written so far completes."""
        r = self.replicas[node_id]
        r.persisted(r.store.end_index, r.store.generation, self.now_ms)
        self.collect(node_id)

    def deliver(self, keep=lambda m: True):
        """Deliver queued messages that `keep` lets through, answers too, until none is
        left; the others stay queued. Messages to absent replicas are lost."""
        while True:
            ready = [m for m in self.queue if keep(m)]
            if not ready:
                return
            self.queue = [m for m in self.queue if not keep(m)]
            for msg in ready:
                if msg.remote_id in self.replicas:
                    self.replicas[msg.remote_id].receive(msg, self.now_ms)
                    self.collect(msg.remote_id)


def test_new_leader_does_not_commit_inherited_entries_before_its_own_term_noop():
    """Entries of term 1 on a quorum are not committed by the term-2 leader until its
    NOOP (term 2) is durable on a quorum; the commit then jumps past them at once."""
    stores = {n: filled_store([1, 1]) for n in ("n1", "n2")}
    wire = Wire({n: make_replica(n, term=2, store=stores[n]) for n in ("n1", "n2")})  # n0 is gone
    n1, n2 = wire.replicas["n1"], wire.replicas["n2"]
    wire.tick("n1")
    wire.deliver(keep=lambda m: isinstance(m, (VoteRequest, VoteResponse)))
    assert n1.role is Role.LEADER and n1.term == 2
    assert n1.store.end_index == 2 and n1.store.get(2).type is EntryType.NOOP
    # the COMPARE round: n2 holds 0..1 durably, so the inherited entries are on a quorum
    wire.deliver(keep=lambda m: not (isinstance(m, PushRequest) and m.type == PushType.APPEND))
    assert n1.replication.progress["n2"].match_index == 1
    assert n1.committed_index == -1
    wire.sync("n1")  # the leader's own NOOP is durable: still only 1 of 3 holds it
    assert n1.committed_index == -1
    wire.deliver()  # the NOOP reaches n2, which must fsync before it acknowledges
    assert n2.store.end_index == 2
    assert n1.committed_index == -1
    wire.sync("n2")
    wire.deliver()
    assert n1.committed_index == 2
    assert wire.commits["n1"] == [2]  # never 0 or 1: no commit of an inherited entry alone
    wire.tick("n1", ms=5.0)  # an idle follower hears the commit index in a COMMIT push
    wire.deliver()
    assert n2.committed_index == 2
    assert wire.commits["n2"] == [2]


def test_a_leader_never_reports_a_commit_at_an_entry_of_an_older_term():
    """Across failovers in the simulator, every commit a leader announces is its own term's."""
    cluster = SimCluster(3, random.Random(6))
    seen = []
    record = cluster.checker.committed

    def committed(node_id, index):
        r = cluster.nodes[node_id].replica
        if r.role is Role.LEADER:
            seen.append((node_id, index, cluster.nodes[node_id].store.term_at(index), r.term))
        record(node_id, index)

    cluster.checker.committed = committed
    for _ in range(3):
        leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
        append_many(cluster, 5)
        cluster.crash(leader.id)
        # a successor in a later term inherits uncommitted entries
        cluster.run_until_leader(settle_ms=3 * HB)
        cluster.restart(leader.id)
    cluster.run_until_leader(settle_ms=3 * HB)
    assert len({term for *_, term in seen}) >= 3
    assert all(entry_term == term for _, _, entry_term, term in seen), seen


# ---------------------------------------------------------------- positions (BatchPushTest)


def single_leader(segment_size=1 << 30) -> Replica:
    r = make_replica("n0", store=MemoryLogStore(segment_size), peers={"n0": "127.0.0.1:40911"})
    r.tick(1000.0)
    assert r.role is Role.LEADER
    r.persisted(r.store.end_index, r.store.generation, 1000.0)
    r.take_output()
    return r


def test_batch_append_positions_are_48_i_plus_the_sizes_before_within_a_segment():
    r = single_leader()
    requests = [(1, [b"a", b"bbb", b""]), (2, [b"c" * 10]), (3, [b"dd", b"e" * 7])]
    assert r.append_batch(requests, 1000.0) == [Code.SUCCESS] * 3
    r.persisted(r.store.end_index, r.store.generation, 1000.0)
    out = r.take_output()
    by_handle = {c.handle: c for c in out.completions}
    assert all(by_handle[h].code is Code.SUCCESS for h, _ in requests)
    sizes = [0]  # index 0 is the leader's NOOP (empty body)
    for _, bodies in requests:
        sizes.extend(len(b) for b in bodies)
    expected = [(i, codec.HEADER_SIZE * i + sum(sizes[:i])) for i in range(len(sizes))]
    got = [pos for h, _ in requests for pos in by_handle[h].positions]
    assert got == expected[1:]
    assert [r.store.get(i).pos for i in range(len(sizes))] == [p for _, p in expected]


def test_an_entry_that_does_not_fit_its_segment_starts_at_the_next_one():
    r = single_leader(segment_size=256)
    r.append_batch([(1, [b"x" * 100, b"y" * 100, b"z" * 10])], 1000.0)
    r.persisted(r.store.end_index, r.store.generation, 1000.0)
    [done] = r.take_output().completions
    # NOOP 0..48, x 48..196, y (148 bytes) would end past 256 - 8: next segment
    assert done.positions == [(1, 48), (2, 256), (3, 256 + 148)]


# ---------------------------------------------------------------- follower acks (§3.4)


def follower(flush_disk_type=None):
    overrides = {"flush_disk_type": flush_disk_type} if flush_disk_type else {}
    r = make_replica("n1", term=1, **overrides)
    r.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 1, seq=1), 0.0)
    r.take_output()
    assert r.role is Role.FOLLOWER
    return r


def append_push(entries_terms, seq=5, pre=-1, pre_term=-1, commit=-1):
    store = filled_store(entries_terms)
    blob, count = store.read_encoded(pre + 1, 1 << 20)
    return PushRequest(
        GROUP,
        "n0",
        "n1",
        "n0",
        1,
        PushType.APPEND,
        pre,
        pre_term,
        commit,
        entries=blob,
        count=count,
        seq=seq,
    )


def push_responses(out):
    return [m for m in out.messages if isinstance(m, PushResponse)]


def test_sync_flush_follower_acknowledges_an_append_only_after_persisted():
    r = follower()
    r.receive(append_push([1, 1, 1]), 1.0)
    out = r.take_output()
    assert r.store.end_index == 2
    assert out.needs_sync
    assert not push_responses(out)
    r.persisted(1, r.store.generation, 2.0)  # an fsync covering only part of it
    assert not push_responses(r.take_output())
    r.persisted(2, r.store.generation - 1, 2.5)  # a stale generation vouches for nothing
    assert not push_responses(r.take_output())
    r.persisted(2, r.store.generation, 3.0)
    [resp] = push_responses(r.take_output())
    assert resp.code == Code.SUCCESS and resp.index == 2 and resp.seq == 5


def test_async_flush_follower_acknowledges_an_append_at_once():
    r = follower(PAGE_CACHE)
    r.receive(append_push([1, 1, 1]), 1.0)
    out = r.take_output()
    assert not out.needs_sync
    [resp] = push_responses(out)
    assert resp.code == Code.SUCCESS and resp.index == 2


# ---------------------------------------------------------------- TRUNCATE (§3.3)


def truncate_push(pre, pre_term, term_runs, leader_end, commit=-1, term=1):
    return PushRequest(
        GROUP,
        "n0",
        "n1",
        "n0",
        term,
        PushType.TRUNCATE,
        pre,
        pre_term,
        commit,
        term_runs=term_runs,
        leader_end_index=leader_end,
        seq=9,
    )


def test_a_follower_reset_to_the_leaders_beginning_syncs_then_answers():
    """A follower silent past the leader's retention holds entries that end before the
    leader's first one: TRUNCATE resets its log to begin there. The answer waits for an
    fsync of the new beginning, so the reset must ask for one, or the follower would
    never answer and never rejoin."""
    leader_store = filled_store([1] * 60)
    r = follower()
    r.receive(append_push([1, 1, 1]), 1.0)
    r.persisted(2, r.store.generation, 1.5)
    r.take_output()
    push = attrs.evolve(truncate_push(49, 1, [(50, 1)], 59), reset_pos=leader_store.pos_at(50))
    r.receive(push, 2.0)
    out = r.take_output()
    assert r.store.begin_index == 50 and r.store.empty
    assert out.needs_sync, "the reset's answer waits for an fsync nobody asked for"
    assert not push_responses(out)
    r.persisted(49, r.store.generation, 3.0)
    [resp] = push_responses(r.take_output())
    assert resp.code == Code.SUCCESS and resp.index == 49


def test_truncate_cuts_only_from_the_first_entry_that_disagrees_with_the_leader():
    store = filled_store([1, 1, 1, 1, 1, 2, 2, 2])  # leader: 1 1 1 1 1 2 2 3 3
    r = make_replica("n1", term=1, store=store)
    r.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 1, seq=1), 0.0)
    before = [store.chain_at(i) for i in range(8)]
    r.take_output()
    r.receive(truncate_push(2, 1, [(3, 1), (5, 2), (7, 3)], 8), 1.0)
    [resp] = push_responses(r.take_output())
    assert resp.code == Code.SUCCESS and resp.index == 6
    assert store.end_index == 6
    assert [store.chain_at(i) for i in range(7)] == before[:7]


def test_truncate_of_a_follower_that_is_a_prefix_of_the_leader_removes_nothing():
    store = filled_store([1, 1, 2])
    r = make_replica("n1", term=1, store=store)
    r.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 1, seq=1), 0.0)
    r.take_output()
    generation = store.generation
    r.receive(truncate_push(0, 1, [(1, 1), (2, 2), (4, 3)], 5), 1.0)
    [resp] = push_responses(r.take_output())
    assert resp.code == Code.SUCCESS and resp.index == 2
    assert store.end_index == 2 and store.generation == generation  # nothing cut


def test_truncate_removes_entries_of_an_older_term_past_the_leaders_end():
    store = filled_store([1, 1, 1, 1])
    r = make_replica("n1", term=2, store=store)
    r.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 2, seq=1), 0.0)
    r.take_output()
    r.receive(truncate_push(0, 1, [(1, 1)], 1, term=2), 1.0)
    [resp] = push_responses(r.take_output())
    assert resp.code == Code.SUCCESS and resp.index == 1
    assert store.end_index == 1


def test_a_late_truncate_keeps_what_its_leader_appended_since():
    """A TRUNCATE delayed behind the APPEND that followed it: the entries past the end
    it names are of its leader's term, so that leader wrote them after it sent the
    TRUNCATE. Cutting them (once acknowledged, the leader never sends them again) left
    a follower waiting for a gap forever in a 5-broker simulation with reordering."""
    store = filled_store([1, 1, 1, 1])
    r = make_replica("n1", term=1, store=store)
    r.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 1, seq=1), 0.0)
    r.take_output()
    generation = store.generation
    r.receive(truncate_push(0, 1, [(1, 1)], 1), 1.0)
    [resp] = push_responses(r.take_output())
    assert resp.code == Code.SUCCESS and resp.index == 3
    assert store.end_index == 3 and store.generation == generation


def test_truncate_with_a_disagreeing_pre_entry_is_inconsistent_state():
    store = filled_store([1, 2, 2])
    r = make_replica("n1", term=1, store=store)
    r.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 1, seq=1), 0.0)
    r.take_output()
    r.receive(truncate_push(1, 1, [(2, 1)], 2), 1.0)
    [resp] = push_responses(r.take_output())
    assert resp.code == Code.INCONSISTENT_STATE
    assert store.end_index == 2  # nothing removed on a mismatch


def test_follower_commit_index_never_passes_what_it_holds_from_the_leader():
    """committed = min(leader's commitIndex, what the follower verified)."""
    r = follower()
    r.receive(append_push([1, 1], commit=5), 1.0)
    assert r.committed_index == 1


def test_a_stale_push_from_before_a_reset_is_refused_not_a_crash():
    """A follower whose log restarts at index 50 gets a delayed APPEND for index 3."""
    leader_store = filled_store([1] * 60)
    follower = make_replica("n1", term=1)
    follower.receive(HeartBeatRequest(GROUP, "n0", "n1", "n0", 1, seq=1), 0.0)
    follower.store.reset(50, leader_store.pos_at(50), 1)
    blob, count = leader_store.read_encoded(3, 1 << 20)
    follower.receive(
        PushRequest(
            GROUP, "n0", "n1", "n0", 1, PushType.APPEND, 2, 1, -1, entries=blob, count=count, seq=2
        ),
        1.0,
    )
    [resp] = [m for m in follower.take_output().messages if isinstance(m, PushResponse)]
    assert resp.code is Code.INCONSISTENT_STATE
    assert follower.store.begin_index == 50 and follower.store.empty


def store_from(full: MemoryLogStore, begin: int) -> MemoryLogStore:
    """`full`'s entries from `begin` on, as a log whose head retention deleted."""
    store = MemoryLogStore()
    store.reset(begin, full.pos_at(begin), full.term_at(begin - 1))
    store.append_encoded(full.read_encoded(begin, 1 << 30)[0])
    store.sync_plan().run()
    return store


def test_a_follower_whose_log_begins_past_the_leaders_beginning_is_compared_not_reset():
    """Found by a soak: a new leader whose retention had kept more than its follower's
    (the follower, the old leader, had deleted up to index 40, the leader only up to 20)
    probed it from below the follower's beginning (as after TERM_NOT_READY), and answered
    "you lack what I would compare" with a reset to the leader's beginning, a TRUNCATE
    that would cut the follower's committed entries. The follower refused it, the leader
    sent it again, and the follower got no entry while that leader lasted. The leader
    must compare where the follower's log begins instead."""
    full = filled_store([1] * 60)
    leader = make_replica("n1", term=1, store=store_from(full, 20))
    follower = make_replica("n2", term=1, store=store_from(full, 40))
    follower.committed_index = 59  # committed while it led
    wire = Wire({"n1": leader, "n2": follower})  # n0 is gone
    wire.tick("n1")
    wire.deliver(keep=lambda m: isinstance(m, (VoteRequest, VoteResponse)))
    assert leader.role is Role.LEADER
    leader.replication.progress["n2"].become_probe(PushType.COMPARE, 0)  # what TERM_NOT_READY does
    wire.tick("n1", ms=1.0)
    pushes, answers = [], []
    for _ in range(20):  # bounded: before the fix this exchange never ended
        wire.tick("n1", ms=HB)  # a heartbeat round too: a refused TRUNCATE waits for one
        pushes += [m for m in wire.queue if isinstance(m, PushRequest)]
        answers += [m for m in wire.queue if isinstance(m, PushResponse)]
        ready, wire.queue = wire.queue, []
        for msg in ready:
            if msg.remote_id in wire.replicas:
                wire.replicas[msg.remote_id].receive(msg, wire.now_ms)
                wire.collect(msg.remote_id)
        wire.sync("n1"), wire.sync("n2")
    resets = [p for p in pushes if p.type == PushType.TRUNCATE and p.reset_pos >= 0]
    assert len(resets) <= 1, f"{len(resets)} resets: the leader keeps sending a refused one"
    assert leader.replication.progress["n2"].match_index == leader.store.end_index
    assert follower.store.begin_index == 40 and follower.store.end_index == leader.store.end_index
    # TERM_NOT_READY (a follower just woke with an older term) probes from our beginning on,
    # not from below it, so no reset goes out at all
    leader.receive(attrs.evolve(answers[-1], code=Code.TERM_NOT_READY), wire.now_ms)
    assert leader.replication.progress["n2"].next_index >= leader.store.begin_index


def test_a_new_leader_sends_its_snapshot_before_its_noop_commits_then_resets_the_follower():
    """A leader just restarted knows no commit index until its NOOP commits, while its
    application's state (restored from its own files) stands further on, committed in an
    earlier term: that is the snapshot it sends. The follower, whose log ends before the
    leader's first entry (new, or wiped), installs it, and only then is its log
    restarted there (core.snapshot)."""
    full = filled_store([1] * 60)
    leader = make_replica("n1", term=1, store=store_from(full, 20))
    leader.snapshot_source = lambda: (40, b"state as of 40")
    follower = make_replica("n2", term=1)
    wire = Wire({"n1": leader, "n2": follower})  # n0 is gone
    wire.tick("n1")
    wire.deliver(keep=lambda m: isinstance(m, (VoteRequest, VoteResponse)))
    assert leader.role is Role.LEADER and leader.committed_index == -1
    installs = []
    for _ in range(10):
        wire.tick("n1", ms=1.0)
        ready, wire.queue = wire.queue, []
        for msg in (m for m in ready if m.remote_id in wire.replicas):
            wire.replicas[msg.remote_id].receive(msg, wire.now_ms)
            out = wire.collect(msg.remote_id)
            if out.snapshot is not None:
                installs.append((out.snapshot, follower.store.begin_index))
                follower.snapshot_installed(out.snapshot[0], True)
                wire.collect("n2")
        wire.sync("n1"), wire.sync("n2")
    assert installs == [((40, b"state as of 40"), 0)]  # once, before the reset
    progress = leader.replication.progress["n2"]
    assert (progress.snapshot, progress.snapshot_index) == (None, -1)  # a wipe needs another
    assert follower.store.begin_index == 20
    assert follower.store.end_index == leader.store.end_index
    assert leader.committed_index == leader.store.end_index


def test_a_refused_truncate_is_probed_again_at_the_next_heartbeat_not_at_once():
    """Whatever makes a follower refuse a TRUNCATE may make it refuse the next one too;
    a leader that probed again at once turned one refusal into a loop at network speed
    (a soak saw 163,000 in four minutes). It waits for the follower's next heartbeat
    answer, then compares again."""
    leader = make_replica("n1", term=2, store=filled_store([1] * 5 + [2]))
    follower = make_replica("n2", term=2, store=filled_store([1] * 8))  # 5..7 to be cut
    wire = Wire({"n1": leader, "n2": follower})
    wire.tick("n1")
    wire.deliver(keep=lambda m: isinstance(m, (VoteRequest, VoteResponse)))
    assert leader.role is Role.LEADER
    truncates = []

    def refuse_truncates(msg) -> bool:
        if isinstance(msg, PushRequest) and msg.type == PushType.TRUNCATE:
            truncates.append(msg)
            return False
        return not isinstance(msg, HeartBeatRequest)

    wire.deliver(keep=refuse_truncates)
    [truncate] = truncates
    wire.queue = [m for m in wire.queue if m is not truncate]
    refusal = PushResponse(
        GROUP, "n2", "n1", "n1", leader.term, Code.INCONSISTENT_STATE, PushType.TRUNCATE,
        truncate.pre_log_index, seq=truncate.seq,
    )  # fmt: skip
    leader.receive(refusal, wire.now_ms)
    wire.collect("n1")
    assert [m for m in wire.queue if isinstance(m, PushRequest)] == []  # nothing at once
    for _ in range(3):  # heartbeats pass: the follower answers, the leader compares again
        wire.tick("n1", ms=HB)
        wire.deliver(keep=lambda m: not isinstance(m, PushRequest))
        wire.collect("n1")
    assert [m.type for m in wire.queue if isinstance(m, PushRequest)][:1] == [PushType.COMPARE]
    wire.deliver()
    wire.sync("n1"), wire.sync("n2")
    wire.deliver()
    assert follower.store.end_chain == leader.store.end_chain


def test_a_follower_restarted_in_an_idle_group_learns_the_commit_index_within_a_beat():
    """A restarted follower trusts the leader's commit index only as far as a COMPARE
    or APPEND has verified its log since: with nothing written, the leader (which saw
    it caught up) sent neither, and its commit index stayed -1 until the next write.
    Its heartbeat answer says how far it knows its log agrees with the leader's; below
    what it acknowledged, the leader compares again."""
    cluster = SimCluster(3, random.Random(5))
    leader, _ = cluster.run_until_leader(settle_ms=3 * HB)
    handles = append_many(cluster, 5)
    cluster.run_until(cluster.now_ms + 2 * HB)
    assert outcomes(cluster, handles) == [Code.SUCCESS] * 5
    follower = next(n for n in cluster.ids if n != leader.id)
    assert cluster.nodes[follower].replica.committed_index == leader.replica.committed_index
    cluster.crash(follower)
    cluster.restart(follower)
    restarted = cluster.nodes[follower].replica
    assert restarted.committed_index == -1
    cluster.run_until(cluster.now_ms + 2 * HB)
    assert restarted.role is Role.FOLLOWER
    assert leader.store.end_index == leader.replica.committed_index  # nothing new written
    assert restarted.committed_index == leader.replica.committed_index
