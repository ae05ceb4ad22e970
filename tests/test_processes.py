"""Real `dledger server` processes on 127.0.0.1, driven over TCP by the client and the CLI."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import trio

from raftmq.tools.dledger_drill import run_drill
from raftmq.tools.dledger_local import LocalGroup, free_ports
from tests.helpers import read_until, stop_signal_stops_every_child

pytestmark = pytest.mark.processes


async def test_leader_kill_loses_no_acknowledged_entry(tmp_path):
    async with LocalGroup(tmp_path, 3, group="drill") as group:
        report = await run_drill(
            group, appenders=16, appends_before_kill=800, appends_after_kill=400
        )
    assert report.new_leader and report.new_leader != report.first_leader
    assert report.new_term > report.first_term
    assert report.acknowledged + report.unknown == report.sent
    assert report.acknowledged >= 1000
    assert report.lost == []
    assert report.restarted_caught_up
    assert report.mismatched_replicas == []
    assert report.identical_bytes > 800 * 48


def dledger(*args, check_code=None):
    proc = subprocess.run(
        [sys.executable, "-m", "raftmq.dledger.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check_code is not None:
        assert proc.returncode == check_code, (proc.returncode, proc.stdout, proc.stderr)
    return proc


async def test_cli_verbs_and_exit_codes(tmp_path):
    async with LocalGroup(tmp_path, 3, group="cli") as group:
        async with group.client() as client:
            await group.wait_for_leader(client)
        common = ["--group", "cli", "--peers", group.peers_arg]

        appended = json.loads(
            dledger(
                "append", *common, "--data", "héllo", "--count", "3", "--json", check_code=0
            ).stdout
        )
        assert [a["index"] for a in appended] == [appended[0]["index"] + i for i in range(3)]
        assert appended[1]["pos"] - appended[0]["pos"] == 48 + len("héllo".encode())

        got = json.loads(
            dledger(
                "get", *common, "--index", str(appended[2]["index"]), "--json", check_code=0
            ).stdout
        )
        assert got == {
            "index": appended[2]["index"],
            "term": got["term"],
            "pos": appended[2]["pos"],
            "body": "héllo",
        }

        status = json.loads(dledger("status", *common, "--json", check_code=0).stdout)
        assert sorted(s["id"] for s in status) == ["n0", "n1", "n2"]
        leaders = [s for s in status if s["role"] == "LEADER"]
        assert len(leaders) == 1
        assert {s["leaderId"] for s in status} == {leaders[0]["id"]}

        transferee = next(s["id"] for s in status if s["role"] == "FOLLOWER")
        dledger(
            "leadershipTransfer",
            *common,
            "--leader",
            leaders[0]["id"],
            "--transferee",
            transferee,
            check_code=0,
        )
        async with group.client() as client:
            leader = await group.wait_for_leader(client)
        assert leader["selfId"] == transferee
        assert leader["term"] > leaders[0]["term"]

        missing = dledger("get", *common, "--index", "999999", check_code=1)
        assert "INDEX_OUT_OF_RANGE" in missing.stderr

        # A wrong --group: every member answers UNKNOWN_GROUP, said at once (status used
        # to exit 0 with rows of '-', get and append to wait 5 s and say NOT_LEADER).
        wrong = ["--group", "other", "--peers", group.peers_arg]
        for verb in (["status"], ["get", "--index", "1"], ["append", "--data", "x"]):
            started = time.monotonic()
            refused = dledger(verb[0], *wrong, *verb[1:], check_code=1)
            assert refused.stderr.startswith(
                "dledger: UNKNOWN_GROUP (400): asked for group 'other'"
            )
            assert refused.stderr.count("\n") == 1 and refused.stdout == ""
            assert time.monotonic() - started < 4

    dledger("status", "--group", "cli", "--peers", "n0-127.0.0.1:nope", check_code=2)
    port = free_ports(1)[0]
    down = dledger("append", "--group", "cli", "--peers", f"n0-127.0.0.1:{port}", check_code=3)
    assert "NOT_LEADER" in down.stderr or "no leader" in down.stderr


async def test_follower_restart_catches_up_and_keeps_term(tmp_path):
    async with LocalGroup(tmp_path, 3, group="restart") as group, group.client() as client:
        leader = await group.wait_for_leader(client)
        follower = next(n for n in group.ids if n != leader["selfId"])
        group.kill(follower)
        for i in range(50):
            await client.append([f"while-down-{i}".encode()])
        group.start(follower)
        with trio.fail_after(15):
            while True:
                rows = {r.get("selfId"): r for r in await client.status()}
                if (
                    rows[follower].get("committedIndex", -1)
                    >= rows[leader["selfId"]]["committedIndex"]
                ):
                    break
                await trio.sleep(0.05)
        assert rows[leader["selfId"]]["role"] == "LEADER"
        assert rows[leader["selfId"]]["term"] == leader["term"]
        assert rows[follower]["ledgerEndIndex"] == rows[leader["selfId"]]["ledgerEndIndex"]


async def test_damage_before_the_committed_point_is_a_clean_refusal_to_start(tmp_path):
    """A flipped byte inside committed data: the replica names the file and offset and exits 4."""
    async with LocalGroup(tmp_path, 3, group="damage") as group, group.client() as client:
        await group.wait_for_leader(client)
        positions = []
        for i in range(20):
            positions += await client.append([f"entry-{i:03d}".encode() * 4])
        victim = group.ids[0]
        assert await group.caught_up(client, victim)
    group.stop()  # a graceful stop writes the checkpoint of what is durable and committed
    checkpoint = (tmp_path / victim / f"dledger-{victim}" / "checkpoint").read_text()
    assert "committedIndex=" in checkpoint
    _index, pos = positions[5]
    segment = sorted(group.data_dir(victim).iterdir())[0]
    with open(segment, "r+b") as f:
        f.seek(pos + 48 + 3)  # inside the body of a committed entry
        byte = f.read(1)
        f.seek(pos + 48 + 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    proc = subprocess.run(group.command(victim), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    assert str(segment) in proc.stderr
    assert f"offset {pos}" in proc.stderr


def test_server_on_a_busy_port_says_so_in_one_line(tmp_path):
    """It died with a 45-line traceback."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = dledger(
            "server",
            *("--group", "g", "--id", "n0", "--peers", f"n0-127.0.0.1:{port}"),
            *("--store-base-dir", str(tmp_path / "n0")),
            check_code=3,
        )
    assert proc.stderr.startswith(f"dledger: n0 cannot listen on 127.0.0.1:{port}: ")
    assert proc.stderr.count("\n") == 1, proc.stderr


def _scrape_dledger(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("role")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_server_metrics_port_serves_its_dledger_metrics(tmp_path):
    """`dledger server --metrics-port` serves the same dledger_* families a broker's
    member does; a busy metrics port is one line naming metricsPort, exit status 3."""
    peer_port, metrics_port, other_port = free_ports(3)

    def server_args(port: int, store: str) -> list[str]:
        return [
            *("server", "--group", "solo", "--id", "n0", "--peers", f"n0-127.0.0.1:{port}"),
            *("--store-base-dir", str(tmp_path / store), "--metrics-port", str(metrics_port)),
        ]

    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq.dledger.cli", *server_args(peer_port, "n0")],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        assert lines[1].strip() == f"metrics at {url}", lines
        common = ["--group", "solo", "--peers", f"n0-127.0.0.1:{peer_port}"]
        appended = json.loads(dledger("append", *common, "--count", "5", "--json").stdout)
        found = _scrape_dledger(url)
        assert found["dledger_role", "LEADER"] == 1
        assert found["dledger_committed_index", None] == appended[-1]["index"]
        assert found["dledger_ledger_end_index", None] == appended[-1]["index"]
        assert found["dledger_fsync_seconds_count", None] >= 1

        busy = dledger(*server_args(other_port, "other"), check_code=3)
        assert busy.stderr.startswith(
            f"dledger: n0 cannot serve metrics: metricsPort={metrics_port}"
        )
        assert busy.stderr.count("\n") == 1, busy.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_server_on_a_store_it_cannot_create_says_so_in_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    store = tmp_path / "file" / "store"
    proc = dledger(
        "server",
        *("--group", "g", "--id", "n0", "--peers", f"n0-127.0.0.1:{free_ports(1)[0]}"),
        *("--store-base-dir", str(store)),
        check_code=4,
    )
    assert proc.stderr.startswith(f"dledger: refusing to run: --store-base-dir {store}: ")
    assert "Not a directory" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
async def test_a_stop_signal_to_the_dledger_demo_stops_its_servers(tmp_path, sig):
    """The demo stopped by Ctrl-C printed a traceback; by kill (SIGTERM) or a hangup it
    exited alone and left its three dledger servers running. Now each stops them, says so
    in one line and exits with 128 + the signal."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "raftmq.tools.dledger_demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    await read_until(process.stdout, b"peers:")
    status = await stop_signal_stops_every_child(process, sig, children=3)
    assert status == 128 + sig
    err = (await process.stderr.receive_some()).decode()
    assert err.strip() == "demo interrupted: its dledger servers are stopped"
    assert list(tmp_path.iterdir()) == []  # its store directory is removed


async def test_cli_grows_and_shrinks_a_group_that_keeps_appending(tmp_path):
    """3 members grown to 5 by `dledger addPeer` (each a learner that catches up, then a
    voter) and shrunk back to 3 by `dledger removePeer` of the leader and of an original
    follower (so two of the three are replaced) while a client appends: every
    acknowledged entry is readable from the group left, and appends stall no longer
    than a new election."""
    async with LocalGroup(tmp_path, 3, group="members") as group, group.client() as client:
        await group.wait_for_leader(client)
        acked: list[int] = []
        gaps_s: list[float] = []

        async def append_all_along():
            last = trio.current_time()
            while True:
                try:
                    ((index, _pos),) = await client.append([b"x" * 64], timeout_s=5.0)
                except Exception:  # noqa: BLE001 - an unknown outcome: not acknowledged
                    continue
                now = trio.current_time()
                gaps_s.append(now - last)
                last = now
                acked.append(index)

        def members(verb, *args):
            common = ["--group", "members", "--peers", group.peers_arg]
            return json.loads(dledger(verb, *common, *args, "--json", check_code=0).stdout)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append_all_along)
            await trio.sleep(0.5)
            for new in ("n3", "n4"):
                joined = group.join(new)
                shown = await trio.to_thread.run_sync(members, "addPeer", "--member", joined)
            assert shown["voters"] == ["n0", "n1", "n2", "n3", "n4"] and not shown["learners"]
            leader = (await group.wait_for_leader(client))["selfId"]
            follower = next(n for n in ("n0", "n1", "n2") if n != leader)
            for gone in (leader, follower):
                shown = await trio.to_thread.run_sync(members, "removePeer", "--member", gone)
                client.peers.pop(gone)  # still running, never campaigning: not asked
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        left = sorted(n for n in group.ids if n not in (leader, follower))
        assert sorted(shown["voters"]) == left
        assert sorted(members("peers")["peers"]) == left
        after = await group.wait_for_leader(client)
        assert after["selfId"] in left
        for index in acked[-50:]:
            assert (await client.get(index))["index"] == index
        print(f"acked {len(acked)}, worst gap {max(gaps_s) * 1000:.0f} ms")
        assert len(acked) > 100
        assert max(gaps_s) < 2.0, max(gaps_s)


async def test_a_member_restarted_with_peers_from_before_a_join_dials_the_joined_member(tmp_path):
    """n0, n1, n2 become n0, n1, n3 (n3 added, n2 removed); n0 is restarted with the
    --peers it was first given, which lack n3, as a broker's conf written before the
    join would be, and n1 is stopped. n0 and n3 are a quorum of three only if each
    reaches the other: n0 follows its saved configuration and must dial n3 too (its
    answers and votes travel on the connections it opens). It dialled only the members
    its --peers listed, so no leader could be elected."""
    async with LocalGroup(tmp_path, 3, group="rejoin") as group, group.client() as client:
        original = group.peers_arg
        await group.wait_for_leader(client)
        joined = group.join("n3")
        await client.add_peer("n3", joined.split("-", 1)[1])
        await client.remove_peer("n2")
        group.kill("n2")
        assert sorted((await client.members())["voters"]) == ["n0", "n1", "n3"]
        group.kill("n0")
        group.start("n0", peers_arg=original)
        group.kill("n1")
        client.peers = {n: group.peers[n] for n in ("n0", "n3")}
        leader = await group.wait_for_leader(client, timeout_s=10.0)
        client.leader_id = "n1"  # as an answer before the kill may have left it: no address
        ((index, _pos),) = await client.append([b"after"], timeout_s=5.0)
        assert leader["selfId"] in ("n0", "n3")
        assert (await client.get(index))["index"] == index
