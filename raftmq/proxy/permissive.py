"""`tls.server.mode=permissive`: TLS and plaintext gRPC clients on one port.

Apache's proxy sniffs each new connection's first byte (Netty's OptionalSslHandler): a
TLS handshake record starts with 0x16, an HTTP/2 client preface with `P`. grpcio's
server has no such hook: a port is either secure or not. So in permissive mode the gRPC
server listens on two loopback ports, one of each, and this front owns the public port:
it reads a connection's first byte, connects to the matching inner port, and relays
bytes both ways until either side ends. The cost is one more hop (a loopback connection
and a copy each way) for every connection, in this mode only; the gRPC server sees
every client as coming from 127.0.0.1.
"""

from __future__ import annotations

import logging

import trio

log = logging.getLogger(__name__)

TLS_HANDSHAKE = 0x16  # the first byte of a TLS record carrying a ClientHello
FIRST_BYTE_TIMEOUT_S = 10.0  # a connection that says nothing is closed
RELAY_BYTES = 64 * 1024


async def _relay(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    while data := await source.receive_some(RELAY_BYTES):
        await sink.send_all(data)


async def _serve_one(stream: trio.SocketStream, tls_port: int, plain_port: int) -> None:
    async with stream:
        with trio.move_on_after(FIRST_BYTE_TIMEOUT_S):
            first = await stream.receive_some(1)
        if not first:  # closed, or silent past the timeout
            return
        inner_port = tls_port if first[0] == TLS_HANDSHAKE else plain_port
        async with await trio.open_tcp_stream("127.0.0.1", inner_port) as inner:
            await inner.send_all(first)
            async with trio.open_nursery() as nursery:

                async def both_ways(source, sink) -> None:
                    await _relay(source, sink)
                    nursery.cancel_scope.cancel()  # one side ended: so does the other

                nursery.start_soon(both_ways, stream, inner)
                nursery.start_soon(both_ways, inner, stream)


async def serve_permissive(
    host: str, port: int, tls_port: int, plain_port: int, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the public `host:port` in front of the gRPC server's inner TLS and plaintext
    ports; reports the bound port. OSError if it cannot bind."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await _serve_one(stream, tls_port, plain_port)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("permissive front: %r", exc)  # a client or the server went away

    await trio.serve_listeners(handler, listeners)
