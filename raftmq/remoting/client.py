"""`RemotingClient`: one pipelined remoting connection (`NettyRemotingClient`, one channel).

One connection carries any number of concurrent calls: each request gets a fresh
opaque and the connection's reader routes responses back by it, so hundreds of
requests can be in flight without a connection each, and everything written while a
send is in flight leaves in one batch. Requests the server sends to the client
(NOTIFY_CONSUMER_IDS_CHANGED, ...) go to `processor`, as on the server side.

    async with RemotingClient("127.0.0.1:9876") as client:
        route = await client.invoke(
            RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "T"}),
            timeout_s=3,
        )

Failures are exceptions of their own: RemotingConnectError when the server cannot be
reached or the connection breaks (every pending call fails at once, and every later
one; open a new client to reconnect), RemotingTimeoutError when one call's answer is
late (the connection stays up).

With `tls` (a `transport.tls.ClientTls` with `enable`), the connection is TLS, handshaken
before `__aenter__` returns, so a server that refuses the client's certificate, or
whose own does not verify, is a RemotingConnectError there.

With `credentials` (RocketMQ's ACL account), every request is signed on its way out
(`signing.sign`, what Java's AclClientRPCHook does).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio

from raftmq.config.address import parse_address
from raftmq.remoting.codec import MAX_FRAME_BYTES
from raftmq.remoting.command import RemotingCommand
from raftmq.remoting.connection import DEFAULT_MAX_PENDING_BYTES, Connection
from raftmq.remoting.errors import RemotingConnectError
from raftmq.remoting.processor import Processor
from raftmq.remoting.signing import SessionCredentials, sign
from raftmq.transport.tls import ClientTls

__all__ = ["RemotingClient"]


class RemotingClient:
    """`async with RemotingClient(address) as c: await c.invoke(request)`.

    The connection's tasks live in a nursery opened by `__aenter__` and cancelled by
    `__aexit__`, so leaving the block stops everything, pending calls included.
    """

    def __init__(
        self,
        address: str,
        *,
        processor: Processor | None = None,
        connect_timeout_s: float = 3.0,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self.address = address
        self.credentials = credentials
        self.host, self.port = parse_address(address)
        self.processor = processor
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.max_pending_bytes = max_pending_bytes
        self.tls = tls if tls is not None and tls.enable else None
        self._connection: Connection | None = None
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> RemotingClient:
        if self._stack is not None:
            raise RuntimeError("RemotingClient is already open")
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(self.host, self.port)
                if self.tls is not None:
                    stream = await self._secure(stream)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            cause = exc.__cause__ or exc
            raise RemotingConnectError(f"cannot connect to {self.address}: {cause!r}") from exc
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        self._connection = Connection(
            stream,
            self.processor,
            max_frame_bytes=self.max_frame_bytes,
            max_pending_bytes=self.max_pending_bytes,
        )
        self._nursery.start_soon(self._connection.run)
        return self

    async def _secure(self, stream: trio.SocketStream) -> trio.SSLStream:
        secured = trio.SSLStream(stream, self.tls.context(), server_hostname=self.host)
        try:
            await secured.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return secured

    async def __aexit__(self, *exc_info) -> None:
        # The body's exception is not handed to the nursery, which would wrap it in an
        # ExceptionGroup: a RemotingTimeoutError leaving the block stays one.
        self._connection.close("client closed")
        self._nursery.cancel_scope.cancel()
        stack, self._stack = self._stack, None
        await stack.aclose()

    @property
    def connection(self) -> Connection:
        if self._connection is None:
            raise RemotingConnectError(f"client for {self.address} is not open")
        return self._connection

    @property
    def closed(self) -> bool:
        """True once the connection has failed or the client was closed."""
        return self._connection is None or self._connection.closed

    @property
    def in_flight(self) -> int:
        return 0 if self._connection is None else self._connection.in_flight

    async def invoke(self, request: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        """Send `request` (a fresh opaque is stamped on it) and return the response."""
        if self.credentials is not None:
            sign(request, self.credentials)
        return await self.connection.invoke(request, timeout_s)

    def invoke_oneway(self, request: RemotingCommand) -> None:
        """Send `request` with the oneway flag; returns at once, no response comes."""
        if self.credentials is not None:
            sign(request, self.credentials)
        self.connection.invoke_oneway(request)
