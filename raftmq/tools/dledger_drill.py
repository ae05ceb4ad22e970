"""The failover drill users run: append under load, kill -9 the leader, keep appending,
then prove every acknowledged entry survived and the replicas hold identical bytes.

`python -m raftmq.tools.dledger_demo` prints it; the process tests assert on the same report.
"""

from __future__ import annotations

import signal

import attrs
import trio

from raftmq.dledger.client import ClientError
from raftmq.tools.dledger_local import LocalGroup


@attrs.define
class DrillReport:
    first_leader: str = ""
    first_term: int = -1
    new_leader: str = ""
    new_term: int = -1
    failover_ms: float = 0.0  # leader killed -> first append committed by the new leader
    sent: int = 0
    acknowledged: int = 0
    unknown: int = 0  # timed out or cut off: may or may not have committed
    lost: list[int] = attrs.Factory(list)  # acknowledged indexes not readable afterwards
    restarted_caught_up: bool = False
    identical_bytes: int = 0  # bytes of committed log compared equal on every replica
    mismatched_replicas: list[str] = attrs.Factory(list)


async def run_drill(
    group: LocalGroup,
    appenders: int = 16,
    appends_before_kill: int = 400,
    appends_after_kill: int = 400,
    log=lambda text: None,
) -> DrillReport:
    report = DrillReport()
    acked: dict[int, bytes] = {}
    async with group.client(timeout_s=5.0) as client:
        leader = await group.wait_for_leader(client)
        report.first_leader, report.first_term = leader["selfId"], leader["term"]
        log(f"leader is {report.first_leader} in term {report.first_term}")

        counter = iter(range(10**9))

        async def appender(how_many: int) -> None:
            async with group.client(timeout_s=5.0) as own:
                for _ in range(how_many):
                    body = f"entry-{next(counter)}".encode()
                    report.sent += 1
                    try:
                        ((index, _pos),) = await own.append([body])
                    except ClientError:
                        report.unknown += 1
                        continue
                    acked[index] = body

        async with trio.open_nursery() as nursery:
            for _ in range(appenders):
                nursery.start_soon(appender, appends_before_kill // appenders)
        log(f"appended {len(acked)} entries; killing leader {report.first_leader} with SIGKILL")

        killed_at = trio.current_time()
        group.kill(report.first_leader, signal.SIGKILL)
        async with group.client(timeout_s=10.0) as probe:
            ((index, _pos),) = await probe.append([b"first-after-failover"])
            acked[index] = b"first-after-failover"
            report.sent += 1
        report.failover_ms = (trio.current_time() - killed_at) * 1000.0
        leader = await group.wait_for_leader(client, not_id=report.first_leader)
        report.new_leader, report.new_term = leader["selfId"], leader["term"]
        log(
            f"new leader {report.new_leader} in term {report.new_term}; "
            f"first append committed {report.failover_ms:.0f} ms after the kill"
        )

        async with trio.open_nursery() as nursery:
            for _ in range(appenders):
                nursery.start_soon(appender, appends_after_kill // appenders)
        report.acknowledged = len(acked)

        for index, body in sorted(acked.items()):
            entry = await client.get(index)
            if entry["body"] != body:
                report.lost.append(index)
        log(f"read back {len(acked)} acknowledged entries: {len(report.lost)} missing or different")

        group.start(report.first_leader)
        report.restarted_caught_up = await group.caught_up(client, report.first_leader)
        log(f"restarted {report.first_leader}: caught up = {report.restarted_caught_up}")
        committed = max(acked)
        last = await client.get(committed)
    group.stop()
    report.identical_bytes, report.mismatched_replicas = _compare_replicas(
        group, last["pos"] + 48 + len(last["body"])
    )
    log(
        f"compared {report.identical_bytes} committed bytes on every replica; "
        f"mismatches: {report.mismatched_replicas or 'none'}"
    )
    return report


def _compare_replicas(group: LocalGroup, end_pos: int) -> tuple[int, list[str]]:
    """Compare each replica's data files with the first's, byte for byte, up to `end_pos`."""

    def read(node_id: str) -> bytes:
        chunks = []
        remaining = end_pos
        for path in sorted(group.data_dir(node_id).iterdir()):
            with open(path, "rb") as f:
                chunk = f.read(remaining)
            chunks.append(chunk)
            remaining -= len(chunk)
            if remaining <= 0:
                break
        return b"".join(chunks)

    reference = read(group.ids[0])
    mismatched = [n for n in group.ids[1:] if read(n) != reference]
    return len(reference), mismatched
