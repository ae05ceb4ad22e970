"""Where a group commit's fsyncs run: on the member's loop while the log is nearly idle
(a single send) and the disk quick; on a worker thread for a plan covering many entries
(load) and while the disk is slow.

Observed by wrapping os.fdatasync (the real call still runs) and noting the thread
and the member whose file each call syncs.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import trio
from raftmq.dledger import cli as dledger_cli
from raftmq.dledger import server as dledger_server
from raftmq.dledger.client import DLedgerClient
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.group_commit import INLINE_FSYNC_MAX_ENTRIES, INLINE_FSYNC_MAX_S
from raftmq.dledger.net.codec import RpcCode
from raftmq.dledger.net.rpc_client import RpcClient
from raftmq.dledger.server import DLedgerServer
from raftmq.dledger.sim.cluster import SimCluster

from raftmq.client.producer import encode_batch
from raftmq.config.address import parse_peers
from raftmq.disk.fsync_thread import FsyncThread
from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import RequestCode, ResponseCode
from raftmq.tools.dledger_local import LOCAL_SEGMENT_ARGS, free_ports
from tests.helpers import create_topic, group, wait_for
from tests.test_election_cluster import ADMIN, cluster_of


def _member_of(fd: int, base: str) -> str | None:
    """The member (n0, n1, ...) whose data file `fd` is, if it is one of the test's."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if not path.startswith(base) or "dledger" not in path:
        return None
    return path[len(base) :].lstrip("/").split("/", 1)[0]


@pytest.fixture(autouse=True)
def fsync_thread_in_python(monkeypatch):
    """A worker's fsyncs run on the fsync thread: here its pure-Python twin, whose calls
    the tests' os.fdatasync wrappers see (the compiled one calls fdatasync from C;
    tests/test_hotpath.py holds the two equal)."""
    monkeypatch.setattr(dledger_server, "FSYNC_THREAD", FsyncThread)


async def test_fsyncs_run_on_the_loop_for_single_sends_on_a_quick_disk(tmp_path, monkeypatch):
    base = str(tmp_path)
    loop_thread = threading.get_ident()
    calls: list[tuple[str, bool]] = []  # (member, ran on the loop's thread)
    slow: set[str] = set()
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        member = _member_of(fd, base)
        if member is not None:
            calls.append((member, threading.get_ident() == loop_thread))
            if member in slow:
                time.sleep(2 * INLINE_FSYNC_MAX_S)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    async with trio.open_nursery() as nursery:
        g = await group(nursery, tmp_path)
        master = g.master()
        await create_topic(g, "T")

        async def sends(count: int) -> None:
            for _ in range(count):
                assert (await g.send(master, "T", b"m")).code == ResponseCode.SUCCESS
            end = master.dledger.store.end_index
            await wait_for(
                lambda: all(b.dledger.replica.persisted_index >= end for b in g.slaves())
            )

        await sends(5)
        calls.clear()
        await sends(5)
        for member in g.ids:  # single sends: each member's fsyncs on its loop (but for
            # those after an fsync this shared machine happened to make slow)
            here = sum(1 for m, on_loop in calls if m == member and on_loop)
            assert here > sum(1 for m, on_loop in calls if m == member and not on_loop)

        calls.clear()  # a batch of many entries: the leader's fsync on a worker
        batch = encode_batch([(b"b%d" % n, "") for n in range(4 * INLINE_FSYNC_MAX_ENTRIES)])
        ext = send_header_v2("PG", "T", 0, born_timestamp_ms=int(time.time() * 1000))
        ext["batch"] = "true"
        response = await g.call(master, RequestCode.SEND_BATCH_MESSAGE, ext, batch)
        assert response.code == ResponseCode.SUCCESS, response.remark
        # the two followers' fsyncs make the quorum: the leader's own may still be running
        end = master.dledger.store.end_index
        await wait_for(lambda: master.dledger.replica.persisted_index >= end)
        assert (master.self_id, False) in set(calls)
        assert (master.self_id, True) not in set(calls)

        followers = {b.self_id for b in g.slaves()}
        slowed = min(followers)
        slow.add(slowed)
        await sends(3)  # the first slow fsync may run on the loop; later ones do not
        calls.clear()
        await sends(5)
        assert (slowed, True) not in set(calls)
        assert (slowed, False) in set(calls)
        (quick,) = followers - {slowed}
        assert (quick, True) in set(calls)
        slow.clear()
        await sends(3)  # a quick fsync brings the member back to its loop
        calls.clear()
        await sends(5)
        assert (slowed, True) in set(calls)
        nursery.cancel_scope.cancel()


async def three_servers(
    nursery: trio.Nursery, peers: str, base: str, keys: list[str] = ()
) -> list[DLedgerServer]:
    """Members n0-n2 of `peers` in this process, stored under `base`, with DLedger
    `keys` (key=value); returned once one of them has committed an entry."""
    servers = []
    for i in range(3):
        args = ["server", "-p", peers, "-i", f"n{i}", "-s", f"{base}/n{i}"]
        args += [arg for key in keys for arg in ("-D", key)]
        config = dledger_cli._server_config(
            dledger_cli._parser().parse_args([*args, *LOCAL_SEGMENT_ARGS])
        )
        servers.append(DLedgerServer(config))
        await nursery.start(servers[-1].serve)
    async with DLedgerClient("default", parse_peers(peers)) as client:
        with trio.fail_after(10):
            await client.append([b"elected"])
    return servers


async def test_appends_in_flight_together_share_fsyncs_on_a_worker(tmp_path, monkeypatch):
    """Many single-entry appends in flight on one connection: after the first, which
    finds the log idle, they are group-committed on the worker. An fsync run on the
    loop per append, with the next appends waiting in the socket behind it, once made
    a group commit of every entry (1 fsync per append: 3.8k appends/s against 51k)."""
    base = str(tmp_path)
    loop_thread = threading.get_ident()
    calls: list[tuple[str, bool]] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        member = _member_of(fd, base)
        if member is not None:
            calls.append((member, threading.get_ident() == loop_thread))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    peers = ";".join(f"n{i}-127.0.0.1:{port}" for i, port in enumerate(free_ports(3)))
    async with trio.open_nursery() as nursery:
        servers = await three_servers(nursery, peers, base)
        (leader,) = [s for s in servers if s.replica.role is Role.LEADER]
        in_flight = 16 * INLINE_FSYNC_MAX_ENTRIES
        calls.clear()
        codes = []
        async with RpcClient(parse_peers(peers)[leader.config.self_id]) as conn:
            request = {"code": RpcCode.APPEND, "group": "default", "bodies": [b"x" * 100]}

            async def append() -> None:
                codes.append((await conn.call(request, timeout_s=10))["code"])

            async with trio.open_nursery() as appends:
                for _ in range(in_flight):
                    appends.start_soon(append)
        assert codes == [Code.SUCCESS] * in_flight
        mine = [on_loop for member, on_loop in calls if member == leader.config.self_id]
        assert len(mine) < in_flight / 2, f"{len(mine)} fsyncs for {in_flight} appends"
        assert sum(mine) <= 2, f"{sum(mine)} of the leader's {len(mine)} fsyncs on its loop"
        nursery.cancel_scope.cancel()


# leaderSlowFsyncMs in the test below: over a real fsync's p99 on a busy shared machine
SLOW_FSYNC_MS = 30
SLOW_WINDOW_MS = 1500  # leaderSlowFsyncWindowMs: room for MIN_FSYNCS of 3 x SLOW_FSYNC_MS


@pytest.mark.slow
async def test_a_leader_with_slow_fsyncs_hands_over_to_a_member_with_quick_ones(
    tmp_path, monkeypatch
):
    """Three members, appends back to back. The leader's fsyncs made slow (3x the
    bound): it hands over to a follower within a window and a check. Then the new
    leader's too: it hands over to the third member, not back to the first, whose
    heartbeat answers say its own fsyncs are still slow; and nobody moves after that
    (no flapping). Prints the append latency under a slow leader and after."""
    base = str(tmp_path)
    slow: set[str] = set()
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        if _member_of(fd, base) in slow:
            time.sleep(3 * SLOW_FSYNC_MS / 1000)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    peers = ";".join(f"n{i}-127.0.0.1:{port}" for i, port in enumerate(free_ports(3)))
    keys = [f"leaderSlowFsyncMs={SLOW_FSYNC_MS}", f"leaderSlowFsyncWindowMs={SLOW_WINDOW_MS}"]
    servers = []
    took: list[tuple[str, float]] = []  # (what was slow, append latency in s)

    def leader() -> str | None:
        leaders = [s.config.self_id for s in servers if s.replica.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    async with trio.open_nursery() as nursery:
        servers += await three_servers(nursery, peers, base, keys)
        async with DLedgerClient("default", parse_peers(peers)) as client:

            async def appends() -> None:
                while True:
                    now_leader = leader()
                    what = "leader " + ("slow" if now_leader in slow else "quick")
                    what += f", {len(slow - {now_leader})} follower(s) slow"
                    started = time.perf_counter()
                    await client.append([b"x" * 100])
                    took.append((what, time.perf_counter() - started))

            async with trio.open_nursery() as load:
                load.start_soon(appends)
                await trio.sleep(SLOW_WINDOW_MS / 1000)  # with every fsync quick
                await wait_for(lambda: leader() is not None)
                first = leader()
                slow.add(first)
                await wait_for(lambda: leader() not in (None, first), timeout_s=10)
                second = leader()
                await trio.sleep(SLOW_WINDOW_MS / 1000)  # a slow follower only
                assert leader() == second
                slow.add(second)
                (third,) = {s.config.self_id for s in servers} - {first, second}
                seen = set()

                def moved_on() -> bool:
                    seen.add(leader())
                    return leader() not in (None, second)

                await wait_for(moved_on, timeout_s=10)
                assert leader() == third and first not in seen, (leader(), seen)
                await trio.sleep(2 * SLOW_WINDOW_MS / 1000)  # two windows: it stays
                assert leader() == third
                load.cancel_scope.cancel()
        for what in sorted({w for w, _ in took}):
            ms = sorted(t * 1000 for w, t in took if w == what)
            print(f"{what}: {len(ms)} appends, median {ms[len(ms) // 2]:.2f} ms")
        nursery.cancel_scope.cancel()


def _fsyncs(cluster: SimCluster, slow: set[str], span_ms: float) -> None:
    """Run the simulated group for `span_ms`, each member reporting an fsync of its own
    every 20 ms: 3 x leaderSlowFsyncMs for those in `slow`, 1 ms for the others."""
    for _ in range(int(span_ms // 20)):
        cluster.run_until(cluster.now_ms + 20)
        for node_id, node in cluster.nodes.items():
            took_ms = 3 * SLOW_FSYNC_MS if node_id in slow else 1
            node.replica.fsync_took(took_ms, cluster.now_ms)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_in_simulation_a_slow_leader_hands_over_to_the_quick_member_and_stays_off(seed):
    """The rule alone, on simulated time: the leader and one follower slow, the leader
    hands over to the other follower within a window and two checks, never to the slow
    one; a member slow but not leading stays a follower, and refuses to take over when
    asked (an operator's or the balancer's transfer); with leaderSlowFsyncMs=0 nobody
    moves."""
    for bound_ms in (0, SLOW_FSYNC_MS):
        cluster = cluster_of(
            3, seed, leader_slow_fsync_ms=bound_ms, leader_slow_fsync_window_ms=SLOW_WINDOW_MS
        )
        cluster.run_until_leader(settle_ms=300)
        first = cluster.leader().id
        slow_follower = min(n for n in cluster.ids if n != first)
        (quick,) = set(cluster.ids) - {first, slow_follower}
        leaders = set()
        for _ in range(int(4 * SLOW_WINDOW_MS // 100)):
            _fsyncs(cluster, {first, slow_follower}, 100)
            leaders.add(cluster.leader().id)
        assert cluster.leader().id == (quick if bound_ms else first)
        assert slow_follower not in leaders
        leader = cluster.leader()
        assert leader.replica.transfer_leadership(ADMIN, slow_follower, cluster.now_ms) is (
            Code.SUCCESS
        )
        cluster._drain(leader)
        _fsyncs(cluster, {first, slow_follower}, 1000)
        taken = Code.TAKE_LEADERSHIP_FAILED if bound_ms else Code.SUCCESS
        assert cluster.admin[ADMIN] is taken
