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
from raftmq.streams.idle import ConnectionCap, ReceiveClock, close_when_idle

__all__ = ["DEFAULT_IDLE_S", "DEFAULT_MAX_CONNECTIONS", "RemotingServer", "listen_host"]

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 120.0  # RocketMQ's serverChannelMaxIdleTimeSeconds; clients beat every 30 s
DEFAULT_MAX_CONNECTIONS = 10_000


def listen_host(bind_address: str) -> str | None:
    """A RocketMQ `bindAddress` as RemotingServer's host. Its default 0.0.0.0 means
    every interface, IPv6 too (Java binds a dual-stack socket), which trio spells None;
    trio given "0.0.0.0" would listen on IPv4 only."""
    return None if bind_address in ("", "0.0.0.0") else bind_address


class RemotingServer:
    """Serve `processor` on `host:port` (port 0 picks a free port; `serve` reports it).

    A connection that sends nothing for `idle_s` is closed, and past `max_connections`
    open ones a new connection is closed at once (`streams.idle`), so a storm of
    connections that each send half a frame holds bounded memory for a bounded time.

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
        self.connections: set[Connection] = set()
        self._cap = ConnectionCap("remoting server", max_connections)

    @property
    def address(self) -> str:
        return f"{self.host or '0.0.0.0'}:{self.port}"

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; `task_status.started(port)` once bound."""
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("remoting server listening on %s", self.address)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.port)

    async def _handle(self, stream: trio.SocketStream) -> None:
        # trio's SocketStream already sets TCP_NODELAY: a lone response must not wait
        # for an ACK to leave.
        if not self._cap.admit():
            await trio.aclose_forcefully(stream)
            return
        try:
            await self._serve_connection(stream)
        finally:
            self._cap.release()

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        clock = ReceiveClock(stream)
        connection = Connection(
            clock,
            self.processor,
            max_frame_bytes=self.max_frame_bytes,
            max_pending_bytes=self.max_pending_bytes,
            max_running_requests=self.max_running_requests,
            on_close=self._connection_closed,
        )
        self.connections.add(connection)
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
