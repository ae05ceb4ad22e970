"""Benchmark of a 3-process DLedger group on loopback, fsync before every acknowledgment.

For each payload size it measures, against real `dledger server` processes:
- committed appends/s with many appends in flight (one entry per request, pipelined
  on a few connections), and the same with 32-entry batch requests;
- p50/p99 commit latency at that load and, open-loop, at half of it;
- single-appender latency (one request in flight);
- kill -9 of the leader -> first committed append at the new leader, median of trials.

The load generator runs in this process and competes with the three replicas for the
machine's cores, as the peers' generators did when they were measured.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import statistics
import tempfile
import time

import trio

from bench import cpu
from bench.rss import peak_rss_mib
from raftmq.dledger.codes import Code
from raftmq.dledger.net.codec import RpcCode, decode_rpc, encode_rpc
from raftmq.dledger.net.frames import HEADER, HEADER_SIZE, RPC, pack_frame
from raftmq.dledger.net.rpc_client import RpcClient
from raftmq.streams.address import parse_address
from raftmq.tools.dledger_local import LocalGroup

SYSTEM = "raftmq dledger (fsync)"
CONNECTIONS = 4  # the open-loop load's


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _closed_loop(
    address: str, group: str, body: bytes, window: int, batch: int, duration_s: float
) -> tuple[float, list[float]]:
    """`window` requests of `batch` entries always in flight on one connection; returns
    (entries/s, latencies ms of the requests answered within `duration_s`).

    The generator is built as the peer's is (`peer_pysyncobj._windowed_load`): a plain
    blocking socket, the window refilled with one `sendall` after each chunk received.
    An event loop's wake-up and task switch would be a third of a single append's
    latency (measured: the trio client's p50 is ~0.1 ms above this one's) and would
    be the generator's cost, not the log's. Blocking: run it in a thread.
    """
    host, port = parse_address(address)
    latencies: list[float] = []
    sent: dict[int, float] = {}
    opaque = 0
    bodies = [body] * batch

    def submit(count: int) -> None:
        nonlocal opaque
        frames = []
        for _ in range(count):
            opaque += 1
            payload = encode_rpc(
                {"code": RpcCode.APPEND, "group": group, "bodies": bodies, "opaque": opaque}
            )
            frames.append(pack_frame(RPC, payload))
        started = time.perf_counter()
        for n in range(opaque - count + 1, opaque + 1):
            sent[n] = started
        sock.sendall(b"".join(frames))

    with socket.create_connection((host, port), timeout=10.0) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        began = time.perf_counter()
        stop_at = began + duration_s
        submit(window)
        while sent:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"{address} closed the connection")
            now = time.perf_counter()
            buf += chunk
            pos, answered = 0, 0
            while len(buf) - pos >= HEADER_SIZE:
                length, _channel = HEADER.unpack_from(buf, pos)
                if len(buf) - pos - HEADER_SIZE < length:
                    break
                response = decode_rpc(bytes(buf[pos + HEADER_SIZE : pos + HEADER_SIZE + length]))
                pos += HEADER_SIZE + length
                started = sent.pop(response["opaque"], None)
                if started is None:
                    continue
                answered += 1
                if response["code"] == Code.SUCCESS and now <= stop_at:
                    latencies.append((now - started) * 1000.0)
            del buf[:pos]
            if answered and now < stop_at:
                submit(answered)
    return len(latencies) * batch / duration_s, latencies


async def _open_loop(address: str, group: str, body: bytes, rate_per_s: float, duration_s: float):
    """Requests issued on a fixed schedule regardless of answers; returns latencies ms."""
    latencies: list[float] = []
    request = {"code": RpcCode.APPEND, "group": group, "bodies": [body]}
    tick_s = 0.002
    per_tick = rate_per_s * tick_s

    async def one(conn: RpcClient) -> None:
        t0 = trio.current_time()
        resp = await conn.call(request, timeout_s=10)
        if resp["code"] == Code.SUCCESS:
            latencies.append((trio.current_time() - t0) * 1000.0)

    async with trio.open_nursery() as nursery:
        conns = [await _open(nursery, address) for _ in range(CONNECTIONS)]
        async with trio.open_nursery() as calls:
            start = trio.current_time()
            issued = 0
            n = 0
            while trio.current_time() < start + duration_s:
                due = (trio.current_time() - start) / tick_s * per_tick
                while issued < due:
                    calls.start_soon(one, conns[n % CONNECTIONS])
                    issued += 1
                    n += 1
                await trio.sleep(tick_s)
        nursery.cancel_scope.cancel()
    return latencies


async def _open(nursery: trio.Nursery, address: str) -> RpcClient:
    async def hold(task_status=trio.TASK_STATUS_IGNORED):
        async with RpcClient(address) as conn:
            task_status.started(conn)
            await trio.sleep_forever()

    return await nursery.start(hold)


async def _failover_trials(group: LocalGroup, trials: int) -> list[float]:
    results = []
    async with group.client(timeout_s=10) as client:
        for _ in range(trials):
            leader = await group.wait_for_leader(client)
            old = leader["selfId"]
            await client.append([b"warm"])
            await trio.sleep(0.3)
            killed_at = trio.current_time()
            group.kill(old, signal.SIGKILL)
            async with group.client(timeout_s=10) as probe:
                await probe.append([b"after-kill"])
            results.append((trio.current_time() - killed_at) * 1000.0)
            group.start(old)
            # the next trial needs two live, caught-up members besides the leader it kills
            if not await group.caught_up(client, old, timeout_s=60.0):
                raise RuntimeError(f"{old} did not catch up after its restart")
    return results


async def measure(payload: int, duration_s: float, window: int, failover_trials: int) -> dict:
    body = os.urandom(payload)  # incompressible, as the peer's payloads are
    with tempfile.TemporaryDirectory(prefix="bench-dledger-") as tmp:
        async with LocalGroup(tmp, 3, group="bench") as group:
            async with group.client() as client:
                leader = await group.wait_for_leader(client)
            address = group.peers[leader["selfId"]]
            term_before = leader["term"]
            closed_loop = functools.partial(trio.to_thread.run_sync, _closed_loop, address, "bench")
            await closed_loop(body, 64, 1, 1.0)  # warm up
            roles = {"leader": group.pid(leader["selfId"]), "generator": os.getpid()}
            roles |= {f"follower {n}": group.pid(n) for n in group.ids if n != leader["selfId"]}
            meter = cpu.CpuMeter(roles)
            rate, full = await closed_loop(body, window, 1, duration_s)
            cpu_figures = meter.per_message_us(len(full))
            batch_rate, _ = await closed_loop(body, window // 8 or 1, 32, duration_s)
            half = await _open_loop(address, "bench", body, rate / 2, duration_s)
            _, single = await closed_loop(body, 1, 1, min(duration_s, 5.0))
            async with group.client() as client:
                term_after = (await group.wait_for_leader(client))["term"]
            rss = [peak_rss_mib(group.pid(n)) for n in group.ids]
            failovers = await _failover_trials(group, failover_trials) if failover_trials else []
    return {
        "system": SYSTEM,
        "payload": payload,
        "appends_per_s": round(rate),
        "batched_appends_per_s": round(batch_rate),
        "p50_ms": round(percentile(full, 0.5), 2),
        "p99_ms": round(percentile(full, 0.99), 2),
        "half_load_p50_ms": round(percentile(half, 0.5), 2),
        "half_load_p99_ms": round(percentile(half, 0.99), 2),
        "single_p50_ms": round(percentile(single, 0.5), 3),
        "failover_ms": round(statistics.median(failovers)) if failovers else None,
        "failover_trials_ms": [round(f) for f in failovers],
        "peak_rss_mib": max((r for r in rss if r is not None), default=None),
        **cpu.columns(cpu_figures),
        "window": window,
        "elections_during_load": term_after - term_before,
    }
