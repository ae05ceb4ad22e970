"""Real processes: a name server and 3 brokers, a master killed with SIGKILL under load;
a second broker process on a store that is in use; a failing fsync; a broker on an address
of its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from functools import partial

import pytest
import trio

from raftmq.config.address import parse_address
from raftmq.remoting import RemotingClient, RemotingConnectError
from raftmq.tools.broker_drill import run_drill
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import read_until, stop_signal_stops_every_child

pytestmark = pytest.mark.processes


@pytest.mark.parametrize("group_address", [False, True], ids=["own-addresses", "group-address"])
async def test_no_acknowledged_message_is_lost_across_a_master_kill(tmp_path, group_address):
    senders = 8
    tally = await run_drill(
        tmp_path, messages=600, senders=senders, queues=4, group_address=group_address
    )
    assert tally.new_master and tally.new_master != tally.old_master
    assert len(tally.acked) >= 550, "sends should keep succeeding across the failover"
    assert not tally.lost, f"acknowledged but never consumed: {sorted(tally.lost)[:20]}"
    assert tally.order_violations == 0
    assert tally.redelivered == 0, "the consumer kept its queues: nothing is delivered twice"
    assert set(tally.consumed) <= set(range(600))  # nothing the producers did not send
    # consumer offsets were committed through the log and survive the failover
    assert tally.committed_offsets == tally.max_offsets
    # A send in flight when the master died may have reached the followers (and so the
    # new master's log) without its answer reaching the producer, which then resends it
    # (at least once, as RocketMQ's client does; the resend keeps its UNIQ_KEY): at most
    # one such message per sender.
    assert len(tally.acked) <= sum(tally.max_offsets.values()) <= tally.sent + senders


@pytest.mark.parametrize("written_while_down", [True, False], ids=["missed-a-write", "idle"])
async def test_waiting_for_the_members_to_catch_up_outlasts_one_still_starting(
    tmp_path, written_while_down
):
    """The jepsen runs' final read waits for every member after restarting them all at
    once; a member whose broker port is not open yet is behind, not an error. (The
    member misses a write while it is down, as under the jepsen load; or nothing is
    written at all, and the restarted member, which trusts the leader's commit index
    only once it has checked its log against the leader's, reported -1 until the next
    write.)"""
    async with LocalCluster(tmp_path, nodes=3) as cluster:
        master = await cluster.wait_master()
        follower = next(n for n in cluster.ids if n != master)
        if not written_while_down:
            await cluster.wait_caught_up(30.0)
        cluster.kill(follower)  # and reaped
        if written_while_down:
            await cluster.create_topic("WrittenWhileDown")
        cluster.start_broker(follower)
        await cluster.wait_caught_up(30.0)
        assert (await cluster.member_state(follower))["dLegerRole"] in ("FOLLOWER", "LEADER")


async def test_a_second_broker_on_the_same_store_refuses_to_start(tmp_path):
    """RocketMQ's store lock: a second process on one store (an operator's slip, or a
    harness that lost track of a process) would truncate and rewrite the first one's
    files under it. It must stop at once with a clear message instead."""
    async with LocalCluster(tmp_path, nodes=1) as cluster:
        second = await trio.run_process(
            [sys.executable, "-m", "raftmq.broker.cli", "-c", str(cluster.conf_path("n0"))],
            capture_stderr=True,
            check=False,
        )
        assert second.returncode == 3
        assert b"in use by another process" in second.stderr
        assert cluster.procs["n0"].poll() is None  # the first one is untouched


@pytest.mark.requires("strace")  # it injects the EIO
@pytest.mark.parametrize("after", [3, 12])
async def test_a_failed_fsync_stops_the_broker_with_the_disk_status(tmp_path, after):
    """Every fsync the broker makes (log, term and vote, checkpoints, ConsumeQueues) that
    fails stops it with status 4 and says so — also when the fsyncs it then tries on
    the way out fail too, which used to turn the exit into a traceback and status 3."""
    async with LocalCluster(tmp_path, nodes=1) as cluster:
        cluster.kill("n0")
        inject = f"inject=fdatasync,fsync:error=EIO:when={after}+"
        broker = [sys.executable, "-m", "raftmq.broker.cli", "-c", str(cluster.conf_path("n0"))]
        with trio.fail_after(30):
            run = await trio.run_process(
                ["strace", "-f", "-qq", "-o", os.devnull, "-e", inject, *broker],
                capture_stderr=True,
                check=False,
            )
        assert run.returncode == 4, run.stderr[-2000:]
        assert b"mqbroker: fsync failed" in run.stderr


async def test_a_broker_listens_on_its_bind_address_and_advertises_brokerip1(tmp_path):
    """bindAddress=127.0.0.2: reachable there and not on 127.0.0.1; registered with the
    name server as brokerIP1 (127.0.0.3, where nothing listens unless a proxy does)."""
    async with LocalCluster(
        tmp_path, nodes=1, hosts=["127.0.0.2"], advertised=["127.0.0.3"]
    ) as cluster:
        host, port = parse_address(cluster.broker_addrs["n0"])
        assert host == "127.0.0.2"
        assert await cluster.master_address() == f"127.0.0.3:{port}"
        assert (await cluster.member_state("n0"))["dLegerRole"] == "LEADER"
        for elsewhere in ("127.0.0.1", "127.0.0.3"):
            with pytest.raises(RemotingConnectError):
                async with RemotingClient(f"{elsewhere}:{port}"):
                    pass
        dledger_port = parse_address(cluster.peer_addrs["n0"])[1]
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", dledger_port)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
async def test_a_stop_signal_to_the_demo_stops_its_servers_and_says_so(tmp_path, sig):
    """Ctrl-C printed a traceback; now one line, status 130, and no server left running.
    SIGTERM (kill, systemd, a container runtime) and SIGHUP killed the demo alone and
    left its name server and three brokers running on their ports; now they stop them
    as Ctrl-C does, with status 143 and 129."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    async with trio.open_nursery() as nursery:
        demo = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-m", "raftmq.tools.broker_demo"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
                env=env,
            )
        )
        seen = await read_until(demo.stdout, b"master is")
        err = b""

        async def read_stderr() -> None:
            nonlocal err
            async for chunk in demo.stderr:
                err += chunk

        nursery.start_soon(read_stderr)
        status = await stop_signal_stops_every_child(demo, sig, children=4)
    assert status == 128 + sig, err.decode()[-3000:]
    assert err.decode().strip() == "demo interrupted: its name server and brokers are stopped"
    brokers = re.search(rb"brokers (.*)\n", seen).group(1).decode()
    for address in re.findall(r"n\d=(\S+?),?(?:\s|$)", brokers):
        with pytest.raises(RemotingConnectError):
            async with RemotingClient(address, connect_timeout_s=0.5):
                pass
    assert list(tmp_path.iterdir()) == []  # its store directory is removed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
async def test_a_stop_signal_to_the_local_cluster_stops_every_process_it_started(tmp_path, sig):
    """`python -m raftmq.tools.broker_local` stopped by kill (or a hangup) exited alone,
    leaving its name server and three brokers running, holding their ports and store
    locks; now it stops them as on Ctrl-C, and a new cluster starts on the same stores."""
    command = [sys.executable, "-m", "raftmq.tools.broker_local", "--dir", str(tmp_path)]
    for expected in (sig, signal.SIGINT):
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
        await read_until(process.stdout, b"Ctrl-C stops every process")
        status = await stop_signal_stops_every_child(process, expected, children=4)
        assert status == 128 + expected
