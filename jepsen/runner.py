"""One run: start a group behind proxies, record a workload while the nemesis plays a
schedule, heal, wait for recovery, read every replica, check, and write the run directory.

The run's shape is Jepsen's: warm-up, faults, heal everything, a bounded wait for the
group to recover (a master, every member caught up), a drain in which the consumers
read to the end of every queue, then a read of each queue from the master (`final`)
and from every member directly (`replicas`). The checkers judge the history against
those logs and the run's own record (process errors fail a run too); the exit status is 0
only if every check passed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import random
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from jepsen.checker import CHECKS, TOPOLOGY_CHECKS, check
from jepsen.cluster import (
    CLIENT_FRAME_HEADER_BYTES,
    PEER_FRAME_HEADER_BYTES,
    JepsenClassicCluster,
    JepsenCluster,
    JepsenControllerCluster,
)
from jepsen.history import Recorder
from jepsen.nemesis import MEMBERSHIP, Nemesis, Step, plan
from jepsen.pop import POP_CHECKS, PopWorkload
from jepsen.proxy import ProxyNet
from jepsen.report import format_summary, write_report
from jepsen.timers import BROKER_CONF as TIMER_CONF
from jepsen.timers import TIMER_CHECKS, TimerWorkload
from jepsen.transactions import BROKER_CONF, TRANSACTION_CHECKS, TransactionWorkload
from jepsen.upgrade import CONSUMER_GROUPS, upgraded_cluster
from jepsen.workload import QUEUES, TOPIC, Workload, read_queue
from raftmq.client.route import MessageQueue

RECOVERY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 2.0
# The negative control's fsync interval. DLedger's own 10 ms loses little at this
# workload's rate, and a control that sometimes sees nothing proves nothing; NATS's
# default is two minutes.
PAGE_CACHE_FLUSH_MS = 1000
# --workload: what the clients do, the broker settings it needs, and how it is checked.
WORKLOADS = {
    "queue": (Workload, {}, CHECKS),
    "transactions": (TransactionWorkload, BROKER_CONF, TRANSACTION_CHECKS),
    "pop": (PopWorkload, {}, POP_CHECKS),
    "timers": (TimerWorkload, TIMER_CONF, TIMER_CHECKS),
}
# --topology: a DLedger group, a classic master and slave (the master's brokerRole), a
# classic SYNC_MASTER group upgraded in place to a DLedger group (jepsen.upgrade), or a
# controller-mode group of --nodes brokers (2 or 3) and three controllers.
UPGRADED = "upgraded"
TOPOLOGIES = {
    "dledger": None,
    "ms-sync": "SYNC_MASTER",
    "ms-async": "ASYNC_MASTER",
    UPGRADED: None,
    "controller": None,
    "controller-async": None,
}
# A controller-mode group's brokers: a master silent for 3 s (not RocketMQ's 10) is
# replaced, so pauses and partitions of a few seconds bring elections; `controller`
# acknowledges a send once every SyncStateSet member has it, `controller-async` at once.
CONTROLLER_CONF = {
    "controller": {"allAckInSyncStateSet": "true", "controllerHeartBeatTimeoutMills": "3000"},
    "controller-async": {
        "allAckInSyncStateSet": "false",
        "controllerHeartBeatTimeoutMills": "3000",
    },
}


def checks_for(workload: str, topology: str) -> dict:
    """The workload's checks with the topology's own rules for loss put over them."""
    return {**WORKLOADS[workload][2], **TOPOLOGY_CHECKS.get(topology, {})}


# A run with disk-full faults puts each store on a tmpfs of its own, this size, with
# files small enough that several fit and the ballast leaves little room between them.
DISK_FULL_STORE_BYTES = 48 << 20
SMALL_STORE_CONF = {
    "mappedFileSizeCommitLog": str(4 << 20),
    "mappedFileSizeForEntryIndex": str(1 << 20),
    "maxHashSlotNum": "4096",
    "maxIndexNum": "16384",
}


@attrs.frozen
class RunConfig:
    run_dir: Path
    seed: int
    nodes: int = 3
    faults: tuple[str, ...] = ("kill", "pause", "partition", "disk")
    time_limit_s: float = 60.0
    rate: float = 1000.0
    page_cache: bool = False  # flushDiskType=ASYNC_FLUSH: the negative control
    steps: tuple[Step, ...] | None = None  # an explicit schedule instead of plan(seed)
    progress: bool = True
    workload: str = "queue"
    topology: str = "dledger"

    @property
    def members(self) -> int:
        """Brokers in the group: `nodes` DLedger replicas, or a master and its slave."""
        return self.nodes if TOPOLOGIES[self.topology] is None else 2

    def schedule(self) -> list[Step]:
        if self.steps is not None:
            return list(self.steps)
        return plan(self.seed, list(self.faults), self.time_limit_s, self.members, self.topology)

    def fault_kinds(self) -> tuple[str, ...]:
        """The kinds this run injects: an explicit schedule's own, else `faults`
        (a replayed schedule ignores `--faults`, so the summary must not echo it)."""
        if self.steps is None:
            return self.faults
        return tuple(dict.fromkeys(step.kind for step in self.steps))

    def store_bytes(self) -> int | None:
        """Each store's own filesystem size, for runs that fill disks (else None)."""
        return DISK_FULL_STORE_BYTES if "disk-full" in self.fault_kinds() else None

    def command(self) -> str:
        parts = [
            "python -m jepsen run",
            f"--topology {self.topology}",
            *([f"--nodes {self.nodes}"] if TOPOLOGIES[self.topology] is None else []),
            f"--workload {self.workload}",
            f"--faults {','.join(self.fault_kinds())}",
            f"--time-limit {self.time_limit_s:g}",
            f"--seed {self.seed}",
            f"--rate {self.rate:g}",
        ]
        if self.page_cache:
            parts.append("--unsafe-page-cache")
        if self.steps is not None:
            parts.append(f"--schedule {self.run_dir / 'schedule.json'}")
        return " ".join(parts)


async def run(config: RunConfig) -> dict:
    """Run, check and report; returns the checker results (with a `run` section)."""
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    steps = config.schedule()
    (run_dir / "schedule.json").write_text(json.dumps([attrs.asdict(s) for s in steps], indent=1))
    rng = random.Random(config.seed)
    workload_class, workload_conf, _ = WORKLOADS[config.workload]
    checks = checks_for(config.workload, config.topology)
    extra = {"flushDiskType": "SYNC_FLUSH", **workload_conf}
    if config.page_cache:
        extra |= {"flushDiskType": "ASYNC_FLUSH", "flushFileInterval": str(PAGE_CACHE_FLUSH_MS)}
    if config.store_bytes() is not None:
        extra.update(SMALL_STORE_CONF)
    shutil.rmtree(run_dir / "cluster", ignore_errors=True)  # a reused run directory
    master_role = TOPOLOGIES[config.topology]
    outcome: dict = {}
    options: dict = {"rate": config.rate}
    with Recorder(run_dir / "history.jsonl") as history:
        if config.topology == UPGRADED:
            assert config.store_bytes() is None, "an upgraded group's stores are not tmpfs"
            cluster = await upgraded_cluster(run_dir / "cluster", config.nodes, extra, history)
            options["groups"] = CONSUMER_GROUPS
        elif config.topology in CONTROLLER_CONF:
            conf = extra | CONTROLLER_CONF[config.topology]
            cluster = JepsenControllerCluster(run_dir / "cluster", config.nodes, conf)
        elif master_role is None:
            spare = MEMBERSHIP in config.fault_kinds()  # a member for it to add
            cluster = JepsenCluster(
                run_dir / "cluster", config.nodes + spare, extra, config.store_bytes()
            )
        else:
            cluster = JepsenClassicCluster(run_dir / "cluster", master_role, extra)
        async with behind_proxies(cluster, rng):
            if MEMBERSHIP in config.fault_kinds():
                await cluster.remove_member(cluster.ids[-1])  # set aside, to be added
            nemesis = Nemesis(cluster, history)
            workload = new_workload(cluster, history, rng, workload_class, **options)
            progress = None
            if config.progress:
                progress = functools.partial(_progress, history, nemesis, config.time_limit_s)
            await play(cluster, nemesis, workload, steps, config.time_limit_s, outcome, progress)
            final, replicas = await read_logs(cluster, outcome)
        record = {**outcome, "faults": nemesis.injected, "errors": nemesis.errors}
        results = check(history.ops, final, replicas, record, checks)
        results["run"] = record
        save_logs(run_dir, final, replicas)
        meta = _meta(config, len(steps))
        write_report(run_dir, history.ops, results, meta)
    return results


@contextlib.asynccontextmanager
async def behind_proxies(cluster: JepsenCluster, rng: random.Random):
    """`cluster` started with every peer and client link through a proxy, and the topic
    created; everything stops on the way out."""
    async with (
        ProxyNet(
            cluster.peer_links(),
            rng,
            cluster.peer_proxies(),
            frame_header_bytes=PEER_FRAME_HEADER_BYTES,
        ) as net,
        ProxyNet(
            cluster.client_links(),
            rng,
            cluster.client_proxies(),
            frame_header_bytes=CLIENT_FRAME_HEADER_BYTES,
        ) as clients,
    ):
        cluster.net, cluster.clients = net, clients
        async with cluster:
            await cluster.create_topic(TOPIC, QUEUES)
            yield cluster


def new_workload(
    cluster: JepsenCluster,
    history: Recorder,
    rng: random.Random,
    workload_class: type[Workload] = Workload,
    **options,
) -> Workload:
    """A workload of `workload_class` (the queue workload by default) against `cluster`
    (its `options` as Workload's), with a random source of its own drawn from `rng`."""
    return workload_class(
        cluster.namesrv_addr,
        cluster.broker_name,
        cluster.node_of(),
        history,
        random.Random(rng.randrange(1 << 32)),
        **options,
    )


async def play(
    cluster: JepsenCluster,
    nemesis: Nemesis,
    workload: Workload,
    steps: list[Step],
    time_limit_s: float,
    outcome: dict,
    progress: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Load and faults for `time_limit_s`, then heal, recover and drain (the module
    docstring's shape); what happened goes into `outcome`."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(workload.produce)
        nursery.start_soon(workload.consume)
        if progress is not None:
            nursery.start_soon(progress)
        started = trio.current_time()
        await nemesis.run(steps, started, time_limit_s)
        await trio.sleep_until(started + time_limit_s)
        outcome["healed"] = await nemesis.heal_all()
        workload.producing = False
        await workload.sends_done.wait()
        healed_at = trio.current_time()
        with trio.move_on_after(RECOVERY_TIMEOUT_S) as recovery:
            outcome["master"] = await cluster.wait_serving(RECOVERY_TIMEOUT_S, nemesis.lost)
        outcome["recovered"] = not recovery.cancelled_caught
        outcome["recovery_s"] = round(trio.current_time() - healed_at, 3)
        master = outcome.get("master")
        if master is not None and nemesis.changed():
            outcome["members"] = {
                "start": nemesis.started_with,
                "expected": sorted(nemesis.nodes),
                "final": await cluster.voters(),
            }
        if master is not None:
            outcome["settled"] = await workload.settle(cluster.broker_addrs[master])
            ends = {}
            for queue_id in range(QUEUES):
                log = await read_queue(
                    cluster.broker_addrs[master],
                    workload.queue(queue_id),
                    outcome.setdefault("read_errors", []),
                )
                ends[queue_id] = log[-1][0] + 1 if log else 0
            workload.drain_to = ends
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                await workload.drained.wait()
        outcome["drained"] = workload.drained.is_set()
        outcome["consumer_positions"] = dict(workload.positions)
        nursery.cancel_scope.cancel()


async def read_logs(cluster: JepsenCluster, outcome: dict):
    """Each queue as the master serves it, and as every member serves it; replies
    that do not decode are listed in outcome["read_errors"]."""
    master = outcome.get("master")
    errors = outcome.setdefault("read_errors", [])
    replicas: dict[str, dict[int, list]] = {}
    for node in cluster.ids:
        if not cluster.running(node):
            continue
        address = cluster.broker_addrs[node]
        replicas[node] = {
            q: await read_queue(address, MessageQueue(TOPIC, cluster.broker_name, q), errors)
            for q in range(QUEUES)
        }
    final = replicas.get(master, {}) if master is not None else {}
    return final, replicas


def save_logs(run_dir: Path, final: dict, replicas: dict) -> None:
    """The logs read at the end, for `python -m jepsen check RUN_DIR`."""
    (run_dir / "final.json").write_text(json.dumps({str(q): v for q, v in final.items()}))
    (run_dir / "replicas.json").write_text(
        json.dumps({n: {str(q): v for q, v in r.items()} for n, r in replicas.items()})
    )


async def _progress(history: Recorder, nemesis: Nemesis, time_limit_s: float) -> None:
    """One status line every couple of seconds, on stderr."""
    counts = {"ok": 0, "fail": 0, "info": 0}
    polled = 0
    seen = 0
    started = trio.current_time()
    while True:
        await trio.sleep(PROGRESS_EVERY_S)
        ops = history.ops
        for op in ops[seen:]:
            if op["f"] == "send" and op["type"] in counts:
                counts[op["type"]] += 1
            elif op["f"] == "poll" and op["type"] == "ok":
                polled += len(op["value"])
        seen = len(ops)
        elapsed = trio.current_time() - started
        phase = f"{elapsed:5.1f}/{time_limit_s:g}s" if elapsed <= time_limit_s else "recovering"
        print(
            f"[jepsen] {phase} sends ok={counts['ok']} fail={counts['fail']} "
            f"info={counts['info']} polled={polled} fault={nemesis.active or '-'}",
            file=sys.stderr,
            flush=True,
        )


def _meta(config: RunConfig, steps: int) -> dict:
    flush = f"ASYNC_FLUSH every {PAGE_CACHE_FLUSH_MS} ms" if config.page_cache else "SYNC_FLUSH"
    meta = run_meta(
        config.command(), config.seed, config.members, config.fault_kinds(),
        config.time_limit_s, flush, steps,
    )  # fmt: skip
    meta["workload"] = config.workload
    meta["topology"] = config.topology
    if config.store_bytes() is not None:
        meta["stores"] = f"tmpfs {config.store_bytes() >> 20} MiB each"
    return meta


def run_meta(
    command: str,
    seed: int,
    nodes: int,
    fault_kinds: tuple[str, ...],
    time_limit_s: float,
    flush: str,
    steps: int,
) -> dict:
    """What the report says about a run's settings (`command` reproduces it)."""
    return {
        "command": command,
        "seed": seed,
        "nodes": nodes,
        "faults": ",".join(fault_kinds),
        "time_limit_s": time_limit_s,
        "flush": flush,
        "scheduled_faults": steps,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
    }


def machine() -> str:
    """Cores and CPU model (from /proc/cpuinfo where there is one), and the Python."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} x {model}, {platform.python_implementation()} "
        f"{platform.python_version()}"
    )


def summary(results: dict, config: RunConfig) -> str:
    return format_summary(results, _meta(config, len(config.schedule())))
