"""`python -m bench broker` runs end to end (without its peer): every phase produces a
figure, so the tables in docs/benchmarks.md can always be measured again. Speed is not
asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial

import pytest
import trio

from bench import broker_bench


@pytest.mark.processes
def test_the_broker_benchmark_measures_every_phase(tmp_path):
    out = tmp_path / "rows.json"
    command = [sys.executable, "-m", "bench", "broker", "--duration", "1", "--warmup", "1"]
    command += ["--failover-trials", "1", "--no-peer", "--json", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    # a row per count of connections (1 and 4 unless told), each size
    assert [(row["size"], row["connections"]) for row in rows] == [
        (128, 1), (128, 4), (1024, 1), (1024, 4)
    ]  # fmt: skip
    for row in rows:
        assert row["errors"] == 0
        assert row["acked_per_s"] > 0 and row["consumed_per_s"] > 0
        assert row["acked_consuming_per_s"] > 0  # a second phase, pulled meanwhile
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["single_p50_ms"] > 0 and row["failover_ms"] > 0
        assert row["peak_rss_mib"] > 0
        assert row["cpu_leader_us"] > 0 and row["cpu_follower_us"] > 0
        assert row["cpu_generator_us"] > 0
        # the Go generator wherever Go can be had; then this process only pulls
        assert row["generator"] in ("go", "python")
        assert row["generator"] == "python" or row["cpu_puller_us"] > 0
    assert "| raftmq broker R3" in run.stdout
    # its own targets, marked, though no peer ran
    assert "1024 B, 4 conns: raftmq single-send p50" in run.stdout


def test_stage_timeline_orders_each_sends_first_marks_and_ignores_strays(tmp_path):
    """`bench broker --stages`: a mark counts for the send whose write and read enclose
    it (first occurrence), rows come in time order with the gap from the row before,
    and a mark seen in no more than half the sends (a heartbeat) is left out."""
    from bench.stages import CLIENT_READ, timeline
    from raftmq.process import stages

    (tmp_path / "10.stages").write_text("read 1100\nread 1150\nread 2100\nstray 2500\n")
    (tmp_path / "20.stages").write_text("fsync 1300\nfsync 2400\n")
    marks = stages.read(str(tmp_path))
    rows = timeline([(1000, 1500), (2000, 2600)], marks, {10: "master", 20: "follower1"})
    assert [(r["role"], r["stage"]) for r in rows] == [
        ("master", "read"),
        ("follower1", "fsync"),
        ("client", CLIENT_READ),
    ]
    assert [r["at_us"] for r in rows] == [0.1, 0.35, 0.55]
    assert rows[1]["gap_us"] == pytest.approx(0.25)


@pytest.mark.processes
@pytest.mark.parametrize(
    "system",
    [
        broker_bench.GRPC_SYSTEM,
        pytest.param(broker_bench.GRPC_JAVA_SYSTEM, marks=pytest.mark.requires("rocketmq-java")),
    ],
    ids=["mqproxy", "apache-proxy"],
)
def test_the_grpc_rows_send_and_receive_through_a_proxy(system):
    """`bench broker --grpc`'s figures for one size: every send the Go generator made
    through the proxy (mqproxy, or Apache RocketMQ's own in front of the same group) is
    stored, the receive+ack phase acknowledges messages, and each role's CPU per message
    (the proxy's by thread too) is a number."""
    row = trio.run(broker_bench.measure_grpc, 1024, 1.0, 64, system)
    assert row["system"] == system
    assert row["errors"] == 0 and row["receive_errors"] == 0, row["notes"]
    assert row["stored"] == row["sent"] > 0
    assert row["acked_per_s"] > 0 and row["received_acked_per_s"] > 0
    assert 0 < row["received"] <= row["stored"]
    assert 0 < row["p50_ms"] <= row["p99_ms"]
    for phase in ("", "receive_"):
        for role in ("proxy", "leader", "follower", "generator"):
            assert row[f"{phase}cpu_{role}_us"] > 0, (phase, role, row)
        assert sum(row[f"{phase}cpu_proxy_threads_us"].values()) > 0


@pytest.mark.processes
@pytest.mark.requires("rocketmq-java", "go")
@pytest.mark.parametrize(
    # The rows with RocketMQ's defaults start the same groups with another flushDiskType.
    # Each case costs about 40 s: the DLedger group and the controller-mode group are
    # checked, the classic group's harness is the mixed HA tests' (tests/test_java_ha.py).
    "system",
    [broker_bench.JAVA_SYSTEMS[0], broker_bench.JAVA_SYSTEMS[4]],
    ids=["dledger-sync", "controller"],
)
def test_the_java_rows_measure_apache_rocketmq_with_the_same_generator(system):
    """Apache RocketMQ's rows for one size: RocketMQ's own name server and brokers (Java
    processes), loaded by the Go generator raftmq's rows use, a row per count of
    connections, with each JVM's CPU per message measured, and a failover figure where
    the group elects a master by itself (DLedger, controller mode) and none where it
    cannot (classic).
    The warm-up is cut to a second: this checks the rows, not the figures."""
    trials = 0 if system.no_failover else 1
    measure = partial(broker_bench.measure, system=system, warmup_s=1.0)
    rows = trio.run(measure, 128, 1.0, 64, trials, broker_bench.GO, (1, 4))
    assert [row["connections"] for row in rows] == [1, 4]
    for row in rows:
        assert row["system"] == system.name and row["generator"] == broker_bench.GO
        assert row["acked_per_s"] > 0, row["notes"]
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["single_p50_ms"] > 0 and row["peak_rss_mib"] > 0
        roles = row["cpu_us_per_message"]
        members = [role for role in roles if role.startswith("follower")] + ["leader"]
        assert len(members) == (3 if "DLedger" in system.name else 2), roles
        assert all(roles[role] > 0 for role in members), roles
        # The Go generator's figure may round to 0: when a JVM group on a loaded machine
        # acks few sends in this one-second window, the Go process spends less than one
        # CPU clock tick (10 ms) in it. That it was measured at all is what this checks.
        assert roles["namesrv"] is not None and roles["generator"] >= 0, roles
        assert (row["failover_ms"] is not None) == (system.no_failover is None), row


def test_the_targets_are_judged_with_each_peers_own_figure_beside_raftmqs():
    from bench import nats_jetstream
    from bench.__main__ import ratios

    def row(system, acked, p99, single):
        return {"system": system, "size": 128, "connections": 4, "acked_per_s": acked,
                "p99_ms": p99, "single_p50_ms": single}  # fmt: skip

    other_size = {**row(nats_jetstream.SYSTEM, 1, 1, 1), "size": 1024}
    lines = ratios(
        [
            row(broker_bench.SYSTEM, 30_000, 14.0, 1.5),
            row(nats_jetstream.SYSTEM, 25_000, 18.0, 1.25),
            other_size,
        ]
    )
    assert lines == [
        f"128 B, 4 conns: raftmq / {nats_jetstream.SYSTEM}: 1.20x (target >= 1.2x: met)",
        f"128 B, 4 conns: raftmq p99 14.00 ms (target <= 10 ms: MISSED; "
        f"{nats_jetstream.SYSTEM}: 18.00 ms)",
        f"128 B, 4 conns: raftmq single-send p50 1.50 ms (target <= 0.6 ms: MISSED; "
        f"{nats_jetstream.SYSTEM}: 1.25 ms)",
    ]
