"""A soak: steady load for minutes or hours on a real group, retention cycling its files,
a fault every few minutes, and every process measured as it goes.

The group is the fault-injection runs' (`runner.behind_proxies`: a name server and three
brokers as real processes, every link through a proxy), the load their queue workload at a
fixed rate with bodies of a realistic size, the faults their nemesis's (one step every
`fault_every_s`, of a kind and target that leaves a majority: kill or pause the leader or
one node, isolate the leader or one node). The logs are cut into small data files kept for
minutes (`mappedFileSizeCommitLog`, `fileReservedHours`), so retention deletes files all
along, as it does over days in production.

Every `sample_every_s` the sampler records each process's RSS and open descriptors, and each
broker's disk use and where its log now begins (`resources`); the process running the
clients records its history to the file only, so that it measures the clients and not the
record. At the end the checker judges the history as a fault-injection run's, except that
the logs have lost their heads: an acknowledged message must have been consumed
(`check(..., retention=True)`). `soak_report` writes the samples, the charts and the summary.
"""

from __future__ import annotations

import csv
import functools
import os
import random
import shutil
import sys
from pathlib import Path

import attrs
import trio

from jepsen import history as history_file
from jepsen.checker import check
from jepsen.cluster import JepsenCluster
from jepsen.history import Recorder
from jepsen.nemesis import KINDS, Nemesis, Step
from jepsen.report import write_report
from jepsen.resources import FIELDS, Sample, disk_bytes, log_begin_bytes, read_process
from jepsen.runner import behind_proxies, new_workload, play, read_logs, run_meta, save_logs
from jepsen.soak_report import write_soak_report
from jepsen.workload import GROUP, QUEUES, Workload

NODES = 3
SOAK_COMMAND = "python -m jepsen soak"
CLIENTS = "clients"  # this process: producers, consumers, proxies and nemesis
# Targets of each kind that leave a majority up and connected: a soak measures steady
# load, so a fault may cost a leader, never the group.
SOAK_TARGETS = {
    "kill": ("leader", "one"),
    "pause": ("leader", "one"),
    "partition": ("isolate-leader", "isolate-one", "one-way-leader"),
}


@attrs.frozen
class SoakConfig:
    run_dir: Path
    seed: int
    duration_s: float
    rate: float = 50.0  # sends per second; modest, so a small machine is not saturated
    body_bytes: int = 1024
    producers: int = 8
    faults: tuple[str, ...] = tuple(SOAK_TARGETS)
    fault_every_s: float = 240.0
    sample_every_s: float = 5.0
    segment_bytes: int = 4 << 20  # mappedFileSizeCommitLog
    queue_file_entries: int = 6000  # mappedFileSizeConsumeQueue / 20
    reserved_hours: float = 0.03  # fileReservedHours: 108 s
    clean_interval_ms: int = 10_000  # cleanResourceInterval: retention's look this often
    rss_limit_pct: float = 20.0  # RSS growth that counts as a leak
    fd_limit: float = 8.0  # descriptor growth that counts as a leak
    progress: bool = True

    def __attrs_post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(SOAK_TARGETS))
        if unknown:
            raise ValueError(f"faults {unknown} are not soak faults ({', '.join(SOAK_TARGETS)})")
        if self.duration_s <= 0 or self.rate <= 0 or self.sample_every_s <= 0:
            raise ValueError("duration, rate and sampling interval must be positive")

    @property
    def warmup_s(self) -> float:
        """Until retention first deletes files, a store (and its open files and mapped
        pages) only grows: growth is judged from here on (see `resources`)."""
        return self.reserved_hours * 3600 + 2 * self.clean_interval_ms / 1000

    @property
    def judged_span_s(self) -> float:
        """A life shorter than this after its warm-up is too short to judge."""
        return min((self.duration_s - self.warmup_s) / 2, 600.0)

    def broker_conf(self) -> dict[str, str]:
        """Every kind of store file small enough that retention deletes it within minutes:
        log data and index files, ConsumeQueue files and IndexFiles."""
        return {
            "flushDiskType": "SYNC_FLUSH",
            "mappedFileSizeCommitLog": str(self.segment_bytes),
            "mappedFileSizeForEntryIndex": str(32 * self.queue_file_entries * QUEUES),
            "mappedFileSizeConsumeQueue": str(20 * self.queue_file_entries),
            "maxIndexNum": str(self.queue_file_entries * QUEUES),
            "maxHashSlotNum": str(self.queue_file_entries),
            "fileReservedHours": str(self.reserved_hours),
            "cleanResourceInterval": str(self.clean_interval_ms),
        }

    def command(self) -> str:
        """The command line that runs this soak again (and that `python -m jepsen check`
        reads the settings back from)."""
        return (
            f"{SOAK_COMMAND} --minutes {self.duration_s / 60:g} --rate {self.rate:g} "
            f"--body-bytes {self.body_bytes} --faults {','.join(self.faults) or 'none'} "
            f"--fault-every {self.fault_every_s:g} --sample-every {self.sample_every_s:g} "
            f"--segment-bytes {self.segment_bytes} --reserved-hours {self.reserved_hours:g} "
            f"--rss-limit-pct {self.rss_limit_pct:g} --fd-limit {self.fd_limit:g} "
            f"--seed {self.seed}"
        )


def schedule(config: SoakConfig) -> list[Step]:
    """One fault every `fault_every_s` (the first after one interval of plain load), each
    over before the run ends."""
    rng = random.Random(config.seed)
    steps: list[Step] = []
    at = config.fault_every_s
    while config.faults:
        kind = rng.choice(config.faults)
        _, variants, (low, high) = KINDS[kind]
        duration = round(rng.uniform(low, high), 2)
        if at + duration >= config.duration_s:
            return steps
        target = rng.choice(SOAK_TARGETS[kind])
        seed = rng.randrange(1 << 32)
        steps.append(Step(round(at, 2), kind, target, variants[0], duration, seed))
        at += config.fault_every_s
    return steps


async def soak(config: SoakConfig) -> dict:
    """Run, check and report; returns the checker results with `run` and `soak` sections."""
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir / "cluster", ignore_errors=True)
    steps = schedule(config)
    rng = random.Random(config.seed)
    cluster = JepsenCluster(run_dir / "cluster", NODES, config.broker_conf())
    outcome: dict = {}
    samples: list[Sample] = []
    with (
        Recorder(run_dir / "history.jsonl", keep_ops=False) as history,
        open(run_dir / "samples.csv", "w", newline="") as samples_file,
    ):
        async with behind_proxies(cluster, rng):
            nemesis = Nemesis(cluster, history)
            workload = new_workload(
                cluster,
                history,
                rng,
                producers=config.producers,
                rate=config.rate,
                body_bytes=config.body_bytes,
            )
            writer = csv.writer(samples_file)
            writer.writerow(FIELDS)

            def keep(sample: Sample) -> None:
                samples.append(sample)
                writer.writerow(sample.row())
                samples_file.flush()

            progress = None
            if config.progress:
                progress = functools.partial(_progress, samples, nemesis, workload, config)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_sample, cluster, history, config, keep)
                await play(cluster, nemesis, workload, steps, config.duration_s, outcome, progress)
                nursery.cancel_scope.cancel()
            final, replicas = await read_logs(cluster, outcome)
    record = {**outcome, "faults": nemesis.injected, "errors": nemesis.errors}
    ops = history_file.load(run_dir / "history.jsonl")
    results = check(ops, final, replicas, record, retention=True)
    results["run"] = record
    save_logs(run_dir, final, replicas)
    meta = _meta(config, len(steps))
    results["soak"] = write_soak_report(run_dir, ops, samples, results, meta, config)
    write_report(run_dir, ops, results, meta)
    return results


def _meta(config: SoakConfig, steps: int) -> dict:
    meta = run_meta(
        config.command(), config.seed, NODES, config.faults, config.duration_s, "SYNC_FLUSH", steps
    )
    return {**meta, "rate": config.rate, "body_bytes": config.body_bytes}


async def _sample(cluster: JepsenCluster, history: Recorder, config: SoakConfig, keep) -> None:
    """A sample of every running process every `sample_every_s`, for the load's duration
    (not the drain after it, when the load is gone)."""
    while history.elapsed() < config.duration_s:
        now_s = history.elapsed()
        processes = {name: proc.pid for name, proc in cluster.procs.items() if proc.poll() is None}
        processes[CLIENTS] = os.getpid()
        for name, pid in processes.items():
            measured = read_process(pid)
            if measured is None:
                continue
            disk = begin = None
            if name in cluster.ids:
                disk = disk_bytes(cluster.store_dir(name))
                begin = log_begin_bytes(cluster.log_dir(name) / "data")
            keep(Sample(now_s, name, pid, *measured, disk, begin))
        await trio.sleep(config.sample_every_s)


async def _progress(samples: list[Sample], nemesis: Nemesis, workload: Workload, config) -> None:
    """A status line on stderr at each sampling interval."""
    while True:
        await trio.sleep(config.sample_every_s)
        if not samples:
            continue
        latest = samples[-1].time_s
        sizes = " ".join(
            f"{s.process}={s.rss_bytes / 2**20:.0f}M/{s.fds}fd"
            for s in samples
            if s.time_s == latest
        )
        consumed = sum(workload.positions[GROUP].get(q, 0) for q in range(QUEUES))
        print(
            f"[soak] {latest:6.0f}/{config.duration_s:g}s consumed={consumed} {sizes} "
            f"fault={nemesis.active or '-'}",
            file=sys.stderr,
            flush=True,
        )
