"""`python -m bench dledger|broker|spark [--duration S] [--json PATH]`: raftmq beside its peers.
(`python -m bench walk` counts the files one send passes through instead: bench/walk.py.)

`dledger` measures the replicated log against PySyncObj; `broker` measures the
broker group end to end (produce -> ack, produce -> consume, failover) against
NATS JetStream R3 with `sync_interval: always`; `spark` measures the rows/s a
local[2] streaming query reads through the Spark source beside our own PullConsumer.
`broker --scale` measures how the broker's cost grows instead (bench/scale_bench.py):
with the message size, the sends in flight, 1,000 topics, a growing log and a backlog.

Prints a table (and writes the rows as JSON with --json). Each system is measured
in the same run on the same machine, so the ratios mean something; absolute figures
vary 10-25 % between runs here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import date
from pathlib import Path

import trio

COLUMNS = [
    ("system", "system"),
    ("payload", "payload B"),
    ("appends_per_s", "appends/s"),
    ("batched_appends_per_s", "batched/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("half_load_p99_ms", "p99@half ms"),
    ("single_p50_ms", "single p50 ms"),
    ("failover_ms", "failover ms"),
    ("peak_rss_mib", "RSS MiB/node"),
    ("cpu_leader_us", "CPU µs/msg leader"),
    ("cpu_follower_us", "per follower"),
    ("cpu_generator_us", "generator"),
]


BROKER_COLUMNS = [
    ("system", "system"),
    ("generator", "load generator"),
    ("size", "size B"),
    ("acked_per_s", "acked/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("single_p50_ms", "single p50 ms"),
    ("consumed_per_s", "consumed/s"),
    ("acked_consuming_per_s", "acked/s consuming"),
    ("e2e_p99_ms", "e2e p99 ms"),
    ("failover_ms", "failover ms"),
    ("peak_rss_mib", "RSS MiB/node"),
    ("cpu_leader_us", "CPU µs/msg leader"),
    ("cpu_follower_us", "per follower"),
    ("cpu_generator_us", "generator"),
    ("cpu_puller_us", "puller"),
]


SPARK_COLUMNS = [
    ("system", "reader"),
    ("messages", "messages"),
    ("size", "size B"),
    ("seconds", "seconds"),
    ("rows_per_s", "rows/s"),
    ("batches", "micro-batches"),
]


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key.endswith("_per_s") or key == "failover_ms" or key.startswith("cpu_"):
        return f"{round(value):,}"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 10 else f"{value:.1f}"
    return str(value)


def table(rows: list[dict], columns=COLUMNS) -> str:
    """A Markdown table, so docs/benchmarks.md can show it as printed."""
    cells = [[title for _, title in columns]]
    cells += [[_cell(key, row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine(load_at_start: tuple[float, float, float]) -> str:
    """The line printed above the table: what ran it, and how busy the machine was when
    the run began (other work on the same cores moves every absolute figure)."""
    cpus = len(os.sched_getaffinity(0))
    load = " ".join(f"{x:.2f}" for x in load_at_start)
    return (
        f"{platform.machine()}, {cpus} cores, Python {platform.python_version()}, "
        f"{date.today()}; load average at the start {load}"
    )


def _measured(system: str, size_key: str, size: int, measure, *args) -> dict:
    """A row from ``measure(*args)``; a system that fails gets a row naming the error, so
    one peer's failure never loses the figures of the others (the exit status is then 1)."""
    try:
        return measure(*args)
    except Exception as exc:  # noqa: BLE001 - a row naming it, not a crash
        print(f"{system}, {size} B failed: {exc!r}", file=sys.stderr, flush=True)
        return {"system": system, size_key: size, "error": repr(exc), "notes": f"failed: {exc!r}"}


def run_dledger(args) -> list[dict]:
    from bench import dledger_bench, peer_pysyncobj

    rows = []
    for payload in (128, 1024):
        print(f"raftmq dledger, {payload} B ...", file=sys.stderr, flush=True)
        rows.append(
            _measured(
                dledger_bench.SYSTEM, "payload", payload, trio.run, dledger_bench.measure,
                payload, args.duration, args.window, args.failover_trials,
            )
        )  # fmt: skip
        print(f"PySyncObj, {payload} B ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-pysyncobj-") as tmp:
            rows.append(
                _measured(
                    peer_pysyncobj.SYSTEM, "payload", payload, peer_pysyncobj.measure,
                    payload, args.duration, args.window, args.failover_trials, Path(tmp),
                )
            )  # fmt: skip
    return rows


def run_broker(args) -> list[dict]:
    from bench import broker_bench, nats_jetstream

    generators, fallback = broker_bench.generators(args.generator)
    if fallback:
        print(f"raftmq broker: {fallback}; the Python generator runs", file=sys.stderr)
    rows = []
    for size in (128, 1024):
        for k, generator in enumerate(generators):
            print(f"raftmq broker ({generator}), {size} B ...", file=sys.stderr, flush=True)
            trials = args.failover_trials if k == 0 else 0  # failover: once per size
            row = _measured(
                broker_bench.SYSTEM, "size", size, trio.run, broker_bench.measure,
                size, args.duration, args.window, trials, generator,
            )  # fmt: skip
            if fallback:
                row["notes"] += f"; {fallback}"
            rows.append(row)
        if args.no_peer:
            continue
        print(f"NATS JetStream, {size} B ...", file=sys.stderr, flush=True)
        rows.append(_measured(nats_jetstream.SYSTEM, "size", size, _nats_row, size, args))
    return rows


def _sizes(text: str) -> list[int]:
    from bench import scale_bench

    try:
        return scale_bench.sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_scale(args, load_at_start: tuple[float, float, float]) -> int:
    """`bench broker --scale`: a table per phase, each row's failure named under it."""
    from bench import broker_bench, scale_bench

    generators, fallback = broker_bench.generators(args.generator)
    if fallback:
        print(f"raftmq broker: {fallback}; the Python generator runs", file=sys.stderr)
    generator = generators[0]
    tables = scale_bench.run(args, generator)
    print(f"\n{machine(load_at_start)}; load generator: {generator}")
    for t in tables:
        print(f"\n{t.title}\n")
        print(table(t.rows, t.columns))
        for note in [*t.notes, *t.errors()]:
            print(f"\n{note}")
    if args.json:
        args.json.write_text(json.dumps({t.name: t.rows for t in tables}, indent=2))
    return 1 if any(t.errors() for t in tables) else 0


def _nats_row(size: int, args) -> dict:
    from bench import nats_jetstream

    nats_jetstream.ensure_installed()
    with tempfile.TemporaryDirectory(prefix="bench-nats-") as tmp:
        row = nats_jetstream.run_throughput(size, args.window, args.duration, Path(tmp))
        if size == 1024 and args.failover_trials:
            failover = nats_jetstream.run_failover(args.failover_trials, Path(tmp))
            row["failover_ms"] = failover["failover_ms"]
    row["peak_rss_mib"] = max(row["peak_rss_mib"])
    return row


def run_spark(args) -> list[dict]:
    from bench import spark_bench

    return spark_bench.measure(args.messages, args.size, args.queues, args.per_trigger)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    sub = parser.add_subparsers(dest="what", required=True)
    dl = sub.add_parser("dledger", help="3-process DLedger group vs PySyncObj")
    dl.add_argument("--duration", type=float, default=10.0, help="seconds per load phase")
    dl.add_argument("--window", type=int, default=256, help="appends in flight")
    dl.add_argument("--failover-trials", type=int, default=5)
    dl.add_argument("--json", type=Path)
    br = sub.add_parser("broker", help="namesrv + 3-broker group vs NATS JetStream R3")
    br.add_argument("--duration", type=float, default=10.0, help="seconds per load phase")
    br.add_argument("--window", type=int, default=256, help="sends in flight")
    br.add_argument("--failover-trials", type=int, default=5)
    br.add_argument("--no-peer", action="store_true", help="skip NATS (not installed here)")
    br.add_argument(
        "--generator",
        choices=("auto", "go", "python", "both"),
        default="auto",
        help="raftmq's load generator: Go where it can be built (auto), or each in turn",
    )
    br.add_argument(
        "--stages",
        action="store_true",
        help="instead of the table: where a single send's latency goes, stage by stage",
    )
    br.add_argument("--sends", type=int, default=300, help="single sends timed by --stages")
    scale = br.add_argument_group("--scale: how the cost grows (one group, phase after phase)")
    scale.add_argument("--scale", action="store_true", help="instead of the table: the curves")
    scale.add_argument(
        "--payloads", type=_sizes, default="128,1K,4K,16K,64K", help="sizes ('' skips)"
    )
    scale.add_argument("--windows", type=_sizes, default="1,16,64,256,1024", help="'' skips")
    scale.add_argument("--topics", type=int, default=1000, help="many topics (0 skips)")
    scale.add_argument("--idle", type=float, default=6.0, help="seconds of each idle phase")
    scale.add_argument("--backlog-mib", type=int, default=1024, help="backlog (0 skips)")
    scale.add_argument("--rss-samples", type=int, default=8, help="RSS samples as it grows")
    br.add_argument("--json", type=Path)
    sp = sub.add_parser("spark", help="Spark source (local[2] stream) vs our PullConsumer")
    sp.add_argument("--messages", type=int, default=200_000, help="messages in the topic")
    sp.add_argument("--size", type=int, default=256, help="message body bytes")
    sp.add_argument("--queues", type=int, default=4)
    sp.add_argument("--per-trigger", type=int, default=20_000, help="maxMessagesPerTrigger")
    sp.add_argument("--json", type=Path)
    wk = sub.add_parser("walk", help="the files one send passes through on the master")
    wk.add_argument("--sends", type=int, default=7, help="sends walked; the shortest is shown")
    args = parser.parse_args(argv)
    if args.what == "walk":
        from bench import walk

        return walk.main(args.sends)
    load_at_start = os.getloadavg()
    if args.what == "broker" and args.stages:
        from bench import stages

        for size in (128, 1024):
            stages.print_table(size, trio.run(stages.measure, size, args.sends))
        print(f"\nload average at the start {' '.join(f'{x:.2f}' for x in load_at_start)}")
        return 0
    if args.what == "broker" and args.scale:
        return run_scale(args, load_at_start)
    if args.what == "broker":
        rows, columns, size_key = run_broker(args), BROKER_COLUMNS, "size"
    elif args.what == "spark":
        rows, columns, size_key = run_spark(args), SPARK_COLUMNS, "size"
    else:
        rows, columns, size_key = run_dledger(args), COLUMNS, "payload"
    print(f"\n{machine(load_at_start)}\n")
    print(table(rows, columns))
    for row in rows:
        if row.get("notes"):
            print(f"\n{row['system']} {row[size_key]} B: {row['notes']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
