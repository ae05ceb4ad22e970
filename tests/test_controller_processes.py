"""Controllers as real processes over real TCP, started from RocketMQ 5's own sample
files as they are (`controller/conf`, copied from apache/rocketmq 5.3.3's
distribution/conf/controller): three `mqcontroller`s, and three `mqnamesrv`s each with a
controller inside (`enableControllerInNamesrv=true`). A client drives the brokerId
steps, an election and a SyncStateSet change through TCP; SIGKILL of the controller
leader leaves the state intact and another controller serves within about a second;
restarting every controller rebuilds the same state from the log."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from bench.javatools import TOOLS5_POM, JavaTool
from raftmq.remoting.client import RemotingClient
from raftmq.remoting.codes import RequestCode as Q
from raftmq.remoting.codes import ResponseCode as R
from raftmq.remoting.errors import RemotingConnectError, RemotingTimeoutError
from tests.helpers import (
    CLUSTER,
    GROUP,
    REPO,
    alter,
    elect,
    heartbeat,
    join,
    mqadmin,
    read_until,
    request,
)

pytestmark = [pytest.mark.processes, pytest.mark.untimed]

CONF = REPO / "controller" / "conf"
BIN = Path(sys.executable).parent
ADDRESSES = ("127.0.0.1:9878", "127.0.0.1:9868", "127.0.0.1:9858")  # the samples' peers
READY = b"The Controller Server boot success"


class Servers:
    """Processes started from sample files with HOME in `home` (where the samples'
    default controllerStorePath, ~/DLedgerController, then is)."""

    def __init__(self, home: Path, command: str, files: list[Path], ready: bytes) -> None:
        self.home, self.command, self.files, self.ready = home, command, files, ready
        self.processes: list[trio.Process | None] = [None] * len(files)

    async def __aenter__(self) -> Servers:
        return self

    async def __aexit__(self, *exc_info) -> None:
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.kill()
                await process.wait()

    async def start(self, i: int) -> None:
        env = {**os.environ, "HOME": str(self.home)}
        log = (self.home / f"{self.command}-{i}.log").open("ab")
        process = await trio.lowlevel.open_process(
            [str(BIN / self.command), "-c", str(self.files[i])],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
        self.processes[i] = process
        await read_until(process.stdout, self.ready, timeout_s=30)

    def signal(self, i: int, signum: int) -> None:
        self.processes[i].send_signal(signum)

    async def wait(self, i: int) -> int:
        return await self.processes[i].wait()

    async def stop_all(self) -> None:
        for i, process in enumerate(self.processes):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(10):
                    assert await process.wait() == 0, f"{self.command} {i} did not stop cleanly"


async def ask(address: str, command) -> object:
    """A request to one controller; None if it is down or silent."""
    try:
        async with RemotingClient(address, connect_timeout_s=0.5) as client:
            return await client.invoke(command, timeout_s=1.0)
    except (RemotingConnectError, RemotingTimeoutError):
        return None


async def find_leader(addresses=ADDRESSES, timeout_s: float = 15.0) -> str:
    with trio.fail_after(timeout_s):
        while True:
            for address in addresses:
                meta = await ask(address, request(Q.CONTROLLER_GET_METADATA_INFO))
                if meta is not None and meta.ext_fields.get("isLeader") == "true":
                    return address
            await trio.sleep(0.02)


async def group_state(address: str) -> tuple:
    """What the controller at `address` says of the group (liveness left out)."""
    info = await ask(address, request(Q.CONTROLLER_GET_REPLICA_INFO, brokerName=GROUP))
    next_id = await ask(
        address, request(Q.CONTROLLER_GET_NEXT_BROKER_ID, clusterName=CLUSTER, brokerName=GROUP)
    )
    data = await ask(
        address, request(Q.CONTROLLER_GET_SYNC_STATE_DATA, json.dumps([GROUP]).encode())
    )
    assert info.code == next_id.code == data.code == R.SUCCESS, (info.remark, data.remark)
    table = json.loads(data.body)["replicasInfoTable"][GROUP]
    for key in ("inSyncReplicas", "notInSyncReplicas"):
        for replica in table[key]:
            del replica["alive"]
    return info.ext_fields, json.loads(info.body), next_id.ext_fields["nextBrokerId"], table


@contextlib.asynccontextmanager
async def brokers_at(leader: str, addresses=ADDRESSES):
    """Brokers 1 and 2 of a group, as the controllers see them: they take their ids, 1
    is elected and takes 2 into its SyncStateSet, and both heartbeat every controller,
    as RocketMQ's brokers do, once, with a timeout longer than any test. Their
    connections stay open for the block (closing one is their death there)."""
    async with contextlib.AsyncExitStack() as stack:
        links = [await stack.enter_async_context(RemotingClient(a)) for a in addresses]
        client = links[addresses.index(leader)]
        for broker_id in (1, 2):
            await join(client, broker_id, f"127.0.0.1:{10910 + broker_id}")
        for link in links:
            for broker_id in (1, 2):
                address = f"127.0.0.1:{10910 + broker_id}"
                heartbeat(link, broker_id, address, heartbeatTimeoutMills=600_000)
        elected = await elect(client, 1)
        assert elected.code == R.SUCCESS, elected.remark
        altered = await alter(client, [1, 2], 1)
        assert altered.code == R.SUCCESS, altered.remark
        yield


async def failover_and_restart(servers: Servers) -> float:
    """The drill of the module docstring; returns the seconds from the leader's SIGKILL
    to the first answer from another controller."""
    for i in range(3):
        await servers.start(i)
    leader = await find_leader()
    async with brokers_at(leader):
        before = await group_state(leader)
        assert before[0]["masterBrokerId"] == "1" and before[1] == {
            "syncStateSet": [1, 2],
            "syncStateSetEpoch": 2,
        }
        killed = ADDRESSES.index(leader)
        servers.signal(killed, signal.SIGKILL)
        await servers.wait(killed)
    started = time.monotonic()
    others = [a for a in ADDRESSES if a != leader]
    new_leader = await find_leader(others)
    served_s = time.monotonic() - started
    assert await group_state(new_leader) == before
    await servers.start(killed)
    await servers.stop_all()
    for i in range(3):
        await servers.start(i)
    assert await group_state(await find_leader()) == before
    await servers.stop_all()
    return served_s


async def test_three_controllers_from_rocketmq_samples_fail_over_and_restart(tmp_path):
    files = [CONF / "cluster-3n-independent" / f"controller-n{i}.conf" for i in range(3)]
    async with Servers(tmp_path, "mqcontroller", files, READY) as servers:
        served_s = await failover_and_restart(servers)
    print(f"a new controller leader served {served_s:.2f} s after the SIGKILL")
    assert served_s < 6.0  # liveness under a loaded CI machine; the figure: docs/controller.md


async def test_controllers_inside_name_servers_from_rocketmq_samples(tmp_path):
    files = [CONF / "cluster-3n-namesrv-plugin" / f"namesrv-n{i}.conf" for i in range(3)]
    async with Servers(tmp_path, "mqnamesrv", files, READY) as servers:
        served_s = await failover_and_restart(servers)
    assert served_s < 6.0  # liveness under a loaded CI machine; the figure: docs/controller.md


async def test_a_sample_file_starts_a_controller_unchanged_and_stops_on_each_signal(tmp_path):
    files = [CONF / "controller-standalone.conf"]
    async with Servers(tmp_path, "mqcontroller", files, READY) as servers:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            await servers.start(0)
            await find_leader(ADDRESSES[:1])
            servers.signal(0, signum)
            with trio.fail_after(10):
                assert await servers.wait(0) == 0


def lines(completed) -> list[str]:
    assert completed.returncode == 0, completed.stderr.decode()
    return completed.stdout.decode().splitlines()


async def test_mqadmin_controller_verbs(tmp_path):
    files = [CONF / "cluster-3n-independent" / f"controller-n{i}.conf" for i in range(3)]
    async with Servers(tmp_path, "mqcontroller", files, READY) as servers:
        for i in range(3):
            await servers.start(i)
        leader = await find_leader()
        follower = next(a for a in ADDRESSES if a != leader)
        leader_id = f"n{ADDRESSES.index(leader)}"
        env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
        async with brokers_at(leader):
            meta = lines(await mqadmin("getControllerMetaData", "-a", follower, env=env))
            assert meta == [
                "",
                "#ControllerGroup\tgroup1",
                f"#ControllerLeaderId\t{leader_id}",
                f"#ControllerLeaderAddress\t{leader}",
                "#Peer:\tn0:127.0.0.1:9878",
                "#Peer:\tn1:127.0.0.1:9868",
                "#Peer:\tn2:127.0.0.1:9858",
            ]

            sync = lines(await mqadmin("getSyncStateSet", "-a", follower, "-b", GROUP, env=env))
            assert "#MasterBrokerId\t1" in sync and "#SyncStateSetNums\t2" in sync
            assert "#MasterEpoch\t1" in sync and "#SyncStateSetEpoch\t2" in sync
            assert (
                "InSyncReplica:\tReplicaIdentity{brokerName='broker-a', brokerId=2,"
                " brokerAddress='127.0.0.1:10912', alive=true}"
            ) in sync

            both = ";".join(ADDRESSES[:2])
            config = lines(await mqadmin("getControllerConfig", "-a", both, env=env))
            assert config[0] == f"============{ADDRESSES[0]}============"
            assert f"============{ADDRESSES[1]}============" in config
            assert "enableElectUncleanMaster                          =  false" in config
            updated = await mqadmin(
                "updateControllerConfig", "-a", both, "-k", "enableElectUncleanMaster",
                "-v", "true", env=env,
            )  # fmt: skip
            assert lines(updated) == [
                f"update controller config success![{ADDRESSES[0]}, {ADDRESSES[1]}]",
                "enableElectUncleanMaster : true",
            ]
            config = lines(await mqadmin("getControllerConfig", "-a", ADDRESSES[1], env=env))
            assert "enableElectUncleanMaster                          =  true" in config
            for key in ("configStorePath", "controllerDLegerPeers"):
                refused = await mqadmin(
                    "updateControllerConfig", "-a", leader, "-k", key, "-v", "x", env=env
                )
                assert refused.returncode == 1, refused.stderr
                code = R.NO_PERMISSION if key == "configStorePath" else R.INVALID_PARAMETER
                assert f"code {int(code)}" in refused.stderr.decode()

            elected = lines(
                await mqadmin(
                    "electMaster", "-a", follower, "-c", CLUSTER, "-bn", GROUP, "-b", "2", env=env
                )
            )
            assert elected == [
                "",
                f"#ClusterName\t{CLUSTER}",
                f"#BrokerName\t{GROUP}",
                "#BrokerMasterAddr\t127.0.0.1:10912",
                "#MasterEpoch\t2",
                "#SyncStateSetEpoch\t3",
                "\t#Broker\t1\t127.0.0.1:10911",
                "\t#Broker\t2\t127.0.0.1:10912",
            ]

            refused = await mqadmin(
                "cleanBrokerMetadata", "-a", leader, "-bn", GROUP, "-c", CLUSTER, env=env
            )
            assert refused.returncode == 1 and b"still alive" in refused.stderr
            usage = await mqadmin("cleanBrokerMetadata", "-a", leader, "-bn", GROUP, env=env)
            assert usage.returncode == 2
            cleaned = await mqadmin(
                "cleanBrokerMetadata", "-a", follower, "-bn", GROUP, "-l", env=env
            )
            assert lines(cleaned) == [f"clear broker {GROUP} metadata from controller success! "]
            gone = lines(await mqadmin("getSyncStateSet", "-a", leader, "-b", GROUP, env=env))
            assert gone == []


async def test_mqcontroller_exit_status_for_a_bad_config_and_a_taken_port(tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_text("controllerDLegerGroup=g\ncontrollerDLegerSelfId=n0\n")
    completed = await trio.run_process(
        [str(BIN / "mqcontroller"), "-c", str(bad)], capture_stderr=True, check=False
    )
    assert completed.returncode == 2
    assert completed.stderr.decode().strip() == (
        f"mqcontroller: {bad}: controllerDLegerPeers is required"
    )
    with trio.socket.socket() as taken:
        await taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = tmp_path / "taken.conf"
        conf.write_text(
            "controllerDLegerGroup=g\ncontrollerDLegerSelfId=n0\n"
            f"controllerDLegerPeers=n0-127.0.0.1:{port}\ncontrollerStorePath={tmp_path}/s\n"
        )
        completed = await trio.run_process(
            [str(BIN / "mqcontroller"), "-c", str(conf)], capture_stderr=True, check=False
        )
    assert completed.returncode == 3, completed.stderr
    assert completed.stderr.decode().startswith(f"mqcontroller: cannot listen on 127.0.0.1:{port}")


async def test_a_paused_leader_answers_nothing_stale_when_it_resumes(tmp_path):
    """SIGSTOP of the controller leader: another leads and changes the master. A read
    sent to the old one while it is paused waits in its socket and, once it resumes,
    may be read before its timers make it step down: it must not answer from its old
    state (its lease ran out while it was paused; RocketMQ's controller would answer
    from memory)."""
    files = [CONF / "cluster-3n-independent" / f"controller-n{i}.conf" for i in range(3)]
    async with Servers(tmp_path, "mqcontroller", files, READY) as servers:
        for i in range(3):
            await servers.start(i)
        leader = await find_leader()
        answers = []
        async with (
            brokers_at(leader),
            RemotingClient(leader) as reader,
            trio.open_nursery() as nursery,
        ):
            paused = ADDRESSES.index(leader)
            servers.signal(paused, signal.SIGSTOP)
            try:
                new_leader = await find_leader([a for a in ADDRESSES if a != leader])
                async with RemotingClient(new_leader) as client:
                    elected = await elect(client, 2, designateElect="true")
                    assert elected.code == R.SUCCESS, elected.remark
                    assert elected.ext_fields["masterEpoch"] == "2"

                async def read() -> None:
                    command = request(Q.CONTROLLER_GET_REPLICA_INFO, brokerName=GROUP)
                    answers.append(await reader.invoke(command, timeout_s=10))

                nursery.start_soon(read)
                await trio.sleep(0.2)  # the request waits in the paused leader's socket
            finally:
                servers.signal(paused, signal.SIGCONT)
        [answer] = answers
        assert answer.code == R.CONTROLLER_NOT_LEADER or answer.ext_fields["masterBrokerId"] == "2"


async def java_mqadmin(home: Path, *args: str) -> subprocess.CompletedProcess:
    """RocketMQ 5.3.3's own mqadmin ARGS: its exit status and output."""
    command = JavaTool(TOOLS5_POM).command(
        "org.apache.rocketmq.tools.command.MQAdminStartup", *args,
        properties={"rocketmq.client.logRoot": str(home / "java-mqadmin")},
    )  # fmt: skip
    return await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)


@pytest.mark.requires("rocketmq-java")
async def test_rocketmq_5_mqadmin_prints_what_ours_prints(tmp_path):
    """Apache's mqadmin 5.3.3 speaks to raftmq's controllers: the same headers and JSON
    bodies both ways, so its controller verbs print what ours print."""
    await trio.to_thread.run_sync(JavaTool(TOOLS5_POM).build)
    files = [CONF / "cluster-3n-independent" / f"controller-n{i}.conf" for i in range(3)]
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    async with Servers(tmp_path, "mqcontroller", files, READY) as servers:
        for i in range(3):
            await servers.start(i)
        leader = await find_leader()
        follower = next(a for a in ADDRESSES if a != leader)
        async with brokers_at(leader):
            for verb in (
                ("getControllerMetaData", "-a", follower),
                ("getSyncStateSet", "-a", follower, "-b", GROUP),
                ("electMaster", "-a", follower, "-c", CLUSTER, "-bn", GROUP, "-b", "2"),
                ("getSyncStateSet", "-a", leader, "-b", GROUP),
                ("updateControllerConfig", "-a", follower, "-k", "notifyBrokerRoleChanged",
                 "-v", "false"),
            ):  # fmt: skip
                java = await java_mqadmin(tmp_path, *verb)
                assert java.returncode == 0, java.stderr.decode()[-2000:]
                if verb[0] == "electMaster":  # done by Java: ours reads the result
                    assert "#MasterEpoch\t2" in java.stdout.decode(), java.stderr.decode()[-3000:]
                    continue
                ours = await mqadmin(*verb, env=env)
                assert ours.returncode == 0, ours.stderr
                assert java.stdout.decode().splitlines() == ours.stdout.decode().splitlines(), (
                    java.stdout.decode(),
                    ours.stdout.decode(),
                )
            java = await java_mqadmin(tmp_path, "getControllerConfig", "-a", follower)
            ours = await mqadmin("getControllerConfig", "-a", follower, env=env)
            java_keys = {line.split("=")[0].strip() for line in java.stdout.decode().splitlines()}
            ours_lines = ours.stdout.decode().splitlines()
            assert ours_lines[0] in java.stdout.decode().splitlines()  # ======addr======
            assert {line.split("=")[0].strip() for line in ours_lines[1:]} <= java_keys
            assert "notifyBrokerRoleChanged                           =  false" in ours_lines
