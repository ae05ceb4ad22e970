"""The broker group under test: LocalCluster's processes, each node on a loopback
address of its own, every link through a proxy the nemesis controls, and the process
faults it needs.

Node n<i> listens on 127.0.0.<10+i> (broker and DLedger ports). Node `a` dials node
`b` at `net.address(a, b)`, a proxy that forwards to `b`'s real port, so blocking the
proxy of (a, b) cuts exactly the connections `a` opens to `b`.

Clients cannot be told to dial a proxy: they take a broker's address from the name
server. So each broker advertises a second address of its node, 127.0.1.<10+i> with
the same port (brokerIP1), where the proxy of link (CLIENT, n<i>) listens and forwards
to the broker's real address (bindAddress): every producer and consumer connection
to a node goes through that node's client proxy. The harness's own calls (runtime
state, final reads, topic creation) use `broker_addrs`, the real addresses, so a
client fault never blinds the observer. Peer partitions leave client links alone:
as in Jepsen, the clients sit with the harness, which can reach every node.

With `store_bytes`, each node's store is a tmpfs of that size of its own (mounted
before the brokers start, unmounted when they stop), which the `disk-full` fault
fills. A slow disk is strace attached to a running broker, delaying the return of
every fsync and fdatasync until it detaches.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import trio
from raftmq.dledger.net.frames import HEADER_SIZE

from jepsen import disk
from jepsen.proxy import Link, ProxyNet
from raftmq.client.admin import Admin
from raftmq.config.address import parse_address
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode
from raftmq.tools.broker_local import LocalClassicGroup, LocalCluster, LocalControllerGroup

EXIT_DISK = 4  # mqbroker's exit status for a store it refuses to open (broker.cli)
CLIENT = "client"  # the producers' and consumers' end of every client link
# a controller-mode group's slaves, as the dialling end of each broker's HA link: a
# slave takes its master's HA address from the name server (brokerIP2), one address per
# master, so the link is cut for all of its slaves at once
SLAVES = "slaves"
# The bytes of a frame before those its 4-byte length counts, on each kind of link, so
# that the proxies cut inside frames: DLedger's header is the length and a channel
# byte; RocketMQ remoting's length counts everything after itself.
PEER_FRAME_HEADER_BYTES = HEADER_SIZE
CLIENT_FRAME_HEADER_BYTES = 4
MEMBER_STATE_TIMEOUT_S = 0.5
# A membership change: a new member's catch-up before it is promoted, or an election
MEMBER_CHANGE_TIMEOUT_S = 30.0


class RefusedToStart(Exception):
    """A broker exited at start; `disk` when it refused its store (a clean refusal)."""

    def __init__(self, node: str, status: int | None, log_tail: str) -> None:
        super().__init__(f"{node} exited at start with status {status}: {log_tail[-300:]}")
        self.node = node
        self.disk = status == EXIT_DISK


def addressing(nodes: int) -> dict[str, list[str]]:
    """Each node's own loopback address, and the one its client proxy listens on."""
    return {
        "hosts": [f"127.0.0.{10 + i}" for i in range(nodes)],
        "advertised": [f"127.0.1.{10 + i}" for i in range(nodes)],
    }


class JepsenCluster(LocalCluster):
    # processes beside the brokers that faults may target (a controller-mode group's)
    controllers: tuple[str, ...] = ()

    def __init__(
        self,
        base_dir: Path,
        nodes: int,
        extra_conf: dict[str, str],
        store_bytes: int | None = None,
        **names: str,
    ) -> None:
        """`names`: LocalCluster's broker_name and cluster_name, if not its own."""
        super().__init__(
            base_dir,
            nodes=nodes,
            extra_conf={"recordSyncedLengths": "true", **extra_conf},
            **addressing(nodes),
            **names,
        )
        self._init_faults(store_bytes)

    def _init_faults(self, store_bytes: int | None = None) -> None:
        self.net: ProxyNet | None = None  # the peer links
        self.clients: ProxyNet | None = None  # the client links
        self.paused: set[str] = set()
        self.traced: set[str] = set()  # run under strace: signal the whole process group
        self.store_bytes = store_bytes  # each store on a tmpfs of this size
        self.mounted: list[Path] = []
        self.slowing: dict[str, subprocess.Popen] = {}  # strace attached to delay fsyncs
        # Members set aside (removed, stopped, their stores emptied) for the membership
        # fault to add again as new ones. Every node is in every node's dLegerPeers, so
        # each keeps a link of its own, through its proxy, to a member that left and
        # comes back: the partitions cover them as any other.
        self.out: set[str] = set()

    async def __aenter__(self) -> JepsenCluster:
        if self.store_bytes is not None:
            try:
                for node in self.ids:
                    disk.mount_tmpfs(self.store_dir(node), self.store_bytes)
                    self.mounted.append(self.store_dir(node))
            except BaseException:
                self.stop()
                raise
        await super().__aenter__()
        return self

    def stop(self) -> None:
        for node in list(self.slowing):
            self.stop_slowing_fsync(node)
        super().stop()
        while self.mounted:
            disk.unmount(self.mounted.pop())

    def peer_links(self) -> dict[tuple[str, str], str]:
        """Every directed peer link and the real address it leads to."""
        return {(a, b): self.peer_addrs[b] for a in self.ids for b in self.ids if a != b}

    def peer_proxies(self) -> dict[Link, str]:
        """Where the proxies of the peer links that cannot be told where to dial listen
        (the rest take a free port: their dialler is given it)."""
        return {}

    def client_links(self) -> dict[Link, str]:
        """Every client link and the broker's real address it leads to."""
        return {(CLIENT, node): self.broker_addrs[node] for node in self.ids}

    def client_proxies(self) -> dict[Link, str]:
        """Where each client link's proxy listens: the address its broker advertises."""
        return {(CLIENT, node): self.client_addrs[node] for node in self.ids}

    def node_of(self) -> dict[str, str]:
        """Each address clients dial -> its node."""
        return {address: node for node, address in self.client_addrs.items()}

    def dledger_peers(self, node: str) -> str:
        return self.proxied_peers(node, self.peer_addrs)

    def proxied_peers(self, name: str, addresses: dict[str, str]) -> str:
        """A peers list (`id-address;...`) as `name` dials it: its own address, and the
        proxy of its link to each other peer."""
        assert self.net is not None, "attach a ProxyNet before starting"
        return ";".join(
            f"{peer}-{address if peer == name else self.net.address(name, peer)}"
            for peer, address in addresses.items()
        )

    def log_dir(self, node: str) -> Path:
        return self.store_dir(node) / f"dledger-{node}"

    # ------------------------------------------------------------------ processes
    def running(self, node: str) -> bool:
        proc = self.procs.get(node)
        return proc is not None and proc.poll() is None

    def pause(self, node: str) -> None:
        if self.running(node):
            os.kill(self.pid(node), signal.SIGSTOP)
            self.paused.add(node)

    def resume(self, node: str) -> None:
        if node in self.paused:
            self.paused.discard(node)
            if self.running(node):
                os.kill(self.pid(node), signal.SIGCONT)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.resume(name)  # a stopped process would not act on SIGTERM
        if name in self.traced:
            # killing strace alone would leave the broker running, detached
            self.traced.discard(name)
            if self.running(name):
                os.killpg(self.pid(name), signal.SIGKILL)
        super().kill(name, sig)

    def crash(self, nodes: list[str]) -> None:
        """SIGKILL `nodes` at the same moment, then reap them: killing one at a time
        would give the others a flush interval to save what a power cut loses."""
        for node in nodes:
            if self.running(node):
                kill = os.killpg if node in self.traced else os.kill
                kill(self.pid(node), signal.SIGKILL)
        for node in nodes:
            self.paused.discard(node)
            self.kill(node)

    async def start(self, node: str) -> None:
        """Restart `node`; RefusedToStart if it exits before it has booted."""
        try:
            await self.restart(node)
        except RuntimeError:
            proc = self.procs.pop(node, None)
            status = None if proc is None else proc.wait()
            log = (self.base_dir / f"{node}.log").read_text(errors="replace")
            raise RefusedToStart(node, status, log) from None

    def start_failing_fsync(self, node: str, after: int) -> None:
        """Start `node` under strace so that its `after`-th and later fdatasync/fsync
        calls fail with EIO; the replica must stop rather than ack what it lost."""
        self.kill(node)
        log = open(self.base_dir / f"{node}.log", "ab")  # noqa: SIM115 - owned by the process
        inject = f"inject=fdatasync,fsync:error=EIO:when={after}+"
        strace = ["strace", "-f", "-qq", "-o", os.devnull, "-e", inject]
        broker = [sys.executable, "-m", "raftmq.broker.cli", "-c", str(self.conf_path(node))]
        self.procs[node] = subprocess.Popen(
            strace + broker, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.traced.add(node)
        log.close()

    def slow_fsync(self, node: str, delay_ms: int) -> None:
        """Attach strace to `node`'s running broker (all its threads, and any it starts)
        so that each fsync and fdatasync returns `delay_ms` late: a slow disk, with no
        restart. Tracing stops every system call of the process, not only those, which
        adds a little to the rest of its work too. Each delayed call is a line of
        `<node>.strace`, which `stop_slowing_fsync` counts."""
        inject = f"inject=fdatasync,fsync:delay_exit={delay_ms * 1000}"
        trace = self.base_dir / f"{node}.strace"
        self.slowing[node] = subprocess.Popen(
            ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fdatasync,fsync",
             "-e", "signal=none", "-e", inject, "-p", str(self.pid(node))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop_slowing_fsync(self, node: str) -> int:
        """Detach strace (the broker runs on at full speed); returns how many fsyncs it
        delayed."""
        tracer = self.slowing.pop(node, None)
        if tracer is None:
            return 0
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)
            try:
                tracer.wait(5)
            except subprocess.TimeoutExpired:
                tracer.kill()
                tracer.wait()
        trace = self.base_dir / f"{node}.strace"
        return trace.read_text(errors="replace").count("DELAYED") if trace.exists() else 0

    def exit_status(self, node: str) -> int | None:
        proc = self.procs.get(node)
        return None if proc is None else proc.poll()

    @staticmethod
    def strace_available() -> bool:
        return shutil.which("strace") is not None

    # ------------------------------------------------------------------ members
    async def add_member(self, node: str) -> dict:
        """Start `node`, set aside, as a learner (`joinAsLearner`) and add it to the
        group, as `mqadmin addDLedgerPeer` does; the group's members after."""
        assert node in self.out, node
        self._write_broker_conf(node, joinAsLearner="true")
        await self.start(node)
        self.out.discard(node)
        via = await self.wait_master(MEMBER_CHANGE_TIMEOUT_S)
        async with Admin(self.namesrv_addr) as admin:
            return await admin.add_dledger_member(
                self.broker_addrs[via], node, self.peer_addrs[node], MEMBER_CHANGE_TIMEOUT_S
            )

    async def remove_member(self, node: str) -> dict:
        """Remove `node` from the group (the leader hands over), as `mqadmin
        removeDLedgerPeer` does, then stop it and empty its store: set aside, it can
        join again only as a new member. The group's members after."""
        via = next(n for n in self.ids if n != node and self.running(n) and n not in self.out)
        async with Admin(self.namesrv_addr) as admin:
            members = await admin.dledger_members(self.broker_addrs[via], "remove", node)
        self.kill(node)
        shutil.rmtree(self.store_dir(node), ignore_errors=True)
        self.out.add(node)
        return members

    async def voters(self) -> list[str]:
        """The group's voters, as its master says."""
        master = await self.wait_master(MEMBER_CHANGE_TIMEOUT_S)
        async with Admin(self.namesrv_addr) as admin:
            return sorted((await admin.dledger_members(self.broker_addrs[master]))["voters"])

    # ------------------------------------------------------------------ asking
    async def member_states(self) -> dict[str, dict]:
        """Runtime tables of the members that answer within a short timeout."""
        states: dict[str, dict] = {}

        async def ask(node: str) -> None:
            with trio.move_on_after(MEMBER_STATE_TIMEOUT_S):
                try:
                    async with RemotingClient(self.broker_addrs[node]) as client:
                        response = await client.invoke(
                            RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO), 1.0
                        )
                    states[node] = json.loads(response.body)["table"]
                except (OSError, ValueError, KeyError):
                    pass

        async with trio.open_nursery() as nursery:
            for node in self.ids:
                if self.running(node) and node not in self.paused:
                    nursery.start_soon(ask, node)
        return states

    async def leader(self) -> str | None:
        """The member that says it leads, in the highest term any member reports."""
        states = await self.member_states()
        leaders = [
            (int(s.get("dLegerTerm", -1)), node)
            for node, s in states.items()
            if s.get("dLegerRole") == "LEADER"
        ]
        return max(leaders)[1] if leaders else None

    async def wait_serving(self, timeout_s: float, lost: set[str]) -> str:
        """After the faults: the member the final read goes to (the master), once
        every member has caught up. `lost` is for topologies whose members can be lost
        for good; a DLedger group replaces them by itself."""
        master = await self.wait_master(timeout_s)
        await self.wait_caught_up(timeout_s)
        return master


class JepsenClassicCluster(JepsenCluster, LocalClassicGroup):
    """A classic master (n0, SYNC_MASTER or ASYNC_MASTER) and its slave (n1) under the
    same harness: client links through proxies as in a DLedger group, and the HA link
    too: the slave's haMasterAddress is the proxy of link (n1, n0), so the nemesis can
    cut the slave off while the master goes on. No member takes over from a dead
    master: sends fail until it restarts, and reads fall back to the slave."""

    MASTER = "n0"
    SLAVE = "n1"

    def __init__(self, base_dir: Path, master_role: str, extra_conf: dict[str, str]) -> None:
        LocalClassicGroup.__init__(
            self, base_dir, 1, master_role, extra_conf=extra_conf, **addressing(2)
        )
        self._init_faults()

    def peer_links(self) -> dict[tuple[str, str], str]:
        """The one peer link: the slave's HA connection to the master."""
        return {(self.SLAVE, self.MASTER): self.ha_addrs[self.MASTER]}

    def ha_links(self, master: str) -> list[Link]:
        """The links `master`'s slaves replicate from it over."""
        assert master == self.MASTER, master
        return [(self.SLAVE, self.MASTER)]

    def _broker_conf(self, node: str) -> dict[str, str]:
        conf = super()._broker_conf(node)
        if node == self.SLAVE:
            assert self.net is not None, "attach a ProxyNet before starting"
            conf["haMasterAddress"] = self.net.address(self.SLAVE, self.MASTER)
        return conf

    async def leader(self) -> str | None:
        """The master, when it answers."""
        return self.MASTER if self.MASTER in await self.member_states() else None

    async def wait_caught_up(self, timeout_s: float = 60.0) -> None:
        await self.wait_replicated(timeout_s)

    async def wait_serving(self, timeout_s: float, lost: set[str]) -> str:
        """The master once its slave has caught up; the slave when the master is lost
        (nothing promotes it: it serves what it had received)."""
        if self.MASTER not in lost:
            return await super().wait_serving(timeout_s, lost)
        assert self.running(self.SLAVE), "a lost master's slave is never left down"
        return self.SLAVE


class JepsenControllerCluster(JepsenCluster, LocalControllerGroup):
    """A controller-mode group (`replicas` classic brokers, n0.., and three standalone
    controllers, c0..c2) under the same harness. The peer links are each broker's
    connections to each controller (its controllerAddr lists the proxies) and the
    controllers' DLedger links to each other, and the HA links (slaves to a master): a
    broker registers its HA proxy's host as brokerIP2, so the address a slave learns
    from the controllers is the proxy's. The nemesis can so cut a master off from the
    controllers only, from its slaves only, or a controller from everything."""

    controllers = LocalControllerGroup.CONTROLLERS
    HA_HOST = "127.0.2.{}"  # where node i's HA proxy listens: its brokerIP2

    def __init__(self, base_dir: Path, replicas: int, extra_conf: dict[str, str]) -> None:
        LocalControllerGroup.__init__(
            self, base_dir, replicas, extra_conf=extra_conf, **addressing(replicas)
        )
        self._init_faults()

    def peer_links(self) -> dict[tuple[str, str], str]:
        """Broker -> controller, controller -> controller and slaves -> HA links."""
        links = {(node, c): a for node in self.ids for c, a in self.controller_addrs.items()}
        return (
            links
            | {
                (c, d): self.controller_addrs[d]
                for c in self.controllers
                for d in self.controllers
                if c != d
            }
            | {(SLAVES, node): self.ha_addrs[node] for node in self.ids}
        )

    def ha_links(self, master: str) -> list[Link]:
        """The links `master`'s slaves replicate from it over."""
        return [(SLAVES, master)]

    def peer_proxies(self) -> dict[Link, str]:
        """The HA links' proxies listen at each broker's brokerIP2 and real HA port."""
        return {(SLAVES, node): self._ha_proxy(node) for node in self.ids}

    def _ha_proxy(self, node: str) -> str:
        port = parse_address(self.ha_addrs[node])[1]
        return f"{self.HA_HOST.format(10 + self.ids.index(node))}:{port}"

    def _broker_conf(self, node: str) -> dict[str, str]:
        return super()._broker_conf(node) | {"brokerIP2": parse_address(self._ha_proxy(node))[0]}

    def controller_addr(self, node: str) -> str:
        assert self.net is not None, "attach a ProxyNet before starting"
        return ";".join(self.net.address(node, c) for c in self.controllers)

    def controller_peers(self, name: str) -> str:
        return self.proxied_peers(name, self.controller_addrs)

    def log_dir(self, node: str) -> Path:
        return self.store_dir(node) / "commitlog"

    async def leader(self) -> str | None:
        """The broker that says it is master, in the highest master epoch any reports."""
        states = await self.member_states()
        masters = [
            (int(s.get("masterEpoch", -1)), node)
            for node, s in states.items()
            if s.get("brokerRole", "SLAVE") != "SLAVE"
        ]
        return max(masters)[1] if masters else None

    async def controller_leader(self) -> str | None:
        """The controller the running controllers name as their leader."""
        for name in self.controllers:
            if not self.running(name) or name in self.paused:
                continue
            with trio.move_on_after(MEMBER_STATE_TIMEOUT_S):
                try:
                    async with RemotingClient(self.controller_addrs[name]) as client:
                        response = await client.invoke(
                            RemotingCommand(RequestCode.CONTROLLER_GET_METADATA_INFO), 1.0
                        )
                    leader = response.ext_fields.get("controllerLeaderId")
                    if leader in self.controllers:
                        return leader
                except (OSError, ValueError):  # RemotingError is a ValueError
                    pass
        return None

    async def wait_serving(self, timeout_s: float, lost: set[str]) -> str:
        """The master once every broker not lost is in its SyncStateSet and holds its
        CommitLog."""
        master = await self.wait_in_sync(len(set(self.ids) - lost), timeout_s)
        await self.wait_replicated(timeout_s)
        return master
