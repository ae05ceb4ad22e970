"""Benchmark of a name server + 3-broker DLedger group on loopback, fsync before every ack.

For each message size, against real `mqnamesrv` and `mqbroker` processes:
- produce -> ack: SEND_MESSAGE_V2 requests, `window` in flight over a few connections,
  one message each (the pipelined individual sends of the issue's target), with
  p50/p99 ack latency;
- produce -> consume: the same load again while one long-polling puller per queue
  reads from the master; the rate it consumes, the p50/p99 of (consumed - born) time
  and the rate acknowledged meanwhile (the first phase has no consumer, as NATS's run
  has none, so the two rows measure the same work);
- kill -9 of the master -> first acknowledged send at the new master (the probe sends
  to every live member every 5 ms, as a client that refreshes its route at once
  would), median of trials.

The load generator speaks the remoting protocol directly (no client library in the
measurement), on the same two cores as the three brokers. It is Go
(`bench/remoting_pub`, built as NATS's publisher is in the same run) wherever Debian's
Go toolchain can be had, so that the generators' CPU is comparable; else the same
pipelined generator in Python, in this process. Each row names the generator that ran,
and CPU per message is counted per role: master, followers, name server, generator and
(with the Go generator) this process, which runs the pullers.
"""

from __future__ import annotations

import json
import os
import statistics
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass

import trio

from bench import cpu, gotools
from bench.dledger_bench import percentile
from bench.rss import peak_rss_mib
from raftmq.config.address import parse_address
from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import (
    LanguageCode,
    RemotingClient,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)
from raftmq.remoting.codec import encode_header
from raftmq.tools.broker_local import LocalCluster

TOPIC = "BenchTopic"
QUEUES = 8
SYSTEM = "raftmq broker R3 (SYNC_FLUSH, fsync on a quorum)"
CONNECTIONS = 4
GO = "go"
PYTHON = "python"
GO_GENERATOR = gotools.GoTool("remoting_pub")
_BORN = struct.Struct(">d")
_FRAME = struct.Struct(">II")  # length, serialize type << 24 | header length


@dataclass(frozen=True)
class Spread:
    """Where a load's messages go, each to the next in turn: queues 0 .. `queues` - 1 of
    `topic`, or of each of `topics` topics named `topic`-0 ... (the Go generator's
    -topic, -topics and -queues)."""

    topic: str = TOPIC
    topics: int = 1
    queues: int = QUEUES

    def names(self) -> list[str]:
        assert self.topics >= 1 and self.queues >= 1, self
        if self.topics == 1:
            return [self.topic]
        return [f"{self.topic}-{k}" for k in range(self.topics)]


SPREAD = Spread()


def _send_request(queue_id: int, body: bytes, topic: str = TOPIC) -> RemotingCommand:
    """A SEND_MESSAGE_V2 request as a RocketMQ 4.9 Java producer sends one message, with
    no properties (NATS's publishes carry no headers); the same header as the Go
    generator's (bench/remoting_pub)."""
    ext = send_header_v2("BENCH_PG", topic, queue_id, born_timestamp_ms=int(time.time() * 1000))
    return RemotingCommand(
        code=RequestCode.SEND_MESSAGE_V2,
        language=LanguageCode.JAVA,
        ext_fields=ext,
        body=body,
    )


async def _produce(
    address: str, size: int, window: int, duration_s: float, spread: Spread = SPREAD
) -> tuple:
    """Closed loop: `window` sends always in flight, over the queues of `spread` in turn;
    returns (acked/s, latencies ms, errors).

    Pipelined like NATS's Go publisher in the same run: each connection writes its
    share of the window at once and answers every response with a new request in
    the same write, and it only parses what it needs (the code and opaque), so the
    generator's own CPU, on the cores the brokers use, stays small. A request is
    the same SEND_MESSAGE_V2 frame a RocketMQ client sends, its header encoded once."""
    host, port = parse_address(address)
    padding = os.urandom(max(0, size - _BORN.size))
    latencies: list[float] = []
    errors = [0]
    shares = [window // CONNECTIONS + (k < window % CONNECTIONS) for k in range(CONNECTIONS)]
    deadline = trio.current_time() + duration_s

    async def connection(share: int, first: int) -> None:
        headers = [
            _header_template(queue_id, topic)
            for topic in spread.names()
            for queue_id in range(spread.queues)
        ]
        sent_at: dict[int, float] = {}
        next_opaque = [first * len(headers) // CONNECTIONS]  # connections start apart

        def requests(count: int) -> bytes:
            frames = []
            now = trio.current_time()
            for _ in range(count):
                opaque = next_opaque[0] = next_opaque[0] + 1
                before, after = headers[opaque % len(headers)]
                header = b"%s%d%s" % (before, opaque, after)
                body = _BORN.pack(time.time()) + padding
                frames += (_FRAME.pack(4 + len(header) + len(body), len(header)), header, body)
                sent_at[opaque] = now
            return b"".join(frames)

        async with await trio.open_tcp_stream(host, port) as stream:
            await stream.send_all(requests(share))
            buffer = bytearray()
            while sent_at:
                data = await stream.receive_some(1 << 16)
                if not data:
                    raise OSError("the broker closed the connection")
                buffer += data
                answered, used = 0, 0
                now = trio.current_time()
                while len(buffer) - used >= 8:
                    length, header_length = _FRAME.unpack_from(buffer, used)
                    if len(buffer) - used < 4 + length:
                        break
                    start = used + 8
                    header = json.loads(buffer[start : start + (header_length & 0xFFFFFF)])
                    used += 4 + length
                    started = sent_at.pop(header["opaque"])
                    if header["code"] == ResponseCode.SUCCESS:
                        latencies.append((now - started) * 1000.0)
                    else:
                        errors[0] += 1
                    answered += 1
                del buffer[:used]
                if answered and now < deadline:
                    await stream.send_all(requests(answered))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for k, share in enumerate(shares):
            if share:
                nursery.start_soon(connection, share, k)
    return len(latencies) / (trio.current_time() - start), latencies, errors[0]


def _header_template(queue_id: int, topic: str = TOPIC) -> tuple[bytes, bytes]:
    """A SEND_MESSAGE_V2 request's JSON header, split where its opaque goes."""
    request = _send_request(queue_id, b"", topic)
    request.opaque = 0
    header = encode_header(request)
    before, marker, after = header.partition(b'"opaque":0')
    assert marker, header
    return before + b'"opaque":', after


async def _hold(client: RemotingClient, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with client:
        task_status.started()
        await trio.sleep_forever()


async def _consume(address: str, stop: trio.Event, results: dict) -> None:
    """One long-polling puller per queue from its end until `stop`; end-to-end latency."""
    delays: list[float] = []
    count = [0]

    async def puller(client: RemotingClient, queue_id: int) -> None:
        ext = {"topic": TOPIC, "queueId": queue_id}
        request = RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=ext)
        offset = int((await client.invoke(request, 10.0)).ext_fields["offset"])  # skip warm-up
        while not stop.is_set():
            ext = {
                "consumerGroup": "BENCH_CG", "topic": TOPIC, "queueId": queue_id,
                "queueOffset": offset, "maxMsgNums": 32, "sysFlag": 2, "commitOffset": 0,
                "suspendTimeoutMillis": 1000, "subscription": "*", "subVersion": 0,
            }  # fmt: skip
            request = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=ext)
            response = await client.invoke(request, 10.0)
            offset = int(response.ext_fields.get("nextBeginOffset", offset))
            if response.code == ResponseCode.SUCCESS:
                now = time.time()
                for born in _born_times(response.body):
                    delays.append((now - born) * 1000.0)
                    count[0] += 1

    start = trio.current_time()
    async with RemotingClient(address) as client, trio.open_nursery() as nursery:
        for queue_id in range(QUEUES):
            nursery.start_soon(puller, client, queue_id)
        await stop.wait()
        nursery.cancel_scope.cancel()
    results["consumed_per_s"] = count[0] / (trio.current_time() - start)
    results["e2e_p50_ms"] = percentile(delays, 0.5)
    results["e2e_p99_ms"] = percentile(delays, 0.99)


def _born_times(body: bytes):
    """The born time each benchmark message carries first in its body (records walked raw)."""
    from raftmq.protocol import message as codec

    for msg in codec.decode_all(body):
        yield _BORN.unpack_from(msg.body)[0]


async def _failover_trials(cluster: LocalCluster, trials: int) -> list[float]:
    results = []
    for _ in range(trials):
        master = await cluster.wait_master()
        killed_at = trio.current_time()
        cluster.kill(master)
        done = trio.Event()

        async def probe(node: str, done=done, killed_at=killed_at) -> None:
            try:
                async with RemotingClient(cluster.broker_addrs[node]) as client:
                    while not done.is_set():
                        response = await client.invoke(_send_request(0, b"probe"), 2.0)
                        if response.code == ResponseCode.SUCCESS and not done.is_set():
                            results.append((trio.current_time() - killed_at) * 1000.0)
                            done.set()
                        await trio.sleep(0.005)
            except OSError:
                pass

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for node in cluster.ids:
                    if node != master:
                        nursery.start_soon(probe, node)
                await done.wait()
                nursery.cancel_scope.cancel()
        await cluster.restart(master)
        await cluster.wait_caught_up()
    return results


def generators(choice: str) -> tuple[list[str], str | None]:
    """The generators a run measures with (GO, PYTHON or both, in that order) and, when
    "auto" fell back to Python, why.  "auto" installs and builds Go's generator if it can."""
    assert choice in ("auto", GO, PYTHON, "both"), choice
    if choice == "auto":
        try:
            GO_GENERATOR.ensure()
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            return [PYTHON], f"the Go generator could not be built ({exc})"
        return [GO], None
    return ([GO, PYTHON] if choice == "both" else [choice]), None


async def measure(
    size: int, duration_s: float, window: int, failover_trials: int, generator: str = GO
) -> dict:
    """One row: a load phase with `generator` (GO or PYTHON), the same load again while
    the pullers consume, a single-send phase with the same generator, RSS, then
    `failover_trials` kills."""
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        async with LocalCluster(tmp) as cluster:
            await cluster.create_topic(TOPIC, QUEUES)
            master = await cluster.wait_master()
            address = cluster.broker_addrs[master]
            roles = _roles(cluster, master)
            await _sends(generator, address, size, 16, 1.0)  # warm up, before the pullers
            # Sends alone, as the NATS row measures its publisher: acked/s, latency, CPU.
            load, cpu_figures = await _load(generator, roles, address, size, window, duration_s)
            stop = trio.Event()
            consumed: dict = {}
            async with trio.open_nursery() as nursery:  # the same load, consumed meanwhile
                nursery.start_soon(_consume, address, stop, consumed)
                consuming, consuming_cpu = await _load(
                    generator, roles, address, size, window, duration_s
                )
                stop.set()
            consumed["acked_consuming_per_s"] = consuming["acked_per_s"]
            single = await _sends(generator, address, size, 1, min(duration_s, 3.0))
            rss = [peak_rss_mib(cluster.pid(node)) for node in cluster.ids]
            failovers = await _failover_trials(cluster, failover_trials)
    if generator == GO:
        notes = (
            f"load from the Go generator (bench/remoting_pub, {CONNECTIONS} connections); "
            "consumed/s, e2e and the puller CPU from a second load phase while this "
            "process pulls from the master"
        )
    else:
        notes = (
            f"load from the Python generator in this process ({CONNECTIONS} connections); "
            "consumed/s and e2e from a second load phase while this process also pulls"
        )
    notes += f"; single-send rate {single['acked_per_s']:.0f}/s"
    if load.get("first_error"):
        notes += f"; first error: {load['first_error']}"
    return {
        "system": SYSTEM,
        "generator": generator,
        "size": size,
        "window": window,
        "acked_per_s": load["acked_per_s"],
        "p50_ms": load["p50_ms"],
        "p99_ms": load["p99_ms"],
        "errors": load["errors"],
        "single_p50_ms": single["p50_ms"],
        **consumed,
        "failover_ms": statistics.median(failovers) if failovers else None,
        "failover_trials_ms": [round(f) for f in failovers],
        "peak_rss_mib": max((r for r in rss if r is not None), default=None),
        **cpu.columns(cpu_figures),
        "cpu_puller_us": consuming_cpu.get("puller"),
        "notes": notes,
    }


async def _load(generator: str, roles: dict[str, int], *run) -> tuple[dict, dict[str, float]]:
    """A measured load phase from `generator`: its figures, and CPU per message per role."""
    if generator == GO:
        return await trio.to_thread.run_sync(_go_load, *run, roles)
    return await _python_load(roles, *run)


async def _python_load(roles: dict[str, int], *run) -> tuple[dict, dict[str, float]]:
    """The load phase from this process (`_python_run(*run)`): its figures, and CPU per
    message per role."""
    meter = cpu.CpuMeter({**roles, "generator": os.getpid()})
    load = await _python_run(*run)
    return load, meter.per_message_us(load["acked"])


async def _python_run(
    address: str, size: int, window: int, duration_s: float, spread: Spread = SPREAD
) -> dict:
    """`_produce`'s figures under the names the Go generator prints."""
    rate, latencies, errors = await _produce(address, size, window, duration_s, spread)
    return {
        "acked": len(latencies),
        "acked_per_s": rate,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "errors": errors,
    }


async def _sends(
    generator: str,
    address: str,
    size: int,
    window: int,
    duration_s: float,
    spread: Spread = SPREAD,
) -> dict:
    """`window` sends in flight from `generator` (GO or PYTHON), CPU not measured: the
    warm-up, and the single-send phase (window 1)."""
    if generator == GO:
        return await trio.to_thread.run_sync(_go_run, address, size, window, duration_s, spread)
    return await _python_run(address, size, window, duration_s, spread)


def _go_load(
    address: str,
    size: int,
    window: int,
    duration_s: float,
    roles: dict[str, int],
    spread: Spread = SPREAD,
) -> tuple[dict, dict[str, float]]:
    """The load phase from the Go generator (run in a thread while the pullers run in
    this process): its figures, and CPU per message per role over its measured window."""
    warmup_s = _go_warmup_s(duration_s)
    meters: list[cpu.CpuMeter] = []

    def measure_window(generator_pid: int) -> None:
        # The generator's warm-up and window start when it starts, give or take its
        # connection set-up (milliseconds).
        meter = cpu.CpuMeter({**roles, "generator": generator_pid, "puller": os.getpid()})
        time.sleep(warmup_s)
        meter.restart()
        time.sleep(duration_s)
        meter.stop()
        meters.append(meter)

    load = _go_run(address, size, window, duration_s, spread, during=measure_window)
    return load, meters[0].per_message_us(int(load["acked"]))


def _go_run(
    address: str,
    size: int,
    window: int,
    duration_s: float,
    spread: Spread = SPREAD,
    during=None,
) -> dict:
    """Run the Go generator once; the JSON it prints (acked, acked_per_s, errors,
    first_error, p50_ms, p99_ms, max_ms)."""
    warmup_s = _go_warmup_s(duration_s)
    args = [
        f"-addr={address}",
        f"-topic={spread.topic}",
        f"-topics={spread.topics}",
        f"-queues={spread.queues}",
        f"-size={size}",
        f"-window={window}",
        f"-conns={CONNECTIONS}",
        f"-warmup={warmup_s}s",
        f"-duration={duration_s}s",
    ]
    return GO_GENERATOR.run(args, timeout_s=warmup_s + duration_s + 60.0, during=during)


def _go_warmup_s(duration_s: float) -> float:
    """As NATS's publisher: a short warm-up, so connection set-up does not dilute the rate."""
    return min(1.0, max(0.2, duration_s * 0.2))


def _roles(cluster: LocalCluster, master: str) -> dict[str, int]:
    """The group's processes whose CPU a message costs: its members, and the name server
    (idle under load, so its figure shows what registration costs)."""
    roles = {"leader": cluster.pid(master), "namesrv": cluster.pid("namesrv")}
    for node in cluster.ids:
        if node != master:
            roles[f"follower {node}"] = cluster.pid(node)
    return roles
