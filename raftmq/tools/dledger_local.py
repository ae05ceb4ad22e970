"""A DLedger group of real `dledger server` processes on 127.0.0.1.

The demo, the process tests and the benchmark all need the same thing: start N
replicas on free ports under one directory, find the leader, kill -9 one, restart
it, and stop everything on the way out — even when the caller fails.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import trio

from raftmq.dledger.client import DLedgerClient


def _ephemeral_range() -> range:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low, high = map(int, text.split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


#: "LOW-HIGH": where `free_ports` looks (10000-32767 unless set). Two test workers
#: running at once are each given a range of their own (tests/conftest.py): a port one
#: has picked but its process not yet bound, or one a Java broker takes beside its
#: listenPort (HA at +1, its fast port at -2), is never the other's pick.
LOCAL_PORTS_ENV = "RAFTMQ_LOCAL_PORTS"


#: The ports `free_ports` handed out lately: a port picked for one process and not yet
#: bound by it is still bindable, and a second call before the first's processes start
#: (a controller group picks its controllers' ports after its brokers') must not pick it.
_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=2048)


def _local_range() -> range:
    low, _, high = os.environ.get(LOCAL_PORTS_ENV, "10000-32767").partition("-")
    return range(int(low), int(high) + 1)


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, hosts: Iterable[str] = ("127.0.0.1",)) -> list[int]:
    """Ports outside the kernel's ephemeral range that are free on every one of `hosts`,
    for processes to listen on.

    A port from the ephemeral range can be handed to some outgoing connection while
    its process is down (killed by a test, say), and the restart then fails with
    "address already in use"; ports below the range are never given out that way.
    Checking every address the caller may bind (loopback has all of 127.0.0.0/8)
    keeps a port that is taken on one of them from being handed out for another, and
    none handed out lately is handed out again (`_RECENT_PORTS`).
    """
    hosts = list(hosts)
    ephemeral = _ephemeral_range()
    recent = set(_RECENT_PORTS)
    candidates = [p for p in _local_range() if p not in ephemeral and p not in recent]
    random.shuffle(candidates)
    ports: list[int] = []
    for port in candidates:
        if not all(_bindable(host, port) for host in hosts):
            continue
        ports.append(port)
        if len(ports) == count:
            _RECENT_PORTS.extend(ports)
            return ports
    raise OSError(f"no {count} free ports outside the ephemeral range")


def stop_process(proc: subprocess.Popen | None, sig: int) -> None:
    """Signal `proc` and reap it (SIGKILL after 10 s); nothing if it is gone already."""
    stop_processes([] if proc is None else [proc], sig)


def stop_processes(procs: list[subprocess.Popen], sig: int) -> None:
    """Signal every one of `procs` first, then reap them (SIGKILL to those still running
    10 s after the signal): stopping a group costs its slowest member's shutdown, not
    the sum of them (a JVM's shutdown hooks take seconds)."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.send_signal(sig)
    deadline = time.monotonic() + 10
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# DLedger's 1 GiB data segments are preallocated on disk; a local group for a demo,
# a test or a benchmark gets 64 MiB ones (and rolls segments as a result).
LOCAL_SEGMENT_ARGS = (
    "-D",
    f"mappedFileSizeForEntryData={64 << 20}",
    "-D",
    f"mappedFileSizeForEntryIndex={32 << 20}",
)


class LocalGroup:
    """`async with LocalGroup(tmp_dir, 3) as group:` — every process is killed on exit."""

    def __init__(
        self,
        base_dir: str | Path,
        size: int = 3,
        group: str = "raftmq",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.base_dir = Path(base_dir)
        self.group = group
        self.ids = [f"n{i}" for i in range(size)]
        ports = free_ports(size)
        self.peers = {
            node_id: f"127.0.0.1:{port}" for node_id, port in zip(self.ids, ports, strict=True)
        }
        self.peers_arg = ";".join(f"{i}-{a}" for i, a in self.peers.items())
        self.extra_args = extra_args
        self.procs: dict[str, subprocess.Popen] = {}
        self.joined: set[str] = set()  # started by `join`, as learners

    def command(self, node_id: str, peers_arg: str | None = None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "raftmq.dledger.cli",
            "server",
            "--group",
            self.group,
            "--id",
            node_id,
            "--peers",
            peers_arg or self.peers_arg,
            "--store-base-dir",
            str(self.base_dir / node_id),
            *LOCAL_SEGMENT_ARGS,
            *self.extra_args,
            *(["-D", "joinAsLearner=true"] if node_id in self.joined else []),
        ]

    def join(self, node_id: str) -> str:
        """Start a new member on a free port, as a learner of the group and itself
        (the group adds it with `dledger addPeer`); its `id-host:port`."""
        self.peers[node_id] = f"127.0.0.1:{free_ports(1)[0]}"
        self.peers_arg = ";".join(f"{i}-{a}" for i, a in self.peers.items())
        self.ids.append(node_id)
        self.joined.add(node_id)
        self.start(node_id)
        return f"{node_id}-{self.peers[node_id]}"

    def start(self, node_id: str, peers_arg: str | None = None) -> None:
        """Start `node_id` with `--peers` `peers_arg`, by default the group's members as
        this harness knows them (a conf written before members joined lists fewer)."""
        log = open(self.base_dir / f"{node_id}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[node_id] = subprocess.Popen(
            self.command(node_id, peers_arg), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        stop_process(self.procs.pop(node_id, None), sig)

    def pid(self, node_id: str) -> int:
        return self.procs[node_id].pid

    def data_dir(self, node_id: str) -> Path:
        return self.base_dir / node_id / f"dledger-{node_id}" / "data"

    async def __aenter__(self) -> LocalGroup:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for node_id in self.ids:
            self.start(node_id)
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        sig = signal.SIGTERM if os.name == "posix" else signal.SIGKILL
        stop_processes([self.procs.pop(node_id) for node_id in list(self.procs)], sig)

    def client(self, timeout_s: float = 5.0) -> DLedgerClient:
        return DLedgerClient(self.group, self.peers, timeout_s)

    async def wait_for_leader(
        self, client: DLedgerClient, timeout_s: float = 10.0, not_id: str | None = None
    ) -> dict:
        """The status row of a leader every live member agrees on (optionally not `not_id`)."""
        with trio.fail_after(timeout_s):
            while True:
                rows = await client.status()
                live = [r for r in rows if r.get("role") != "UNREACHABLE"]
                leaders = [
                    r for r in live if r.get("role") == "LEADER" and r.get("selfId") != not_id
                ]
                if leaders:
                    leader = max(leaders, key=lambda r: r["term"])
                    if all(r.get("leaderId") == leader["selfId"] for r in live):
                        return leader
                await trio.sleep(0.02)

    async def caught_up(self, client: DLedgerClient, node_id: str, timeout_s: float = 30.0) -> bool:
        """Whether `node_id` reaches the leader's commit index within `timeout_s`."""
        with trio.move_on_after(timeout_s):
            while True:
                rows = {r.get("selfId"): r for r in await client.status()}
                leader = next((r for r in rows.values() if r.get("role") == "LEADER"), None)
                mine = rows.get(node_id, {}).get("committedIndex")
                if leader and mine is not None and mine >= leader["committedIndex"] >= 0:
                    return True
                await trio.sleep(0.05)
        return False
