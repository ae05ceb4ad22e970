"""A soak's report, next to the fault-injection report in the run directory.

- `samples.csv` (written as the run goes): time, process, pid, RSS, open descriptors, disk
  use of a broker's store and where its log begins;
- `load.csv`: per sampling interval, acknowledged and other sends, polled messages, and the
  send latency p50 and p99 of the sends acknowledged in it;
- `soak-rss.svg`, `soak-fds.svg`, `soak-disk.svg`, `soak-latency.svg`: those over time, one
  line per process (a break where a fault restarted it), fault windows shaded, drawn with
  the fault-injection report's `Chart`;
- `soak-summary.txt`: the verdict, what was sent, acknowledged and lost, the faults, and per
  process RSS and descriptors at start and end with their growth (`resources.judge`), leaks
  flagged; `soak.html` shows it with the charts.
"""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from html import escape
from pathlib import Path

from jepsen.checker import summarise
from jepsen.history import Fault, end_time, faults, pairs
from jepsen.report import Chart, fault_summary
from jepsen.resources import Growth, Sample, incarnations, judge, longest

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf")
CHARTS = {
    "soak-rss.svg": "RSS",
    "soak-fds.svg": "open file descriptors",
    "soak-disk.svg": "disk use of each store",
    "soak-latency.svg": "send latency per interval",
}
LOAD_FIELDS = ("start_s", "sends_ok", "sends_not_ok", "polled", "send_p50_ms", "send_p99_ms")
MIB = float(1 << 20)


def write_soak_report(
    run_dir: Path, ops: list[dict], samples: list[Sample], results: dict, meta: dict, config
) -> dict:
    """Write load.csv, the charts, soak-summary.txt and soak.html; returns the `soak` section
    of results.json (growth per process, leaks, intervals' worst latency)."""
    intervals = load_intervals(ops, config.sample_every_s)
    with open(run_dir / "load.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(LOAD_FIELDS)
        writer.writerows([row[name] for name in LOAD_FIELDS] for row in intervals)
    growths = judge(samples, config.judged_span_s, config.warmup_s)
    leaks = [
        leak
        for lives in growths.values()
        for g in lives
        for leak in g.leaks(config.rss_limit_pct, config.fd_limit)
    ]
    section = {
        "leaks": leaks,
        # every member caught up once the faults healed (jepsen.runner.play)
        "recovered": bool(results.get("run", {}).get("recovered")),
        "growth": {p: [_growth_dict(g) for g in lives] for p, lives in growths.items()},
        "worst_interval_p99_ms": max(
            (row["send_p99_ms"] for row in intervals if row["send_p99_ms"] is not None),
            default=None,
        ),
    }
    summary = format_soak_summary(results, meta, samples, growths, leaks, section, config)
    (run_dir / "soak-summary.txt").write_text(summary + "\n", encoding="utf-8")
    windows = faults(ops)
    x_max = max(end_time(ops), config.duration_s)
    charts = {
        "soak-rss.svg": process_chart("RSS", "MiB", samples, lambda s: s.rss_bytes / MIB),
        "soak-fds.svg": process_chart("open file descriptors", "descriptors", samples, _fds),
        "soak-disk.svg": process_chart("disk use of each store", "MiB", samples, _disk),
    }
    for name, draw in charts.items():
        (run_dir / name).write_text(draw(x_max, windows), encoding="utf-8")
    (run_dir / "soak-latency.svg").write_text(
        latency_chart(intervals, config.sample_every_s, x_max, windows), encoding="utf-8"
    )
    (run_dir / "soak.html").write_text(html(summary), encoding="utf-8")
    return section


def _fds(sample: Sample) -> float:
    return sample.fds


def _disk(sample: Sample) -> float | None:
    return None if sample.disk_bytes is None else sample.disk_bytes / MIB


def _growth_dict(g: Growth) -> dict:
    return {
        "pid": g.pid,
        "start_s": g.start_s,
        "end_s": g.end_s,
        "judged": g.judged,
        "rss_first_bytes": g.rss_first_bytes,
        "rss_last_bytes": g.rss_last_bytes,
        "rss_growth_pct": round(g.rss_growth_pct, 2),
        "fds_first": g.fds_first,
        "fds_last": g.fds_last,
        "fd_growth": g.fd_growth,
    }


# --- load per interval ---------------------------------------------------------------------


def load_intervals(ops: list[dict], every_s: float) -> list[dict]:
    """Per interval of `every_s` (by completion time): sends acknowledged and not, messages
    polled, and the latency percentiles of the acknowledged sends."""
    latencies: dict[int, list[float]] = defaultdict(list)
    not_ok: Counter = Counter()
    polled: Counter = Counter()
    for pair in pairs(ops):
        if pair.completion is None:
            continue
        bucket = int(pair.end // every_s)
        if pair.f == "send" and pair.ok:
            latencies[bucket].append(pair.end - pair.start)
        elif pair.f == "send":
            not_ok[bucket] += 1
        elif pair.f == "poll" and pair.ok:
            polled[bucket] += len(pair.completion["value"])
    last = max([*latencies, *not_ok, *polled], default=-1)
    rows = []
    for bucket in range(last + 1):
        stats = summarise(latencies[bucket])
        rows.append(
            {
                "start_s": round(bucket * every_s, 3),
                "sends_ok": stats["count"],
                "sends_not_ok": not_ok[bucket],
                "polled": polled[bucket],
                "send_p50_ms": _ms(stats["p50"]),
                "send_p99_ms": _ms(stats["p99"]),
            }
        )
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


# --- charts --------------------------------------------------------------------------------


def process_chart(title: str, y_label: str, samples: list[Sample], value):
    """A function drawing `value(sample)` over time, one line per incarnation of a process."""

    def draw(x_max: float, windows: list[Fault]) -> str:
        series = {
            process: [
                [(s.time_s, v) for s in life if (v := value(s)) is not None] for life in lives
            ]
            for process, lives in incarnations(samples).items()
        }
        series = {p: lives for p, lives in series.items() if any(lives)}
        return line_chart(title, y_label, series, x_max, windows)

    return draw


def latency_chart(intervals: list[dict], every_s: float, x_max: float, windows) -> str:
    series = {
        label: [[(row["start_s"] + every_s / 2, row[field]) for row in intervals if row[field]]]
        for label, field in (("p50", "send_p50_ms"), ("p99", "send_p99_ms"))
    }
    return line_chart(CHARTS["soak-latency.svg"], "ms", series, x_max, windows)


def line_chart(
    title: str,
    y_label: str,
    series: dict[str, list[list[tuple[float, float]]]],
    x_max: float,
    windows: list[Fault],
) -> str:
    """Lines from 0 up (so flat reads as flat), one colour per series, a break between the
    point lists of one series."""
    peak = max((v for lives in series.values() for life in lives for _, v in life), default=1)
    chart = Chart(title, x_max, (0, peak * 1.1 or 1), False)
    chart.fault_bands(windows)
    chart.axes(y_label)
    legend = []
    for (label, lives), colour in zip(series.items(), COLOURS * 4, strict=False):
        for life in lives:
            points = " ".join(f"{chart.x(t):.1f},{chart.y(v):.1f}" for t, v in life)
            chart.add(
                f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            )
        legend.append((label, colour))
    chart.legend(legend)
    return chart.svg()


def html(summary: str) -> str:
    images = "\n".join(f'<p><img src="{name}" alt="{escape(title)}"></p>' for name, title in (
        *CHARTS.items(), ("throughput.svg", "throughput"), ("latency.svg", "every send"))
    )  # fmt: skip
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>raftmq soak</title></head>\n'
        f"<body>\n<pre>{escape(summary)}</pre>\n{images}\n</body></html>\n"
    )


# --- summary -------------------------------------------------------------------------------


def format_soak_summary(
    results: dict,
    meta: dict,
    samples: list[Sample],
    growths: dict[str, list[Growth]],
    leaks: list[str],
    section: dict,
    config,
) -> str:
    counts = results["counts"]
    latency = results["latency"]["send"]
    fatal = {n: r for n, r in results.items() if isinstance(r, dict) and r.get("fatal")}
    failed = ", ".join(name for name, r in fatal.items() if not r["valid"])
    verdict = "VALID ✓" if results["valid"] else f"INVALID ✗ (failed: {failed})"
    worst = section["worst_interval_p99_ms"]
    lines = [
        f"raftmq soak: {verdict}; leaks: {'none' if not leaks else f'{len(leaks)} FLAGGED'}; "
        + recovery_text(results.get("run", {})),
        f"date={meta['date']}  machine={meta['machine']}",
        f"duration={config.duration_s:g}s  rate={config.rate:g}/s  body={config.body_bytes} B  "
        f"segments={config.segment_bytes / MIB:g} MiB  fileReservedHours={config.reserved_hours}",
        f"faults injected: {fault_summary(counts['faults'])}",
        *(
            f"  #{f['id']} {f['kind']} {' '.join(f['targets'])}: {f['detail']}"
            for f in results.get("run", {}).get("faults", [])
        ),
        "sends: attempted={attempted} acknowledged={acknowledged} failed={failed} "
        "indeterminate={indeterminate}".format(**counts),
        f"lost={results['lost']['count']} unconsumed={results['unconsumed']['count']} "
        f"duplicated={results['duplicated']['count']} polled={counts['polled_messages']}",
        f"send latency (acknowledged): p50={_ms(latency['p50'])} ms p99={_ms(latency['p99'])} ms"
        f" max={_ms(latency['max'])} ms; worst {config.sample_every_s:g} s interval p99="
        f"{worst} ms",
        *retention_lines(samples, config.segment_bytes),
        "",
        f"{'process':<8} {'lives':>5} {'RSS MiB start':>13} {'end':>6} {'growth':>8} "
        f"{'fds start':>9} {'end':>4} {'growth':>6}  {'disk MiB min..max'}",
    ]
    first_last = _first_last(samples)
    for process, lives in growths.items():
        g = longest(lives)
        first, last = first_last[process]
        disks = [s.disk_bytes for s in samples if s.process == process and s.disk_bytes]
        disk = f"{min(disks) / MIB:.1f}..{max(disks) / MIB:.1f}" if disks else "-"
        judged = f"{g.rss_growth_pct:+.1f}%" if g.judged else "short"
        fd_growth = f"{g.fd_growth:+g}" if g.judged else "-"
        lines.append(
            f"{process:<8} {len(lives):>5} {first.rss_bytes / MIB:>13.1f} "
            f"{last.rss_bytes / MIB:>6.1f} {judged:>8} {first.fds:>9} {last.fds:>4} "
            f"{fd_growth:>6}  {disk}"
        )
    lines += [
        "",
        f"growth: after a {config.warmup_s:g} s warm-up, the median of the first quarter "
        "against the lowest of the last, over each process's longest life (a restart starts a "
        f"new one; 'short': under {config.judged_span_s:g} s to judge); a leak is RSS growth "
        f"over {config.rss_limit_pct:g}% or descriptor growth over {config.fd_limit:g} in any life",
        *(f"LEAK: {leak}" for leak in leaks),
        f"process errors: {fatal['process_errors']['count']}",
        f"reproduce: {meta['command']}",
    ]
    return "\n".join(lines)


def recovery_text(run: dict) -> str:
    if run.get("recovered"):
        return f"recovered {run.get('recovery_s')} s after the faults healed"
    return (
        f"NOT RECOVERED: a member had not caught up {run.get('recovery_s')} s after the "
        "faults healed"
    )


def passed(section: dict, results: dict) -> bool:
    """The soak's own verdict: every check passed, nothing leaked, the group recovered."""
    return results["valid"] and not section["leaks"] and section["recovered"]


def _first_last(samples: list[Sample]) -> dict[str, tuple[Sample, Sample]]:
    by_process: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_process[sample.process].append(sample)
    return {p: (min(ss, key=_time), max(ss, key=_time)) for p, ss in by_process.items()}


def _time(sample: Sample) -> float:
    return sample.time_s


def retention_lines(samples: list[Sample], segment_bytes: int) -> list[str]:
    """How far retention moved each broker's log's beginning: whole data files deleted."""
    begins: dict[str, list[int]] = defaultdict(list)
    for sample in samples:
        if sample.log_begin_bytes is not None:
            begins[sample.process].append(sample.log_begin_bytes)
    parts = [
        f"{node} {math.floor((max(b) - min(b)) / segment_bytes)} files "
        f"(log begins at {max(b) / MIB:.0f} MiB)"
        for node, b in sorted(begins.items())
    ]
    return [f"retention deleted: {', '.join(parts) or 'nothing sampled'}"]
