"""The NATS JetStream peer's server config: what makes it a fair peer is in the file."""

import subprocess

import pytest

from bench.nats_jetstream import NodePorts, run_throughput, server_binary, server_config


def config(tmp_path):
    return server_config("n1", NodePorts(4223, 6223, 8223), [6222, 6224], tmp_path / "a b" / "n1")


def test_fsync_before_every_ack_on_file_storage_routed_to_the_other_two(tmp_path):
    text = config(tmp_path)
    assert 'server_name: "n1"' in text
    assert "listen: 127.0.0.1:4223" in text
    assert "http: 127.0.0.1:8223" in text
    # sync_interval lives in the jetstream block; "always" means an fsync per write
    jetstream = text.split("jetstream {", 1)[1].split("}", 1)[0]
    assert "sync_interval: always" in jetstream
    assert f'store_dir: "{tmp_path}/a b/n1"' in jetstream
    cluster = text.split("cluster {", 1)[1].split("}", 1)[0]
    assert "listen: 127.0.0.1:6223" in cluster
    assert 'routes: ["nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6224"]' in cluster


@pytest.mark.processes
@pytest.mark.requires("nats-server")
def test_the_server_accepts_the_config(tmp_path):
    path = tmp_path / "n1.conf"
    path.write_text(config(tmp_path))
    proc = subprocess.run(
        [str(server_binary()), "-t", "-c", str(path)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.processes
@pytest.mark.requires("nats-server", "go")
def test_the_nats_rows_measure_the_load_and_a_single_publish_at_a_time(tmp_path):
    """`bench broker`'s NATS row, briefly: the load phase over each count of connections
    and the single-publish phase (one in flight, as raftmq's single-send phase) each give
    a figure, with every role's CPU per message."""
    rows = run_throughput(128, 64, 1.0, tmp_path, (1, 4), warmup_s=0.5)
    assert [row["connections"] for row in rows] == [1, 4]
    for row in rows:
        assert row["errors"] == 0 and row["acked_per_s"] > 0, row["notes"]
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["single_p50_ms"] > 0
        roles = row["cpu_us_per_message"]
        assert roles["leader"] > 0 and roles["generator"] >= 0, roles
    assert rows[0]["single_p50_ms"] == rows[1]["single_p50_ms"]  # one phase for the group
