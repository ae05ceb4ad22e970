"""`python -m bench broker --scale`: every table of a small run has its figures, and the
pieces of arithmetic it sizes its phases by."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import broker_bench
from bench.broker_bench import TOPIC, Spread
from bench.scale_bench import next_chunk_s, sample_points, sizes

TABLES = {
    "payload": "acked/s and latency against payload size",
    "window": "acked/s and latency against sends in flight",
    "topics": "1 topic against 20 topics under the same load",
    "idle": "the group's CPU (and the master's RSS) with no load",
    "rss": "RSS MiB per broker (RssAnon, RssFile)",
    "catch-up": "a consumer catching up on the backlog",
}


def test_sizes_read_kib_and_an_empty_list_skips_the_phase():
    assert sizes("128,1K, 4k,64K") == [128, 1024, 4096, 65536]
    assert sizes("") == []
    with pytest.raises(ValueError):
        sizes("0")
    with pytest.raises(ValueError):
        sizes("1M")


def test_rss_is_sampled_at_even_steps_ending_at_the_backlog():
    assert sample_points(100, 4) == [25, 50, 75, 100]
    assert sample_points(10, 3) == [3, 6, 10]
    assert sample_points(5, 1) == [5]


def test_a_backlog_run_lasts_what_the_rate_so_far_needs_within_bounds():
    assert next_chunk_s(10 << 20, 0.0, 0.0) == 0.5  # no rate yet: a short first run
    assert next_chunk_s(10 << 20, 5 << 20, 5.0) == pytest.approx(2.0)
    assert next_chunk_s(10 << 20, 5 << 20, 0.5) == 1.0  # at most twice the last run
    assert next_chunk_s(1, 5 << 20, 1.0) == 0.3  # a generator start costs: never shorter
    assert next_chunk_s(1 << 40, 1.0, 60.0) == 10.0


def test_a_load_spread_over_topics_names_them_as_the_go_generator_does():
    assert Spread().names() == [TOPIC]
    assert Spread(topic="T", topics=3, queues=4).names() == ["T-0", "T-1", "T-2"]


@pytest.mark.processes
@pytest.mark.requires("go", "rocketmq-java")
def test_a_small_scale_run_fills_every_table(tmp_path):
    """raftmq's every phase, and the topics phase against Apache RocketMQ's DLedger mode
    too, in the same tables."""
    out = tmp_path / "scale.json"
    command = [sys.executable, "-m", "bench", "broker", "--scale", "--duration", "0.5"]
    command += ["--payloads", "128,4K", "--windows", "1,64", "--topics", "20", "--idle", "0.5"]
    command += ["--backlog-mib", "24", "--rss-samples", "3", "--json", str(out)]
    command += ["--peers", "rocketmq"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "load average at the start" in run.stdout and "load generator: go" in run.stdout
    for title in TABLES.values():
        assert title in run.stdout
    tables = json.loads(out.read_text())
    assert set(tables) == set(TABLES)
    assert all("error" not in row for rows in tables.values() for row in rows)
    assert [r["size"] for r in tables["payload"]] == [128, 4096]
    assert [r["window"] for r in tables["window"]] == [1, 64]
    for row in tables["payload"] + tables["window"] + tables["topics"]:
        assert row["acked_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["cpu_leader_us"] > 0 and row["cpu_follower_us"] > 0
        if row["system"] == "raftmq":
            assert row["errors"] == 0 and row["cpu_generator_us"] > 0
        else:
            # A loaded Java broker refuses some sends ("[TIMEOUT_CLEAN_QUEUE] broker
            # busy", its flow control), which its row counts as errors; and the Go
            # generator's CPU may round to 0 against it, acking few sends in a
            # half-second window (less than one 10 ms clock tick). That both were
            # measured is what this checks there.
            assert row["errors"] >= 0 and row["cpu_generator_us"] >= 0
    java = broker_bench.JAVA_SYSTEMS[1].name
    systems = ["raftmq"] * 2 + [java] * 2
    assert [(r["system"], r["queues"]) for r in tables["topics"]] == list(
        zip(systems, [4, 80, 4, 80], strict=True)
    )
    assert [r["system"] for r in tables["idle"]] == ["raftmq"] * 3 + [java] * 3
    for row in tables["idle"]:
        assert row["idle_leader_ms"] >= 0 and row["idle_follower_ms"] >= 0
        assert row["settled_s"] is not None  # a dispatch checkpoint came after the load
        assert row["leader_anon_mib"] > 0 and row["leader_file_mib"] >= 0
    rss = tables["rss"]
    assert rss[0]["log_mib"] == 0 and rss[-1]["log_mib"] >= 24 and len(rss) >= 2
    for row in rss:
        for member in ("leader", "follower1", "follower2"):
            assert row[f"{member}_anon_mib"] > 0 and row[f"{member}_file_mib"] > 0
    # the mapped log grows the file pages, not the heap
    assert rss[-1]["leader_file_mib"] - rss[0]["leader_file_mib"] >= 16
    catch_up = {row["read"]: row for row in tables["catch-up"]}
    assert set(catch_up) == {"warm", "disk", "cold"}
    for row in catch_up.values():
        assert row["mib"] >= 20 and row["mib_s"] > 0 and row["cached_mib"] is not None
    assert catch_up["warm"]["messages_per_s"] > 0 and catch_up["cold"]["messages_per_s"] > 0
