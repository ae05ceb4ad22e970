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

import trio
from raftmq.dledger import cli as dledger_cli
from raftmq.dledger.client import DLedgerClient
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.group_commit import INLINE_FSYNC_MAX_ENTRIES, INLINE_FSYNC_MAX_S
from raftmq.dledger.net.codec import RpcCode
from raftmq.dledger.net.rpc_client import RpcClient
from raftmq.dledger.server import DLedgerServer

from raftmq.client.producer import encode_batch
from raftmq.config.address import parse_peers
from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import RequestCode, ResponseCode
from raftmq.tools.dledger_local import LOCAL_SEGMENT_ARGS, free_ports
from tests.helpers import create_topic, group, wait_for


def _member_of(fd: int, base: str) -> str | None:
    """The member (n0, n1, ...) whose data file `fd` is, if it is one of the test's."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if not path.startswith(base) or "dledger" not in path:
        return None
    return path[len(base) :].lstrip("/").split("/", 1)[0]


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
    servers = []
    async with trio.open_nursery() as nursery:
        for i in range(3):
            args = ["server", "-p", peers, "-i", f"n{i}", "-s", f"{base}/n{i}"]
            config = dledger_cli._server_config(
                dledger_cli._parser().parse_args([*args, *LOCAL_SEGMENT_ARGS])
            )
            servers.append(DLedgerServer(config))
            await nursery.start(servers[-1].serve)
        async with DLedgerClient("default", parse_peers(peers)) as client:
            with trio.fail_after(10):
                await client.append([b"elected"])
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
