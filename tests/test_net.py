"""The network layer: codec, framing, the peer transport and the RPC client.

The socket tests run on 127.0.0.1 with ports the OS picked, and every wait is under
a `fail_after`, so a regression shows as a failure rather than a hung run.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import socket

import attrs
import msgpack
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raftmq.dledger.codes import Code, PushType, VoteResult
from raftmq.dledger.core.messages import (
    MESSAGE_TYPES,
    HeartBeatRequest,
    HeartBeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    PushRequest,
    PushResponse,
    VoteRequest,
    VoteResponse,
)
from raftmq.dledger.net import frames as peer_frames
from raftmq.dledger.net.codec import (
    FrameError,
    RpcCode,
    decode_message,
    decode_rpc,
    encode_message,
    encode_rpc,
)
from raftmq.dledger.net.frames import RPC, FrameReader, FrameWriter, pack_frame
from raftmq.dledger.net.rpc_client import RpcClient, RpcTimeout, RpcUnavailable
from raftmq.dledger.net.tcp import PeerTransport

from raftmq.remoting import codec as remoting_codec
from raftmq.remoting.codes import SerializeType
from raftmq.remoting.command import RemotingCommand

G = "g0"

SAMPLES = [
    VoteRequest(G, "n0", "n1", "n0", term=7, ledger_end_index=1234, ledger_end_term=6, seq=3),
    VoteResponse(G, "n1", "n0", None, 7, VoteResult.REJECT_ALREADY_VOTED, seq=3),
    VoteResponse(G, "n1", "n0", "n2", 7, VoteResult.ACCEPT, seq=4, code=Code.EXPIRED_TERM),
    HeartBeatRequest(G, "n0", "n2", "n0", term=7, seq=99),
    HeartBeatResponse(G, "n2", "n0", "n0", 7, Code.SUCCESS, seq=99),
    PushRequest(
        G,
        "n0",
        "n1",
        "n0",
        7,
        PushType.APPEND,
        pre_log_index=41,
        pre_log_term=6,
        commit_index=40,
        entries=bytes(range(256)) * 40,
        count=3,
        leader_end_index=44,
        seq=12,
    ),
    PushRequest(
        G,
        "n0",
        "n1",
        "n0",
        7,
        PushType.TRUNCATE,
        pre_log_index=10,
        pre_log_term=2,
        commit_index=9,
        term_runs=[(11, 2), (15, 5), (30, 7)],
        leader_end_index=33,
        reset_pos=4096,
        seq=13,
    ),
    PushRequest(G, "n0", "n1", "n0", 7, PushType.COMMIT, -1, -1, 40),
    PushResponse(
        G,
        "n1",
        "n0",
        "n0",
        7,
        Code.INCONSISTENT_TERM,
        PushType.COMPARE,
        index=41,
        begin_index=0,
        end_index=39,
        x_term=5,
        x_index=20,
        seq=14,
    ),
    PushResponse(G, "n1", "n0", None, 8, Code.SUCCESS, PushType.APPEND, 44),
    LeadershipTransferRequest(
        G,
        "n0",
        "n2",
        "n0",
        7,
        transfer_id="n0",
        transferee_id="n2",
        take_leadership_ledger_index=44,
        seq=5,
    ),
    LeadershipTransferResponse(G, "n2", "n0", None, 8, Code.TAKE_LEADERSHIP_FAILED, seq=5),
    InstallSnapshotRequest(G, "n0", "n3", "n0", 7, 99, 600, 256, bytes(range(256)), seq=15),
    InstallSnapshotResponse(G, "n3", "n0", "n0", 7, Code.SUCCESS, 99, 512, seq=15),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- codec
def test_sample_covers_every_message_type():
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_message_round_trip(msg):
    back = decode_message(encode_message(msg))
    assert back == msg
    assert type(back) is type(msg)
    for field in ("code", "vote_result", "type"):
        if hasattr(msg, field):
            assert type(getattr(back, field)) is type(getattr(msg, field))
    if isinstance(msg, PushRequest):
        assert all(type(run) is tuple for run in back.term_runs)


@pytest.mark.parametrize("serialize_type", list(SerializeType))
def test_a_shared_port_tells_peer_frames_from_remoting_frames(serialize_type):
    """The controller's port serves both (`PeerTransport`'s `foreign`): every peer
    message and RPC opens a peer frame, a remoting request of either header type not."""
    sniffed = peer_frames.SNIFF_BYTES
    for msg in SAMPLES:
        assert peer_frames.opens_peer_frame(
            pack_frame(peer_frames.PEER, encode_message(msg))[:sniffed]
        )
    rpc = pack_frame(RPC, encode_rpc({"code": 1, "opaque": 2}))
    assert peer_frames.opens_peer_frame(rpc[:sniffed])
    request = RemotingCommand(
        code=1005, ext_fields={"k" * 300: "v" * 60_000}, serialize_type=serialize_type
    )
    for command in (request, RemotingCommand(code=1005, serialize_type=serialize_type)):
        assert not peer_frames.opens_peer_frame(remoting_codec.encode(command)[:sniffed])


def test_message_is_a_positional_array():
    msg = SAMPLES[0]
    assert msgpack.unpackb(encode_message(msg)) == [51001, G, "n0", "n1", "n0", 7, 1234, 6, 3]


def test_encode_rejects_non_messages():
    with pytest.raises(TypeError):
        encode_message({"code": 1})


@pytest.mark.parametrize(
    "obj, why",
    [
        ([51001, G, "n0", "n1", "n0", 7, 1234], "fields"),  # ledger_end_term has no default
        ([51001, G, "n0", "n1", "n0", "7", 1234, 6, 0], "term"),  # wrong type
        ([51001, G, "n0", "n1", "n0", True, 1234, 6, 0], "term"),  # bool is not int
        ([-51002, G, "n1", "n0", None, 7, 999, 0, -1], "Code"),  # not a Code
        ([12345, G], "KIND"),
        ({"code": 1}, "array"),
        ([], "array"),
    ],
)
def test_decode_message_rejects_bad_shapes(obj, why):
    with pytest.raises(FrameError, match=why):
        decode_message(msgpack.packb(obj, use_bin_type=True))


def test_peers_of_other_versions_understand_each_other():
    """A rolling upgrade: a newer peer's appended fields are dropped, an older peer's
    message takes the defaults of the fields it did not have yet (here the heartbeat
    answer's verified_index, added after the first release, and fsync_p99_us after it)."""
    beat = HeartBeatResponse(G, "n1", "n0", "n0", 7, Code.SUCCESS, 5, 12, 4200)
    fields = msgpack.unpackb(encode_message(beat))
    older = decode_message(msgpack.packb(fields[:-1]))
    assert older == attrs.evolve(beat, fsync_p99_us=-1)
    oldest = decode_message(msgpack.packb(fields[:-2]))
    assert oldest == attrs.evolve(beat, verified_index=-1, fsync_p99_us=-1)
    newer = decode_message(msgpack.packb([*fields, 99, "a field of a later version"]))
    assert newer == beat


def test_decode_message_rejects_bad_term_runs():
    good = msgpack.unpackb(encode_message(SAMPLES[6]))
    good[12] = [[11, 2], [15]]
    with pytest.raises(FrameError, match="term_runs"):
        decode_message(msgpack.packb(good))


def test_rpc_round_trip_and_validation():
    req = {"code": RpcCode.APPEND, "opaque": 9, "group": G, "bodies": [b"a", b"bc"]}
    assert decode_rpc(encode_rpc(req)) == {**req, "code": 50001}
    for bad in ([1, 2], {"code": 1}, {"code": "1", "opaque": 1}, {"code": 1, "opaque": None}):
        with pytest.raises(FrameError):
            decode_rpc(msgpack.packb(bad))


field_values = st.one_of(
    st.integers(-3, 600),  # hits valid and invalid enum values
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
    st.binary(max_size=3),
    st.floats(allow_nan=False),
    st.lists(st.lists(st.integers(-2, 2) | st.text(max_size=1), max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(-5, 5), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_random_bytes_only_raise_frame_error(data):
    for decode in (decode_message, decode_rpc):
        with contextlib.suppress(FrameError):
            decode(data)


def _well_typed(field: attrs.Attribute):
    """Values of the field's own type (enums: any small int), so whole messages get through."""
    tp = field.type
    if field.name == "term_runs":
        return st.lists(st.lists(st.integers(-2, 2), min_size=1, max_size=3), max_size=3)
    if tp is str:
        return st.text(max_size=3)
    if tp is bytes:
        return st.binary(max_size=3)
    if isinstance(tp, type) and issubclass(tp, int):  # int and the IntEnums
        return st.integers(-3, 600) | st.integers(-(2**63), 2**64 - 1)
    return st.none() | st.text(max_size=3)  # str | None


_CLASSES = {int(cls.KIND): cls for cls in MESSAGE_TYPES}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_CLASSES)), st.integers(-1, 1), st.data())
def test_fuzz_plausible_messages_only_raise_frame_error(kind, extra, data):
    """Right KIND, (mostly) the right field count and (mostly) well-typed fields, so the
    type and enum checks are what is exercised; whatever decodes must re-encode."""
    cls = _CLASSES[kind]
    fields = attrs.fields(cls)
    values = [
        data.draw(
            _well_typed(f) | field_values if data.draw(st.integers(0, 9)) == 0 else _well_typed(f)
        )
        for f in fields
    ]
    values = values[: len(values) + extra] if extra < 0 else values + [0] * extra
    try:
        msg = decode_message(msgpack.packb([kind, *values], use_bin_type=True))
    except FrameError:
        return
    assert type(msg) is cls
    assert decode_message(encode_message(msg)) == msg


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_corrupted_messages_only_raise_frame_error(msg, data):
    blob = bytearray(encode_message(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    with contextlib.suppress(FrameError):
        decode_message(bytes(blob[:cut]))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["code", "opaque", "group", "x"]), field_values, max_size=4))
def test_fuzz_rpc_maps_only_raise_frame_error(obj):
    with contextlib.suppress(FrameError):
        decoded = decode_rpc(msgpack.packb(obj, use_bin_type=True))
        assert type(decoded["code"]) is int and type(decoded["opaque"]) is int


# --------------------------------------------------------------------------- frames
class ChunkStream(trio.abc.ReceiveStream):
    """Hands out predetermined chunks, then end of stream."""

    def __init__(self, chunks):
        self.chunks = list(chunks)

    async def receive_some(self, max_bytes=None):
        await trio.lowlevel.checkpoint()
        return self.chunks.pop(0) if self.chunks else b""

    async def aclose(self):
        pass


async def read_all(stream, **kw):
    return [frame async for frame in FrameReader(stream, **kw)]


frames_st = st.lists(st.tuples(st.integers(0, 1), st.binary(max_size=300)), max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames_st, st.data())
def test_reader_handles_any_split(frames, data):
    wire = b"".join(pack_frame(ch, p) for ch, p in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    edges = [0, *cuts, len(wire)]
    chunks = [wire[a:b] for a, b in itertools.pairwise(edges) if b > a]
    assert trio.run(read_all, ChunkStream(chunks)) == frames


async def test_reader_over_lockstep_stream():
    frames = [(i % 2, bytes([i]) * (i * 37)) for i in range(40)]
    send, recv = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:

        async def writer():
            w = FrameWriter(send)
            async with trio.open_nursery() as inner:
                inner.start_soon(w.run)
                for ch, p in frames:
                    w.write(ch, p)
                    await trio.sleep(0)
                w.close()
            await send.aclose()  # the stream is the writer's owner's to close

        nursery.start_soon(writer)
        got = await read_all(recv, receive_size=7)
    assert got == frames


async def test_oversized_frame_rejected():
    header_only = pack_frame(0, b"x" * 101)[:5]
    with pytest.raises(FrameError, match="limit"):
        await read_all(ChunkStream([header_only]), max_frame_bytes=100)
    assert await read_all(ChunkStream([pack_frame(1, b"y" * 100)]), max_frame_bytes=100) == [
        (1, b"y" * 100)
    ]
    w = FrameWriter(ChunkStream([]), max_frame_bytes=100)
    with pytest.raises(FrameError):
        w.write(0, b"z" * 101)


async def test_truncated_stream_is_a_frame_error():
    with pytest.raises(FrameError, match="inside a frame"):
        await read_all(ChunkStream([pack_frame(0, b"abc")[:-1]]))


class RecordingStream(trio.abc.SendStream):
    def __init__(self):
        self.sends = []

    async def send_all(self, data):
        self.sends.append(bytes(data))
        await trio.sleep(0.01)

    async def wait_send_all_might_not_block(self):
        pass

    async def aclose(self):
        pass


async def test_writer_batches_frames_into_one_send():
    stream = RecordingStream()
    w = FrameWriter(stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        for i in range(100):
            w.write(0, b"m%d" % i)
        await trio.sleep(0.001)  # first batch in flight
        for i in range(100, 150):
            w.write(1, b"m%d" % i)
        w.close()
    assert len(stream.sends) == 2
    frames = await read_all(ChunkStream(stream.sends))
    assert frames == [(0 if i < 100 else 1, b"m%d" % i) for i in range(150)]
    with pytest.raises(trio.ClosedResourceError):
        w.write(0, b"late")


# --------------------------------------------------------------------------- transport
class Node:
    """A transport plus what it received, for the tests."""

    def __init__(self, self_id, peers, rpc_handler=None, **kw):
        self.received = []
        self.failed = []
        self.got = trio.Event()
        self.transport = PeerTransport(
            self_id, peers, self._on_message, self._on_failed, rpc_handler, **kw
        )

    def _on_message(self, msg):
        self.received.append(msg)
        self.got.set()

    def _on_failed(self, msg):
        self.failed.append(msg)
        self.got.set()

    async def wait_for(self, predicate, timeout=5):
        with trio.fail_after(timeout):
            while not predicate():
                await self.got.wait()
                self.got = trio.Event()


def hb(src, dst, seq):
    return HeartBeatRequest(G, src, dst, src, 3, seq=seq)


async def test_two_transports_exchange_messages_both_ways(nursery):
    peers = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    a, b = Node("a", peers), Node("b", peers)
    await nursery.start(a.transport.serve)
    await nursery.start(b.transport.serve)

    for seq in range(500):
        a.transport.send(hb("a", "b", seq))
        b.transport.send(HeartBeatResponse(G, "b", "a", "a", 3, Code.SUCCESS, seq=seq))
    a.transport.send(attrs.evolve(SAMPLES[5], local_id="a", remote_id="b"))  # 10 KiB push
    await b.wait_for(lambda: len(b.received) == 501)
    await a.wait_for(lambda: len(a.received) == 500)
    assert [m.seq for m in b.received[:500]] == list(range(500))  # per-link FIFO
    assert b.received[500].entries == SAMPLES[5].entries
    assert [m.seq for m in a.received] == list(range(500))
    assert not a.failed and not b.failed
    assert a.transport.is_connected("b") and b.transport.is_connected("a")


async def test_the_end_of_each_chunk_read_follows_its_messages(nursery):
    """`on_chunk_end` comes after the messages of every chunk read, so a driver can do
    once per read what each message asks for (a follower's fsync)."""
    peers = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    a = Node("a", peers)
    b = Node("b", peers, on_chunk_end=lambda: b.received.append(END))
    END = "chunk end"
    await nursery.start(a.transport.serve)
    await nursery.start(b.transport.serve)
    for seq in range(500):  # queued at once: the writer sends them in a few writes
        a.transport.send(hb("a", "b", seq))
    await b.wait_for(lambda: sum(m is not END for m in b.received) == 500)
    await b.wait_for(lambda: b.received[-1] is END)
    assert [m.seq for m in b.received if m is not END] == list(range(500))
    chunks = b.received.count(END)
    assert 1 <= chunks < 500, chunks  # several messages to a chunk


async def test_a_chunk_cut_short_by_a_bad_frame_still_ends(nursery):
    """The messages before a malformed frame were handed over, so what they asked for
    (an fsync the driver holds until the chunk ends) must still start."""
    peers = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    END = "chunk end"
    b = Node("b", peers, on_chunk_end=lambda: b.received.append(END))
    await nursery.start(b.transport.serve)
    good = pack_frame(peer_frames.PEER, encode_message(hb("a", "b", 1)))
    stream = await trio.open_tcp_stream("127.0.0.1", int(peers["b"].rsplit(":", 1)[1]))
    await stream.send_all(good + pack_frame(0, b"\xc1not msgpack"))
    with trio.fail_after(5):
        assert await stream.receive_some(100) == b""  # closed by b
    await stream.aclose()
    assert [getattr(m, "seq", m) for m in b.received] == [1, END]


async def test_send_failed_for_requests_to_an_absent_peer(nursery):
    peers = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}  # b never runs
    a = Node("a", peers, reconnect_backoff_s=10)
    await nursery.start(a.transport.serve)

    vote = VoteRequest(G, "a", "b", "a", 4, 10, 3, seq=1)
    a.transport.send(vote)
    a.transport.send(VoteResponse(G, "a", "b", None, 4, VoteResult.ACCEPT))  # not reported
    await a.wait_for(lambda: len(a.failed) == 1)
    assert a.failed == [vote]

    # while backing off, requests are reported (from a task, not inside send) and dropped
    a.transport.send(hb("a", "b", 2))
    assert len(a.failed) == 1
    await a.wait_for(lambda: len(a.failed) == 2)
    assert a.failed[1].seq == 2
    assert not a.transport.is_connected("b")


def test_oversized_message_raises_at_the_sender():
    peers = {"a": "127.0.0.1:1", "b": "127.0.0.1:2"}
    t = PeerTransport("a", peers, print, print, max_frame_bytes=1000)
    big = attrs.evolve(SAMPLES[5], local_id="a", remote_id="b", entries=b"x" * 2000)
    with pytest.raises(FrameError, match="frame limit"):
        t.send(big)


async def test_reconnects_after_peer_restart(nursery):
    peers = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    a, b = Node("a", peers, reconnect_backoff_s=0.02), Node("b", peers)
    await nursery.start(a.transport.serve)
    scope = trio.CancelScope()
    await nursery.start(serve_in, scope, b.transport.serve)
    a.transport.send(hb("a", "b", 0))
    await b.wait_for(lambda: len(b.received) == 1)

    scope.cancel()  # b goes away
    with trio.fail_after(5):
        while a.transport.is_connected("b"):
            await trio.sleep(0.01)
    b2 = Node("b", peers)
    await nursery.start(b2.transport.serve)
    with trio.fail_after(5):
        seq = 1
        while not b2.received:
            a.transport.send(hb("a", "b", seq))
            seq += 1
            await trio.sleep(0.01)


async def serve_in(scope, serve, task_status=trio.TASK_STATUS_IGNORED):
    """Run a transport under `scope`, so a test can stop one node and keep the others."""
    with scope:
        await serve(task_status=task_status)


async def echo_handler(request):
    await trio.sleep(random.random() * 0.02)
    if request.get("boom"):
        raise RuntimeError("boom")
    return {"code": Code.SUCCESS, "echo": request["n"]}


async def test_rpc_round_trip_with_200_concurrent_calls(nursery):
    port = free_port()
    server = Node("a", {"a": f"127.0.0.1:{port}"}, rpc_handler=echo_handler)
    await nursery.start(server.transport.serve)

    results = {}
    async with RpcClient(f"127.0.0.1:{port}") as client:

        async def one(n):
            results[n] = await client.call({"code": RpcCode.APPEND, "group": G, "n": n})

        async with trio.open_nursery() as calls:
            for n in range(200):
                calls.start_soon(one, n)
        assert client.in_flight == 0
        failed = await client.call({"code": RpcCode.STATUS, "group": G, "n": 0, "boom": 1})
    assert sorted(results) == list(range(200))
    assert all(r["echo"] == n and r["code"] == Code.SUCCESS for n, r in results.items())
    assert all(r["remark"] == "" for r in results.values())
    assert failed["code"] == Code.INTERNAL_ERROR and "boom" in failed["remark"]


async def test_malformed_frames_close_only_that_connection(nursery):
    port = free_port()
    server = Node("a", {"a": f"127.0.0.1:{port}"}, rpc_handler=echo_handler, max_frame_bytes=1024)
    await nursery.start(server.transport.serve)
    for garbage in (
        pack_frame(0, b"\xc1not msgpack"),
        pack_frame(RPC, msgpack.packb({"code": 1})),  # no opaque
        pack_frame(7, b""),  # unknown channel
        pack_frame(0, b"x" * 2000)[:5],  # oversized
    ):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(garbage)
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""  # closed by the server
        await stream.aclose()
    async with RpcClient(f"127.0.0.1:{port}") as client:
        assert (await client.call({"code": RpcCode.GET, "n": 5}))["echo"] == 5
    assert not server.received


async def test_rpc_client_unavailable_and_timeout(nursery):
    with pytest.raises(RpcUnavailable):
        async with RpcClient(f"127.0.0.1:{free_port()}", connect_timeout_s=1):
            pass

    async def slow(request):
        await trio.sleep_forever()

    port = free_port()
    server = Node("a", {"a": f"127.0.0.1:{port}"}, rpc_handler=slow)
    scope = trio.CancelScope()
    await nursery.start(serve_in, scope, server.transport.serve)
    async with RpcClient(f"127.0.0.1:{port}") as client:
        with pytest.raises(RpcTimeout):
            await client.call({"code": RpcCode.METADATA}, timeout_s=0.05)

        async def stop_server_soon():
            await trio.sleep(0.05)
            scope.cancel()

        nursery.start_soon(stop_server_soon)
        with pytest.raises(RpcUnavailable):
            await client.call({"code": RpcCode.METADATA}, timeout_s=5)
        with pytest.raises(RpcUnavailable):
            await client.call({"code": RpcCode.METADATA})


async def test_rpc_client_errors_leave_the_block_unwrapped(nursery):
    async def slow(request):
        await trio.sleep_forever()

    port = free_port()
    server = Node("a", {"a": f"127.0.0.1:{port}"}, rpc_handler=slow)
    await nursery.start(server.transport.serve)
    with pytest.raises(RpcTimeout):
        async with RpcClient(f"127.0.0.1:{port}") as client:
            await client.call({"code": RpcCode.STATUS}, timeout_s=0.02)
    with pytest.raises(RpcUnavailable, match="closed"):
        await client.call({"code": RpcCode.STATUS})
