"""Opt-in timestamps of the stages a request passes through, for `bench broker --stages`.

A single send's latency is the sum of its stages (client write, master read, append,
push, follower write, fsyncs, ack, commit, response written); the stages that are
neither an fsync nor the network are waits to remove, and only timestamps taken in
every process on the path show which they are. With `RAFTMQ_STAGES=<directory>` in
a process's environment, `mark(stage)` appends `<stage> <CLOCK_MONOTONIC ns>` to
`<directory>/<pid>.stages` (one clock for every process of the machine, so marks of
different processes can be put on one time line). Unset, `ON` is False and a call
site's `if stages.ON:` is all it costs.
"""

from __future__ import annotations

import os
import time

ENV = "RAFTMQ_STAGES"

_directory = os.environ.get(ENV, "")
ON = bool(_directory)
_file = None


def mark(stage: str) -> None:
    """Record that this process reached `stage` now (only call when `ON`)."""
    global _file
    if _file is None:
        _file = open(os.path.join(_directory, f"{os.getpid()}.stages"), "a", buffering=1)  # noqa: SIM115
    _file.write(f"{stage} {time.monotonic_ns()}\n")


def read(directory: str) -> dict[int, list[tuple[str, int]]]:
    """Every process's marks in `directory`: pid -> [(stage, ns)] in order."""
    marks: dict[int, list[tuple[str, int]]] = {}
    for name in os.listdir(directory):
        if not name.endswith(".stages"):
            continue
        with open(os.path.join(directory, name)) as f:
            rows = [line.rsplit(" ", 1) for line in f if line.strip()]
        marks[int(name.removesuffix(".stages"))] = [(stage, int(ns)) for stage, ns in rows]
    return marks
