"""A frame begun must be completed within a deadline, on the remoting port and on the
DLedger peer port: a peer that sends a frame's header and then trickles the rest a
byte at a time is never idle, so only this limit closes it. A peer that sends whole
frames, however far apart, is not affected."""

from __future__ import annotations

import struct

import trio
from raftmq.dledger.core.messages import HeartBeatRequest
from raftmq.dledger.net.frames import PEER
from raftmq.dledger.net.tcp import PeerTransport
from raftmq.namesrv.processor import NamesrvProcessor
from raftmq.namesrv.routes import RouteInfoManager

from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.remoting.server import RemotingServer
from raftmq.tools.dledger_local import free_ports

DEADLINE_S = 1.0


async def closed_after_s(port: int, header: bytes) -> float:
    """Send `header` (a frame announcing 1000 bytes), then a byte every 0.1 s; how long
    until the server closes the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    started = trio.current_time()  # before the send: the server may read it at once
    await stream.send_all(header)

    async def trickle() -> None:
        try:
            while True:
                await trio.sleep(0.1)
                await stream.send_all(b"x")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        with trio.fail_after(10):
            try:
                while await stream.receive_some(1):
                    pass
            except trio.BrokenResourceError:
                pass
        nursery.cancel_scope.cancel()
    await stream.aclose()
    return trio.current_time() - started


async def test_a_remoting_connection_that_trickles_a_frame_is_closed_at_the_deadline(nursery):
    processor = NamesrvProcessor(RouteInfoManager(), lambda: 0).table()
    server = RemotingServer("127.0.0.1", 0, processor, idle_s=30, frame_deadline_s=DEADLINE_S)
    port = await nursery.start(server.serve)
    elapsed = await closed_after_s(port, struct.pack(">I", 1000))
    assert DEADLINE_S <= elapsed < 3 * DEADLINE_S
    async with RemotingClient(f"127.0.0.1:{port}") as client:  # whole frames, far apart
        for _ in range(6):
            request = RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)
            assert (await client.invoke(request, 5.0)).code == ResponseCode.SUCCESS
            assert len(server.connections) == 1  # the same one throughout
            await trio.sleep(0.4)


async def test_a_peer_connection_that_trickles_a_frame_is_closed_at_the_deadline(nursery):
    a_port, b_port = free_ports(2)
    peers = {"a": f"127.0.0.1:{a_port}", "b": f"127.0.0.1:{b_port}"}
    received = []
    a = PeerTransport("a", peers, received.append, print, idle_s=30, frame_deadline_s=DEADLINE_S)
    await nursery.start(a.serve)
    elapsed = await closed_after_s(a_port, struct.pack(">IB", 1000, PEER))
    assert DEADLINE_S <= elapsed < 3 * DEADLINE_S
    b = PeerTransport("b", peers, print, print)
    await nursery.start(b.serve)
    for term in range(1, 7):  # whole frames, far apart, on one connection
        b.send(HeartBeatRequest("broker-t", "b", "a", "b", term))
        await trio.sleep(0.4)
    assert [msg.term for msg in received] == [1, 2, 3, 4, 5, 6]
