"""Apache RocketMQ's 4.9 Java broker as a member of a group with raftmq's brokers, or
of a group of its own: the tests' mixed groups and the benchmark's Java rows alike.

`MixedClassicGroup` is raftmq's `LocalClassicGroup` (a name server, n0 the master, n1..
slaves, real processes) in which the members named in `java` run RocketMQ's own
BrokerStartup (rocketmq-broker 4.9.7 from Maven Central, bench/java/server/pom.xml)
instead of raftmq's broker, with the same brokerName, roles, store segment size and
name server, so the two replicate over RocketMQ's HA protocol. `MixedDLedgerGroup` is
the same for a DLedger group (LocalCluster). Either can restart a member as the other
kind on its store (`reboot_as`). With every member in `java` and `java_namesrv`, the
name server is RocketMQ's NamesrvStartup too: Apache RocketMQ alone, as `bench broker`
runs it beside raftmq (BENCH_PROFILE, each `flush_disk_type`). `server_pom` picks the
release: 4.9.7, or RocketMQ 5.3.3 (bench/java/server5/pom.xml). `MixedControllerGroup`
is the same for a controller-mode group (RocketMQ 5.3.3's brokers, and with
`java_controllers` its ControllerStartup instead of raftmq's controllers).

A Java broker binds listenPort - 2 (its VIP channel) and listenPort + 1 (its HA port,
forced so in 4.9), so its listen port is chosen with both free, and its HA address is
listenPort + 1.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench.javatools import JVM_FLAGS, SERVER5_POM, SERVER_POM, JavaTool
from raftmq.client.admin import Admin
from raftmq.client.errors import MQClientError
from raftmq.client.mqadmin.controller import sync_state_data
from raftmq.config.address import parse_address
from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingError,
    RequestCode,
    ResponseCode,
)
from raftmq.tools.broker_local import (
    BOOT_TIMEOUT_S,
    LOOPBACK,
    LocalClassicGroup,
    LocalCluster,
    LocalControllerGroup,
    _lenient_json,
)
from raftmq.tools.dledger_local import _bindable, free_ports

BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
CONTROLLER_MAIN = "org.apache.rocketmq.controller.ControllerStartup"
JAVA_BOOT_TIMEOUT_S = 90.0
DLEDGER_INDEX_BYTES = 32 * 5 * 1024 * 1024  # DLedgerConfig.mappedFileSizeForEntryIndex
# What every Java broker here is given: Java 17 needs these for RocketMQ 4.9's
# direct-buffer cleaning (MappedFile.clean), and writes are refused above these used
# ratios of the disk (RocketMQ's 0.90 and 0.85).
_BROKER_FLAGS = (
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "-Drocketmq.broker.diskSpaceWarningLevelRatio=0.99",
    "-Drocketmq.broker.diskSpaceCleanForciblyRatio=0.98",
)


@dataclass(frozen=True)
class JavaProfile:
    """How the Java processes are run: the brokers' and the name server's JVM flags, and
    broker.conf keys set beyond what the group's harness sets."""

    broker_flags: tuple[str, ...]
    namesrv_flags: tuple[str, ...]
    broker_conf: dict[str, str] = field(default_factory=dict)


_OPENS = tuple(flag for flag in JVM_FLAGS if flag.startswith("--add-opens"))
#: A test peer on a shared 2-core machine: the drivers' quick-start flags (a small heap,
#: C1 only, serial GC), no pre-touch, and few threads.
TEST_PROFILE = JavaProfile(
    broker_flags=(*JVM_FLAGS, "-XX:MaxDirectMemorySize=256m", *_BROKER_FLAGS),
    namesrv_flags=JVM_FLAGS,
    broker_conf={"sendMessageThreadPoolNums": "2", "pullMessageThreadPoolNums": "4"},
)
#: A benchmarked group, sized for 2 cores and 24 GiB shared by three brokers, a name
#: server and the load generator (reference java-peers.md §3: RocketMQ's runbroker.sh
#: gives a broker 8 GiB and pre-touches it, runserver.sh a name server 4 GiB, which
#: three brokers here cannot have): per broker a 1 GiB G1 heap and 1 GiB of direct
#: memory, the name server 256 MiB of each, both JIT tiers, no pre-touch, RocketMQ's
#: default thread pools; the rest of the memory is page cache.
BENCH_PROFILE = JavaProfile(
    broker_flags=(
        *_OPENS, "-Xms1g", "-Xmx1g", "-XX:MaxDirectMemorySize=1g", "-XX:+UseG1GC",
        *_BROKER_FLAGS,
    ),
    namesrv_flags=(
        *_OPENS, "-Xms256m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", "-XX:+UseG1GC"
    ),
)  # fmt: skip
#: The topic a SYNC_MASTER with only Java slaves is probed on until one acknowledges.
PROBE_TOPIC = "JavaSlaveProbe"


def _java_listen_port() -> int:
    """A port whose neighbours a Java broker also binds (-2 and +1) are free too."""
    while True:
        port = free_ports(1)[0]
        if all(_bindable(LOOPBACK, p) for p in (port - 2, port + 1)):
            return port


class JavaMembers(LocalCluster):
    """What a group with RocketMQ's Java broker among its members adds to raftmq's
    harness: each member in `java` runs BrokerStartup with a broker.conf written from
    raftmq's (`_java_conf`), listening where a Java broker can (its listenPort - 2 and
    + 1 free), and any member can be restarted as the other kind on its store."""

    def __init__(
        self,
        base_dir,
        java: set[str],
        profile: JavaProfile = TEST_PROFILE,
        flush_disk_type: str = "ASYNC_FLUSH",
        java_namesrv: bool = False,
        server_pom: Path = SERVER_POM,
        **kwargs,
    ) -> None:
        """`profile` runs the Java processes; `flush_disk_type` is the Java brokers'
        flushDiskType; `java_namesrv` runs RocketMQ's name server instead of raftmq's;
        `server_pom` names the release (bench/java/server: 4.9.7, server5: 5.3.3)."""
        super().__init__(base_dir, **kwargs)
        assert java <= set(self.ids), java
        assert flush_disk_type in ("ASYNC_FLUSH", "SYNC_FLUSH"), flush_disk_type
        assert not java_namesrv or self.own_namesrv, "a name server of its own"
        self.java = java
        self.profile = profile
        self.flush_disk_type = flush_disk_type
        self.java_namesrv = java_namesrv
        self.server_pom = server_pom
        for node in self.ids:  # every member's listenPort - 2 is free: a raftmq master's
            port = _java_listen_port()  # VIP channel, for its Java slaves' sync
            self.broker_addrs[node] = self.client_addrs[node] = f"{LOOPBACK}:{port}"

    def commitlog_dir(self, node: str):
        return self.store_dir(node) / "commitlog"

    def _write_confs(self) -> None:
        super()._write_confs()
        for node in self.java:
            self.conf_path(node).write_text(
                "".join(f"{k}={v}\n" for k, v in self._java_conf(node).items())
            )

    def _java_conf(self, node: str) -> dict[str, str]:
        """RocketMQ 4.9's broker.conf for `node`: its name and store as raftmq's members
        have theirs (the same segment size, so the files can match)."""
        ours = {**self._broker_conf(node), **self.extra_conf}
        host, port = parse_address(self.broker_addrs[node])
        conf = {
            key: ours[key]
            for key in ("brokerClusterName", "brokerName", "namesrvAddr", "storePathRootDir",
                        "mappedFileSizeCommitLog")
        }  # fmt: skip
        conf.update(
            listenPort=str(port),
            brokerIP1=host,
            brokerIP2=host,
            flushDiskType=self.flush_disk_type,
            deleteWhen="04",
            fileReservedTime="48",
            autoCreateTopicEnable="true",
            messageIndexEnable="false",
        )
        return {**conf, **self.profile.broker_conf}

    async def reboot_as(self, node: str, java: bool) -> None:
        """Stop `node` cleanly and start it again on the same store as RocketMQ's Java
        broker (`java`) or as raftmq's: the migration off Java brokers and back."""
        self.kill(node, signal.SIGTERM)
        (self.java.add if java else self.java.discard)(node)
        self._write_confs()
        self.start_broker(node)
        await self._booted(node)

    def start_broker(self, node: str) -> None:
        if node not in self.java:
            super().start_broker(node)
            return
        self._spawn_java(node, BROKER_MAIN, self.conf_path(node), self.profile.broker_flags)

    async def start_namesrv(self) -> None:
        """Raftmq's name server, or with `java_namesrv` RocketMQ's NamesrvStartup on the
        same conf (its listenPort; keys only raftmq's has, it ignores)."""
        if not self.java_namesrv:
            await super().start_namesrv()
            return
        self._write_confs()
        conf = self.base_dir / "namesrv.conf"
        self._spawn_java("namesrv", NAMESRV_MAIN, conf, self.profile.namesrv_flags)
        await self._booted("namesrv")

    def _spawn_java(self, name: str, main: str, conf, flags: tuple[str, ...]) -> None:
        """Start RocketMQ's `main` as process `name` on `conf`, logging beside raftmq's."""
        command = JavaTool(self.server_pom).command(
            main, "-c", str(conf),
            properties={"user.home": str(self.base_dir / name)},  # its ~/logs
            jvm_flags=flags,
        )  # fmt: skip
        log = open(self.base_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self._log_starts[name] = log.tell()
        self.procs[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def _is_java(self, name: str) -> bool:
        return name in self.java or (name == "namesrv" and self.java_namesrv)

    async def _booted(self, name: str, timeout_s: float = JAVA_BOOT_TIMEOUT_S) -> None:
        """A JVM takes its time to start, the more so three at once on two cores."""
        await super()._booted(name, timeout_s if self._is_java(name) else BOOT_TIMEOUT_S)

    async def wait_caught_up(self, timeout_s: float = 60.0) -> None:
        """Until every running member's CommitLog ends at the same offset and each has
        dispatched it (the fields Java's broker and raftmq's both report)."""
        if not self.java:
            await super().wait_caught_up(timeout_s)
            return
        await self._same_commitlog_end(timeout_s)

    async def _same_commitlog_end(self, timeout_s: float) -> None:
        with trio.fail_after(timeout_s):
            while True:
                states = [await self.member_state(n) for n in self.ids if n in self.procs]
                if len({s["commitLogMaxOffset"] for s in states}) == 1 and all(
                    s.get("dispatchBehindBytes", "0") == "0" for s in states
                ):
                    return
                await trio.sleep(0.05)

    async def topics(self, node: str) -> set[str]:
        """The topics `node` has (GET_ALL_TOPIC_CONFIG, Java's broker or ours)."""
        response = await self.broker_call(node, RequestCode.GET_ALL_TOPIC_CONFIG)
        return set(_lenient_json(response.body)["topicConfigTable"])

    async def member_state(self, node: str) -> dict:
        """The runtime table; a Java broker answers SYSTEM_ERROR for its first seconds
        (its stats have no sample yet: NoSuchElementException), so it is asked again."""
        if node not in self.java:
            return await super().member_state(node)
        with trio.fail_after(30):
            while True:
                response = await self.broker_call(node, RequestCode.GET_BROKER_RUNTIME_INFO)
                if response.code == ResponseCode.SUCCESS:
                    return _lenient_json(response.body)["table"]
                await trio.sleep(0.5)


class MixedClassicGroup(JavaMembers, LocalClassicGroup):
    """A classic group whose members in `java` are RocketMQ's Java broker."""

    def __init__(self, base_dir, java: set[str], **kwargs) -> None:
        super().__init__(base_dir, java, **kwargs)
        for node in java:
            self.ha_addrs[node] = f"{LOOPBACK}:{parse_address(self.broker_addrs[node])[1] + 1}"

    def _broker_conf(self, node: str) -> dict[str, str]:
        """A raftmq master with Java slaves serves RocketMQ's VIP channel (listenPort - 2),
        where a Java slave syncs topics and consumer offsets from its master."""
        conf = super()._broker_conf(node)
        if node == self.ids[0] and node not in self.java and self.java:
            conf["fastListenPort"] = str(parse_address(self.broker_addrs[node])[1] - 2)
        return conf

    def _java_conf(self, node: str) -> dict[str, str]:
        """Its role as raftmq's members have theirs; a slave learns the master's HA
        address from the name server, as raftmq's do. A slave's heartbeat comes within
        the master's housekeeping interval."""
        ours = {**self._broker_conf(node), **self.extra_conf}
        keys = ("brokerId", "brokerRole", "haSendHeartbeatInterval", "haHousekeepingInterval")
        return {
            **super()._java_conf(node),
            **{key: ours[key] for key in keys},
            "storePathCommitLog": str(self.commitlog_dir(node)),
        }

    async def wait_slaves(self, count: int, timeout_s: float = 30.0) -> None:
        """Until `count` slaves replicate from the master. A Java master does not report
        its HA connections, so with one its raftmq slaves are asked whom they follow;
        with Java slaves only, a SYNC_MASTER is sent to until it acknowledges (it answers
        SLAVE_NOT_AVAILABLE until a slave has reported its offset)."""
        if self.ids[0] not in self.java:
            await super().wait_slaves(count, timeout_s)
            return
        ours = [n for n in self.ids[1:] if n not in self.java]
        if not ours and count:
            assert count == 1 and self.master_role == "SYNC_MASTER", "cannot be asked"
            await self._acknowledged(timeout_s)
            return
        assert len(ours) >= count, "a Java master's Java slaves cannot be asked"
        with trio.fail_after(timeout_s):
            while sum([bool((await self.member_state(n)).get("masterAddr")) for n in ours]) < count:
                await trio.sleep(0.1)

    async def _acknowledged(self, timeout_s: float) -> None:
        """Until a send to the master of PROBE_TOPIC (created from TBW102 on the way,
        autoCreateTopicEnable) is acknowledged."""
        header = send_header_v2("PROBE_PG", PROBE_TOPIC, 0, born_timestamp_ms=0)
        async with RemotingClient(self.broker_addrs[self.ids[0]]) as client:
            with trio.fail_after(timeout_s):
                while True:
                    request = RemotingCommand(
                        code=RequestCode.SEND_MESSAGE_V2, ext_fields=header, body=b"probe"
                    )
                    if (await client.invoke(request, 5.0)).code == ResponseCode.SUCCESS:
                        return
                    await trio.sleep(0.2)


class MixedDLedgerGroup(JavaMembers, LocalCluster):
    """A DLedger group (RocketMQ's DLedger mode, `enableDLegerCommitLog`) whose members
    in `java` are RocketMQ's Java broker, with the same dLegerGroup, dLegerPeers and
    data segment size (mappedFileSizeCommitLog). RocketMQ 4.9 fixes DLedger's index
    segments at 160 MiB (DLedgerConfig's default; the broker does not pass one on), so
    raftmq's members here have theirs that size too: a store is either's."""

    def _broker_conf(self, node: str) -> dict[str, str]:
        return {
            **super()._broker_conf(node),
            "mappedFileSizeForEntryIndex": str(DLEDGER_INDEX_BYTES),
        }

    def _java_conf(self, node: str) -> dict[str, str]:
        ours = self._broker_conf(node)
        keys = ("enableDLegerCommitLog", "dLegerGroup", "dLegerPeers", "dLegerSelfId")
        return {**super()._java_conf(node), **{key: ours[key] for key in keys}}


class MixedControllerGroup(JavaMembers, LocalControllerGroup):
    """A controller-mode group (raftmq's controllers, `LocalControllerGroup`) whose
    members in `java` are RocketMQ 5.3's Java broker (bench/java/server5), started from
    the same quick-start keys (brokerId=-1, brokerRole=SLAVE, allAckInSyncStateSet): they
    take their ids and roles from raftmq's controllers and replicate with raftmq's
    brokers over RocketMQ 5's AutoSwitch HA protocol."""

    def __init__(self, base_dir, java: set[str], java_controllers: bool = False, **kwargs) -> None:
        """`java_controllers`: the three controllers are RocketMQ 5.3's ControllerStartup
        on the same controller.conf, instead of raftmq's."""
        kwargs.setdefault("server_pom", SERVER5_POM)
        super().__init__(base_dir, java, **kwargs)
        self.java_controllers = java_controllers
        for node in java:  # RocketMQ 5 honours haListenPort; its default is listenPort + 1
            self.ha_addrs[node] = f"{LOOPBACK}:{parse_address(self.broker_addrs[node])[1] + 1}"

    async def wait_caught_up(self, timeout_s: float = 60.0) -> None:
        """Until every running member's CommitLog ends at the same offset and each has
        dispatched it, whichever kinds they are."""
        await self._same_commitlog_end(timeout_s)

    def start_controller(self, name: str, join: bool = False) -> None:
        if not self.java_controllers:
            super().start_controller(name, join)
            return
        conf = self.controller_conf(name, join)
        self._spawn_java(name, CONTROLLER_MAIN, conf, self.profile.namesrv_flags)

    def _is_java(self, name: str) -> bool:
        return super()._is_java(name) or (name in self.CONTROLLERS and self.java_controllers)

    def _java_conf(self, node: str) -> dict[str, str]:
        ours = {**self._broker_conf(node), **self.extra_conf}
        keys = (
            "brokerId", "brokerRole", "enableControllerMode", "controllerAddr",
            "allAckInSyncStateSet", "haListenPort", "haSendHeartbeatInterval",
            "haHousekeepingInterval",
        )  # fmt: skip
        return {
            **super()._java_conf(node),
            **{key: ours[key] for key in keys},
            "storePathCommitLog": str(self.commitlog_dir(node)),
            **self.extra_conf,  # RocketMQ's keys, which both kinds read
        }

    async def sync_state(self) -> dict:
        """The controllers' view of the group (CONTROLLER_GET_SYNC_STATE_DATA at their
        leader): masterAddress, masterEpoch, inSyncReplicas... A Java broker does not
        report its SyncStateSet the way raftmq's does (`syncStateSet` in its runtime
        table), so the group is watched from the controllers."""
        controller = next(iter(self.controller_addrs.values()))
        async with Admin([self.namesrv_addr]) as admin:
            return (await sync_state_data(admin, controller, [self.broker_name]))[self.broker_name]

    async def wait_in_sync(self, count: int, timeout_s: float = 60.0) -> str:
        """The master, once the controllers list `count` members in its SyncStateSet
        and it serves as master (brokerId 0 at the name server)."""
        by_address = {a: n for n, a in self.broker_addrs.items()}
        with trio.fail_after(timeout_s):
            while True:
                with contextlib.suppress(OSError, RemotingError, MQClientError, KeyError):
                    state = await self.sync_state()
                    master = by_address.get(state.get("masterAddress"))
                    if (
                        master in self.procs
                        and len(state["inSyncReplicas"]) == count
                        and await self.master_address() == self.broker_addrs[master]
                    ):
                        return master
                await trio.sleep(0.1)


PROXY_MAIN = "org.apache.rocketmq.proxy.ProxyStartup"
#: A proxy in cluster mode holds no messages: RocketMQ's runserver.sh gives it 4 GiB,
#: reference java-peers.md §3 sizes it at 512 MiB on this machine.
PROXY_FLAGS = (*_OPENS, "-Xms512m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseG1GC")


async def start_java_proxy(cluster: LocalCluster, name: str = "java-proxy") -> str:
    """Start Apache RocketMQ 5.3.3's own proxy (ProxyStartup, cluster mode) in front of
    `cluster`'s name server, as process `name` of the cluster (stopped with it); returns
    its gRPC endpoint once it serves. Its remoting port is a free one too."""
    grpc_port, remoting_port = free_ports(2, {LOOPBACK})
    conf = cluster.proxy_conf(
        name, grpc_port, proxyMode="cluster", remotingListenPort=remoting_port
    )
    command = JavaTool(SERVER5_POM).command(
        PROXY_MAIN, "-pc", str(conf), "-pm", "cluster",
        properties={"user.home": str(cluster.base_dir / name)},  # its ~/logs
        jvm_flags=PROXY_FLAGS,
    )  # fmt: skip
    path = cluster.base_dir / f"{name}.log"
    with path.open("ab") as log:
        cluster.procs[name] = proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    with trio.fail_after(JAVA_BOOT_TIMEOUT_S):
        while b"startup successfully" not in path.read_bytes():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited at start:\n{path.read_text()[-2000:]}")
            await trio.sleep(0.1)
    return f"{LOOPBACK}:{grpc_port}"
