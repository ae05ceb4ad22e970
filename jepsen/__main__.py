"""`python -m jepsen run ...` (a fault-injection run) and `python -m jepsen check RUN_DIR`.

Exit status: 0 when every check passed (the safety checks, and no process errors such as a
node that would not restart), 1 when one failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import trio

from jepsen import history as history_file
from jepsen.checker import check
from jepsen.nemesis import DEFAULT_FAULTS, TOPOLOGY_KINDS, Step
from jepsen.report import format_summary, write_report
from jepsen.runner import TOPOLOGIES, WORKLOADS, RunConfig, checks_for, run, summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jepsen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="start a group, inject faults, check, report")
    r.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    r.add_argument("--workload", default="queue", choices=tuple(WORKLOADS))
    r.add_argument(
        "--topology",
        default="dledger",
        choices=tuple(TOPOLOGIES),
        help="a DLedger group (--nodes), or a classic SYNC_MASTER/ASYNC_MASTER and its slave",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":
        return _recheck(args.run_dir)
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
    results = trio.run(run, config)
    print(summary(results, config))
    for error in results["run"].get("errors", []):
        print(f"nemesis: {error}")
    print(f"run directory: {run_dir}")
    return 0 if results["valid"] else 1


def _recheck(run_dir: Path) -> int:
    ops = history_file.load(run_dir / "history.jsonl")
    final = json.loads((run_dir / "final.json").read_text())
    replicas = json.loads((run_dir / "replicas.json").read_text())
    previous = json.loads((run_dir / "results.json").read_text())
    meta = previous.get("meta", {"command": f"python -m jepsen check {run_dir}"})
    checks = checks_for(meta.get("workload", "queue"), meta.get("topology", "dledger"))
    results = check(ops, final, replicas, previous.get("run", {}), checks)
    results["run"] = previous.get("run", {})
    write_report(run_dir, ops, results, meta)
    print(format_summary(results, meta))
    return 0 if results["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
