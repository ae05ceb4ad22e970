"""`python -m bench dledger|broker|spark [--duration S] [--json PATH]`: raftmq beside its peers.
(`python -m bench walk` counts the files one send passes through instead: bench/walk.py.)

`dledger` measures the replicated log against PySyncObj; `broker` measures the
broker group end to end (produce -> ack, produce -> consume, failover) against
NATS JetStream R3 with `sync_interval: always` and Apache RocketMQ 4.9.7's Java brokers
(DLedger mode and classic SYNC_MASTER + SLAVE, each with SYNC_FLUSH and its defaults),
every system loaded alike (`--connections`, one warm-up), then prints raftmq's ratios
against the issue's targets; `spark` measures the rows/s a
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
    ("connections", "conns"),
    ("acked_per_s", "acked/s"),
    ("errors", "errors"),
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
    ("cpu_namesrv_us", "namesrv"),
    ("cpu_generator_us", "generator"),
    ("cpu_puller_us", "puller"),
]

#: `bench broker --grpc`: the same group through mqproxy (and, with the rocketmq peer,
#: through Apache RocketMQ's proxy), sends then receive+ack, in a table of its own below
#: the remoting rows (bench/broker_bench.py measure_grpc).
GRPC_COLUMNS = [
    ("system", "system"),
    ("size", "size B"),
    ("acked_per_s", "sends/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("received_acked_per_s", "recv+ack/s"),
    ("cpu_proxy_us", "CPU µs/msg send: proxy"),
    ("cpu_leader_us", "master"),
    ("cpu_follower_us", "per follower"),
    ("cpu_generator_us", "generator"),
    ("receive_cpu_proxy_us", "recv+ack: proxy"),
    ("receive_cpu_leader_us", "master"),
    ("receive_cpu_follower_us", "per follower"),
    ("receive_cpu_generator_us", "generator"),
]


SPARK_COLUMNS = [
    ("system", "reader"),
    ("messages", "messages"),
    ("size", "size B"),
    ("seconds", "seconds"),
    ("rows_per_s", "rows/s"),
    ("of_pull", "of PullConsumer"),
    ("runs_s", "runs, s"),
    ("batches", "micro-batches"),
]


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "of_pull":
        return f"{value:.2f}x"
    if key.endswith("_per_s") or key == "failover_ms" or key.startswith(("cpu_", "receive_cpu_")):
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
    """Per size: raftmq's rows, then each peer's (NATS, Apache RocketMQ's four), a row
    per count of connections each."""
    from bench import broker_bench

    generators, fallback = broker_bench.generators(args.generator)
    if fallback:
        print(f"raftmq broker: {fallback}; the Python generator runs", file=sys.stderr)
    rows = []
    for size in (128, 1024):
        for k, generator in enumerate(generators):
            print(f"raftmq broker ({generator}), {size} B ...", file=sys.stderr, flush=True)
            trials = args.failover_trials if k == 0 else 0  # failover: once per size
            measured = _measured(
                broker_bench.SYSTEM, "size", size, trio.run, broker_bench.measure,
                size, args.duration, args.window, trials, generator, args.connections,
                broker_bench.RAFTMQ, _warmup_s(args),
            )  # fmt: skip
            for row in measured if isinstance(measured, list) else [measured]:
                if fallback:
                    row["notes"] += f"; {fallback}"
                rows.append(row)
        # through Apache's proxy too, with the RocketMQ peer
        proxies = (
            broker_bench.GRPC_SYSTEMS if "rocketmq" in args.peers else [broker_bench.GRPC_SYSTEM]
        )
        for system in proxies if args.grpc else ():
            print(f"{system}, {size} B ...", file=sys.stderr, flush=True)
            rows.append(
                _measured(
                    system, "size", size, trio.run, broker_bench.measure_grpc,
                    size, args.duration, args.window, system,
                )
            )  # fmt: skip
        if "nats" in args.peers:
            print(f"NATS JetStream, {size} B ...", file=sys.stderr, flush=True)
            rows += _listed(_measured("NATS JetStream", "size", size, _nats_rows, size, args))
        if "rocketmq" in args.peers:
            rows += _java_rows(size, args)
    return rows


def _warmup_s(args) -> float:
    """`--warmup`, the same for every system; WARMUP_S unless given."""
    from bench import broker_bench

    return broker_bench.WARMUP_S if args.warmup is None else args.warmup


def _listed(measured: list[dict] | dict) -> list[dict]:
    """A measurement's rows: its list, or the one row naming its failure."""
    return measured if isinstance(measured, list) else [measured]


def _java_rows(size: int, args) -> list[dict]:
    """Apache RocketMQ's rows for `size`, by the same Go generator as raftmq's (failover
    trials at 1 KiB only: a JVM takes 10-20 s to start again after each kill)."""
    from bench import broker_bench

    rows = []
    for system in broker_bench.JAVA_SYSTEMS:
        print(f"{system.name}, {size} B ...", file=sys.stderr, flush=True)
        trials = args.failover_trials if size == 1024 else 0
        rows += _listed(
            _measured(
                system.name, "size", size, trio.run, broker_bench.measure, size,
                args.duration, args.window, trials, broker_bench.GO, args.connections, system,
                _warmup_s(args),
            )
        )  # fmt: skip
    return rows


def ratios(rows: list[dict]) -> list[str]:
    """raftmq's rows against each peer's of the same size and connections, and its own
    latency, each against the issue's target, met or missed, with the peers' beside it."""
    from bench import broker_bench

    lines = []
    ours = [r for r in rows if r["system"] == broker_bench.SYSTEM and "error" not in r]
    for row in ours:
        where = f"{row['size']} B, {row['connections']} conns"
        for peer in rows:
            same = (peer.get("size"), peer.get("connections")) == (row["size"], row["connections"])
            target = _ratio_target(peer["system"], row["size"])
            if not same or target is None or not peer.get("acked_per_s"):
                continue
            ratio = row["acked_per_s"] / peer["acked_per_s"]
            lines.append(
                f"{where}: raftmq / {peer['system']}: {ratio:.2f}x "
                f"(target >= {target:g}x: {_met(ratio >= target)})"
            )
        for key, title, bound in (
            ("p99_ms", "p99", TARGET_P99_MS),
            ("single_p50_ms", "single-send p50", TARGET_SINGLE_P50_MS),
        ):
            if row.get(key) is not None:
                beside = "".join(
                    f"; {peer['system']}: {peer[key]:.2f} ms"
                    for peer in rows
                    if peer["system"] != row["system"]
                    and (peer.get("size"), peer.get("connections"))
                    == (row["size"], row["connections"])
                    and peer.get(key) is not None
                )
                lines.append(
                    f"{where}: raftmq {title} {row[key]:.2f} ms "
                    f"(target <= {bound:g} ms: {_met(row[key] <= bound)}{beside})"
                )
    return lines


#: The issue's targets on this 2-vCPU machine: raftmq's acked/s over each peer's.
TARGET_OVER_DLEDGER = 3.0
TARGET_OVER_CLASSIC = 1.5
TARGET_OVER_NATS = {128: 1.2, 1024: 1.5}
TARGET_P99_MS = 10.0
TARGET_SINGLE_P50_MS = 0.6


def _ratio_target(system: str, size: int) -> float | None:
    """The ratio raftmq's acked/s should reach over `system`'s at `size`, if any."""
    from bench import broker_bench, nats_jetstream

    if system == nats_jetstream.SYSTEM:
        return TARGET_OVER_NATS.get(size)
    if system.startswith(broker_bench.ROCKETMQ):
        return TARGET_OVER_DLEDGER if " DLedger " in system else TARGET_OVER_CLASSIC
    return None


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _peers(text: str) -> tuple[str, ...]:
    peers = tuple(p for p in text.split(",") if p)
    if not set(peers) <= {"nats", "rocketmq"}:
        raise argparse.ArgumentTypeError(f"peers are nats and rocketmq, not {text!r}")
    return peers


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(n) for n in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"counts of connections, 1,4 say, not {text!r}")
    return counts


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


def _nats_rows(size: int, args) -> list[dict]:
    from bench import nats_jetstream

    nats_jetstream.ensure_installed()
    with tempfile.TemporaryDirectory(prefix="bench-nats-") as tmp:
        rows = nats_jetstream.run_throughput(
            size, args.window, args.duration, Path(tmp), args.connections, _warmup_s(args)
        )
        failover = None
        if size == 1024 and args.failover_trials:
            failover = nats_jetstream.run_failover(args.failover_trials, Path(tmp))
    for row in rows:
        row["peak_rss_mib"] = max(row["peak_rss_mib"])
        if failover:
            row["failover_ms"] = failover["failover_ms"]
    return rows


def run_spark(args) -> list[dict]:
    from bench import spark_bench

    return spark_bench.measure(
        args.messages, args.size, args.queues, args.per_trigger, args.repeats
    )


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
    br.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds of load before every system's measured phases (default 10: a JVM"
        " compiles its hot paths in the first seconds)",
    )
    br.add_argument(
        "--peers",
        type=_peers,
        default="nats,rocketmq",
        help="peers measured beside raftmq: nats (JetStream), rocketmq (Apache's Java brokers)",
    )
    br.add_argument("--no-peer", action="store_const", const=(), dest="peers", help="no peer")
    br.add_argument(
        "--connections",
        type=_counts,
        default="1,4",
        help="connections the window is split over, a row per count, for every system",
    )
    br.add_argument(
        "--generator",
        choices=("auto", "go", "python", "both"),
        default="auto",
        help="raftmq's load generator: Go where it can be built (auto), or each in turn",
    )
    br.add_argument(
        "--grpc",
        action="store_true",
        help="also the gRPC path: sends and receive+ack through mqproxy, and through"
        " Apache RocketMQ's proxy with the rocketmq peer (Go generator)",
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
    sp.add_argument("--repeats", type=int, default=3, help="runs of each read (median shown)")
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
    grpc_rows = []
    if args.what == "broker":
        from bench.broker_bench import GRPC_SYSTEMS

        grpc_rows = [row for row in rows if row["system"] in GRPC_SYSTEMS]
    print(table([row for row in rows if row not in grpc_rows], columns))
    if grpc_rows:
        print(f"\n{table(grpc_rows, GRPC_COLUMNS)}")
    for row in rows:
        if row.get("notes"):
            conns = f", {row['connections']} conns" if "connections" in row else ""
            print(f"\n{row['system']} {row[size_key]} B{conns}: {row['notes']}")
    if args.what == "broker":
        print("\nraftmq against the targets, in this run:\n")
        print("\n".join(ratios(rows)) or "(no rows to compare)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
