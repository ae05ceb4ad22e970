"""`bench broker --stages`: where a single send's latency goes, stage by stage.

One send in flight at a time, against a 3-broker group whose processes record
`raftmq.process.stages` marks (RAFTMQ_STAGES set for them). For each send, every
mark between the client's write and its read of the response is placed on one time
line (all processes use CLOCK_MONOTONIC); each row is a (role, stage), first
occurrence per send, with the median time since the client's write and the median
gap from the row before. A gap that is neither an fsync nor a network hop is a wait.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import trio
from raftmq.dledger.core.replication import COMMIT_LINGER_MS

from bench import broker_bench
from raftmq.config.address import parse_address
from raftmq.process import stages
from raftmq.remoting.codec import encode
from raftmq.tools.broker_local import LocalCluster

CLIENT_WRITE = "client write"
CLIENT_READ = "client read"
# The pause before each send: past the lingering commit push the send before it leaves
# (an idle leader tells its followers a new commit index COMMIT_LINGER_MS later), so
# that push and the followers' work on it do not land on the send being timed.
PAUSE_S = (COMMIT_LINGER_MS + 3.0) / 1000


async def _single_sends(address: str, size: int, sends: int) -> list[tuple[int, int]]:
    """(write ns, response read ns) of `sends` sends, one at a time on one connection."""
    host, port = parse_address(address)
    body = os.urandom(size)
    times = []
    async with await trio.open_tcp_stream(host, port) as stream:
        for k in range(sends):
            request = broker_bench._send_request(k % broker_bench.QUEUES, body)
            request.opaque = k + 1
            frame = encode(request)
            await trio.sleep(PAUSE_S)
            started = time.monotonic_ns()
            await stream.send_all(frame)
            buffer = bytearray()
            while len(buffer) < 4 or len(buffer) < 4 + int.from_bytes(buffer[:4], "big"):
                data = await stream.receive_some(1 << 16)
                if not data:
                    raise OSError("the broker closed the connection")
                buffer += data
            times.append((started, time.monotonic_ns()))
    return times


def timeline(sends, marks: dict[int, list[tuple[str, int]]], roles: dict[int, str]) -> list[dict]:
    """Rows (role, stage, median µs since the client's write, median gap µs from the row
    before) from the sends' (write, read) ns and each process's marks."""
    offsets: dict[tuple[str, str], list[float]] = {}
    for started, answered in sends:
        offsets.setdefault(("client", CLIENT_READ), []).append((answered - started) / 1000)
        for pid, rows in marks.items():
            seen = set()
            for stage, ns in rows:
                if started <= ns <= answered and stage not in seen:
                    seen.add(stage)
                    key = (roles.get(pid, str(pid)), stage)
                    offsets.setdefault(key, []).append((ns - started) / 1000)
    # A stage counts when it happens in most sends (not a heartbeat that fell in one).
    common = {k: v for k, v in offsets.items() if 2 * len(v) > len(sends)}
    ordered = sorted(common.items(), key=lambda kv: statistics.median(kv[1]))
    rows, previous = [], 0.0
    for (role, stage), values in ordered:
        at = statistics.median(values)
        rows.append({"role": role, "stage": stage, "at_us": at, "gap_us": at - previous})
        previous = at
    return rows


async def measure(size: int, sends: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        marks_dir = os.path.join(tmp, "stages")
        os.mkdir(marks_dir)
        os.environ[stages.ENV] = marks_dir  # inherited by the processes LocalCluster starts
        try:
            async with LocalCluster(os.path.join(tmp, "cluster")) as cluster:
                await cluster.create_topic(broker_bench.TOPIC, broker_bench.QUEUES)
                master = await cluster.wait_master()
                roles = {cluster.pid(master): "master"}
                followers = sorted(node for node in cluster.ids if node != master)
                for k, node in enumerate(followers):
                    roles[cluster.pid(node)] = f"follower{k + 1}"
                address = cluster.broker_addrs[master]
                await _single_sends(address, size, 50)  # warm up
                for name in os.listdir(marks_dir):
                    os.truncate(os.path.join(marks_dir, name), 0)
                sends = await _single_sends(address, size, sends)
                await trio.sleep(0.2)
                marks = stages.read(marks_dir)
        finally:
            del os.environ[stages.ENV]
    return timeline(sends, marks, roles)


def print_table(size: int, rows: list[dict]) -> None:
    print(f"\nsingle send, {size} B: median µs since the client's write\n")
    print("| role | stage | at µs | gap µs |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['role']} | {row['stage']} | {row['at_us']:.0f} | {row['gap_us']:.0f} |")
