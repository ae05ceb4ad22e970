"""A name server and a DLedger broker group (or a classic master/slave group) as real
processes on loopback addresses.

RocketMQ's `fast-try` for this project: the main demo, the process tests, the
benchmarks and the fault-injection runs all start the same thing, kill -9 and
restart members, ask the name server who the master is, and stop everything on
the way out, even when the caller fails. Everything is on 127.0.0.1 unless the
caller gives each node an address of its own (the fault-injection harness does).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from raftmq.config.address import parse_address
from raftmq.config.properties import parse_properties
from raftmq.process.signals import InterruptOnStopSignals
from raftmq.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingError,
    RequestCode,
    ResponseCode,
)
from raftmq.remoting.signing import SessionCredentials
from raftmq.tools.dledger_local import free_ports, stop_process, stop_processes
from raftmq.transport.tls import ClientTls

LOOPBACK = "127.0.0.1"
GROUP_HOST = "127.0.0.2"  # a group address's host (any 127.x.y.z is bindable)
LOCAL_SEGMENT_BYTES = (
    64 << 20
)  # DLedger's 1 GiB segments are preallocated; see raftmq.tools.dledger_local
BOOT_TIMEOUT_S = 20.0
STARTS_TIMEOUT_S = 60.0  # seven Python processes starting at once on a loaded machine


def _lenient_json(body: bytes):
    """fastjson's unquoted integer map keys (a Java name server) made standard."""
    return json.loads(re.sub(rb"([{,])(-?\d+):", rb'\1"\2":', body))


def _addresses(ids: list[str], hosts: list[str], ports: list[int]) -> dict[str, str]:
    return {node: f"{host}:{port}" for node, host, port in zip(ids, hosts, ports, strict=True)}


class LocalCluster:
    """`async with LocalCluster(tmp, nodes=3) as cluster:` — all processes die on exit."""

    def __init__(
        self,
        base_dir: str | Path,
        nodes: int = 3,
        broker_name: str = "RaftNode00",
        cluster_name: str = "RaftCluster",
        extra_conf: dict[str, str] | None = None,
        hosts: Sequence[str] | None = None,
        advertised: Sequence[str] | None = None,
        namesrv_addr: str | None = None,
        credentials: SessionCredentials | None = None,
        metrics: bool = False,
        group_address: bool = False,
    ) -> None:
        """`hosts[i]` is the address node i's broker and DLedger replica listen on
        (127.0.0.1 for all by default); `advertised[i]` the one its broker registers with
        the name server (brokerIP1), which clients dial: its own by default. An
        advertised address of its own needs something, a proxy, listening there.
        `namesrv_addr` joins a name server someone else runs (another group's, so that
        several groups form one cluster) instead of starting one. Each node's
        rocketmqHome is its directory (its ACL file: `<node>/conf/plain_acl.yml`);
        `credentials` sign the harness's own calls to brokers with `aclEnable`. `metrics`
        gives every process a `metricsPort` of its own: `metrics_addrs[name]` ("namesrv",
        "n0", ...). `group_address` gives the group a `groupAddress` on GROUP_HOST, which
        the master listens on and registers (`group_addr`)."""
        self.base_dir = Path(base_dir)
        self.broker_name = broker_name
        self.cluster_name = cluster_name
        self.ids = [f"n{i}" for i in range(nodes)]
        hosts = list(hosts or [LOOPBACK] * nodes)
        advertised = list(advertised or hosts)
        ports = free_ports(
            (2 if metrics else 1) * (1 + nodes) + nodes + (1 if group_address else 0),
            {LOOPBACK, *hosts, *advertised, *([GROUP_HOST] if group_address else [])},
        )
        self.group_addr = f"{GROUP_HOST}:{ports.pop()}" if group_address else None
        self.namesrv_port = ports[0]
        self.own_namesrv = namesrv_addr is None
        self.namesrv_addr = namesrv_addr or f"{LOOPBACK}:{ports[0]}"
        broker_ports = ports[1 : 1 + nodes]
        # Where each broker listens: the harness's own calls go here directly.
        self.broker_addrs = _addresses(self.ids, hosts, broker_ports)
        # What each broker registers, and what producers and consumers dial.
        self.client_addrs = _addresses(self.ids, advertised, broker_ports)
        self.peer_addrs = _addresses(self.ids, hosts, ports[1 + nodes : 1 + 2 * nodes])
        metrics_ports = ports[1 + 2 * nodes :]
        self.metrics_addrs = (
            _addresses(["namesrv", *self.ids], [LOOPBACK, *hosts], metrics_ports) if metrics else {}
        )
        self.extra_conf = dict(extra_conf or {})
        self.credentials = credentials
        self.broker_tls: ClientTls | None = None  # how the harness reaches the brokers
        self.procs: dict[str, subprocess.Popen] = {}
        self._log_starts: dict[str, int] = {}  # name -> where its log's current run starts

    # ------------------------------------------------------------------ files
    def conf_path(self, node: str) -> Path:
        return self.base_dir / f"broker-{node}.conf"

    def store_dir(self, node: str) -> Path:
        return self.base_dir / node

    def dledger_peers(self, node: str) -> str:
        """`node`'s dLegerPeers: how it reaches each member (a harness may put proxies here)."""
        return ";".join(f"{peer}-{address}" for peer, address in self.peer_addrs.items())

    def _write_confs(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "namesrv.conf").write_text(
            f"listenPort={self.namesrv_port}\nbrokerChannelExpiredTime=10000\n"
            "scanNotActiveBrokerInterval=1000\n"
            + (f"metricsPort={self._metrics_port('namesrv')}\n" if self.metrics_addrs else "")
        )
        for node in self.ids:
            self._write_broker_conf(node)

    def _write_broker_conf(self, node: str, **more: str) -> None:
        conf = {**self._broker_conf(node), **self.extra_conf, **more}
        self.conf_path(node).write_text("".join(f"{k}={v}\n" for k, v in conf.items()))

    def _common_conf(self, node: str) -> dict[str, str]:
        """What every broker here is given, DLedger or classic."""
        bind_host, listen_port = parse_address(self.broker_addrs[node])
        return {
            "brokerClusterName": self.cluster_name,
            "brokerName": self.broker_name,
            "listenPort": str(listen_port),
            "bindAddress": bind_host,
            "brokerIP1": parse_address(self.client_addrs[node])[0],
            "namesrvAddr": self.namesrv_addr,
            "storePathRootDir": str(self.store_dir(node)),
            "rocketmqHome": str(self.store_dir(node)),
            "mappedFileSizeCommitLog": str(LOCAL_SEGMENT_BYTES),
            # the name server here expires a broker after 10 s of silence (not 120 s),
            # so brokers re-register every 3 s (not 30 s)
            "registerNameServerPeriod": "3000",
            **({"groupAddress": self.group_addr} if self.group_addr else {}),
            **({"metricsPort": str(self._metrics_port(node))} if self.metrics_addrs else {}),
        }

    def _broker_conf(self, node: str) -> dict[str, str]:
        return {
            **self._common_conf(node),
            "enableDLegerCommitLog": "true",
            "dLegerGroup": self.broker_name,
            "dLegerPeers": self.dledger_peers(node),
            "dLegerSelfId": node,
            "mappedFileSizeForEntryIndex": str(32 << 20),
        }

    def _metrics_port(self, name: str) -> int:
        return parse_address(self.metrics_addrs[name])[1]

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.base_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        # Where this run's lines start: a store reused (--dir, a restart) has the
        # earlier runs' "boot success" lines above it.
        self._log_starts[name] = log.tell()
        proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[name] = proc
        return proc

    def start_broker(self, node: str) -> None:
        self._spawn(node, ["-m", "raftmq.broker.cli", "-c", str(self.conf_path(node))])

    async def _booted(self, name: str, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        """Wait until process `name`, spawned last, says "boot success" in its log."""
        path = self.base_dir / f"{name}.log"
        with trio.fail_after(timeout_s):
            with path.open("rb") as log:
                log.seek(self._log_starts[name])
                printed = b""
                while b"boot success" not in (printed := printed + log.read()):
                    proc = self.procs.get(name)
                    if proc is None or proc.poll() is not None:
                        raise RuntimeError(f"{name} exited at start:\n{path.read_text()[-2000:]}")
                    await trio.sleep(0.02)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        stop_process(self.procs.pop(name, None), sig)

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    async def join(self, node: str) -> str:
        """Start a new DLedger member `node` on 127.0.0.1 as a learner of the group
        (`joinAsLearner`; `mqadmin addDLedgerPeer` adds it); its `id-host:port`."""
        broker_port, peer_port = free_ports(2, {LOOPBACK})
        self.ids.append(node)
        self.broker_addrs[node] = self.client_addrs[node] = f"{LOOPBACK}:{broker_port}"
        self.peer_addrs[node] = f"{LOOPBACK}:{peer_port}"
        self._write_broker_conf(node, joinAsLearner="true")
        self.start_broker(node)
        await self._booted(node)
        return f"{node}-{self.peer_addrs[node]}"

    async def restart(self, node: str) -> None:
        self.kill(node)
        self.start_broker(node)
        await self._booted(node)

    def proxy_conf(self, name: str, grpc_port: int, **extra: object) -> Path:
        """An rmq-proxy.json for an mqproxy named `name` in front of this cluster's name
        server, serving gRPC on 127.0.0.1:`grpc_port`; `extra` adds RocketMQ's proxy keys."""
        conf = {
            "rocketMQClusterName": self.cluster_name,
            "namesrvAddr": self.namesrv_addr,
            "grpcServerPort": grpc_port,
            "grpcServerHost": "127.0.0.1",
            **extra,
        }
        path = self.base_dir / f"{name}.json"
        path.write_text(json.dumps(conf))
        return path

    async def start_proxy(self, name: str = "proxy") -> str:
        """Start an mqproxy process `name` (stopped with the cluster, `pid(name)` gives
        it); returns its gRPC endpoint once it serves."""
        (port,) = free_ports(1, {"127.0.0.1"})
        self._spawn(name, ["-m", "raftmq.proxy.cli", "-pc", str(self.proxy_conf(name, port))])
        await self._booted(name)
        return f"127.0.0.1:{port}"

    async def start_namesrv(self) -> None:
        """Write every config file and start the name server (unless it is someone
        else's): the first step of `async with`, for a caller that then starts the
        brokers itself, in an order of its own, with `boot`."""
        self._write_confs()
        if self.own_namesrv:
            namesrv_conf = str(self.base_dir / "namesrv.conf")
            self._spawn("namesrv", ["-m", "raftmq.namesrv.cli", "-c", namesrv_conf])
            await self._booted("namesrv")

    async def boot(self, *nodes: str) -> None:
        """Start `nodes` at once; return when each accepts connections."""
        for node in nodes:
            self.start_broker(node)
        for node in nodes:
            await self._booted(node)

    async def __aenter__(self) -> LocalCluster:
        try:
            await self.start_namesrv()
            await self.boot(*self.ids)
            await self.wait_master()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM to every process of the cluster at once; returns when all are gone."""
        stop_processes([self.procs.pop(name) for name in list(self.procs)], signal.SIGTERM)

    # ------------------------------------------------------------------ asking
    async def namesrv_call(self, code: int, ext: dict | None = None, body: bytes = b""):
        async with RemotingClient(self.namesrv_addr) as client:
            return await client.invoke(
                RemotingCommand(code=code, ext_fields=ext or {}, body=body), 3.0
            )

    async def broker_addresses(self) -> dict[str, str]:
        """The group's brokerAddrs as the name server routes them: brokerId -> address."""
        response = await self.namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)
        if response.code != ResponseCode.SUCCESS:
            return {}
        table = _lenient_json(response.body).get("brokerAddrTable", {})
        return table.get(self.broker_name, {}).get("brokerAddrs", {})

    async def master_address(self) -> str | None:
        return (await self.broker_addresses()).get("0")

    async def wait_master(self, timeout_s: float = 15.0, not_node: str | None = None) -> str:
        """The member registered as brokerId 0 (optionally other than `not_node`). Under
        a group address, the one that says it is brokerId 0 (`not_node`, perhaps
        stopped, is not asked)."""
        by_address = {a: n for n, a in self.client_addrs.items()}
        with trio.fail_after(timeout_s):
            while True:
                address = await self.master_address()
                if address is not None and address == self.group_addr:
                    node = await self._member_with_id_0(not_node)
                else:
                    node = by_address.get(address)
                if node is not None and node != not_node and node in self.procs:
                    return node
                await trio.sleep(0.02)

    async def _member_with_id_0(self, not_node: str | None) -> str | None:
        for node in self.ids:
            if node != not_node and node in self.procs:
                with contextlib.suppress(OSError, RemotingError):
                    if (await self.member_state(node))["brokerId"] == "0":
                        return node
        return None

    async def broker_call(self, node: str, code: int, ext: dict | None = None, body=b""):
        address = self.broker_addrs[node]
        async with RemotingClient(
            address, credentials=self.credentials, tls=self.broker_tls
        ) as client:
            return await client.invoke(
                RemotingCommand(code=code, ext_fields=ext or {}, body=body), 5.0
            )

    async def member_state(self, node: str) -> dict:
        """The member's runtime table (GET_BROKER_RUNTIME_INFO), DLedger fields included."""
        response = await self.broker_call(node, RequestCode.GET_BROKER_RUNTIME_INFO)
        return json.loads(response.body)["table"]

    async def wait_caught_up(self, timeout_s: float = 60.0) -> None:
        """Until every running member has committed and dispatched the same log end.

        A member restarted under load replays what it missed; killing the master
        before it has caught up leaves a quorum whose new leader cannot commit
        until it has. A member still starting (its broker port not yet open) counts as
        not caught up."""
        with trio.fail_after(timeout_s):
            while True:
                try:
                    states = [await self.member_state(n) for n in self.ids if n in self.procs]
                except (OSError, RemotingError):
                    await trio.sleep(0.05)
                    continue
                ends = {s["dLegerLedgerEndIndex"] for s in states}
                committed = {s["dLegerCommittedIndex"] for s in states}
                if (
                    len(ends) == 1
                    and committed == ends
                    and all(s["dispatchBehindEntries"] == "0" for s in states)
                ):
                    return
                await trio.sleep(0.05)

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        """Create `topic` on the master and wait until the name server routes it."""
        await self.create_topics([topic], queues)

    async def create_topics(self, topics: Sequence[str], queues: int = 4) -> None:
        """Create `topics` on the master, up to 32 requests in flight on one connection
        (each is a replicated metadata record), and wait until the name server routes
        the last (a registration carries every topic)."""
        master = await self.wait_master()
        limiter = trio.CapacityLimiter(32)
        refused: list[str] = []

        async def create(client: RemotingClient, topic: str) -> None:
            ext = {  # every field a Java broker requires (CreateTopicRequestHeader)
                "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
                "writeQueueNums": queues, "perm": 6, "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": 0, "order": "false",
            }  # fmt: skip
            async with limiter:
                request = RemotingCommand(code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=ext)
                response = await client.invoke(request, 10.0)
            if response.code != ResponseCode.SUCCESS:
                refused.append(f"create topic {topic}: {response.code} {response.remark}")

        address = self.broker_addrs[master]
        client = RemotingClient(address, credentials=self.credentials)
        async with client, trio.open_nursery() as nursery:
            for topic in topics:
                nursery.start_soon(create, client, topic)
        if refused:  # one error naming the first refusal, as a single create raises it
            raise RuntimeError(f"{refused[0]} ({len(refused)} of {len(topics)} refused)")
        with trio.fail_after(10):
            while (
                await self.namesrv_call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topics[-1]})
            ).code != ResponseCode.SUCCESS:
                await trio.sleep(0.02)


class LocalClassicGroup(LocalCluster):
    """`async with LocalClassicGroup(tmp, slaves=1) as group:` — a classic master/slave
    group (enableDLegerCommitLog=false): node n0 is the master (brokerId 0,
    `master_role`), n1.. its slaves (brokerId 1..), each with its HA port; slaves learn
    the master's HA address from the name server."""

    def __init__(self, base_dir, slaves: int = 1, master_role="ASYNC_MASTER", **kwargs) -> None:
        """`kwargs` as LocalCluster's (brokerName broker-a, cluster DefaultCluster here)."""
        assert master_role in ("ASYNC_MASTER", "SYNC_MASTER"), master_role
        kwargs.setdefault("broker_name", "broker-a")
        kwargs.setdefault("cluster_name", "DefaultCluster")
        super().__init__(base_dir, 1 + slaves, **kwargs)
        self.master_role = master_role
        # the ports LocalCluster keeps for DLedger peers serve HA here
        self.ha_addrs = self.peer_addrs

    def _broker_conf(self, node: str) -> dict[str, str]:
        broker_id = self.ids.index(node)
        return {
            **self._common_conf(node),
            # the HA address slaves dial is the real one even when clients are given
            # another (a proxy's)
            "brokerIP2": parse_address(self.broker_addrs[node])[0],
            "brokerId": str(broker_id),
            "brokerRole": "SLAVE" if broker_id else self.master_role,
            "haListenPort": str(parse_address(self.ha_addrs[node])[1]),
            "haSendHeartbeatInterval": "1000",
            "haHousekeepingInterval": "4000",
        }

    async def __aenter__(self) -> LocalClassicGroup:
        """Started, and every slave connected to the master's HA port (a slave learns
        the address at its first registration after the master's)."""
        await super().__aenter__()
        try:
            await self.wait_slaves(len(self.ids) - 1)
        except BaseException:
            self.stop()
            raise
        return self

    async def wait_slaves(self, count: int, timeout_s: float = 20.0) -> None:
        """Until the master has `count` HA connections."""
        with trio.fail_after(timeout_s):
            while (await self.member_state(self.ids[0]))["haConnections"] != str(count):
                await trio.sleep(0.05)

    async def wait_replicated(self, timeout_s: float = 30.0) -> None:
        """Until every running slave holds the master's CommitLog bytes and every
        broker has dispatched what it holds."""
        with trio.fail_after(timeout_s):
            while True:
                states = [await self.member_state(n) for n in self.ids if n in self.procs]
                if len({s["commitLogWriteOffset"] for s in states}) == 1 and all(
                    s["dispatchBehindEntries"] == "0" for s in states
                ):
                    return
                await trio.sleep(0.05)

    @classmethod
    def stopped_in(cls, base_dir: str | Path) -> LocalClassicGroup:
        """The classic group an earlier run left in `base_dir` (stopped), with the
        names and addresses its config files give."""
        base = Path(base_dir)
        confs = sorted(base.glob("broker-n*.conf"))
        if not confs and (base / "g0").is_dir():  # `--classic --dir`: group i in g<i>
            if (base / "g1").exists():
                raise ValueError(f"{base} holds several groups: name one, {base / 'g0'}")
            return cls.stopped_in(base / "g0")
        if not confs:
            raise ValueError(f"{base} holds no broker-n*.conf of a classic group")
        read = [parse_properties(path.read_text(), str(path)) for path in confs]
        group = cls(
            base,
            slaves=len(confs) - 1,
            broker_name=read[0]["brokerName"],
            cluster_name=read[0]["brokerClusterName"],
        )
        namesrv_port = int(parse_properties((base / "namesrv.conf").read_text())["listenPort"])
        group.namesrv_port, group.namesrv_addr = namesrv_port, f"{LOOPBACK}:{namesrv_port}"
        for node, conf in zip(group.ids, read, strict=True):
            host = conf["bindAddress"]
            group.broker_addrs[node] = f"{host}:{conf['listenPort']}"
            group.client_addrs[node] = f"{conf['brokerIP1']}:{conf['listenPort']}"
            group.ha_addrs[node] = f"{host}:{conf['haListenPort']}"
        return group

    def upgraded(
        self, nodes: int = 3, cluster_class: type[LocalCluster] = LocalCluster
    ) -> LocalCluster:
        """The DLedger group this stopped group becomes in place, as RocketMQ's upgrade
        guide has it: the same brokerName and stores, configs switched to DLedger
        (written when the returned cluster starts), each node keeping its addresses
        and serving DLedger on its former HA port. Members beyond this group's get
        a copy of the master's store (its commitlog and config files) first, and
        addresses of their own. The classic processes' logs are kept as
        `<name>.classic.log`. The cluster is a `cluster_class`: a harness may
        give its own LocalCluster, which must take LocalCluster's arguments."""
        assert not self.procs, "stop the group first"
        cluster = cluster_class(
            self.base_dir,
            nodes,
            broker_name=self.broker_name,
            cluster_name=self.cluster_name,
            extra_conf=self.extra_conf,
        )
        cluster.namesrv_port, cluster.namesrv_addr = self.namesrv_port, self.namesrv_addr
        for node in self.ids[:nodes]:
            cluster.broker_addrs[node] = self.broker_addrs[node]
            cluster.client_addrs[node] = self.client_addrs[node]
            cluster.peer_addrs[node] = self.ha_addrs[node]
        for name in ("namesrv", *self.ids):  # the new processes log afresh
            log = self.base_dir / f"{name}.log"
            if log.exists():
                log.rename(log.with_suffix(".classic.log"))
        master = self.store_dir(self.ids[0])
        for node in cluster.ids[len(self.ids) :]:
            shutil.copytree(master, cluster.store_dir(node), ignore=shutil.ignore_patterns("lock"))
        return cluster


class LocalControllerGroup(LocalClassicGroup):
    """`async with LocalControllerGroup(tmp, replicas=2) as group:` — a controller-mode
    group (enableControllerMode=true): three standalone controllers (`c0`..`c2`) and
    `replicas` brokers started from RocketMQ's quick-start settings (brokerId=-1,
    brokerRole=SLAVE, allAckInSyncStateSet=true), which take their ids and roles from
    the controllers; returns once one is master with every other in its SyncStateSet."""

    CONTROLLERS = ("c0", "c1", "c2")

    def __init__(
        self, base_dir, replicas: int = 2, controller_addrs: dict | None = None, **kwargs
    ) -> None:
        """`controller_addrs`: another group's controllers (already running) instead of
        three of its own."""
        super().__init__(base_dir, slaves=replicas - 1, **kwargs)
        self.own_controllers = controller_addrs is None
        if controller_addrs is None:
            ports = free_ports(len(self.CONTROLLERS), {LOOPBACK})
            controller_addrs = {
                c: f"{LOOPBACK}:{p}" for c, p in zip(self.CONTROLLERS, ports, strict=True)
            }
        self.controller_addrs = controller_addrs
        if self.metrics_addrs and self.own_controllers:
            ports = free_ports(len(self.CONTROLLERS), {LOOPBACK})
            self.metrics_addrs |= {
                c: f"{LOOPBACK}:{p}" for c, p in zip(self.CONTROLLERS, ports, strict=True)
            }

    def _broker_conf(self, node: str) -> dict[str, str]:
        conf = super()._broker_conf(node)
        return {
            **conf,
            "brokerId": "-1",
            "brokerRole": "SLAVE",
            "enableControllerMode": "true",
            "controllerAddr": self.controller_addr(node),
            "allAckInSyncStateSet": "true",
        }

    def controller_addr(self, node: str) -> str:
        """Broker `node`'s controllerAddr: how it reaches each controller (a harness may
        put proxies here)."""
        return ";".join(self.controller_addrs.values())

    def controller_peers(self, name: str) -> str:
        """Controller `name`'s controllerDLegerPeers: how it reaches each controller (a
        harness may put proxies here)."""
        return ";".join(f"{c}-{a}" for c, a in self.controller_addrs.items())

    def controller_conf(self, name: str, join: bool = False) -> Path:
        """`join`: a controller added to the running group (joinAsLearner)."""
        path = self.base_dir / f"controller-{name}.conf"
        peers = self.controller_peers(name)
        path.write_text(
            f"controllerDLegerGroup=group1\ncontrollerDLegerPeers={peers}\n"
            f"controllerDLegerSelfId={name}\ncontrollerStorePath={self.base_dir / name}\n"
            # a silent broker is found within a second of its timeout (not 5 s)
            "scanNotActiveBrokerInterval=1000\n"
            + ("joinAsLearner=true\n" if join else "")
            + (
                f"metricsPromExporterPort={self._metrics_port(name)}\n"
                if name in self.metrics_addrs
                else ""
            )
        )
        return path

    def start_controller(self, name: str, join: bool = False) -> None:
        conf = self.controller_conf(name, join)
        self._spawn(name, ["-m", "raftmq.controller.cli", "-c", str(conf)])

    async def join_controller(self, name: str) -> str:
        """Start controller `name` on a new port as a learner of the controllers' group
        (`dledger addPeer` adds it); its `id-host:port`. Brokers are not told."""
        (port,) = free_ports(1, {LOOPBACK})
        self.controller_addrs[name] = f"{LOOPBACK}:{port}"
        self.start_controller(name, join=True)
        await self._booted(name, STARTS_TIMEOUT_S)
        return f"{name}-{self.controller_addrs[name]}"

    async def start_controllers(self, *names: str) -> None:
        """Start controllers `names` at once; return when each listens."""
        for name in names:
            self.start_controller(name)
        for name in names:
            await self._booted(name, STARTS_TIMEOUT_S)

    async def restart(self, name: str) -> None:
        """Restart broker or controller `name` (killed first if it runs)."""
        if name not in self.CONTROLLERS:
            await super().restart(name)
            return
        self.kill(name)
        await self.start_controllers(name)

    async def __aenter__(self) -> LocalControllerGroup:
        try:
            await self.start_namesrv()
            await self.start_controllers(*(self.CONTROLLERS if self.own_controllers else ()))
            for node in self.ids:
                self.start_broker(node)
            for node in self.ids:
                await self._booted(node, STARTS_TIMEOUT_S)
            await self.wait_in_sync(len(self.ids))
        except BaseException:
            self.stop()
            raise
        return self

    async def wait_in_sync(self, count: int, timeout_s: float = 30.0) -> str:
        """The master, once its SyncStateSet has `count` members."""
        with trio.fail_after(timeout_s):
            while True:
                master = await self.wait_master(timeout_s)
                with contextlib.suppress(OSError, RemotingError, KeyError):
                    members = (await self.member_state(master))["syncStateSet"]
                    if len(members.split(",")) == count:
                        return master
                await trio.sleep(0.05)


class LocalGroups:
    """`async with LocalGroups(tmp, groups=2) as groups:` — several groups, one cluster,
    one name server (the first group's): what `updateTopic -c` spreads a topic over and
    what a producer fails over between. `groups.groups[i]` is group i: a DLedger
    LocalCluster of `nodes` brokers, brokerName RaftNode0i; or, with `master_role`, a
    LocalClassicGroup (a master and `nodes - 1` slaves), brokerName broker-a, broker-b...
    as in RocketMQ's 2m-2s sample configs."""

    def __init__(
        self,
        base_dir: str | Path,
        groups: int = 2,
        nodes: int = 3,
        master_role: str | None = None,
        controller: bool = False,
        **kwargs,
    ) -> None:
        """`controller`: controller-mode groups of `nodes` brokers each (brokerName
        broker-a, broker-b...), all under the first group's three controllers."""
        assert 1 <= groups <= 26, groups
        self.base_dir = Path(base_dir)
        self.groups: list[LocalCluster] = []
        for index in range(groups):
            if index:
                kwargs["namesrv_addr"] = self.groups[0].namesrv_addr
            group_dir = self.base_dir / f"g{index}"
            broker_name = f"broker-{chr(ord('a') + index)}"
            if controller:
                controllers = self.groups[0].controller_addrs if index else None
                group = LocalControllerGroup(
                    group_dir, nodes, controllers, broker_name=broker_name, **kwargs
                )
            elif master_role is None:
                group = LocalCluster(group_dir, nodes, f"RaftNode{index:02d}", **kwargs)
            else:
                group = LocalClassicGroup(
                    group_dir, nodes - 1, master_role, broker_name=broker_name, **kwargs
                )
            self.groups.append(group)
        self.namesrv_addr = self.groups[0].namesrv_addr
        self.cluster_name = self.groups[0].cluster_name

    async def __aenter__(self) -> LocalGroups:
        """Groups stop in reverse order, so the first group's name server stops last."""
        async with contextlib.AsyncExitStack() as stack:
            for group in self.groups:
                await stack.enter_async_context(group)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._stack.aclose()

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        """Create `topic` on every group's master; routed once the last one is."""
        for group in self.groups:
            await group.create_topic(topic, queues)


def _print_metrics(cluster: LocalCluster, names: list[str]) -> None:
    for name in names:
        print(f"  metrics {name}: http://{cluster.metrics_addrs[name]}/metrics", flush=True)


async def _serve(
    base_dir: str,
    groups: int,
    nodes: int,
    master_role: str | None,
    metrics: bool,
    controller: bool = False,
) -> None:
    async with LocalGroups(
        base_dir, groups, nodes, master_role, controller, metrics=metrics
    ) as cluster:
        print(f"name server {cluster.namesrv_addr}, cluster {cluster.cluster_name}", flush=True)
        if metrics:
            _print_metrics(cluster.groups[0], ["namesrv"])
        first = cluster.groups[0]
        if isinstance(first, LocalControllerGroup):
            addresses = ";".join(first.controller_addrs.values())
            print(f"controllers {addresses} (mqadmin getSyncStateSet -a ...)", flush=True)
            if metrics:
                _print_metrics(first, list(first.CONTROLLERS))
        for group in cluster.groups:
            if isinstance(group, LocalControllerGroup):
                master = await group.wait_master()
                for node in group.ids:
                    role = "master" if node == master else "slave"
                    print(
                        f"  {group.broker_name} {role}: {group.client_addrs[node]}"
                        f" (HA {group.ha_addrs[node]})",
                        flush=True,
                    )
            elif isinstance(group, LocalClassicGroup):
                for index, node in enumerate(group.ids):
                    role = "SLAVE" if index else master_role
                    print(
                        f"  {group.broker_name} {role}: {group.client_addrs[node]}"
                        f" (HA {group.ha_addrs[node]})",
                        flush=True,
                    )
            else:
                addresses = " ".join(group.client_addrs.values())
                print(f"  {group.broker_name}: {addresses}", flush=True)
            if metrics:
                _print_metrics(group, group.ids)
        print("Ctrl-C stops every process", flush=True)
        await trio.sleep_forever()


async def _serve_upgraded(classic: LocalClassicGroup, nodes: int) -> None:
    async with classic.upgraded(nodes) as cluster:
        print(f"name server {cluster.namesrv_addr}, cluster {cluster.cluster_name}", flush=True)
        print(f"  {cluster.broker_name}: {' '.join(cluster.client_addrs.values())}", flush=True)
        print("Ctrl-C stops every process", flush=True)
        await trio.sleep_forever()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m raftmq.tools.broker_local --groups 2`: a local cluster until Ctrl-C,
    SIGTERM or SIGHUP (exit status 130, 143, 129: every process it started stopped);
    `--classic [--groups 2] [--slaves N] [--role SYNC_MASTER]`: classic master/slave
    groups (`--classic --groups 2`: RocketMQ's 2m-2s);
    `--upgrade --dir DIR`: the classic group stopped in DIR, upgraded in place to a
    DLedger group of `--nodes` (LocalClassicGroup.upgraded);
    `--controller [--groups 2] [--nodes 2]`: controller-mode groups under three standalone
    controllers (LocalControllerGroup);
    `--metrics`: every process serves Prometheus metrics (their addresses are printed)."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m raftmq.tools.broker_local")
    parser.add_argument("--groups", type=int, default=1, help="groups (brokerNames), at most 26")
    parser.add_argument("--nodes", type=int, default=3, help="brokers in each group")
    parser.add_argument("--dir", help="where stores and logs go (a temporary directory if not)")
    parser.add_argument("--classic", action="store_true", help="a classic master/slave group")
    parser.add_argument(
        "--controller", action="store_true",
        help="controller-mode groups of --nodes brokers under three controllers",
    )  # fmt: skip
    parser.add_argument("--slaves", type=int, default=1, help="with --classic: slaves")
    parser.add_argument(
        "--role", choices=("ASYNC_MASTER", "SYNC_MASTER"), default="ASYNC_MASTER",
        help="with --classic: the master's brokerRole",
    )  # fmt: skip
    parser.add_argument(
        "--upgrade", action="store_true",
        help="with --dir: the classic group stopped there, upgraded in place to DLedger",
    )  # fmt: skip
    parser.add_argument(
        "--metrics", action="store_true",
        help="give every process a metricsPort and print its /metrics address",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 1 <= args.groups <= 26:
        parser.error(f"--groups {args.groups}: between 1 and 26")
    classic = None
    if args.upgrade:
        if not args.dir:
            parser.error("--upgrade needs --dir, where a --classic group ran")
        try:
            classic = LocalClassicGroup.stopped_in(args.dir)
        except (OSError, ValueError, KeyError) as exc:
            print(
                f"{parser.prog}: {args.dir}: no stopped classic group there ({exc!r})",
                file=sys.stderr,
            )
            return 2

    stop = InterruptOnStopSignals().install()

    def serve(base_dir: str) -> None:
        if classic is not None:
            stop.run(_serve_upgraded, classic, args.nodes)
        elif args.controller:
            stop.run(_serve, base_dir, args.groups, args.nodes, None, args.metrics, True)
        elif args.classic:
            stop.run(_serve, base_dir, args.groups, 1 + args.slaves, args.role, args.metrics)
        else:
            stop.run(_serve, base_dir, args.groups, args.nodes, None, args.metrics)

    try:
        if args.dir:
            serve(args.dir)
        else:
            with tempfile.TemporaryDirectory(prefix="raftmq-local-") as tmp:
                serve(tmp)
    except KeyboardInterrupt:  # a stop signal before the run took the signals over
        pass
    return stop.exit_status


if __name__ == "__main__":
    sys.exit(main())
