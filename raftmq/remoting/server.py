"""`RemotingServer`: RocketMQ remoting over trio TCP (`NettyRemotingServer`).

Each accepted connection is a `Connection` running in the server's nursery: a reader
that decodes frames and hands each request to the processor in a task of its own, a
writer that batches responses into one `send_all`, and the rules of
`processRequestCommand` (see connection.py). Nothing a client sends can stop the
server: a malformed frame closes that one connection, a processor exception becomes
a SYSTEM_ERROR response, and any other failure of a connection is logged and ends
only that connection. Shutting the server down is cancelling `serve`.

The broker keeps the `Connection` a request arrived on (it is the processor's second
argument) to push its own requests later: `connection.invoke_oneway(...)` for
NOTIFY_CONSUMER_IDS_CHANGED, `await connection.invoke(...)` for
GET_CONSUMER_RUNNING_INFO. `on_disconnect` tells it when to forget a client, as
Java's `ChannelEventListener.onChannelClose` does.

With `tls` (a `transport.tls.ServerTls`), a connection is wrapped in TLS before its
`Connection` exists: enforcing closes a connection whose first byte does not open a TLS
handshake, permissive serves it plain, and a handshake that fails (a client without
the certificate `require` asks for, one the trust file does not vouch for) is logged
and closes that connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from raftmq.remoting.codec import MAX_FRAME_BYTES
from raftmq.remoting.connection import (
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_MAX_RUNNING_REQUESTS,
    Connection,
)
from raftmq.remoting.processor import Processor
from raftmq.transport.idle import ConnectionCap, ReceiveClock, close_when_idle
from raftmq.transport.tls import ServerTls, starts_with_tls

__all__ = ["DEFAULT_IDLE_S", "DEFAULT_MAX_CONNECTIONS", "RemotingServer", "listen_host"]

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 120.0  # RocketMQ's serverChannelMaxIdleTimeSeconds; clients beat every 30 s
# A frame begun must be complete this long after its first byte (a 4 MiB message at 1 Mbit/s
# takes 32 s), or the connection is closed: a peer trickling a frame is never idle.
DEFAULT_FRAME_DEADLINE_S = 60.0
DEFAULT_MAX_CONNECTIONS = 10_000
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a connection that stalls its handshake holds a slot no longer


def listen_host(bind_address: str) -> str | None:
    """A RocketMQ `bindAddress` as RemotingServer's host. Its default 0.0.0.0 means
    every interface, IPv6 too (Java binds a dual-stack socket), which trio spells None;
    trio given "0.0.0.0" would listen on IPv4 only."""
    return None if bind_address in ("", "0.0.0.0") else bind_address


class RemotingServer:
    """Serve `processor` on `host:port` (port 0 picks a free port; `serve` reports it).

    A connection that sends nothing for `idle_s`, or does not complete a frame within
    `frame_deadline_s` of its first byte, is closed, and past `max_connections` open
    ones a new connection is closed at once (`transport.idle`), so a storm of connections
    that each send half a frame holds bounded memory for a bounded time.

    server = RemotingServer("127.0.0.1", 0, ProcessorTable({...}))
    port = await nursery.start(server.serve)
    """

    def __init__(
        self,
        host: str | None,
        port: int,
        processor: Processor | None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        *,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
        on_connect: Callable[[Connection], None] | None = None,
        on_disconnect: Callable[[Connection], None] | None = None,
        idle_s: float = DEFAULT_IDLE_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: ServerTls | None = None,
        frame_deadline_s: float = DEFAULT_FRAME_DEADLINE_S,
    ) -> None:
        self.host = host
        self.port = port
        self.processor = processor
        self.max_frame_bytes = max_frame_bytes
        self.max_pending_bytes = max_pending_bytes
        self.max_running_requests = max_running_requests
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.idle_s = idle_s
        self.frame_deadline_s = frame_deadline_s
        self.connections: set[Connection] = set()
        self._accepting: trio.CancelScope | None = None
        self._finishing: tuple[float, float] | None = None  # `finish`'s (quiet_s, limit_s)
        self._cap = ConnectionCap("remoting server", max_connections)
        self.tls = tls if tls is not None and tls.enabled else None
        # Built here so that a bad certificate or key file fails the start, not a connection.
        self._tls_context = None if self.tls is None else self.tls.context()

    @property
    def address(self) -> str:
        return f"{self.host or '0.0.0.0'}:{self.port}"

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; `task_status.started(port)` once bound."""
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        await self.serve_listeners(listeners, task_status=task_status)

    async def serve_listeners(
        self,
        listeners: list[trio.SocketListener],
        task_status=trio.TASK_STATUS_IGNORED,
        *,
        handler_nursery: trio.Nursery | None = None,
    ) -> None:
        """Serve on `listeners`, bound by the caller (one that must see a failed bind as
        an OSError of its own, not inside a nursery's exception group), until cancelled
        or, after `finish`, until the connections have ended; with `handler_nursery`
        they run there instead, and `finish` returns at once (the caller may listen
        again while the last ones end)."""
        self.port = listeners[0].socket.getsockname()[1]
        log.info(
            "remoting server listening on %s (TLS %s)",
            self.address,
            "disabled" if self.tls is None else self.tls.mode,
        )
        self._finishing = None
        async with trio.open_nursery() as connections:
            self._accepting = trio.CancelScope()
            connections.start_soon(
                self._accept, self._accepting, listeners, handler_nursery or connections
            )
            task_status.started(self.port)

    async def _accept(self, scope: trio.CancelScope, listeners, connections) -> None:
        with scope:  # the listeners close when it is cancelled; the connections go on
            await trio.serve_listeners(self._handle, listeners, handler_nursery=connections)

    def finish(self, quiet_s: float, limit_s: float) -> None:
        """Stop accepting at once and end every connection once it has gone quiet with
        everything answered (`Connection.finish`, at most `limit_s` later), so that its
        clients' next requests go to new connections; `serve_listeners` returns when
        the last has ended. Never blocks."""
        self._finishing = (quiet_s, limit_s)
        if self._accepting is not None:
            self._accepting.cancel()
        for connection in list(self.connections):
            connection.finish(quiet_s, limit_s)

    async def serve_accepted(self, stream: trio.SocketStream) -> None:
        """Serve one connection another listener accepted: a port shared with another
        protocol (the controller's DLedger peer port, `dledger.net.tcp`)."""
        await self._handle(stream)

    async def _handle(self, stream: trio.SocketStream) -> None:
        # trio's SocketStream already sets TCP_NODELAY: a lone response must not wait
        # for an ACK to leave.
        if not self._cap.admit():
            await trio.aclose_forcefully(stream)
            return
        try:
            served = stream if self.tls is None else await self._secure(stream)
            if served is not None:
                await self._serve_connection(served)
        finally:
            self._cap.release()

    async def _secure(self, stream: trio.SocketStream) -> trio.abc.Stream | None:
        """`stream` as TLS demands: wrapped and handshaken, as it is (permissive and
        plain), or None (closed) when refused."""
        peer = peer_name(stream)
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT_S):
                if not await starts_with_tls(stream):
                    if self.tls.mode == "permissive":
                        return stream
                    log.warning("refusing a plain connection from %s: TLS is enforced", peer)
                    await trio.aclose_forcefully(stream)
                    return None
                secured = trio.SSLStream(stream, self._tls_context, server_side=True)
                await secured.do_handshake()
                return secured
        except (trio.BrokenResourceError, trio.TooSlowError, OSError) as exc:
            log.warning("TLS handshake with %s failed: %s", peer, _reason(exc))
            await trio.aclose_forcefully(stream)
            return None

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        clock = ReceiveClock(stream)
        connection = Connection(
            clock,
            self.processor,
            max_frame_bytes=self.max_frame_bytes,
            max_pending_bytes=self.max_pending_bytes,
            max_running_requests=self.max_running_requests,
            on_close=self._connection_closed,
            frame_deadline_s=self.frame_deadline_s,
        )
        self.connections.add(connection)
        if self._finishing is not None:  # accepted just before the server finished
            connection.finish(*self._finishing)
        try:
            if self.on_connect is not None:
                self.on_connect(connection)
            async with trio.open_nursery() as watch:
                watch.start_soon(
                    close_when_idle,
                    clock,
                    self.idle_s,
                    lambda: connection.close(f"nothing received for {self.idle_s} s"),
                )
                await connection.run()
                watch.cancel_scope.cancel()
        except Exception:  # a bug must end this connection, not the server
            log.exception("connection from %s failed", connection.remote_address)
            connection.close("internal error")
            await trio.aclose_forcefully(stream)
        finally:
            self.connections.discard(connection)

    def _connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if self.on_disconnect is not None:
            self.on_disconnect(connection)


def peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


def _reason(exc: BaseException) -> str:
    """The SSL error under trio's BrokenResourceError, which says only that it broke."""
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"
