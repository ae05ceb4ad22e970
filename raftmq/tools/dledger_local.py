"""A DLedger group of real `dledger server` processes on 127.0.0.1.

The demo, the process tests and the benchmark all need the same thing: start N
replicas on free ports under one directory, find the leader, kill -9 one, restart
it, and stop everything on the way out — even when the caller fails.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
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
    keeps a port that is taken on one of them from being handed out for another.
    """
    hosts = list(hosts)
    ephemeral = _ephemeral_range()
    candidates = [p for p in range(10000, 32768) if p not in ephemeral]
    random.shuffle(candidates)
    ports: list[int] = []
    for port in candidates:
        if not all(_bindable(host, port) for host in hosts):
            continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise OSError(f"no {count} free ports outside the ephemeral range")


def stop_process(proc: subprocess.Popen | None, sig: int) -> None:
    """Signal `proc` and reap it (SIGKILL after 10 s); nothing if it is gone already."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
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

    def command(self, node_id: str) -> list[str]:
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
            self.peers_arg,
            "--store-base-dir",
            str(self.base_dir / node_id),
            *LOCAL_SEGMENT_ARGS,
            *self.extra_args,
        ]

    def start(self, node_id: str) -> None:
        log = open(self.base_dir / f"{node_id}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[node_id] = subprocess.Popen(
            self.command(node_id), stdout=log, stderr=subprocess.STDOUT
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
        for node_id in list(self.procs):
            self.kill(node_id, signal.SIGTERM if os.name == "posix" else signal.SIGKILL)

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
