"""Hostile bytes on every port: the broker's remoting port, the DLedger peer port and
the name server's port of a running group.

Each input is random bytes, or a well-formed frame (a RocketMQ command, a peer message,
a DLedger RPC) that may be truncated, bit-flipped or given a false length, or several
of these back to back. The oracle, per input: the port answers only with well-formed
responses (a RocketMQ response code on remoting ports, an RPC answer on the peer port)
or closes the connection, within a few seconds. Per test: every server is still up,
and the group still serves — a send is acknowledged, a pull returns it, and the
DLedger group has one leader and commits.

Hypothesis drives a sync test, so the group runs in a trio loop on a thread of its own
(`BackgroundLoop`); the connections are plain blocking sockets. Inputs that are
well-formed peer messages come from 127.0.0.2, another host than the members' (the
transport drops them there; what members' own bytes can do is test_hostile_peers).
Requests that administer the broker or the name server by design (wipe write
permission, delete topics, unregister brokers, change configuration) are left out:
refusing those to strangers is access control's job, not the parser's.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from raftmq.dledger.codes import Code, PushType, VoteResult
from raftmq.dledger.core.messages import HeartBeatRequest, PushRequest, VoteRequest, VoteResponse
from raftmq.dledger.net.codec import RpcCode, decode_rpc, encode_message, encode_rpc
from raftmq.dledger.net.frames import PEER, RPC, FrameReader, pack_frame
from raftmq.dledger.net.rpc_client import RpcClient
from raftmq.dledger.net.tcp import PeerTransport
from raftmq.namesrv.config import NamesrvConfig
from raftmq.namesrv.processor import NamesrvProcessor
from raftmq.namesrv.routes import RouteInfoManager
from raftmq.namesrv.server import NamesrvServer

from jepsen.fuzz import ADMINISTRATIVE, fuzz
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.remoting.codec import MAX_FRAME_BYTES, encode
from raftmq.remoting.command import FLAG_ONEWAY, FLAG_RESPONSE
from raftmq.remoting.frames import FrameDecoder
from raftmq.remoting.server import RemotingServer
from raftmq.tools.dledger_local import free_ports
from tests.helpers import create_topic
from tests.inprocess_broker import InProcessGroup

STRANGER_HOST = "127.0.0.2"
ANSWER_WITHIN_S = 5.0

# ---------------------------------------------------------------- the group, on a thread


class BackgroundLoop:
    """A trio loop on a thread of its own, hosting servers for a sync (hypothesis) test."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.failure: BaseException | None = None

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self._ready.set()
                await trio.sleep_forever()
        except BaseException as exc:  # a server that died: the tests report it
            self.failure = exc
            raise

    def __enter__(self) -> BackgroundLoop:
        self._thread.start()
        assert self._ready.wait(10), "the loop did not start"
        return self

    def __exit__(self, *exc_info) -> None:
        if self._thread.is_alive():
            trio.from_thread.run_sync(self.nursery.cancel_scope.cancel, trio_token=self.token)
        self._thread.join(10)

    def run(self, afn, *args):
        assert self.failure is None, f"a server died: {self.failure!r}"
        return trio.from_thread.run(afn, *args, trio_token=self.token)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    with BackgroundLoop() as loop:
        g = InProcessGroup(loop.nursery, tmp_path_factory.mktemp("hostile"))
        loop.run(g.start)
        loop.run(create_topic, g, "HostileCheck")
        yield loop, g
        assert loop.failure is None, f"a server died: {loop.failure!r}"


def still_serving(loop: BackgroundLoop, g: InProcessGroup) -> None:
    """One leader that commits: a send is acknowledged and a pull returns it."""

    async def check() -> None:
        master = await g.wait_master()
        before = master.dledger.replica.committed_index
        body = f"check-{time.monotonic_ns()}".encode()
        response = await g.send(master, "HostileCheck", body)
        assert response.code == ResponseCode.SUCCESS, response.remark
        offset = int(response.ext_fields["queueOffset"])
        pulled = await g.pull(master, "HostileCheck", int(response.ext_fields["queueId"]), offset)
        assert pulled.code == ResponseCode.SUCCESS, pulled.remark
        assert body in pulled.body
        assert master.dledger.replica.committed_index > before
        assert sum(b.is_master for b in g.brokers.values()) == 1

    loop.run(check)


# ---------------------------------------------------------------- one hostile connection


def exchange(port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    """Send `data`, end our half of the stream, and return everything received until
    the port closes the connection; fail if it neither closes nor stops sending."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=ANSWER_WITHIN_S, source_address=(source, 0)
    ) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it closed on us mid-input: allowed
        received = bytearray()
        deadline = time.monotonic() + ANSWER_WITHIN_S
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return bytes(received)
            except TimeoutError:
                break
            if not chunk:
                return bytes(received)
            received += chunk
        raise AssertionError(f"port {port} kept the connection open ({len(received)} bytes)")


def remoting_answers(data: bytes) -> list[RemotingCommand]:
    """The commands in `data`; each must be a response with a code."""
    decoder = FrameDecoder()
    commands = decoder.feed(data)
    decoder.end_of_stream()
    for command in commands:
        assert command.flag & FLAG_RESPONSE, command
        assert isinstance(command.code, int)
    return commands


async def _rpc_answers(data: bytes) -> list[dict]:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(data)
    stream.put_eof()
    answers = []
    async for channel, payload in FrameReader(stream):
        assert channel == RPC, "the peer port answers on incoming connections with RPCs only"
        answers.append(decode_rpc(payload))
    return answers


def peer_answers(data: bytes) -> list[dict]:
    answers = trio.run(_rpc_answers, data)
    assert all(isinstance(a["code"], int) for a in answers)
    return answers


# ---------------------------------------------------------------- what a stranger sends


def mutations(frame: bytes) -> st.SearchStrategy[bytes]:
    """`frame` whole, cut short, with a byte changed, or with a false declared length."""
    n = len(frame)
    return st.one_of(
        st.just(frame),
        st.integers(0, n - 1).map(lambda k: frame[:k]),
        st.tuples(st.integers(0, n - 1), st.integers(0, 255)).map(
            lambda kb: frame[: kb[0]] + bytes([kb[1]]) + frame[kb[0] + 1 :]
        ),
        st.sampled_from([0, 1, 7, n - 5, n + 100, MAX_FRAME_BYTES + 1, 2**31, 2**32 - 1]).map(
            lambda length: max(length, 0).to_bytes(4, "big") + frame[4:]
        ),
    )


def concatenations(frames: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=600),
        frames,
        st.lists(frames, min_size=2, max_size=4).map(b"".join),
    )


_codes = st.sampled_from(sorted(set(RequestCode) - ADMINISTRATIVE)) | st.integers(-3, 500).filter(
    lambda c: c not in ADMINISTRATIVE
)
_header_keys = st.sampled_from(
    ["topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "consumerGroup",
     "producerGroup", "bornTimestamp", "flag", "properties", "a", "b", "c", "d", "e", "f",
     "suspendTimeoutMillis", "commitOffset", "subscription", "key", "offset", "msgId"]
)  # fmt: skip
_header_values = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**63), 2**64).map(str),
    st.sampled_from(["HostileCheck", "0", "-1", "%RETRY%CG", "*", "true"]),
)
_commands = st.builds(
    lambda code, ext, body, flag, opaque: RemotingCommand(
        code=code, ext_fields=ext, body=body, flag=flag, opaque=opaque
    ),
    _codes,
    st.dictionaries(_header_keys, _header_values, max_size=8),
    st.binary(max_size=200),
    st.sampled_from([0, 0, FLAG_ONEWAY, FLAG_RESPONSE]),
    st.integers(0, 2**31 - 1),
)
remoting_inputs = concatenations(_commands.map(encode).flatmap(mutations))

_ids = st.sampled_from(["n0", "n1", "n2", "x"])
_ints = st.integers(-2, 2**63)
_packable = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
_peer_messages = st.one_of(
    st.builds(VoteRequest, st.just("broker-t"), _ids, _ids, _ids, _ints, _ints, _ints, _ints),
    st.builds(HeartBeatRequest, st.just("broker-t"), _ids, _ids, _ids, _ints, _ints),
    st.builds(
        VoteResponse, st.just("broker-t"), _ids, _ids, _ids, _ints,
        st.sampled_from(VoteResult), _ints,
    ),
    st.builds(
        PushRequest, st.just("broker-t"), _ids, _ids, _ids, _ints, st.sampled_from(PushType),
        _ints, _ints, _ints, st.binary(max_size=100), _ints,
    ),
).map(lambda m: pack_frame(PEER, encode_message(m)))  # fmt: skip
_rpc_requests = st.fixed_dictionaries(
    {"code": st.sampled_from([int(c) for c in RpcCode]) | _packable, "opaque": _ints},
    optional={
        "group": st.sampled_from(["broker-t", "other"]) | st.text(max_size=4),
        "index": _ints | st.text(max_size=3),
        "bodies": st.lists(st.binary(max_size=20), max_size=2) | _packable,
    },
).map(lambda r: pack_frame(RPC, encode_rpc(r)))
_other_frames = st.tuples(st.integers(0, 255), st.binary(max_size=80)).map(
    lambda cp: pack_frame(*cp)
)
peer_inputs = concatenations(
    st.one_of(
        _peer_messages,
        _rpc_requests,
        _other_frames,
        st.builds(msgpack.packb, st.lists(_packable | st.text(max_size=3), max_size=9)).map(
            lambda p: pack_frame(PEER, p)
        ),
    ).flatmap(mutations)
)


# ---------------------------------------------------------------- the tests


def _peer_port(g: InProcessGroup, node: str) -> int:
    return int(dict(p.split("-", 1) for p in g.dledger_peers.split(";"))[node].rsplit(":", 1)[1])


@given(data=remoting_inputs)
def test_the_broker_port_answers_with_codes_or_closes(running, data):
    _, g = running
    for node in g.ids:
        remoting_answers(exchange(g.listen[node], data))


@given(data=remoting_inputs)
def test_the_name_server_port_answers_with_codes_or_closes(running, data):
    _, g = running
    remoting_answers(exchange(g.namesrv.port, data))


@given(data=peer_inputs)
def test_the_peer_port_answers_rpcs_or_closes(running, data):
    _, g = running
    for node in g.ids:
        peer_answers(exchange(_peer_port(g, node), data, source=STRANGER_HOST))


def test_the_group_still_serves_after_the_fuzzing(running):
    """Runs after the fuzz tests above (file order): nothing they sent stopped it."""
    still_serving(*running)


def test_a_raw_append_on_a_brokers_peer_port_is_refused(running):
    """The DLedger APPEND RPC put bytes that are not a message into the broker's log,
    and the broker's placement of them killed the master."""
    loop, g = running
    master = g.master()
    address = f"127.0.0.1:{_peer_port(g, master.dledger.config.self_id)}"

    async def append() -> dict:
        async with RpcClient(address) as client:
            return await client.call({"code": RpcCode.APPEND, "bodies": [b"not a message"]})

    assert loop.run(append)["code"] == Code.UNSUPPORTED
    still_serving(loop, g)


@pytest.mark.processes
async def test_the_fuzz_harness_finds_nothing_against_real_processes(tmp_path):
    results = await fuzz(tmp_path, seed=16, time_limit_s=5.0)
    assert results["valid"], results


def test_an_oversized_declared_length_is_refused_before_it_is_buffered(running):
    """Each port closes at once on a length over its limit, without waiting for the
    bytes it declares."""
    loop, g = running
    ports = [
        (g.listen[g.ids[0]], (MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"\0" * 8),
        (g.namesrv.port, (2**32 - 1).to_bytes(4, "big") + b"\0" * 8),
        (_peer_port(g, g.ids[0]), (2**32 - 1).to_bytes(4, "big") + b"\0" * 8),
    ]
    for port, data in ports:
        with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as sock:
            sock.sendall(data)  # and keep our half open: the port must not wait for more
            assert sock.recv(1) == b""
    still_serving(loop, g)


def test_a_refused_frame_still_gets_the_responses_before_it(running):
    """A valid request, then garbage: the request is answered or the connection closes,
    and whatever came back is a response."""
    _, g = running
    request = encode(RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO, opaque=7))
    answers = remoting_answers(exchange(g.listen[g.ids[0]], request + b"\xff" * 9))
    assert all(a.opaque == 7 for a in answers)


# ---------------------------------------------------------------- connection storms


async def half_frame_connections(port: int, count: int, declared: int = 64 * 1024) -> list:
    """`count` connections that each declare a frame of `declared` bytes and send half."""
    streams = []
    for _ in range(count):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(declared.to_bytes(4, "big") + b"\0" * (declared // 2))
        streams.append(stream)
    return streams


async def is_closed(stream, within_s: float) -> bool:
    with trio.move_on_after(within_s):
        try:
            return await stream.receive_some(1) == b""
        except trio.BrokenResourceError:
            return True
    return False


async def test_a_storm_of_half_frames_on_a_remoting_port_is_capped_then_reclaimed(nursery):
    """Past the cap a connection is closed at once; the ones admitted are closed when
    they have sent nothing for `idle_s`; then the port serves again."""
    processor = NamesrvProcessor(RouteInfoManager(), lambda: 0).table()
    server = RemotingServer("127.0.0.1", 0, processor, idle_s=0.5, max_connections=8)
    port = await nursery.start(server.serve)
    admitted = await half_frame_connections(port, 8)
    refused = await half_frame_connections(port, 4)
    assert all([await is_closed(s, 0.3) for s in refused])
    assert len(server.connections) == 8
    assert all([await is_closed(s, 2.0) for s in admitted])
    assert not server.connections
    async with RemotingClient(f"127.0.0.1:{port}") as client:
        request = RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)
        assert (await client.invoke(request, 5.0)).code == ResponseCode.SUCCESS


async def test_a_storm_of_half_frames_on_the_peer_port_is_capped_then_reclaimed(nursery):
    a_port, b_port = free_ports(2)
    peers = {"a": f"127.0.0.1:{a_port}", "b": f"127.0.0.1:{b_port}"}
    received = []
    a = PeerTransport("a", peers, received.append, print, idle_s=0.5, max_connections=4)
    await nursery.start(a.serve)
    admitted = await half_frame_connections(a_port, 4)
    refused = await half_frame_connections(a_port, 3)
    assert all([await is_closed(s, 0.3) for s in refused])
    assert all([await is_closed(s, 2.0) for s in admitted])
    b = PeerTransport("b", peers, print, print)
    await nursery.start(b.serve)
    b.send(HeartBeatRequest("broker-t", "b", "a", "b", 1))
    with trio.fail_after(5):
        while not received:
            await trio.sleep(0.01)


# ---------------------------------------------------------------- the name server's tables


@pytest.fixture(scope="module")
def lone_namesrv():
    """A name server of its own: registrations drawn at random go into its tables."""
    with BackgroundLoop() as loop:
        server = NamesrvServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
        loop.run(loop.nursery.start, server.serve)
        yield loop, server


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_topic_configs = st.dictionaries(
    st.sampled_from(["readQueueNums", "writeQueueNums", "perm", "topicSysFlag", "topicName",
                     "order", "topicFilterType"]),
    st.integers(-3, 2**40) | _json_values,
    max_size=5,
)  # fmt: skip
_register_bodies = st.one_of(
    st.binary(max_size=60),
    st.builds(
        lambda table, version, filters: json.dumps(
            {"topicConfigSerializeWrapper": {"topicConfigTable": table, "dataVersion": version},
             "filterServerList": filters}
        ).encode(),
        st.dictionaries(st.text(max_size=6), _topic_configs | _json_values, max_size=3),
        st.dictionaries(st.sampled_from(["timestamp", "counter", "x"]), _json_values, max_size=2)
        | _json_values,
        st.lists(st.text(max_size=8), max_size=2) | _json_values,
    ),
)  # fmt: skip
_register_ext = st.fixed_dictionaries(
    {},
    optional={
        key: _header_values
        for key in ("clusterName", "brokerAddr", "brokerName", "brokerId", "haServerAddr",
                    "heartbeatTimeoutMillis", "dLegerTerm", "bodyCrc32", "compressed")
    },
)  # fmt: skip


@given(
    code=st.sampled_from([RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER]),
    ext=_register_ext,
    body=_register_bodies,
)
def test_random_registrations_leave_the_name_server_answering(lone_namesrv, code, ext, body):
    """What a stranger registers is access control's concern; here, whatever it is, the
    name server answers it with a code and can still describe its tables."""
    loop, server = lone_namesrv

    async def register_then_list() -> None:
        async with RemotingClient(f"127.0.0.1:{server.port}") as client:
            request = RemotingCommand(code=code, ext_fields=ext, body=body)
            answer = await client.invoke(request, 5.0)
            assert answer.code in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR), answer
            listing = RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)
            answer = await client.invoke(listing, 5.0)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            json.loads(answer.body)
            listing = RemotingCommand(code=RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            answer = await client.invoke(listing, 5.0)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            for topic in ("TBW102", *json.loads(answer.body)["topicList"][:3]):
                route = RemotingCommand(
                    code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}
                )
                answer = await client.invoke(route, 5.0)
                assert answer.code in (ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST), (
                    answer.remark
                )

    loop.run(register_then_list)


async def test_an_rpc_client_that_does_not_read_its_answers_is_closed(nursery):
    """Answers to a client that only sends would queue without end on the peer port."""
    a_port, b_port = free_ports(2)
    peers = {"a": f"127.0.0.1:{a_port}", "b": f"127.0.0.1:{b_port}"}

    async def big_answer(request: dict) -> dict:
        return {"code": 200, "body": b"x" * 10_000}

    a = PeerTransport("a", peers, print, print, big_answer, max_pending_bytes=64 * 1024)
    await nursery.start(a.serve)
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", a_port))
    stream = trio.SocketStream(sock)
    requests = b"".join(
        pack_frame(RPC, encode_rpc({"code": int(RpcCode.STATUS), "opaque": n})) for n in range(2000)
    )
    await stream.send_all(requests)
    await trio.sleep(0.5)  # not reading, while 20 MB of answers are due
    received = 0
    with trio.fail_after(5):
        try:
            while chunk := await stream.receive_some(65536):
                received += len(chunk)
        except trio.BrokenResourceError:
            pass
    assert received < 2000 * 10_000
