"""The run directory's report: checker results as JSON, a one-screen summary, and SVG plots.

The plots are written as SVG text by hand so that judging a run needs no plotting package:
latency over time, throughput, and unavailability windows, each with the fault windows shaded
so a stall can be read against the fault that caused it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from jepsen.history import Fault, end_time, faults, pairs

OUTCOME_COLOURS = {"ok": "#2ca02c", "fail": "#d62728", "info": "#ff7f0e"}
FAULT_COLOURS = {
    "kill": "#e45756",
    "pause": "#f2b701",
    "partition": "#4c78a8",
    "disk": "#9d755d",
    "restart": "#72b7b2",
    "client": "#b279a2",
    "disk-full": "#54a24b",
    "slow-disk": "#bab0ac",
}
OTHER_FAULT_COLOUR = "#9467bd"
WIDTH, HEIGHT = 960, 360
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 44, 40


def write_report(run_dir: str | Path, history: list[dict], results: dict, meta: dict) -> list[Path]:
    """Write results.json, summary.txt, latency.svg, throughput.svg and availability.svg into
    `run_dir`; `meta` describes the run (its `command` is printed as the way to reproduce it,
    its other plain values as the run's settings). Returns the paths written."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fault_windows = faults(history)
    files = {
        "results.json": json.dumps({"meta": meta, **results}, indent=2, default=str) + "\n",
        "summary.txt": format_summary(results, meta) + "\n",
        "latency.svg": latency_svg(history, fault_windows),
        "throughput.svg": throughput_svg(history, fault_windows),
        "availability.svg": availability_svg(history, results, fault_windows),
    }
    written = []
    for name, text in files.items():
        path = run_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


# --- summary -----------------------------------------------------------------------------


def format_summary(results: dict, meta: dict) -> str:
    """One screen: verdict (and the checks that failed), what the run did, the headline numbers
    and the table of checks."""
    counts = results["counts"]
    settings = "  ".join(f"{k}={v}" for k, v in meta.items() if k != "command" and is_plain(v))
    fatal = {name: r for name, r in results.items() if isinstance(r, dict) and r.get("fatal")}
    failed = ", ".join(name for name, result in fatal.items() if not result["valid"])
    lines = [
        f"raftmq jepsen: {'VALID ✓' if results['valid'] else f'INVALID ✗ (failed: {failed})'}",
        *([settings] if settings else []),
        f"operations={counts['operations']}  faults={fault_summary(counts['faults'])}",
        "attempted={attempted} acknowledged={acknowledged} failed={failed} "
        "indeterminate={indeterminate}".format(**counts),
        " ".join(
            f"{name}={results.get(name, {}).get('count', '-')}"
            for name in ("lost", "duplicated", "recovered", "redelivered", "unseen_below_observed")
        ),
        *[
            f"{name}: {results[name]['statement']}"
            for name in ("lost", "acked_without_slave")
            if "statement" in results.get(name, {})
        ],
        *availability_lines(results["availability"]),
        latency_line(results["latency"]["send"]),
        *disk_fault_lines(results.get("disk_faults", {}).get("faults", [])),
        *membership_lines(results.get("membership")),
        process_errors_line(results.get("run", {}).get("errors", [])),
        "",
        f"{'check':<28} {'result':<6} count",
    ]
    for name, result in fatal.items():
        mark = "✓" if result["valid"] else "✗"
        lines.append(f"{name:<28} {mark:<6} {result['count']}")
    lines += ["", f"reproduce: {meta.get('command', '(not recorded)')}"]
    return "\n".join(lines)


def membership_lines(membership: dict | None) -> list[str]:
    """The membership changes with their times and the worst unavailability around
    each, and the voters before and after."""
    if membership is None:
        return []
    members = membership["members"]
    lines = [
        f"membership: {len(membership['changes'])} changes, voters "
        f"{','.join(members['start'])} -> {','.join(members['final'])} "
        f"(expected {','.join(members['expected'])})"
    ]
    lines += [
        f"  {c['change']} {c['member']} at {c['start']:.1f}-{c['end']:.1f} s, "
        f"worst unavailability around it {c['worst_unavailable_s']:.2f} s"
        for c in membership["changes"]
    ]
    return lines


def process_errors_line(errors: list[str]) -> str:
    """What the nemesis saw go wrong with the processes themselves (a node that would not
    restart, a wrong exit status). Not a safety violation, but a bug all the same: the
    `process_errors` check fails the run over it, and this line says which."""
    if not errors:
        return "process errors: none"
    more = f" (+{len(errors) - 1} more in results.json)" if len(errors) > 1 else ""
    return f"process errors: {len(errors)}: {errors[0][:160]}{more}"


def is_plain(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def fault_summary(by_kind: dict[str, int]) -> str:
    total = sum(by_kind.values())
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(by_kind.items()))
    return f"{total} ({kinds})" if kinds else "0"


def availability_lines(availability: dict) -> list[str]:
    worst = availability["worst"]
    if worst is None:
        head = "worst unavailability: none"
    else:
        where = f"at {worst['start']:.1f} s"
        if worst["faults"]:
            where += f", faults {', '.join(map(str, worst['faults']))}"
        if not worst["recovered"]:
            where += ", never recovered"
        head = f"worst unavailability: {worst['duration']:.2f} s ({where})"
    total = availability["unavailable_seconds"]
    stalled = ", ".join(map(str, availability["no_progress"])) or "none"
    return [
        head,
        f"unavailable {total:.2f} s in {availability['count']} windows; "
        f"majority-ok faults without progress: {stalled}",
    ]


def disk_fault_lines(rows: list[dict]) -> list[str]:
    """A line per full or slow disk: what was refused and when sends came back; the
    acknowledged sends' latency before and during a slow disk."""
    lines = []
    for row in rows:
        head = f"{row['kind']}#{row['id']} ({row['detail']})"
        if row["kind"] == "disk-full":
            back = row["resumed_after_s"]
            resumed = "never" if back is None else f"{back:.2f} s after the space returned"
            lines.append(
                f"{head}: {row['refused']} sends refused (disk full), {row['ok_during']} ok;"
                f" sends resumed {resumed}"
            )
        else:
            before, during = row["before"], row["during"]
            lines.append(
                f"{head}: send latency before {percentiles(before)}; during {percentiles(during)}"
            )
    return lines


def percentiles(latency: dict) -> str:
    if not latency["count"]:
        return "no acknowledged sends"
    p50, p99 = latency["p50"] * 1000, latency["p99"] * 1000
    return f"p50 {p50:.1f} ms p99 {p99:.1f} ms (n={latency['count']})"


def latency_line(send: dict) -> str:
    if not send["count"]:
        return "send latency: no acknowledged sends"
    parts = "  ".join(f"{p} {send[p] * 1000:.1f} ms" for p in ("p50", "p95", "p99", "max"))
    return f"send latency: {parts}"


# --- plots -------------------------------------------------------------------------------


class Chart:
    """An SVG plot area mapping data to pixels, with axes, fault bands and a legend."""

    def __init__(self, title: str, x_max: float, y_range: tuple[float, float], log_y: bool):
        self.x_max = max(x_max, 1e-9)
        self.log_y = log_y
        low, high = y_range
        self.y_low, self.y_high = (math.log10(low), math.log10(high)) if log_y else (low, high)
        if self.y_high <= self.y_low:
            self.y_high = self.y_low + 1
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
            text(WIDTH / 2, 18, title, anchor="middle", size=14),
        ]

    def x(self, t: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * t / self.x_max

    def y(self, v: float) -> float:
        v = math.log10(v) if self.log_y else v
        share = (v - self.y_low) / (self.y_high - self.y_low)
        return HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * share

    def add(self, element: str) -> None:
        self.parts.append(element)

    def fault_bands(self, fault_windows: Iterable[Fault]) -> None:
        """Shade each fault's window and label it kind#id at the top (staggered so that
        overlapping faults stay readable)."""
        for row, fault in enumerate(fault_windows):
            colour = FAULT_COLOURS.get(fault.kind, OTHER_FAULT_COLOUR)
            x0, x1 = self.x(fault.start), self.x(fault.stop)
            self.add(
                f'<rect x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 1):.1f}" '
                f'height="{HEIGHT - TOP - BOTTOM}" fill="{colour}" fill-opacity="0.15"/>'
            )
            label = f"{fault.kind}#{fault.id}"
            self.add(text(x0 + 2, TOP + 10 + 11 * (row % 3), label, colour=colour))

    def axes(self, y_label: str, y_ticks: bool = True) -> None:
        bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
        self.add(f'<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>')
        self.add(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="black"/>')
        for t in linear_ticks(0, self.x_max):
            x = self.x(t)
            self.add(
                f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="black"/>'
            )
            self.add(text(x, bottom + 16, f"{t:g}", anchor="middle"))
        self.add(text((LEFT + right) / 2, HEIGHT - 6, "seconds since start", anchor="middle"))
        for v in self.y_tick_values() if y_ticks else []:
            y = self.y(v)
            self.add(
                f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ddd"/>'
            )
            self.add(text(LEFT - 6, y + 4, f"{v:g}", anchor="end"))
        self.add(
            f'<text x="14" y="{(TOP + bottom) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 14 {(TOP + bottom) / 2})">{escape(y_label)}</text>'
        )

    def y_tick_values(self) -> list[float]:
        if self.log_y:
            return log_ticks(self.y_low, self.y_high)
        return linear_ticks(self.y_low, self.y_high)

    def legend(self, items: list[tuple[str, str]]) -> None:
        x = WIDTH - RIGHT - 110 * len(items)
        for label, colour in items:
            self.add(f'<rect x="{x}" y="26" width="10" height="10" fill="{colour}"/>')
            self.add(text(x + 14, 35, label))
            x += 110

    def svg(self) -> str:
        return "\n".join([*self.parts, "</svg>"]) + "\n"


def text(
    x: float, y: float, content: str, anchor: str = "start", size: int = 11, colour: str = "black"
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
        f'fill="{colour}">{escape(content)}</text>'
    )


def linear_ticks(low: float, high: float, wanted: int = 8) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    span = max(high - low, 1e-9)
    step = 10.0 ** math.floor(math.log10(span / wanted))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= wanted:
            step *= factor
            break
    first = math.ceil(low / step - 1e-9)
    return [round(i * step, 9) for i in range(first, math.floor(high / step + 1e-9) + 1)]


def log_ticks(low_exponent: float, high_exponent: float) -> list[float]:
    """Powers of ten in range, or 1-2-3-5 steps when the range spans too few decades for
    powers of ten alone to label it."""
    decades = range(math.floor(low_exponent), math.ceil(high_exponent) + 1)
    low, high = 10.0**low_exponent, 10.0**high_exponent
    for mantissas in ((1,), (1, 2, 5), (1, 2, 3, 5)):
        ticks = [m * 10.0**e for e in decades for m in mantissas if low <= m * 10.0**e <= high]
        if len(ticks) >= 3:
            return ticks
    return ticks


def latency_svg(history: list[dict], fault_windows: list[Fault]) -> str:
    """Send latency (log scale) against invoke time, one colour per outcome. Points that land on
    the same pixel are drawn once, so a million sends still make a small file."""
    points = [
        (pair.start, max(pair.end - pair.start, 1e-5), pair.type)
        for pair in pairs(history)
        if pair.f == "send" and pair.completion is not None
    ]
    latencies = [p[1] for p in points] or [1e-3]
    chart = Chart(
        "send latency", end_time(history), (min(latencies) / 1.5, max(latencies) * 1.5), True
    )
    chart.fault_bands(fault_windows)
    chart.axes("latency (s)")
    drawn = set()
    for t, latency, outcome in points:
        x, y = round(chart.x(t)), round(chart.y(latency))
        if (x, y, outcome) not in drawn:
            drawn.add((x, y, outcome))
            colour = OUTCOME_COLOURS[outcome]
            chart.add(f'<circle cx="{x}" cy="{y}" r="1.6" fill="{colour}" fill-opacity="0.7"/>')
    chart.legend([(outcome, colour) for outcome, colour in OUTCOME_COLOURS.items()])
    return chart.svg()


def throughput_svg(history: list[dict], fault_windows: list[Fault]) -> str:
    """Acknowledged sends and polled messages per second, in buckets of at least a second
    (wider for long runs, so the line keeps to a few hundred points)."""
    end = end_time(history)
    bucket = max(1.0, math.ceil(end / 600))
    sent: Counter = Counter()
    polled: Counter = Counter()
    for pair in pairs(history):
        if pair.ok and pair.f == "send":
            sent[int(pair.end // bucket)] += 1
        elif pair.ok and pair.f == "poll":
            polled[int(pair.end // bucket)] += len(pair.completion["value"])
    # only whole buckets: a final sliver of a bucket would plot as a false drop or spike
    buckets = range(max(1, int(end // bucket)))
    peak = max([*sent.values(), *polled.values(), 1]) / bucket
    chart = Chart("throughput", end, (0, peak * 1.1), False)
    chart.fault_bands(fault_windows)
    chart.axes("per second")
    series = (("ok sends", sent, "#1f77b4"), ("polled messages", polled, "#2ca02c"))
    for _, counts, colour in series:
        line = " ".join(
            f"{chart.x((b + 0.5) * bucket):.1f},{chart.y(counts[b] / bucket):.1f}" for b in buckets
        )
        chart.add(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    chart.legend([(label, colour) for label, _, colour in series])
    return chart.svg()


def availability_svg(history: list[dict], results: dict, fault_windows: list[Fault]) -> str:
    """One lane per fault kind with its windows, and a lane of unavailability windows below."""
    kinds = sorted({fault.kind for fault in fault_windows})
    lanes = [*kinds, "unavailable"]
    chart = Chart("unavailability", end_time(history), (0, len(lanes)), False)
    chart.fault_bands(fault_windows)
    chart.axes("", y_ticks=False)
    lane_height = (HEIGHT - TOP - BOTTOM) / len(lanes)

    def bar(lane: int, start: float, stop: float, colour: str) -> None:
        x0, x1 = chart.x(start), chart.x(stop)
        y = chart.y(len(lanes) - lane) + lane_height * 0.2
        chart.add(
            f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1.5):.1f}" '
            f'height="{lane_height * 0.6:.1f}" fill="{colour}"/>'
        )

    for fault in fault_windows:
        colour = FAULT_COLOURS.get(fault.kind, OTHER_FAULT_COLOUR)
        bar(kinds.index(fault.kind), fault.start, fault.stop, colour)
    for window in results["availability"]["windows"]:
        bar(len(kinds), window["start"], window["end"], OUTCOME_COLOURS["fail"])
    for lane, name in enumerate(lanes):
        chart.add(text(LEFT - 4, chart.y(len(lanes) - lane) + lane_height * 0.5, name, "end"))
    return chart.svg()
