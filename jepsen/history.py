"""Operation histories: recorded as JSON Lines while a run goes, read back for the checkers.

One op per line (`index`, `time`, `process`, `type`, `f`, then the op's fields). Lines are
written and flushed as they happen, so a runner that crashes still leaves every op it recorded
and the checkers can judge the partial run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLIENT_FUNCTIONS = frozenset({"send", "poll", "commit", "fetch_offset", "pop", "ack", "change"})
COMPLETIONS = frozenset({"ok", "fail", "info"})
NEMESIS = "nemesis"


class Recorder:
    """Appends ops to a JSON Lines file and keeps them in `ops`.

    It also enforces the protocol the checkers rely on, so a runner bug fails loudly instead of
    producing a history that checks wrongly: a process has one op outstanding at a time, a
    completion matches its invoke's `f`, and a process whose op ended `info` is retired (its op
    may still take effect later, so nothing it does afterwards could be ordered after it).
    Keep using `ops` for the checker rather than `load`ing the file again: a long run's history
    is large and one copy is enough. A soak passes `keep_ops=False`: its history only goes to
    the file, so the process running the clients is not measured growing by its own record.
    """

    def __init__(
        self,
        path: str | Path,
        clock: Callable[[], float] = time.monotonic,
        keep_ops: bool = True,
    ) -> None:
        self._clock = clock
        self._start = clock()
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 -- lives as long as the run
        self._pending: dict[Any, str] = {}
        self._retired: set[Any] = set()
        self._keep_ops = keep_ops
        self._count = 0
        self.ops: list[dict] = []

    def elapsed(self) -> float:
        """Seconds since the history began: the `time` an op recorded now would get."""
        return round(self._clock() - self._start, 6)

    def invoke(self, process: int, f: str, **fields: Any) -> dict:
        """Record that `process` starts op `f` (send: value, key; poll: key, offset, group; ...)."""
        if f not in CLIENT_FUNCTIONS:
            raise ValueError(f"unknown client function {f!r}")
        if process in self._retired:
            raise ValueError(f"process {process} is retired after an info op")
        if process in self._pending:
            raise ValueError(f"process {process} already has a {self._pending[process]} pending")
        self._pending[process] = f
        return self._append(process, "invoke", f, fields)

    def complete(self, type: str, process: int, f: str, **fields: Any) -> dict:
        """Record the outcome (`ok`, `fail` or `info`) of `process`'s pending op."""
        if type not in COMPLETIONS:
            raise ValueError(f"unknown completion type {type!r}")
        if self._pending.get(process) != f:
            raise ValueError(f"process {process} has no pending {f}")
        del self._pending[process]
        if type == "info":
            self._retired.add(process)
        return self._append(process, type, f, fields)

    def fault(
        self,
        kind: str,
        phase: str,
        targets: Iterable[str],
        detail: str,
        majority_ok: bool,
        id: int,
    ) -> dict:
        """Record a nemesis fault starting or stopping; `id` pairs a start with its stop."""
        if phase not in ("start", "stop"):
            raise ValueError(f"unknown fault phase {phase!r}")
        value = {
            "id": id,
            "kind": kind,
            "phase": phase,
            "targets": list(targets),
            "detail": detail,
            "majority_ok": majority_ok,
        }
        return self._append(NEMESIS, "info", "fault", {"value": value})

    def pending(self) -> dict[Any, str]:
        """Processes with an op outstanding (process -> f), e.g. to report at the end of a run."""
        return dict(self._pending)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(self, process: Any, type: str, f: str, fields: dict) -> dict:
        op = {
            "index": self._count,
            "time": self.elapsed(),
            "process": process,
            "type": type,
            "f": f,
            **fields,
        }
        self._count += 1
        if self._keep_ops:
            self.ops.append(op)
        self._file.write(json.dumps(op, separators=(",", ":"), ensure_ascii=False) + "\n")
        self._file.flush()
        return op


def load(path: str | Path) -> list[dict]:
    """Read a history; a torn last line (the runner died mid-write) is dropped, any other
    unparsable line is an error."""
    ops = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            try:
                ops.append(json.loads(line))
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    raise ValueError(f"{path}:{number}: not a JSON op") from None
    return ops


@dataclass(slots=True)
class Pair:
    """A client op: its invoke and its completion (None when the run ended first)."""

    invoke: dict
    completion: dict | None

    @property
    def type(self) -> str:
        """`ok`, `fail` or `info`; an op that never completed is indeterminate, like `info`."""
        return self.completion["type"] if self.completion else "info"

    @property
    def ok(self) -> bool:
        return self.completion is not None and self.completion["type"] == "ok"

    @property
    def f(self) -> str:
        return self.invoke["f"]

    @property
    def process(self) -> Any:
        return self.invoke["process"]

    @property
    def start(self) -> float:
        return self.invoke["time"]

    @property
    def end(self) -> float | None:
        return self.completion["time"] if self.completion else None


def pairs(history: Iterable[dict]) -> list[Pair]:
    """Client ops in invoke order, each invoke paired with its process's next completion."""
    result: list[Pair] = []
    open_: dict[Any, Pair] = {}
    for op in history:
        if op["process"] == NEMESIS:
            continue
        process = op["process"]
        if op["type"] == "invoke":
            if process in open_:
                raise ValueError(f"op {op['index']}: process {process} invoked twice")
            open_[process] = pair = Pair(op, None)
            result.append(pair)
            continue
        pair = open_.pop(process, None)
        if pair is None or pair.f != op["f"]:
            raise ValueError(f"op {op['index']}: completion without a matching invoke")
        pair.completion = op
    return result


@dataclass(slots=True, frozen=True)
class Fault:
    """One injected fault from its start to its stop (the history's end if it never stopped)."""

    id: int
    kind: str
    targets: list[str]
    detail: str
    majority_ok: bool
    start: float
    stop: float
    stopped: bool


def end_time(history: list[dict]) -> float:
    return history[-1]["time"] if history else 0.0


def faults(history: list[dict]) -> list[Fault]:
    """The faults of a history in start order."""
    starts: dict[int, dict] = {}
    stops: dict[int, float] = {}
    for op in history:
        if op["f"] != "fault":
            continue
        value = op["value"]
        if value["phase"] == "start":
            starts[value["id"]] = op
        else:
            stops[value["id"]] = op["time"]
    end = end_time(history)
    return [
        Fault(
            id=id,
            kind=op["value"]["kind"],
            targets=list(op["value"]["targets"]),
            detail=op["value"]["detail"],
            majority_ok=bool(op["value"]["majority_ok"]),
            start=op["time"],
            stop=stops.get(id, end),
            stopped=id in stops,
        )
        for id, op in starts.items()
    ]
