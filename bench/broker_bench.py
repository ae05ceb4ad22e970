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

The same generator, unchanged, loads Apache RocketMQ's Java brokers and name server
(`JAVA_SYSTEMS`, started by bench/java_brokers.py as the tests start them): 4.9.7's
DLedger mode and 5.3.3's classic SYNC_MASTER + SLAVE, each with
flushDiskType=SYNC_FLUSH and with its defaults, and 5.3.3's controller mode, with the
same window, connections and warm-up (`measure`'s `system`). Every system gets the same
warm-up (WARMUP_S at the measured window), and a row per count of connections.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from bench import cpu, gotools
from bench.dledger_bench import percentile
from bench.java_brokers import (
    BENCH_PROFILE,
    PROXY_FLAGS,
    MixedClassicGroup,
    MixedControllerGroup,
    MixedDLedgerGroup,
    start_java_proxy,
)
from bench.javatools import SERVER5_POM
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
#: Every system's warm-up before its measured phases: this long at the measured window
#: (the Go generators warm up again at the start of each run: go_warmup_s). A JVM
#: compiles its hot paths in the first seconds: after 2 s, RocketMQ's DLedger rows were
#: still compiling in the first measured phase (flow-control refusals, a leader's CPU
#: per message 1.4-2.3x that of the next phase).
WARMUP_S = 10.0
# The single-send phase: one request in flight over one connection, for every system.
SINGLE_SEND_S = 3.0
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
    address: str,
    size: int,
    window: int,
    duration_s: float,
    spread: Spread = SPREAD,
    connections: int = CONNECTIONS,
) -> tuple:
    """Closed loop: `window` sends always in flight over `connections`, over the queues
    of `spread` in turn; returns (acked/s, latencies ms, errors).

    Pipelined like NATS's Go publisher in the same run: each connection writes its
    share of the window at once and answers every response with a new request in
    the same write, and it only parses what it needs (the code and opaque), so the
    generator's own CPU, on the cores the brokers use, stays small. A request is
    the same SEND_MESSAGE_V2 frame a RocketMQ client sends, its header encoded once."""
    host, port = parse_address(address)
    padding = os.urandom(max(0, size - _BORN.size))
    latencies: list[float] = []
    errors = [0]
    shares = [window // connections + (k < window % connections) for k in range(connections)]
    deadline = trio.current_time() + duration_s

    async def connection(share: int, first: int) -> None:
        headers = [
            _header_template(queue_id, topic)
            for topic in spread.names()
            for queue_id in range(spread.queues)
        ]
        sent_at: dict[int, float] = {}
        next_opaque = [first * len(headers) // connections]  # connections start apart

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
    """Kill the master `trials` times; the ms until a survivor acknowledges a send. The
    killed member is restarted and caught up before the next kill only (a JVM takes
    10-20 s to start again: after the last kill the group is torn down anyway)."""
    results = []
    for trial in range(trials):
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
        if trial < trials - 1:
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


@dataclass(frozen=True)
class System:
    """A system the remoting generator measures: its rows' name (what an acknowledgement
    means in it), how its group starts in a directory, whether this process pulls from
    it in a second load phase, and why it has no failover figure, if it has none."""

    name: str
    group: Callable[[str], LocalCluster]
    consume: bool = False
    no_failover: str | None = None


RAFTMQ = System(SYSTEM, LocalCluster, consume=True)


def _java_dledger(flush_disk_type: str) -> Callable[[str], LocalCluster]:
    """Apache RocketMQ's DLedger mode: three Java brokers and its name server."""
    return functools.partial(
        MixedDLedgerGroup, java={"n0", "n1", "n2"}, profile=BENCH_PROFILE,
        flush_disk_type=flush_disk_type, java_namesrv=True,
    )  # fmt: skip


def _java_classic(flush_disk_type: str) -> Callable[[str], LocalCluster]:
    """Apache RocketMQ 5.3's classic HA: a Java SYNC_MASTER, one Java SLAVE, its name
    server."""
    return functools.partial(
        MixedClassicGroup, java={"n0", "n1"}, slaves=1, master_role="SYNC_MASTER",
        profile=BENCH_PROFILE, flush_disk_type=flush_disk_type, java_namesrv=True,
        server_pom=SERVER5_POM,
    )  # fmt: skip


def _java_controller(base_dir: str) -> LocalCluster:
    """Apache RocketMQ 5.3's controller mode as its quick start runs it: two Java
    brokers (brokerId=-1, allAckInSyncStateSet=true), three Java controllers, its name
    server; RocketMQ's defaults otherwise (ASYNC_FLUSH)."""
    return MixedControllerGroup(
        base_dir, java={"n0", "n1"}, java_controllers=True, replicas=2,
        profile=BENCH_PROFILE, java_namesrv=True,
    )  # fmt: skip


ROCKETMQ = "Apache RocketMQ"
ROCKETMQ4 = f"{ROCKETMQ} 4.9.7"
ROCKETMQ5 = f"{ROCKETMQ} 5.3.3"
_CLASSIC_FAILOVER = "classic HA has no failover: a SLAVE never takes writes"
#: Apache RocketMQ's Java brokers, each labelled with what its acknowledgement means.
#: DLedger 0.3.1.2 acknowledges on a quorum's append to the page cache and flushes every
#: 10 ms; flushDiskType does not reach it (DLedgerCommitLog never takes the flush path).
#: A SYNC_MASTER acknowledges once its SLAVE has the bytes (in its page cache), and with
#: SYNC_FLUSH once its own fsync (group commit) is done too.
#: A controller-mode master with allAckInSyncStateSet acknowledges once every member of
#: the SyncStateSet has the bytes, which under ASYNC_FLUSH means their page caches.
JAVA_SYSTEMS = (
    System(
        f"{ROCKETMQ4} DLedger R3 SYNC_FLUSH (no effect: quorum page cache)",
        _java_dledger("SYNC_FLUSH"),
    ),
    System(
        f"{ROCKETMQ4} DLedger R3 defaults (ASYNC_FLUSH: quorum page cache)",
        _java_dledger("ASYNC_FLUSH"),
    ),
    System(
        f"{ROCKETMQ5} SYNC_MASTER+SLAVE SYNC_FLUSH (master fsync, slave page cache)",
        _java_classic("SYNC_FLUSH"),
        no_failover=_CLASSIC_FAILOVER,
    ),
    System(
        f"{ROCKETMQ5} SYNC_MASTER+SLAVE defaults (ASYNC_FLUSH: both page caches)",
        _java_classic("ASYNC_FLUSH"),
        no_failover=_CLASSIC_FAILOVER,
    ),
    System(
        f"{ROCKETMQ5} controller mode R2 defaults (ASYNC_FLUSH: both page caches)",
        _java_controller,
    ),
)
#: Each Java system's default election timing: DLedger's (reference dledger.md):
#: heartbeats every 2 s, a follower stands after 3 missed (6 s), then votes after
#: 300-1000 ms gaps; the controller's (controller.md): it elects as soon as a broker's
#: connection closes, a silent one after controllerHeartBeatTimeoutMills (10 s).
JAVA_ELECTION = {
    "DLedger": "DLedger defaults: 2 s heartbeats, a candidate after 6 s silent",
    "controller": "controller defaults: elected when the master's connection closes,"
    " or 10 s after its last heartbeat",
}


async def measure(
    size: int,
    duration_s: float,
    window: int,
    failover_trials: int,
    generator: str = GO,
    connections: Sequence[int] = (CONNECTIONS,),
    system: System = RAFTMQ,
    warmup_s: float = WARMUP_S,
) -> list[dict]:
    """A row per count of `connections`, of one group of `system` started for them all:
    after the warm-up every system gets (`warmup_s` at `window` over the first count), a
    load phase with `generator` (GO or PYTHON) over each count, with raftmq the same
    load again while the pullers consume, then a single-send phase with the same
    generator, RSS, and `failover_trials` kills."""
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        async with system.group(tmp) as cluster:
            await cluster.create_topic(TOPIC, QUEUES)
            master = await cluster.wait_master()
            address = cluster.broker_addrs[master]
            roles = _roles(cluster, master)
            # before the pullers, the same for every system
            await _sends(generator, address, size, window, warmup_s, connections=connections[0])
            phases = [
                await _phases(system, generator, roles, address, size, window, duration_s, n)
                for n in connections
            ]
            single = await _sends(generator, address, size, 1, min(duration_s, SINGLE_SEND_S))
            rss = [peak_rss_mib(cluster.pid(node)) for node in cluster.ids]
            trials = 0 if system.no_failover else failover_trials
            failovers = await _failover_trials(cluster, trials)
    rows = []
    for n, (load, cpu_figures, consumed, puller_us) in zip(connections, phases, strict=True):
        rows.append(
            {
                **_row(system.name, generator, size, window, load),
                "connections": n,
                "errors": load["errors"],
                "single_p50_ms": single["p50_ms"],
                **consumed,
                "failover_ms": statistics.median(failovers) if failovers else None,
                "failover_trials_ms": [round(f) for f in failovers],
                "peak_rss_mib": max((r for r in rss if r is not None), default=None),
                **cpu.columns(cpu_figures),
                "cpu_puller_us": puller_us,
                "notes": _notes(system, generator, n, load, single),
            }
        )
    return rows


async def _phases(
    system: System,
    generator: str,
    roles: dict[str, int],
    address: str,
    size: int,
    window: int,
    duration_s: float,
    connections: int,
) -> tuple[dict, dict[str, float], dict, float | None]:
    """The load phase over `connections` (sends alone, as the NATS row measures its
    publisher: acked/s, latency, CPU), and for a system that is pulled from the same
    load again while the pullers consume: consumed/s, e2e and the pullers' CPU."""
    run = (address, size, window, duration_s)
    load, cpu_figures = await _load(generator, roles, *run, connections=connections)
    if not system.consume:
        return load, cpu_figures, {}, None
    stop = trio.Event()
    consumed: dict = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_consume, address, stop, consumed)
        consuming, consuming_cpu = await _load(generator, roles, *run, connections=connections)
        stop.set()
    consumed["acked_consuming_per_s"] = consuming["acked_per_s"]
    return load, cpu_figures, consumed, consuming_cpu.get("puller")


def _notes(system: System, generator: str, connections: int, load: dict, single: dict) -> str:
    """What a row's figures came from."""
    if generator == GO:
        notes = f"load from the Go generator (bench/remoting_pub, connections: {connections})"
        if system.consume:
            notes += (
                "; consumed/s, e2e and the puller CPU from a second load phase while this "
                "process pulls from the master"
            )
    else:
        notes = f"load from the Python generator in this process (connections: {connections})"
        if system.consume:
            notes += "; consumed/s and e2e from a second load phase while this process also pulls"
    notes += f"; single-send rate {single['acked_per_s']:.0f}/s"
    if system in JAVA_SYSTEMS:
        notes += (
            f"; JVMs: each broker {_flags(BENCH_PROFILE.broker_flags)}, the name server "
            f"{_flags(BENCH_PROFILE.namesrv_flags)}; RocketMQ's default thread pools"
        )
    if system.no_failover:
        notes += f"; no failover figure: {system.no_failover}"
    elif system in JAVA_SYSTEMS:
        kind = "DLedger" if " DLedger " in system.name else "controller"
        notes += f"; failover with {JAVA_ELECTION[kind]}"
    if load.get("first_error"):
        notes += f"; {load['errors']} errors, the first: {load['first_error']}"
    return notes


def _flags(flags: Sequence[str]) -> str:
    """The sizing flags of a JVM (heap, direct memory, GC), for a row's notes."""
    return " ".join(f for f in flags if f.startswith(("-Xm", "-XX:Max", "-XX:+Use")))


def _row(system: str, generator: str, size: int, window: int, load: dict) -> dict:
    """A row's first columns: what ran and the sends' rate and latency."""
    return {
        "system": system,
        "generator": generator,
        "size": size,
        "window": window,
        "acked_per_s": load["acked_per_s"],
        "p50_ms": load["p50_ms"],
        "p99_ms": load["p99_ms"],
    }


async def _load(
    generator: str, roles: dict[str, int], *run, connections: int = CONNECTIONS
) -> tuple[dict, dict[str, float]]:
    """A measured load phase from `generator`: its figures, and CPU per message per role."""
    if generator == GO:
        return await trio.to_thread.run_sync(
            functools.partial(_go_load, *run, roles, connections=connections)
        )
    return await _python_load(roles, *run, connections=connections)


async def _python_load(
    roles: dict[str, int], *run, connections: int = CONNECTIONS
) -> tuple[dict, dict[str, float]]:
    """The load phase from this process (`_python_run(*run)`): its figures, and CPU per
    message per role."""
    meter = cpu.CpuMeter({**roles, "generator": os.getpid()})
    load = await _python_run(*run, connections=connections)
    return load, meter.per_message_us(load["acked"])


async def _python_run(*run, **options) -> dict:
    """`_produce(*run, **options)`'s figures under the names the Go generator prints."""
    rate, latencies, errors = await _produce(*run, **options)
    return {
        "acked": len(latencies),
        "acked_per_s": rate,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "errors": errors,
    }


async def _sends(generator: str, *run, connections: int = CONNECTIONS) -> dict:
    """Sends from `generator` (GO or PYTHON) as `_go_run(*run)` makes them (address,
    size, window, seconds, perhaps a spread) over `connections` (at most the window),
    CPU not measured: the warm-up, and the single-send phase (window 1)."""
    connections = min(connections, run[2])
    if generator == GO:
        return await trio.to_thread.run_sync(
            functools.partial(_go_run, *run, connections=connections)
        )
    return await _python_run(*run, connections=connections)


def _go_load(
    address: str,
    size: int,
    window: int,
    duration_s: float,
    roles: dict[str, int],
    spread: Spread = SPREAD,
    connections: int = CONNECTIONS,
) -> tuple[dict, dict[str, float]]:
    """The load phase from the Go generator (run in a thread while the pullers run in
    this process): its figures, and CPU per message per role over its measured window."""
    during, meters = _metered(
        duration_s,
        lambda pid: [cpu.CpuMeter({**roles, "generator": pid, "puller": os.getpid()})],
    )
    load = _go_run(
        address, size, window, duration_s, spread, connections=connections, during=during
    )
    return load, meters[0].per_message_us(int(load["acked"]))


def _metered(duration_s: float, meters_for) -> tuple:
    """A Go generator's `during`, and the list its meters land in: `meters_for(pid)`'s
    meters (CpuMeter, ThreadMeter), restarted after the generator's warm-up and stopped
    after its measured window. The warm-up and window start when the generator starts,
    give or take its connection set-up (milliseconds)."""
    meters: list = []

    def during(generator_pid: int) -> None:
        started = meters_for(generator_pid)
        time.sleep(go_warmup_s(duration_s))
        for meter in started:
            meter.restart()
        time.sleep(duration_s)
        for meter in started:
            meter.stop()
        meters.extend(started)

    return during, meters


def _go_run(
    address: str,
    size: int,
    window: int,
    duration_s: float,
    spread: Spread = SPREAD,
    *,
    during=None,
    connections: int = CONNECTIONS,
) -> dict:
    """Run the Go generator once; the JSON it prints (acked, acked_per_s, errors,
    first_error, p50_ms, p99_ms, max_ms)."""
    warmup_s = go_warmup_s(duration_s)
    args = [
        f"-addr={address}",
        f"-topic={spread.topic}",
        f"-topics={spread.topics}",
        f"-queues={spread.queues}",
        f"-size={size}",
        f"-window={window}",
        f"-conns={connections}",
        f"-warmup={warmup_s}s",
        f"-duration={duration_s}s",
    ]
    return GO_GENERATOR.run(args, timeout_s=warmup_s + duration_s + 60.0, during=during)


def go_warmup_s(duration_s: float) -> float:
    """The Go generators' own warm-up in each run (remoting_pub's, nats_pub's), so
    connection set-up does not dilute the rate."""
    return min(1.0, max(0.2, duration_s * 0.2))


def _roles(cluster: LocalCluster, master: str) -> dict[str, int]:
    """The group's processes whose CPU a message costs: its members, and the name server
    (idle under load, so its figure shows what registration costs)."""
    roles = {"leader": cluster.pid(master), "namesrv": cluster.pid("namesrv")}
    for node in cluster.ids:
        if node != master:
            roles[f"follower {node}"] = cluster.pid(node)
    return roles


# ---------------------------------------------------------------- the gRPC path
GRPC_SYSTEM = "raftmq broker R3 through mqproxy (gRPC)"
#: The same group and load through Apache RocketMQ 5.3.3's own proxy (ProxyStartup,
#: cluster mode) instead: what the proxy costs in each.
GRPC_JAVA_SYSTEM = f"raftmq broker R3 through {ROCKETMQ5}'s proxy (gRPC)"
GRPC_SYSTEMS = (GRPC_SYSTEM, GRPC_JAVA_SYSTEM)
#: The proxy threads a row's notes name, the busiest first (a JVM has dozens).
GRPC_THREADS_NOTED = 6
GRPC_GENERATOR = gotools.GoModule("grpc_pub")
#: Messages per ReceiveMessage; `window` // RECEIVE_BATCH long polls are kept open, so
#: about `window` messages are in flight between receipt and acknowledgement.
RECEIVE_BATCH = 32
GRPC_GROUP = "BENCH_CG"


async def measure_grpc(
    size: int, duration_s: float, window: int, system: str = GRPC_SYSTEM
) -> dict:
    """The gRPC rows' figures: the same group behind an `mqproxy` (or, for
    GRPC_JAVA_SYSTEM, Apache RocketMQ's proxy), the Go generator (bench/grpc_pub)
    speaking apache.rocketmq.v2 to it.  First `window` SendMessage calls in flight
    (sends/s, p50/p99, CPU per message per role), then the backlog they left received
    (ReceiveMessage, long-polled, RECEIVE_BATCH at a time) and each message acknowledged
    by its own AckMessage (received+acked/s, CPU per message per role). The proxy's CPU
    is also split by thread (mqproxy's main thread, gRPC's; the JVM's busiest)."""
    assert system in GRPC_SYSTEMS, system
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        async with LocalCluster(tmp) as cluster:
            await cluster.create_topic(TOPIC, QUEUES)
            master = await cluster.wait_master()
            if system == GRPC_JAVA_SYSTEM:
                endpoint = await start_java_proxy(cluster, "proxy")
            else:
                endpoint = await cluster.start_proxy()
            roles = {"proxy": cluster.pid("proxy"), **_roles(cluster, master)}
            run = (endpoint, cluster.broker_name, size)
            # The group receives first, from the empty queues: Apache's proxy starts a
            # group new to a queue at its end (POP initMode MAX), so the group must be
            # placed before the sends whose backlog it is to receive.
            await trio.to_thread.run_sync(_grpc_run, "receive", *run, 1, 0.5)
            warm = await trio.to_thread.run_sync(_grpc_run, "send", *run, 16, 1.0)
            sends, send_cpu, send_threads = await trio.to_thread.run_sync(
                _grpc_load, roles, "send", *run, window, duration_s
            )
            receives, receive_cpu, receive_threads = await trio.to_thread.run_sync(
                _grpc_load, roles, "receive", *run, max(1, window // RECEIVE_BATCH), duration_s
            )
            stored = await _stored(cluster, master)
    noted = [dict(list(t.items())[:GRPC_THREADS_NOTED]) for t in (send_threads, receive_threads)]
    notes = (
        f"load from the Go generator (bench/grpc_pub, {CONNECTIONS} HTTP/2 connections to "
        f"the proxy); receive+ack: {max(1, window // RECEIVE_BATCH)} long polls of "
        f"{RECEIVE_BATCH}, one AckMessage per message, over the backlog the sends left; "
        f"proxy CPU µs/msg by thread (the busiest {GRPC_THREADS_NOTED}), sends {noted[0]}, "
        f"receive+ack {noted[1]}"
    )
    if system == GRPC_JAVA_SYSTEM:
        notes += f"; the proxy's JVM {_flags(PROXY_FLAGS)}"
    if receives["empty"]:
        notes += f"; the backlog ran out ({receives['empty']} empty polls)"
    for phase in (sends, receives):
        if phase.get("first_error"):
            notes += f"; first error: {phase['first_error']}"
    return {
        **_row(system, GO, size, window, sends),
        "errors": warm["errors"] + sends["errors"],
        "sent": warm["sent"] + sends["sent"],  # the warm-up's too: each is stored
        "stored": stored,
        "received_acked_per_s": receives["acked_per_s"],
        "received": receives["received"],
        "receive_errors": receives["errors"],
        "ack_p99_ms": receives["p99_ms"],
        "cpu_proxy_us": send_cpu.get("proxy"),
        **cpu.columns(send_cpu),
        **{f"receive_{k}": v for k, v in cpu.columns(receive_cpu).items()},
        "receive_cpu_proxy_us": receive_cpu.get("proxy"),
        "cpu_proxy_threads_us": send_threads,
        "receive_cpu_proxy_threads_us": receive_threads,
        "notes": notes,
    }


def _grpc_load(roles: dict[str, int], *run) -> tuple[dict, dict[str, float], dict[str, float]]:
    """A measured phase of the gRPC generator, `_grpc_run(*run)` (its last argument the
    measured seconds): its figures, CPU per message per role, and the proxy's CPU per
    message per thread, over its measured window."""
    during, meters = _metered(
        run[-1],
        lambda pid: [cpu.CpuMeter({**roles, "generator": pid}), cpu.ThreadMeter(roles["proxy"])],
    )
    load = _grpc_run(*run, during=during)
    acked = int(load["acked"])
    return load, meters[0].per_message_us(acked), meters[1].per_message_us(acked)


def _grpc_run(
    mode: str,
    endpoint: str,
    broker_name: str,
    size: int,
    window: int,
    duration_s: float,
    during=None,
) -> dict:
    """Run bench/grpc_pub once in `mode` (send or receive); the JSON it prints."""
    warmup_s = go_warmup_s(duration_s)
    args = [
        f"-mode={mode}",
        f"-addr={endpoint}",
        f"-topic={TOPIC}",
        f"-group={GRPC_GROUP}",
        f"-broker={broker_name}",
        f"-size={size}",
        f"-window={window}",
        f"-batch={RECEIVE_BATCH}",
        f"-conns={CONNECTIONS}",
        f"-warmup={warmup_s}s",
        f"-duration={duration_s}s",
    ]
    return GRPC_GENERATOR.run(args, timeout_s=warmup_s + duration_s + 60.0, during=during)


async def _stored(cluster: LocalCluster, master: str) -> int:
    """Messages in the topic's queues at the master (their max offsets summed)."""
    total = 0
    for queue_id in range(QUEUES):
        ext = {"topic": TOPIC, "queueId": queue_id}
        response = await cluster.broker_call(master, RequestCode.GET_MAX_OFFSET, ext)
        assert response.code == ResponseCode.SUCCESS, response.remark
        total += int(response.ext_fields["offset"])
    return total
