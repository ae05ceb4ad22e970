"""Benchmark of a 3-process DLedger group on loopback, fsync before every acknowledgment.

For each payload size it measures, against real `dledger server` processes:
- committed appends/s with many appends in flight (one entry per request, pipelined
  on one connection), and the same with 32-entry batch requests;
- p50/p99 commit latency at that load and, open-loop, at half of it;
- single-appender latency (one request in flight);
- kill -9 of the leader -> first committed append at the new leader, median of trials.

The load generator runs in this process and competes with the three replicas for the
machine's cores, as the peers' generators did when they were measured.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import statistics
import tempfile
import threading
import time

import trio
from raftmq.dledger.codes import Code
from raftmq.dledger.net.codec import RpcCode, decode_rpc, encode_rpc
from raftmq.dledger.net.frames import RPC, FrameSplitter, pack_frame

from bench import cpu
from bench.rss import peak_rss_mib
from raftmq.config.address import parse_address
from raftmq.tools.dledger_local import LocalGroup

SYSTEM = "raftmq dledger (fsync)"
OPEN_LOOP_TICK_S = 0.001


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Appender:
    """A plain blocking connection to the leader issuing APPEND requests, built as the
    peer's generator is (`peer_pysyncobj._windowed_load`): pipelined requests, one
    `sendall` per batch of them, answers parsed per chunk received.

    Not the trio client: its wake-up and task switch per answer were ~0.1 ms of a
    single append's latency and 21 µs of CPU per append against 9 here — the
    generator's cost, not the log's. Blocking, so each load runs in a thread.
    """

    def __init__(self, address: str, group: str, body: bytes, batch: int) -> None:
        host, port = parse_address(address)
        self.address = address
        self.sock = socket.create_connection((host, port), timeout=10.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.group = group
        self.bodies = [body] * batch
        self.sent: dict[int, float] = {}  # opaque -> perf_counter when sent
        self._opaque = 0
        self._frames = FrameSplitter()

    def submit(self, count: int) -> None:
        frames = []
        for _ in range(count):
            self._opaque += 1
            request = {"code": RpcCode.APPEND, "group": self.group, "bodies": self.bodies}
            frames.append(pack_frame(RPC, encode_rpc({**request, "opaque": self._opaque})))
        started = time.perf_counter()
        for opaque in range(self._opaque - count + 1, self._opaque + 1):
            self.sent[opaque] = started
        self.sock.sendall(b"".join(frames))

    def answers(self) -> tuple[float, list[tuple[float, int]]]:
        """Block for the next chunk: (when it arrived, [(seconds since sent, code)])."""
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"{self.address} closed the connection")
        now = time.perf_counter()
        answered = []
        for _channel, payload in self._frames.feed(chunk):
            response = decode_rpc(payload)
            started = self.sent.pop(response["opaque"], None)
            if started is not None:
                answered.append((now - started, response["code"]))
        return now, answered

    def close(self) -> None:
        self.sock.close()


def _closed_loop(
    address: str, group: str, body: bytes, window: int, batch: int, duration_s: float
) -> tuple[float, list[float]]:
    """`window` requests of `batch` entries always in flight on one connection, the
    window refilled after each chunk received; returns (entries/s, latencies ms of
    the requests answered within `duration_s`)."""
    appender = _Appender(address, group, body, batch)
    latencies: list[float] = []
    try:
        stop_at = time.perf_counter() + duration_s
        appender.submit(window)
        while appender.sent:
            now, answered = appender.answers()
            if now <= stop_at:
                latencies += [took * 1000.0 for took, code in answered if code == Code.SUCCESS]
                if answered:
                    appender.submit(len(answered))
    finally:
        appender.close()
    return len(latencies) * batch / duration_s, latencies


def _open_loop(
    address: str, group: str, body: bytes, rate_per_s: float, duration_s: float
) -> list[float]:
    """Requests issued on a fixed schedule whatever the answers (so a stall shows in
    the latencies instead of slowing the load); returns latencies ms. The answers are
    read on a second thread."""
    appender = _Appender(address, group, body, 1)
    latencies: list[float] = []

    def read_answers() -> None:
        with contextlib.suppress(OSError):  # the socket shut down once all are answered
            while True:
                _, answered = appender.answers()
                latencies.extend(took * 1000.0 for took, code in answered if code == Code.SUCCESS)

    reader = threading.Thread(target=read_answers, daemon=True)
    try:
        reader.start()
        began = time.perf_counter()
        issued = 0
        while (elapsed_s := time.perf_counter() - began) < duration_s:
            due = int(elapsed_s * rate_per_s)
            if due > issued:
                appender.submit(due - issued)
                issued = due
            time.sleep(OPEN_LOOP_TICK_S)
        drained_by = time.perf_counter() + 30.0
        while appender.sent and time.perf_counter() < drained_by:
            time.sleep(OPEN_LOOP_TICK_S)
        appender.sock.shutdown(socket.SHUT_RDWR)
        reader.join()
    finally:
        appender.close()
    return latencies


async def _failover_trials(group: LocalGroup, trials: int) -> list[float]:
    """Kill the leader `trials` times; the ms until the group appends again. The killed
    member is restarted and caught up before the next kill only."""
    results = []
    async with group.client(timeout_s=10) as client:
        for trial in range(trials):
            leader = await group.wait_for_leader(client)
            old = leader["selfId"]
            await client.append([b"warm"])
            await trio.sleep(0.3)
            killed_at = trio.current_time()
            group.kill(old, signal.SIGKILL)
            async with group.client(timeout_s=10) as probe:
                await probe.append([b"after-kill"])
            results.append((trio.current_time() - killed_at) * 1000.0)
            if trial == trials - 1:
                break
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
            half = await trio.to_thread.run_sync(
                _open_loop, address, "bench", body, rate / 2, duration_s
            )
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
