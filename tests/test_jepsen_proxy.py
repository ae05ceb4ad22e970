"""The fault proxy over real sockets: an echo server (or one that reads remoting frames)
behind it, a client in front; and where a cut falls among frames.

Every wait is bounded: "nothing arrives" is a read under a short `move_on_after`,
and each test runs under `fail_after`, so a regression fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import functools
import random
import socket
import struct

import pytest
import trio

from jepsen.proxy import LinkProxy, ProxyNet, _Frames
from raftmq.config.address import parse_address
from raftmq.remoting import RemotingCommand, RemotingError, RequestCode, encode
from raftmq.remoting.frames import FrameReader
from raftmq.tools.dledger_local import free_ports

QUIET_S = 0.15  # how long "nothing arrives" is watched for
# How long a probe through a ProxyNet waits for its echo. It is also how long a probe of a
# blackholed link takes, but those run in parallel; 0.15 s was too short for the six
# first connections of a fresh ProxyNet on a loaded CI machine (every probe failed).
ANSWER_S = 1.0
REMOTING_HEADER_BYTES = 4  # the bytes of a remoting frame before those its length counts
LIMIT_S = 20  # a hang guard, not a speed check


class Echo:
    """An echo server that records, per connection, every byte it received."""

    def __init__(self) -> None:
        self.received: list[bytearray] = []
        self.closed: list[trio.Event] = []
        self.address = ""

    async def closed_nth(self, i: int) -> bytes:
        """Wait for connection i (from 0) to arrive and end; return what it received."""
        while len(self.closed) <= i:
            await trio.sleep(0.005)
        await self.closed[i].wait()
        return bytes(self.received[i])

    async def handle(self, stream: trio.SocketStream) -> None:
        data, closed = bytearray(), trio.Event()
        self.received.append(data)
        self.closed.append(closed)
        try:
            async for chunk in stream:
                data += chunk
                await stream.send_all(chunk)
        except trio.BrokenResourceError:
            pass
        finally:
            closed.set()


async def start_echo(nursery: trio.Nursery) -> Echo:
    echo = Echo()
    serve = functools.partial(trio.serve_tcp, echo.handle, 0, host="127.0.0.1")
    [listener] = await nursery.start(serve)
    echo.address = f"127.0.0.1:{listener.socket.getsockname()[1]}"
    return echo


async def start_proxy(nursery: trio.Nursery, upstream: str, seed: int = 1) -> LinkProxy:
    proxy = LinkProxy(upstream, random.Random(seed), frame_header_bytes=REMOTING_HEADER_BYTES)
    await nursery.start(proxy.serve)
    return proxy


async def dial(address: str) -> trio.SocketStream:
    return await trio.open_tcp_stream(*parse_address(address))


async def receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        assert chunk, f"stream ended after {len(data)} of {n} bytes"
        data += chunk
    return bytes(data)


async def roundtrip(stream: trio.SocketStream, payload: bytes) -> bytes:
    await stream.send_all(payload)
    return await receive_exactly(stream, len(payload))


async def quiet(stream: trio.SocketStream) -> bool:
    """True if nothing (not even an end of stream) arrives within QUIET_S."""
    with trio.move_on_after(QUIET_S):
        await stream.receive_some(1)
        return False
    return True


async def ended(stream: trio.SocketStream) -> bool:
    """True if the stream ends (EOF or reset) before any byte arrives."""
    try:
        return await stream.receive_some(1) == b""
    except trio.BrokenResourceError:
        return True


async def refused(address: str) -> bool:
    """True if a connection is reset, whether before or after connect() returns."""
    try:
        stream = await dial(address)
    except OSError:
        return True
    return await ended(stream)


@pytest.fixture
async def echo(nursery):
    return await start_echo(nursery)


@pytest.fixture
async def proxy(nursery, echo):
    return await start_proxy(nursery, echo.address)


async def test_pass_forwards_both_ways_with_backpressure(proxy, echo):
    with trio.fail_after(LIMIT_S):
        assert proxy.address == f"127.0.0.1:{proxy.port}"
        assert proxy.mode == "pass"
        client = await dial(proxy.address)
        assert await roundtrip(client, b"hello") == b"hello"
        # Far more than the proxy holds in flight: only flows if every hop awaits send_all.
        big = random.Random(0).randbytes(4 * 1024 * 1024)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, big)
            assert await receive_exactly(client, len(big)) == big
        assert bytes(echo.received[0]) == b"hello" + big
        # A client's end of stream reaches the server, whose close comes back.
        await client.send_eof()
        assert await client.receive_some(1) == b""
        await echo.closed_nth(0)


async def test_blackhole_stalls_existing_and_new_connections_until_heal(proxy, echo):
    with trio.fail_after(LIMIT_S):
        old = await dial(proxy.address)
        assert await roundtrip(old, b"before") == b"before"
        proxy.blackhole()
        assert proxy.mode == "blackhole"
        await old.send_all(b"during")
        assert await quiet(old)
        new = await dial(proxy.address)  # the kernel completes it; nothing flows
        await new.send_all(b"new")
        assert await quiet(new)
        assert [bytes(r) for r in echo.received] == [b"before"]  # upstream saw nothing

        proxy.heal()
        # Bytes sent into the partition were held, not dropped: no hole in the stream.
        assert await receive_exactly(old, 6) == b"during"
        assert await receive_exactly(new, 3) == b"new"
        assert await roundtrip(old, b"after") == b"after"
        assert await roundtrip(new, b"again") == b"again"


async def test_blackhole_holds_a_reply_already_in_flight(proxy, echo):
    with trio.fail_after(LIMIT_S):
        client = await dial(proxy.address)
        proxy.latency(100)  # so the echo's reply is still inside the proxy when...
        await client.send_all(b"ping")
        while not echo.received or not echo.received[0]:
            await trio.sleep(0.005)
        proxy.blackhole()  # ...the partition starts: the upstream-to-client direction stalls
        assert await quiet(client)
        proxy.heal()
        assert await receive_exactly(client, 4) == b"ping"


async def test_reset_closes_live_connections_and_refuses_new_ones(proxy, echo):
    with trio.fail_after(LIMIT_S):
        live = await dial(proxy.address)
        assert await roundtrip(live, b"x") == b"x"
        proxy.reset()
        assert proxy.mode == "refuse"
        assert await ended(live)
        await echo.closed_nth(0)  # the upstream side was closed too

        assert await refused(proxy.address)
        assert len(echo.received) == 1  # never dialed upstream

        proxy.heal()
        fresh = await dial(proxy.address)
        assert await roundtrip(fresh, b"y") == b"y"


async def test_latency_delays_each_direction_and_keeps_order(proxy):
    with trio.fail_after(LIMIT_S):
        client = await dial(proxy.address)
        proxy.latency(50)
        start = trio.current_time()
        assert await roundtrip(client, b"slow") == b"slow"
        assert trio.current_time() - start >= 2 * 0.050  # once out, once back

        proxy.latency(5, jitter_ms=40)
        parts = [bytes([i]) * 10 for i in range(20)]
        for part in parts:
            await client.send_all(part)
            await trio.sleep(0.002)  # separate chunks, each with its own jittered delay
        assert await receive_exactly(client, 200) == b"".join(parts)

        proxy.heal()
        start = trio.current_time()
        assert await roundtrip(client, b"fast") == b"fast"
        assert trio.current_time() - start < 2 * 0.050  # less than the latency would cost


async def test_jitter_draws_from_the_given_rng():
    first = LinkProxy("127.0.0.1:1", random.Random(7), frame_header_bytes=REMOTING_HEADER_BYTES)
    second = LinkProxy("127.0.0.1:1", random.Random(7), frame_header_bytes=REMOTING_HEADER_BYTES)
    for proxy in (first, second):
        proxy.latency(10, jitter_ms=20)
    delays = [first._delay() for _ in range(5)]
    assert delays == [second._delay() for _ in range(5)]
    assert all(0.010 <= d <= 0.030 for d in delays)
    assert len(set(delays)) > 1


async def test_cut_after_forwards_exactly_n_bytes_over_the_link(proxy, echo):
    """The count spans connections; these bytes read as the start of one long frame
    per connection, so the n-th byte is inside a frame and the cut falls right after it."""
    with trio.fail_after(LIMIT_S):
        first = await dial(proxy.address)
        proxy.cut_after(10)
        assert proxy.mode == "cut"
        assert await roundtrip(first, b"1234") == b"1234"  # 4 of the 10
        second = await dial(proxy.address)
        await second.send_all(b"abcdefghijklmnopqrst")
        assert await echo.closed_nth(1) == b"abcdef"  # the remaining 6, then cut
        got = bytearray()
        try:
            while chunk := await second.receive_some():
                got += chunk
        except trio.BrokenResourceError:
            pass
        assert b"abcdef".startswith(got)  # what the echo got back out before the cut, if any

        # The budget is spent: back to pass for the old connection and new ones.
        assert proxy.mode == "pass"
        assert await roundtrip(first, b"still") == b"still"
        third = await dial(proxy.address)
        assert await roundtrip(third, b"z" * 100) == b"z" * 100


async def test_a_peer_vanishing_mid_transfer_leaves_the_proxy_serving(proxy, echo):
    with trio.fail_after(LIMIT_S):
        client = await dial(proxy.address)
        big = b"q" * (2 * 1024 * 1024)
        with trio.move_on_after(0.05):
            await client.send_all(big)  # the echo's replies go unread: backpressure stalls it
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.socket.close()  # RST, mid-transfer
        await echo.closed_nth(0)  # passed on to the upstream
        other = await dial(proxy.address)
        assert await roundtrip(other, b"fine") == b"fine"


async def test_upstream_down_resets_the_client(nursery):
    with trio.fail_after(LIMIT_S):
        with trio.socket.socket() as placeholder:  # a port nothing listens on
            await placeholder.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{placeholder.getsockname()[1]}"
        proxy = await start_proxy(nursery, dead)
        client = await dial(proxy.address)
        assert await ended(client)


async def test_bad_arguments():
    with pytest.raises(ValueError):
        LinkProxy("nowhere", random.Random(0), frame_header_bytes=REMOTING_HEADER_BYTES)
    with pytest.raises(ValueError):
        LinkProxy("127.0.0.1:1", random.Random(0), frame_header_bytes=3)
    proxy = LinkProxy("127.0.0.1:1", random.Random(0), frame_header_bytes=REMOTING_HEADER_BYTES)
    with pytest.raises(RuntimeError):
        _ = proxy.address
    with pytest.raises(ValueError):
        proxy.latency(-1)
    with pytest.raises(ValueError):
        proxy.cut_after(-1)


# -- ProxyNet ---------------------------------------------------------------------

NODES = ["a", "b", "c"]


@pytest.fixture
async def servers(nursery):
    return {node: await start_echo(nursery) for node in NODES}


def all_links(servers) -> dict[tuple[str, str], str]:
    return {(s, d): servers[d].address for s in NODES for d in NODES if s != d}


async def link_works(net: ProxyNet, src: str, dst: str) -> bool:
    """Open a fresh connection src -> dst and see whether a byte comes back in time."""
    try:
        stream = await dial(net.address(src, dst))
    except OSError:
        return False  # reset before connect() returned
    async with stream:
        try:
            await stream.send_all(b"?")
            with trio.move_on_after(ANSWER_S):
                return await stream.receive_some(1) == b"?"
        except trio.BrokenResourceError:
            pass
        return False


async def working_links(net: ProxyNet) -> set[tuple[str, str]]:
    result = set()

    async def probe(src, dst):
        if await link_works(net, src, dst):
            result.add((src, dst))

    async with trio.open_nursery() as nursery:
        for src in NODES:
            for dst in NODES:
                if src != dst:
                    nursery.start_soon(probe, src, dst)
    return result


EVERY_LINK = {(s, d) for s in NODES for d in NODES if s != d}


async def test_proxynet_addresses_one_way_grudge_and_heal(servers):
    with trio.fail_after(LIMIT_S):
        async with ProxyNet(
            all_links(servers), random.Random(3), frame_header_bytes=REMOTING_HEADER_BYTES
        ) as net:
            addresses = {net.address(s, d) for s, d in EVERY_LINK}
            assert len(addresses) == len(EVERY_LINK)
            assert await working_links(net) == EVERY_LINK

            net.one_way("a", "b")
            assert await working_links(net) == EVERY_LINK - {("a", "b")}

            # a drops b's traffic: TCP between them dies both ways; apply clears the one-way.
            net.apply({"a": {"b"}})
            assert net.grudge == {"a": {"b"}}
            assert await working_links(net) == EVERY_LINK - {("a", "b"), ("b", "a")}

            net.heal()
            assert net.grudge == {}
            assert await working_links(net) == EVERY_LINK
        addr = next(iter(addresses))
        with pytest.raises(OSError):
            await dial(addr)  # closed with the ProxyNet


async def test_proxynet_reset_cut_and_latency_on_chosen_links(servers):
    with trio.fail_after(LIMIT_S):
        async with ProxyNet(
            all_links(servers), random.Random(3), frame_header_bytes=REMOTING_HEADER_BYTES
        ) as net:
            net.reset([("a", "c")])
            assert await working_links(net) == EVERY_LINK - {("a", "c")}
            net.heal()

            net.cut_after([("b", "c")], 0)
            assert not await link_works(net, "b", "c")  # cut after the byte that opens a frame
            assert net.cuts([("b", "c")]) == 1
            assert await link_works(net, "b", "c")  # then back to pass
            assert net.cuts([("a", "b"), ("b", "c")]) == 1

            net.set_latency(60, links=[("c", "a")])
            start = trio.current_time()
            assert await link_works(net, "a", "c")
            assert trio.current_time() - start < 0.120  # the other direction is not slowed
            start = trio.current_time()
            stream = await dial(net.address("c", "a"))
            assert await roundtrip(stream, b"!") == b"!"
            assert trio.current_time() - start >= 0.120


async def test_proxynet_listens_where_told_for_clients_that_cannot_be_redirected(servers):
    """A client link's proxy sits at the address the broker advertises (on a loopback
    address of its own), since clients dial what the name server gives them."""
    [port] = free_ports(1, ["127.0.0.2"])
    links = {("client", "a"): servers["a"].address, ("client", "b"): servers["b"].address}
    listen = {("client", "a"): f"127.0.0.2:{port}"}
    with trio.fail_after(LIMIT_S):
        async with ProxyNet(
            links, random.Random(3), listen, frame_header_bytes=REMOTING_HEADER_BYTES
        ) as net:
            assert net.address("client", "a") == f"127.0.0.2:{port}"
            assert net.address("client", "b").startswith("127.0.0.1:")
            assert await link_works(net, "client", "a")
            net.apply({"client": {"a"}})  # cut the clients off a only
            assert not await link_works(net, "client", "a")
            assert await link_works(net, "client", "b")


async def test_proxynet_rejects_unknown_nodes_and_passes_body_errors_through(servers):
    with pytest.raises(KeyError):
        async with ProxyNet(
            all_links(servers), random.Random(3), frame_header_bytes=REMOTING_HEADER_BYTES
        ) as net:
            with pytest.raises(ValueError):
                net.apply({"a": {"zz"}})
            raise KeyError("from the body")  # not wrapped in an ExceptionGroup


# -- cutting a request frame --------------------------------------------------------


class FrameServer:
    """Reads remoting frames as a broker does and records how each connection ended.

    With `flood_bytes` it also writes that much to every client, which the test never
    reads, so the proxy holds unread replies when it cuts (as it does in front of a broker
    answering pipelined requests): closing a socket with unread bytes sends an RST.
    """

    def __init__(self, flood_bytes: int = 0) -> None:
        self.flood_bytes = flood_bytes
        self.frames: list[int] = []  # frames decoded, per connection
        self.endings: list[str] = []
        self.ended = trio.Event()
        self.address = ""

    async def handle(self, stream: trio.SocketStream) -> None:
        index = len(self.frames)
        self.frames.append(0)
        try:
            async with trio.open_nursery() as nursery:
                if self.flood_bytes:
                    nursery.start_soon(self._flood, stream)
                try:
                    async for _ in FrameReader(stream):
                        self.frames[index] += 1
                    self.endings.append("end of stream")
                except RemotingError as exc:
                    self.endings.append(str(exc))
                except trio.BrokenResourceError as exc:
                    self.endings.append(f"broken: {exc.__cause__!r}")
                nursery.cancel_scope.cancel()
        finally:
            self.ended.set()

    async def _flood(self, stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(b"r" * self.flood_bytes)


async def start_frame_server(nursery: trio.Nursery, flood_bytes: int = 0) -> FrameServer:
    server = FrameServer(flood_bytes)
    serve = functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
    [listener] = await nursery.start(serve)
    server.address = f"127.0.0.1:{listener.socket.getsockname()[1]}"
    return server


def request(body_bytes: int) -> bytes:
    return encode(RemotingCommand(RequestCode.SEND_MESSAGE, body=b"m" * body_bytes))


@pytest.mark.parametrize("on_boundary", [False, True])
async def test_a_cut_ends_a_request_frame_halfway_even_with_replies_unread(nursery, on_boundary):
    """What the client-link cut-mid-frame fault must do every time a request crosses the
    link: the broker reads a frame that stops halfway, then the end of the stream — not
    a reset (the proxy holds replies it has not read) and not a clean end between frames
    (the byte count landing on a frame boundary)."""
    with trio.fail_after(LIMIT_S):
        server = await start_frame_server(nursery, flood_bytes=8 * 1024 * 1024)
        proxy = await start_proxy(nursery, server.address)
        client = await dial(proxy.address)
        frame = request(200)
        await client.send_all(frame)
        while not server.frames or not server.frames[0]:
            await trio.sleep(0.005)
        await trio.sleep(0.2)  # the flood fills the proxy's buffers: replies wait unread
        proxy.cut_after(len(frame) if on_boundary else len(frame) // 2)
        with contextlib.suppress(trio.BrokenResourceError):
            await client.send_all(frame * 2)  # one chunk holding two requests
        await server.ended.wait()
        assert server.endings[0].startswith("stream ended inside a frame"), server.endings
        assert server.frames[0] == (2 if on_boundary else 1)
        assert (proxy.cuts, proxy.mode) == (1, "pass")


def test_the_cut_point_moves_off_a_frame_boundary_by_one_byte():
    frame = request(10)
    two = frame + frame
    frames = _Frames(REMOTING_HEADER_BYTES)
    assert frames.cut_point(two, 5) == 5  # inside the first frame: cut right there
    assert frames.cut_point(two, len(frame)) == len(frame) + 1  # between: into the next
    assert frames.cut_point(two, 0) == 1  # a fresh connection is between frames too
    assert frames.cut_point(two, len(two)) is None  # the chunk ends between frames
    assert frames.cut_point(two, len(two) + 1) is None  # not reached in this chunk
    frames.advance(two[:3])  # mid length field
    assert frames.cut_point(two[3:], 0) == 0  # already inside a frame: cut at once
    assert frames.cut_point(two[3:], len(frame) - 3) == len(frame) - 2
    # The length field split across chunks, and DLedger's 5-byte header.
    dledger = struct.pack(">IB", 3, 1) + b"abc"
    frames = _Frames(5)
    for i, byte in enumerate(dledger[:-1]):
        assert frames.cut_point(bytes([byte]), 0) == (1 if i == 0 else 0), i
        frames.advance(bytes([byte]))
    assert frames.cut_point(dledger[-1:], 1) is None  # its last byte ends the frame
    frames.advance(dledger[-1:])
    assert frames.cut_point(dledger, 0) == 1
