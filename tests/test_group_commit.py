"""Group commit's decisions (`dledger.core.group_commit`): when an fsync starts, what
it covers and on which thread, and that the trio server and the simulator both run
them — the simulator with its drawn fsync durations standing in for measured ones,
so it meets the inline and the worker branch alike."""

from __future__ import annotations

import random

import pytest
import trio
from raftmq.dledger import cli as dledger_cli
from raftmq.dledger.codes import Role
from raftmq.dledger.core.group_commit import (
    INLINE_FSYNC_MAX_ENTRIES,
    INLINE_FSYNC_MAX_S,
    Fsync,
    GroupCommitSchedule,
)
from raftmq.dledger.server import DLedgerServer
from raftmq.dledger.sim.cluster import SimCluster

from raftmq.tools.dledger_local import LOCAL_SEGMENT_ARGS, free_ports
from tests.helpers import wait_for

QUICK_S = INLINE_FSYNC_MAX_S / 10
SLOW_S = INLINE_FSYNC_MAX_S * 2
FLUSH_MS = 10.0


def fsync_mode() -> GroupCommitSchedule:
    return GroupCommitSchedule(True, FLUSH_MS, 0.0)


def test_one_fsync_at_a_time_and_the_next_covers_what_came_meanwhile():
    schedule = fsync_mode()
    assert schedule.next(0, -1, 0.0, following=False) is None  # nothing asked for
    assert schedule.wanted(0, -1, 0.0, following=False) == Fsync(0, inline=True)
    assert schedule.in_flight
    assert (
        schedule.wanted(2, 0, 1.0, following=False) is None
    )  # entries 1 and 2, appended while it runs
    assert schedule.next(2, 0, 1.0, following=False) is None
    assert schedule.finished(QUICK_S, True, 1.0)  # one was wanted meanwhile
    assert not schedule.in_flight
    assert schedule.next(2, 0, 1.0, following=False) == Fsync(2, inline=True)
    assert not schedule.finished(QUICK_S, True, 2.0)
    assert schedule.next(2, 2, 2.0, following=False) is None  # asked for once, started once


def test_an_fsync_runs_inline_only_on_an_idle_log():
    """Idle: every entry before the new ones committed and few new ones. Pipelined
    appends, each behind the previous inline fsync, once each found the log 'idle' by
    the plan's size alone, and every group commit covered one entry."""
    schedule = fsync_mode()
    last = INLINE_FSYNC_MAX_ENTRIES - 1
    assert schedule.wanted(last, -1, 0.0, following=False) == Fsync(
        last, inline=True
    )  # the first entries
    schedule.finished(QUICK_S, True, 0.1)
    assert schedule.wanted(last + 1, last, 0.2, following=False) == Fsync(
        last + 1, inline=True
    )  # one new
    schedule.finished(QUICK_S, True, 0.3)
    # one new entry, but the one before it is not yet committed
    assert schedule.wanted(last + 2, last, 0.4, following=False) == Fsync(last + 2, inline=False)
    schedule.finished(QUICK_S, True, 0.5)
    many = last + 2 + INLINE_FSYNC_MAX_ENTRIES + 1  # a group larger than an idle log makes
    assert schedule.wanted(many, last + 2, 0.6, following=False) == Fsync(many, inline=False)


def test_a_follower_fsyncs_on_the_loop_under_load_too_while_the_disk_is_quick():
    """A follower's entries come in pushes, which wait for its fsync whatever thread runs
    it: a group of any size, behind uncommitted entries, still runs inline."""
    schedule = fsync_mode()
    many = 10 * INLINE_FSYNC_MAX_ENTRIES
    assert schedule.wanted(many, -1, 0.0, following=True) == Fsync(many, inline=True)
    assert schedule.wanted(2 * many, -1, 0.1, following=True) is None  # one at a time
    assert schedule.finished(SLOW_S, True, 0.2)
    # the leader's rule would keep this one off the loop; a slow disk does, for both
    assert schedule.next(2 * many, -1, 0.3, following=True) == Fsync(2 * many, inline=False)
    schedule.finished(QUICK_S, True, 0.4)
    assert schedule.wanted(3 * many, many, 0.5, following=False) == Fsync(3 * many, inline=False)
    schedule.finished(QUICK_S, True, 0.6)
    assert schedule.wanted(4 * many, many, 0.7, following=True) == Fsync(4 * many, inline=True)


def test_a_slow_fsync_keeps_the_next_off_the_loop_until_one_is_quick_again():
    schedule = fsync_mode()
    end = 0

    def next_inline(took_s: float, synced: bool) -> bool:
        nonlocal end
        fsync = schedule.wanted(end, end - 1, 0.0, following=False)
        schedule.finished(took_s, synced, 0.0)
        end += 1
        return fsync.inline

    assert next_inline(SLOW_S, True)  # nothing measured yet: inline
    assert not next_inline(QUICK_S, False)  # slow last time; this one found nothing dirty
    assert not next_inline(QUICK_S, True)  # ... so its time said nothing of the disk
    assert next_inline(QUICK_S, True)


def test_page_cache_mode_flushes_on_a_worker_every_interval_from_the_last_flush():
    schedule = GroupCommitSchedule(False, FLUSH_MS, 0.0)
    with pytest.raises(AssertionError):
        schedule.wanted(
            5, 5, 0.0, following=False
        )  # acknowledgments wait for no fsync: the core asks for none
    assert schedule.deadline_ms == FLUSH_MS
    assert schedule.next(5, 5, FLUSH_MS - 1, following=False) is None
    assert schedule.next(5, 5, FLUSH_MS, following=False) == Fsync(5, inline=False)
    assert schedule.deadline_ms == float("inf")  # while it runs
    assert not schedule.in_flight  # appends do not wait behind a flush
    schedule.finished(SLOW_S, True, FLUSH_MS + 3)
    assert schedule.deadline_ms == 2 * FLUSH_MS + 3


@pytest.fixture
def decisions(monkeypatch) -> list[tuple[GroupCommitSchedule, Fsync]]:
    """Every fsync any driver starts, by the schedule that decided it: the real
    decisions run, and are recorded."""
    made: list[tuple[GroupCommitSchedule, Fsync]] = []
    real_next = GroupCommitSchedule.next

    def recording_next(self, end_index: int, committed_index: int, now_ms: float, **kw):
        fsync = real_next(self, end_index, committed_index, now_ms, **kw)
        if fsync is not None:
            made.append((self, fsync))
        return fsync

    monkeypatch.setattr(GroupCommitSchedule, "next", recording_next)
    return made


def test_the_simulator_runs_the_group_commit_schedule_inline_and_on_a_worker(decisions):
    """Its simulated fsyncs are now and then slow, so both branches run; an inline one
    blocks its node: nothing else reaches it until the fsync ends."""
    cluster = SimCluster(3, random.Random(5), slow_fsync_chance=0.05)
    leader, _ = cluster.run_until_leader(settle_ms=300)
    handled_while_busy = []
    real_dispatch = cluster._dispatch

    def dispatch(node, kind, data) -> None:
        if cluster.now_ms < node.busy_until_ms:
            handled_while_busy.append((node.id, kind, cluster.now_ms))
        real_dispatch(node, kind, data)

    cluster._dispatch = dispatch
    handles = []
    for step in range(400):
        for _ in range(1 + step % 3 * 4):  # single appends and bursts
            handles.append(cluster.client_append(leader.id))
        cluster.run_until(cluster.now_ms + 2)
    cluster.run_until(cluster.now_ms + 200)
    assert all(cluster.checker.outcomes.get(h) is not None for h in handles)
    schedules = {id(node.group_commit) for node in cluster.nodes.values()}
    mine = [fsync for schedule, fsync in decisions if id(schedule) in schedules]
    assert len(mine) == len(decisions) > 0
    inline = sum(fsync.inline for fsync in mine)
    assert 0 < inline < len(mine), f"{inline} of {len(mine)} fsyncs inline"
    assert handled_while_busy == []


async def test_the_server_runs_the_group_commit_schedule(decisions, tmp_path):
    port = free_ports(1)[0]
    args = ["server", "-p", f"n0-127.0.0.1:{port}", "-i", "n0", "-s", str(tmp_path)]
    config = dledger_cli._server_config(
        dledger_cli._parser().parse_args([*args, *LOCAL_SEGMENT_ARGS])
    )
    server = DLedgerServer(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        await wait_for(lambda: server.role is Role.LEADER)
        with trio.fail_after(10):
            for n in range(5):
                await server.append(b"e%d" % n)
            await server.append_batch([b"b%d" % n for n in range(4 * INLINE_FSYNC_MAX_ENTRIES)])
        nursery.cancel_scope.cancel()
    assert {id(schedule) for schedule, _ in decisions} == {id(server._group_commit)}
    assert {fsync.inline for _, fsync in decisions} == {True, False}
    assert decisions[-1][1].end_index == server.store.end_index


def test_a_follower_covers_the_pushes_it_finds_waiting_with_one_fsync():
    """Pushes that reach a follower while its inline fsync blocks it are handled as one
    chunk, as one read returns them, and one fsync covers them all: fsyncs twenty
    times slower than appends still leave the followers a few fsyncs behind, where one
    fsync per push left them about 500 entries behind after 2,000 appends."""
    for seed in range(3):
        cluster = SimCluster(3, random.Random(seed), fsync_ms=(1.0, 2.0))
        leader, _ = cluster.run_until_leader(2000)
        followers = [cluster.nodes[n] for n in cluster.ids if n != leader.id]
        for _ in range(2000):
            cluster.client_append(leader.id)
            cluster.run_until(cluster.now_ms + 0.1)
        behind = [leader.store.end_index - f.replica.persisted_index for f in followers]
        assert max(behind) < 100, (seed, behind)
