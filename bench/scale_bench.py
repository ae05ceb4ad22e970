"""`python -m bench broker --scale`: how the cost grows, the curves a cluster is sized by.

One name server and a 3-broker DLedger group (fsync on a quorum before every
acknowledgment), started once, loaded as `bench broker` loads it (its Go generator where
Go can be had, else its Python one), measured phase after phase in the same sitting:

- `payload` and `window`: acked/s, p50/p99 and CPU µs per message per role against the
  message size (at the default window) and against the sends in flight (at 1 KiB);
- `topics`: the same load over 1 topic and over many topics of 4 queues each, and the
  group's CPU (and the master's RSS, heap and mapped files apart) while idle with 1
  topic, with the many topics created, and once all their queues exist: periodic work
  (dispatch checkpoints, registration) next to idle queues. With the `rocketmq` peer,
  the same phase again against Apache RocketMQ 4.9.7's DLedger mode (three Java
  brokers, as `bench broker` runs them), the same generator and load, in the same
  tables;
- `rss`: a backlog written to one topic, every broker's RSS split into RssAnon (heap:
  what a leak grows) and RssFile (touched pages of the mapped log segments, which the
  kernel reclaims) sampled as the log grows;
- `catch-up`: the backlog pulled from the master from its first offset by one puller
  per queue, each on its own connection, warm (as written) and cold (the group stopped,
  its segment files dropped from the page cache with posix_fadvise(DONTNEED) and the
  group started again), beside the disk's sequential read of the same bytes (one copy of
  the segment files, dropped the same way, read in 1 MiB reads).

A phase that fails gives a row naming its error and the other phases still run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio
from raftmq.broker.store.messagestore import (
    CHECKPOINT_MAX_INTERVAL_S,
    DISPATCH_CHECKPOINT,
)

from bench import broker_bench, cpu
from bench.broker_bench import GO, QUEUES, SPREAD, TOPIC, Spread
from bench.rss import rss_split_mib
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalCluster

MANY_TOPICS_QUEUES = 4
BACKLOG = Spread(topic="BenchBacklog")
BACKLOG_MESSAGE_BYTES = 4096
PULL_BATCH = 32  # RocketMQ's maxMsgNums default; a pull also stops at 256 KiB
READ_BYTES = 1 << 20
MIB = 1 << 20
_BOOTED = b"boot success"

_LOAD = [
    ("size", "size B"),
    ("window", "window"),
    ("acked_per_s", "acked/s"),
    ("mib_s", "MiB/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("cpu_leader_us", "CPU µs/msg leader"),
    ("cpu_follower_us", "per follower"),
    ("cpu_generator_us", "generator"),
]
_TOPICS = [
    ("load", "load over"),
    ("system", "system"),
    *_LOAD[2:],
    ("caught_up_s", "warm-up dispatched in s"),
]
_IDLE = [
    ("idle", "idle, no load"),
    ("system", "system"),
    ("settled_s", "checkpoint after s"),
    ("idle_leader_ms", "CPU ms/s leader"),
    ("idle_follower_ms", "per follower"),
    ("idle_namesrv_ms", "name server"),
    ("leader_anon_mib", "leader RssAnon MiB"),
    ("leader_file_mib", "RssFile MiB"),
]
RAFTMQ = "raftmq"
#: RocketMQ writes no file to watch for its dispatch: it flushes its ConsumeQueues every
#: second (flushIntervalConsumeQueue) and its checkpoint with them; this is waited instead.
JAVA_SETTLE_S = 3.0
#: How long the members may take to dispatch a warm-up: RocketMQ 4.9's followers took
#: about two minutes (124.5 and 135.7 s) for one reaching each of 2,500 topics x 4
#: queues (each queue's first message maps a new 5.7 MiB ConsumeQueue file).
CAUGHT_UP_TIMEOUT_S = 600.0
_RSS = [("log_mib", "log MiB written")] + [
    (f"{member}_{part}_mib", f"{title} {part}")
    for member, title in (
        ("leader", "leader"),
        ("follower1", "follower 1"),
        ("follower2", "follower 2"),
    )
    for part in ("anon", "file")
]
_CATCH_UP = [
    ("read", "read"),
    ("cached_mib", "in page cache at start MiB"),
    ("mib", "MiB"),
    ("seconds", "seconds"),
    ("mib_s", "MiB/s"),
    ("messages_per_s", "msgs/s"),
    ("cpu_leader_us", "CPU µs/msg leader"),
    ("cpu_puller_us", "pullers"),
]


@dataclass
class Table:
    name: str  # its key in the JSON
    title: str
    columns: list[tuple[str, str]]
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def errors(self) -> list[str]:
        return [f"{row['what']}: failed: {row['error']}" for row in self.rows if "error" in row]


def sizes(text: str) -> list[int]:
    """A comma-separated list of sizes for the command line ('' for none: the phase is
    skipped); a size may end in K (KiB)."""
    values = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        scale = 1024 if part[-1] in "kK" else 1
        values.append(int(part.rstrip("kK")) * scale)
    if any(v <= 0 for v in values):
        raise ValueError(f"sizes must be positive: {text}")
    return values


def sample_points(total_bytes: int, samples: int) -> list[int]:
    """The log sizes (bytes written) after which RSS is sampled: `samples` even steps
    up to `total_bytes`, the last exactly at it."""
    assert total_bytes > 0 and samples > 0
    return [total_bytes * k // samples for k in range(1, samples + 1)]


def next_chunk_s(remaining_bytes: int, bytes_per_s: float, last_s: float) -> float:
    """How long the next run of the generator writing the backlog lasts: long enough for
    `remaining_bytes` at the last run's rate, at most twice the last run (whose rate
    counts the generator's start) and 10 s, at least 0.3 s (a start costs)."""
    if bytes_per_s <= 0:
        return 0.5
    return max(0.3, min(10.0, 2 * last_s, remaining_bytes / bytes_per_s))


def run(args, generator: str) -> list[Table]:
    """Every phase the options ask for, against one group, in one sitting."""
    return trio.run(_run, args, generator)


async def _run(args, generator: str) -> list[Table]:
    tables = [
        Table("payload", f"acked/s and latency against payload size (window {args.window})", _LOAD),
        Table("window", "acked/s and latency against sends in flight (1 KiB)", _LOAD),
        Table("topics", f"1 topic against {args.topics:,} topics under the same load", _TOPICS),
        Table(
            "idle",
            "the group's CPU (and the master's RSS) with no load (CPU in ms per second)",
            _IDLE,
        ),
        Table(
            "rss",
            f"RSS MiB per broker (RssAnon, RssFile) as {args.backlog_mib} MiB are written",
            _RSS,
        ),
        Table("catch-up", "a consumer catching up on the backlog, from the master", _CATCH_UP),
    ]
    by_name = {t.name: t for t in tables}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        async with LocalCluster(tmp) as cluster:
            await cluster.create_topic(TOPIC, QUEUES)
            await cluster.create_topic(BACKLOG.topic, BACKLOG.queues)
            sitting = Sitting(cluster, generator, args.duration)
            await sitting.warm_up()
            for size in args.payloads:
                await sitting.row(by_name["payload"], f"{size} B", sitting.load, size, args.window)
            for window in args.windows:
                await sitting.row(by_name["window"], f"window {window}", sitting.load, 1024, window)
            if args.topics:
                await _topics_phase(sitting, by_name, args)
            if args.backlog_mib:
                await _backlog_phase(sitting, by_name, args)
    if args.topics and "rocketmq" in args.peers:
        java = broker_bench.JAVA_SYSTEMS[1]  # DLedger R3, RocketMQ's defaults
        with tempfile.TemporaryDirectory(prefix="bench-scale-java-") as tmp:
            async with java.group(tmp) as cluster:
                await cluster.create_topic(TOPIC, QUEUES)
                sitting = Sitting(cluster, generator, args.duration, system=java.name)
                await sitting.warm_up()
                await _topics_phase(sitting, by_name, args)
    return [t for t in tables if t.rows]


async def _topics_phase(sitting: Sitting, by_name: dict[str, Table], args) -> None:
    topics, idle = by_name["topics"], by_name["idle"]
    one = Spread(queues=MANY_TOPICS_QUEUES)
    many = Spread(topics=args.topics, queues=MANY_TOPICS_QUEUES)
    what_one = f"1 topic x {one.queues} queues"
    what_many = f"{many.topics:,} topics x {many.queues} queues"
    await sitting.row(topics, what_one, sitting.warm_then_load, 1024, args.window, one)
    await sitting.row(idle, "1 topic, after load", sitting.idle, args.idle)
    created = await sitting.row(
        idle, f"{what_many} created", sitting.create_then_idle, many, args.idle
    )
    if "error" in created:
        return
    topics.notes.append(
        f"{sitting.system}: {many.topics:,} topics created in {created['created_s']:.1f} s;"
        " before the measured load over them (and the 1 topic's), a warm-up load reached each"
        " of their queues (the first message of a queue creates its file) and a dispatch"
        " checkpoint passed"
        + ("" if sitting.system == RAFTMQ else f" (for RocketMQ: {JAVA_SETTLE_S:g} s)")
    )
    await sitting.row(topics, what_many, sitting.warm_then_load, 1024, args.window, many)
    await sitting.row(idle, f"{what_many}, after load", sitting.idle, args.idle)


async def _backlog_phase(sitting: Sitting, by_name: dict[str, Table], args) -> None:
    rss, catch_up = by_name["rss"], by_name["catch-up"]
    total = args.backlog_mib * MIB
    written = await sitting.row(rss, "backlog", sitting.write_backlog, total, args.rss_samples, rss)
    if "error" in written:
        return
    rss.rows.remove(written)  # its samples are the rows
    rss.notes.append(
        f"{written['log_mib']:.0f} MiB written at {written['write_mib_s']:.1f} MiB/s "
        f"({BACKLOG_MESSAGE_BYTES} B messages, 256 in flight, to {BACKLOG.queues} queues)"
    )
    await sitting.row(catch_up, "warm", sitting.pull_backlog)
    await sitting.row(catch_up, "disk", sitting.restart_cold)
    await sitting.row(catch_up, "cold", sitting.pull_backlog)
    catch_up.notes.append(
        f"pulls of up to {PULL_BATCH} messages (256 KiB), one puller per queue; "
        "disk: one member's copy of the backlog read sequentially in 1 MiB reads after "
        "posix_fadvise(DONTNEED) with the group stopped; cold: the group started again "
        "after every segment file was dropped the same way"
    )


class Sitting:
    """The group under measurement, and how each phase measures it."""

    def __init__(
        self, cluster: LocalCluster, generator: str, duration_s: float, system: str = RAFTMQ
    ) -> None:
        """`system` names what `cluster` runs: raftmq, or one of Apache RocketMQ's
        JAVA_SYSTEMS (whose dispatch is waited for by time, JAVA_SETTLE_S)."""
        self.system = system
        self.cluster = cluster
        self.generator = generator
        self.duration_s = duration_s
        self.backlog_start = 0  # the master's log end before the backlog, and after it
        self.backlog_end = 0

    async def row(self, table: Table, what: str, measure, *args) -> dict:
        """`measure(*args)`'s row in `table`; a failure gives a row naming its error."""
        print(f"scale: {table.name}, {what} ...", file=sys.stderr, flush=True)
        try:
            row = {"what": what, "system": self.system, **await measure(*args)}
        except Exception as exc:  # noqa: BLE001 - a row naming it; other phases run
            print(f"scale: {table.name}, {what} failed: {exc!r}", file=sys.stderr, flush=True)
            row = {"what": what, "system": self.system, "error": repr(exc)}
        row.setdefault(table.columns[0][0], what)
        table.rows.append(row)
        return row

    async def master(self) -> tuple[str, str, dict[str, int]]:
        """(node, address, roles) of the master now."""
        master = await self.cluster.wait_master()
        return master, self.cluster.broker_addrs[master], broker_bench._roles(self.cluster, master)

    async def warm_up(self) -> None:
        _master, address, _roles = await self.master()
        await broker_bench._sends(self.generator, address, 1024, 16, 1.0)

    async def load(self, size: int, window: int, spread: Spread = SPREAD) -> dict:
        """One closed-loop load phase: its figures and CPU µs per message per role."""
        _master, address, roles = await self.master()
        if self.generator == GO:
            load, figures = await trio.to_thread.run_sync(
                broker_bench._go_load, address, size, window, self.duration_s, roles, spread
            )
            figures.pop("puller", None)  # this process, idle here: no pullers in this phase
        else:
            load, figures = await broker_bench._python_load(
                roles, address, size, window, self.duration_s, spread
            )
        if not load["acked"]:
            raise RuntimeError(f"nothing acknowledged: {load.get('first_error')}")
        return {
            "size": size,
            "window": window,
            "queues": spread.topics * spread.queues,
            "acked_per_s": load["acked_per_s"],
            "mib_s": load["acked_per_s"] * size / MIB,
            "p50_ms": load["p50_ms"],
            "p99_ms": load["p99_ms"],
            "errors": load["errors"],
            **cpu.columns(figures),
        }

    async def warm_then_load(self, size: int, window: int, spread: Spread) -> dict:
        """`load` after a warm-up that reached every queue of `spread` (each one's first
        message creates its file: twice as many messages as queues, the generator's
        connections each going round its share) and the dispatch checkpoint after it
        (which fsyncs every new file): the figures are then those of queues that exist,
        in a window between two checkpoints."""
        _master, address, _roles = await self.master()
        acked = 0
        while acked < 2 * spread.topics * spread.queues:
            load = await broker_bench._sends(self.generator, address, size, window, 2.0, spread)
            if not load["acked"]:
                raise RuntimeError(f"nothing acknowledged: {load.get('first_error')}")
            acked += load["acked"]
        started = time.monotonic()
        await self.cluster.wait_caught_up(CAUGHT_UP_TIMEOUT_S)
        caught_up_s = time.monotonic() - started
        if await self._checkpointed_since(time.time()) is None:
            raise RuntimeError("no dispatch checkpoint after the warm-up")
        return {**await self.load(size, window, spread), "caught_up_s": caught_up_s}

    async def idle(self, idle_s: float) -> dict:
        """The CPU each member and the name server spend with no load, per second, once
        the last load's tail has passed: its dispatch, and the dispatch checkpoint
        after it, which fsyncs every queue the load wrote (once, not periodically)."""
        _master, _address, roles = await self.master()
        await self.cluster.wait_caught_up(CAUGHT_UP_TIMEOUT_S)
        settled_s = await self._checkpointed_since(time.time())
        meter = cpu.CpuMeter(roles)
        await trio.sleep(idle_s)
        ms_per_s = {role: us / idle_s / 1000 for role, us in meter.per_message_us(1).items()}
        followers = [v for role, v in ms_per_s.items() if role.startswith("follower")]
        rss = rss_split_mib(roles["leader"]) or {}
        return {
            "settled_s": settled_s,
            "idle_leader_ms": ms_per_s.get("leader"),
            "idle_follower_ms": sum(followers) / len(followers) if followers else None,
            "idle_namesrv_ms": ms_per_s.get("namesrv"),
            "leader_anon_mib": rss.get("anon"),  # the heap: what grows with the queues
            "leader_file_mib": rss.get("file"),  # touched pages of mapped files
        }

    async def _checkpointed_since(self, moment: float) -> float | None:
        """Wait until every member has written its dispatch checkpoint after `moment`
        (time.time(); a checkpoint comes every 5 to 60 s); the seconds waited, None when
        none came. A Java group: JAVA_SETTLE_S."""
        if self.system != RAFTMQ:
            await trio.sleep(JAVA_SETTLE_S)
            return JAVA_SETTLE_S
        started = time.monotonic()
        with trio.move_on_after(CHECKPOINT_MAX_INTERVAL_S + 5.0) as waiting:
            while True:
                stamps = []
                for node in self.cluster.ids:
                    found = list(self.cluster.store_dir(node).rglob(DISPATCH_CHECKPOINT))
                    stamps += [path.stat().st_mtime for path in found] or [0.0]
                if min(stamps) > moment:
                    break
                await trio.sleep(0.2)
        if waiting.cancelled_caught:
            return None
        await trio.sleep(0.5)  # its fsyncs done, the rest of its work with them
        return time.monotonic() - started

    async def create_then_idle(self, spread: Spread, idle_s: float) -> dict:
        started = time.monotonic()
        await self.cluster.create_topics(spread.names(), spread.queues)
        created_s = time.monotonic() - started
        print(f"scale: {spread.topics} topics created in {created_s:.1f} s", file=sys.stderr)
        return {"created_s": created_s, **await self.idle(idle_s)}

    async def log_end(self, node: str) -> int:
        return int((await self.cluster.member_state(node))["commitLogMaxOffset"])

    async def write_backlog(self, total_bytes: int, samples: int, table: Table) -> dict:
        """Write `total_bytes` of messages to BACKLOG, in runs of the generator; after
        each step of total/samples, a row of every member's RSS into `table`."""
        master, address, roles = await self.master()
        start = self.backlog_start = await self.log_end(master)
        table.rows.append(self._rss_row(0, roles))
        started = time.monotonic()
        written, rate, chunk_s = 0, 0.0, 0.0
        for point in sample_points(total_bytes, samples):
            if written >= point:
                continue  # the last run wrote past this point too
            while written < point:
                chunk_s = next_chunk_s(point - written, rate, chunk_s)
                run_started, before = time.monotonic(), written
                load = await broker_bench._sends(
                    self.generator, address, BACKLOG_MESSAGE_BYTES, 256, chunk_s, BACKLOG
                )
                if not load["acked"]:
                    raise RuntimeError(f"nothing acknowledged: {load.get('first_error')}")
                written = await self.log_end(master) - start
                rate = (written - before) / (time.monotonic() - run_started)
            table.rows.append(self._rss_row(written, roles))
        seconds = time.monotonic() - started
        self.backlog_end = start + written
        await self.cluster.wait_caught_up()
        return {"log_mib": written / MIB, "write_mib_s": written / MIB / seconds}

    def _rss_row(self, written_bytes: int, roles: dict[str, int]) -> dict:
        row = {"what": f"{written_bytes / MIB:.0f} MiB", "log_mib": written_bytes / MIB}
        members = [("leader", roles["leader"])]
        members += [(f"follower{k}", pid) for k, (role, pid) in enumerate(
            sorted((r, p) for r, p in roles.items() if r.startswith("follower")), start=1
        )]  # fmt: skip
        for member, pid in members:
            split = rss_split_mib(pid) or {}
            row[f"{member}_anon_mib"] = split.get("anon")
            row[f"{member}_file_mib"] = split.get("file")
        return row

    async def pull_backlog(self) -> dict:
        """Pull every message of BACKLOG from the master, one puller per queue on its own
        connection, PULL_MESSAGE after PULL_MESSAGE, as fast as they are answered."""
        master, address, roles = await self.master()
        cached = self.cached_mib(master)
        ends = {}
        async with RemotingClient(address) as client:
            for queue_id in range(BACKLOG.queues):
                ext = {"topic": BACKLOG.topic, "queueId": queue_id}
                request = RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=ext)
                ends[queue_id] = int((await client.invoke(request, 10.0)).ext_fields["offset"])
        taken = {"bytes": 0, "messages": 0}

        async def puller(queue_id: int) -> None:
            offset = 0
            async with RemotingClient(address) as client:
                while offset < ends[queue_id]:
                    ext = {
                        "consumerGroup": "BENCH_CATCH_UP", "topic": BACKLOG.topic,
                        "queueId": queue_id, "queueOffset": offset, "maxMsgNums": PULL_BATCH,
                        "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                        "subscription": "*", "subVersion": 0,
                    }  # fmt: skip
                    request = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=ext)
                    response = await client.invoke(request, 30.0)
                    following = int(response.ext_fields.get("nextBeginOffset", offset))
                    if response.code != ResponseCode.SUCCESS or following <= offset:
                        raise RuntimeError(
                            f"queue {queue_id} at {offset}: code {response.code} "
                            f"{response.remark}, next {following}"
                        )
                    taken["bytes"] += len(response.body)
                    taken["messages"] += following - offset
                    offset = following

        meter = cpu.CpuMeter({**roles, "puller": os.getpid()})
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            for queue_id in range(BACKLOG.queues):
                nursery.start_soon(puller, queue_id)
        seconds = time.monotonic() - started
        figures = meter.per_message_us(taken["messages"])
        return {
            "cached_mib": cached,
            "mib": taken["bytes"] / MIB,
            "seconds": seconds,
            "mib_s": taken["bytes"] / MIB / seconds,
            "messages_per_s": taken["messages"] / seconds,
            **cpu.columns(figures),
            "cpu_puller_us": figures.get("puller"),
        }

    def backlog_files(self, node: str) -> list[tuple[Path, int, int]]:
        """(path, first, last byte) of `node`'s data segment files holding the backlog."""
        files = []
        for path in sorted(self.cluster.store_dir(node).glob("**/dledger-*/data/[0-9]*")):
            start = int(path.name)
            first = max(self.backlog_start, start) - start
            last = min(self.backlog_end, start + path.stat().st_size) - start
            if first < last:
                files.append((path, first, last))
        return files

    def cached_mib(self, node: str) -> float | None:
        """MiB of the segment files holding the backlog in the page cache now
        (util-linux `fincore`, whole files: the backlog's and any neighbour's pages)."""
        files = self.backlog_files(node)
        if not files:
            return None
        command = ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES"]
        try:
            out = subprocess.run(
                command + [str(path) for path, _, _ in files],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
        except (OSError, subprocess.CalledProcessError):
            return None
        return sum(int(line) for line in out.split()) / MIB

    async def restart_cold(self) -> dict:
        """Stop the group, drop every segment file from the page cache, time a cold
        sequential read of one member's copy of the backlog (dropped again after), and
        start the group again; the row is the read's."""
        cluster = self.cluster
        master, _address, _roles = await self.master()
        logs = {node: cluster.base_dir / f"{node}.log" for node in cluster.ids}
        boots = {node: log.read_bytes().count(_BOOTED) for node, log in logs.items()}
        for node in cluster.ids:
            cluster.kill(node, signal.SIGTERM)
        try:
            everything = [
                (path, 0, path.stat().st_size)
                for node in cluster.ids
                for path in cluster.store_dir(node).glob("**/dledger-*/data/[0-9]*")
            ]
            _drop(everything)
            files = self.backlog_files(master)
            cached = self.cached_mib(master)
            read_bytes, seconds = await trio.to_thread.run_sync(_read_cold, files)
        finally:
            for node in cluster.ids:
                cluster.start_broker(node)
        with trio.fail_after(60):
            for node, log in logs.items():
                while log.read_bytes().count(_BOOTED) <= boots[node]:
                    await trio.sleep(0.05)
        await cluster.wait_master(timeout_s=30)
        await cluster.wait_caught_up()
        return {
            "cached_mib": cached,
            "mib": read_bytes / MIB,
            "seconds": seconds,
            "mib_s": read_bytes / MIB / seconds,
        }


def _drop(files: list[tuple[Path, int, int]]) -> None:
    """Drop the byte ranges from the page cache (no process maps them: the kernel keeps
    mapped pages); dirty pages are written first, as DONTNEED skips them."""
    for path, first, last in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, first, last - first, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_cold(files: list[tuple[Path, int, int]]) -> tuple[int, float]:
    """(bytes, seconds) of a sequential read of the ranges (dropped from the page cache)
    in 1 MiB reads; they are dropped again after, for the cold pull."""
    total = 0
    started = time.monotonic()
    for path, first, last in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, first, last - first, os.POSIX_FADV_SEQUENTIAL)
            position = first
            while position < last:
                data = os.pread(fd, min(READ_BYTES, last - position), position)
                if not data:
                    break
                position += len(data)
                total += len(data)
        finally:
            os.close(fd)
    seconds = time.monotonic() - started
    _drop(files)
    return total, seconds
