"""`python -m jepsen run ...` (a fault-injection run), `python -m jepsen check RUN_DIR` and
`python -m jepsen soak --minutes M` (steady load with retention and faults; see jepsen.soak).

Exit status: 0 when every check passed (the safety checks, and no process errors such as a
node that would not restart), 1 when one failed, 2 for bad arguments (or disk-full faults
asked of a user who cannot mount their filesystems).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from pathlib import Path

import trio

from jepsen import history as history_file
from jepsen.checker import check
from jepsen.nemesis import DEFAULT_FAULTS, TOPOLOGY_KINDS, Step
from jepsen.report import format_summary, write_report
from jepsen.resources import read_samples
from jepsen.runner import (
    CONTROLLER_CONF,
    TOPOLOGIES,
    WORKLOADS,
    RunConfig,
    checks_for,
    run,
    summary,
)
from jepsen.soak import SOAK_COMMAND, SOAK_TARGETS, SoakConfig, soak
from jepsen.soak_report import passed, write_soak_report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jepsen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="start a group, inject faults, check, report")
    r.add_argument(
        "--nodes", type=int, default=3, choices=(2, 3, 5),
        help="a DLedger group's members (3 or 5), a controller-mode group's brokers (2 or 3)",
    )  # fmt: skip
    r.add_argument("--workload", default="queue", choices=tuple(WORKLOADS))
    r.add_argument(
        "--topology",
        default="dledger",
        choices=tuple(TOPOLOGIES),
        help="a DLedger group (--nodes), a classic SYNC_MASTER/ASYNC_MASTER and its slave, "
        "(upgraded) such a SYNC_MASTER group given old messages, then upgraded in place "
        "to a DLedger group of --nodes, or (controller, controller-async) --nodes brokers in "
        "controller mode under three controllers, with allAckInSyncStateSet true or false",
    )
    r.add_argument(
        "--faults",
        default=None,
        help="comma-separated kinds among "
        + "; ".join(f"{t}: {','.join(k)}" for t, k in TOPOLOGY_KINDS.items())
        + " (default: "
        + "; ".join(f"{t}: {','.join(k)}" for t, k in DEFAULT_FAULTS.items())
        + ")",
    )
    r.add_argument("--time-limit", type=float, default=60.0, help="seconds of faults")
    r.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: random)")
    r.add_argument("--rate", type=float, default=1000.0, help="sends per second, all producers")
    r.add_argument("--dir", type=Path, default=None, help="run directory (default: runs/...)")
    r.add_argument(
        "--unsafe-page-cache",
        action="store_true",
        help="acknowledge before fsync (ASYNC_FLUSH): the negative control, which must lose data",
    )
    r.add_argument("--schedule", type=Path, help="replay a run's schedule.json instead of a seed")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    c = commands.add_parser("check", help="check a run directory again")
    c.add_argument("run_dir", type=Path)
    _soak_parser(commands)
    return parser


def _soak_parser(commands) -> None:
    s = commands.add_parser(
        "soak", help="steady load, retention and a fault every few minutes; measure every process"
    )
    length = s.add_mutually_exclusive_group(required=True)
    length.add_argument("--minutes", type=float)
    length.add_argument("--hours", type=float)
    s.add_argument("--rate", type=float, default=50.0, help="sends per second (default 50)")
    s.add_argument("--body-bytes", type=int, default=1024, help="message body size")
    s.add_argument(
        "--faults",
        default=",".join(SOAK_TARGETS),
        help=f"comma-separated kinds among {','.join(SOAK_TARGETS)}, or none",
    )
    s.add_argument("--fault-every", type=float, default=240.0, help="seconds between faults")
    s.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    s.add_argument("--segment-bytes", type=int, default=4 << 20, help="log data file size")
    s.add_argument(
        "--reserved-hours", type=float, default=0.03, help="fileReservedHours (0.03 = 108 s)"
    )
    s.add_argument("--rss-limit-pct", type=float, default=20.0, help="RSS growth that is a leak")
    s.add_argument("--fd-limit", type=float, default=8.0, help="descriptor growth that is a leak")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--dir", type=Path, default=None, help="run directory (default: runs/...)")
    s.add_argument("--quiet", action="store_true", help="no progress lines")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":
        return _recheck(args.run_dir)
    if args.command == "soak":
        return _soak(args)
    if args.nodes not in ((2, 3) if args.topology in CONTROLLER_CONF else (3, 5)):
        print(f"jepsen: --nodes {args.nodes} not for --topology {args.topology}", file=sys.stderr)
        return 2
    known = TOPOLOGY_KINDS[args.topology]
    if args.faults is None:
        faults = DEFAULT_FAULTS[args.topology]
    else:
        faults = tuple(filter(None, args.faults.split(",")))
    unknown = sorted(set(faults) - set(known))
    if unknown:
        print(
            f"jepsen: faults {unknown} not for --topology {args.topology}; known: "
            f"{', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    run_dir = args.dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{seed}"
    steps = None
    if args.schedule is not None:
        steps = tuple(Step(**s) for s in json.loads(args.schedule.read_text()))
    config = RunConfig(
        run_dir=run_dir,
        seed=seed,
        nodes=args.nodes,
        faults=faults,
        time_limit_s=args.time_limit,
        rate=args.rate,
        page_cache=args.unsafe_page_cache,
        steps=steps,
        progress=not args.quiet,
        workload=args.workload,
        topology=args.topology,
    )
    if config.store_bytes() is not None and os.geteuid() != 0:
        print("jepsen: disk-full faults mount a tmpfs for each store: run as root", file=sys.stderr)
        return 2
    results = trio.run(run, config)
    print(summary(results, config))
    for error in results["run"].get("errors", []):
        print(f"nemesis: {error}")
    print(f"run directory: {run_dir}")
    return 0 if results["valid"] else 1


def _soak(args: argparse.Namespace) -> int:
    """Exit status 0 when every check passed, no process leaked and the group recovered
    once the faults healed; 1 otherwise; 2 for bad arguments."""
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    run_dir = args.dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-soak-seed{seed}"
    try:
        config = _soak_config(args, run_dir, seed)
    except ValueError as exc:
        print(f"jepsen soak: {exc}", file=sys.stderr)
        return 2
    results = trio.run(soak, config)
    print((run_dir / "soak-summary.txt").read_text(), end="")
    print(f"run directory: {run_dir}")
    return 0 if passed(results["soak"], results) else 1


def _soak_config(args: argparse.Namespace, run_dir: Path, seed: int) -> SoakConfig:
    minutes = args.minutes if args.minutes is not None else args.hours * 60
    return SoakConfig(
        run_dir=run_dir,
        seed=seed,
        duration_s=minutes * 60,
        rate=args.rate,
        body_bytes=args.body_bytes,
        faults=tuple(f for f in args.faults.split(",") if f and f != "none"),
        fault_every_s=args.fault_every,
        sample_every_s=args.sample_every,
        segment_bytes=args.segment_bytes,
        reserved_hours=args.reserved_hours,
        rss_limit_pct=args.rss_limit_pct,
        fd_limit=args.fd_limit,
        progress=not args.quiet,
    )


def _recheck(run_dir: Path) -> int:
    ops = history_file.load(run_dir / "history.jsonl")
    final = json.loads((run_dir / "final.json").read_text())
    replicas = json.loads((run_dir / "replicas.json").read_text())
    previous = json.loads((run_dir / "results.json").read_text())
    meta = previous.get("meta", {"command": f"python -m jepsen check {run_dir}"})
    checks = checks_for(meta.get("workload", "queue"), meta.get("topology", "dledger"))
    soaked = meta["command"].startswith(SOAK_COMMAND)  # its logs lost heads to retention
    results = check(ops, final, replicas, previous.get("run", {}), checks, retention=soaked)
    results["run"] = previous.get("run", {})
    if soaked:  # judged again from its samples, under the settings its command records
        args = _parser().parse_args(shlex.split(meta["command"])[len(SOAK_COMMAND.split()) - 1 :])
        config = _soak_config(args, run_dir, meta["seed"])
        samples = read_samples(run_dir / "samples.csv")
        results["soak"] = write_soak_report(run_dir, ops, samples, results, meta, config)
    write_report(run_dir, ops, results, meta)
    if soaked:
        print((run_dir / "soak-summary.txt").read_text(), end="")
        return 0 if passed(results["soak"], results) else 1
    print(format_summary(results, meta))
    return 0 if results["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
