"""`ConnectionPool`: one pipelined RemotingClient per address, reopened when it dies.

RocketMQ's `NettyRemotingClient.channelTables`: every request to a broker or name
server goes over the one connection to that address, so hundreds of concurrent sends
share it (the connection matches answers by opaque; nothing here holds a lock across
a round trip). The only lock is per address and only while connecting, so that many
first callers open one connection, not one each.

Each connection runs as a task in the pool's nursery and ends when its peer goes
away; the next `get` opens a new one. Leaving the pool's `async with` closes them all.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio

from raftmq.remoting import RemotingClient, RemotingCommand
from raftmq.remoting.processor import Processor
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """`async with ConnectionPool(processor) as pool: await pool.invoke(addr, request)`.

    `processor` answers requests the servers send (NOTIFY_CONSUMER_IDS_CHANGED);
    with `credentials` every request is signed (RocketMQ's ACL).
    """

    def __init__(
        self,
        processor: Processor | None = None,
        connect_timeout_s: float = 3.0,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
    ):
        self.processor = processor
        self.credentials = credentials
        self.tls = tls  # `tls.enable`: every connection of the pool is TLS
        self.connect_timeout_s = connect_timeout_s
        self._clients: dict[str, RemotingClient] = {}
        self._connecting: dict[str, trio.Lock] = {}
        self._nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> ConnectionPool:
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info) -> None:
        self._nursery.cancel_scope.cancel()
        stack, self._stack = self._stack, None
        await stack.aclose()

    def open_client(self, address: str) -> RemotingClient | None:
        """The open connection to `address`, if there is one (no waiting: a send's
        common case, which then needs no connect timeout)."""
        client = self._clients.get(address)
        return client if client is not None and not client.closed else None

    async def get(self, address: str) -> RemotingClient:
        """The open connection to `address`, connecting first if there is none.

        Raises RemotingConnectError when the address cannot be reached; nothing has
        been sent then.
        """
        client = self.open_client(address)
        if client is not None:
            return client
        lock = self._connecting.setdefault(address, trio.Lock())
        async with lock:
            client = self._clients.get(address)
            if client is None or client.closed:
                client = await self._nursery.start(self._hold, address)
                self._clients[address] = client
            return client

    async def invoke(
        self, address: str, request: RemotingCommand, timeout_s: float
    ) -> RemotingCommand:
        client = await self.get(address)
        return await client.invoke(request, timeout_s)

    async def _hold(self, address: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
        client = RemotingClient(
            address,
            processor=self.processor,
            connect_timeout_s=self.connect_timeout_s,
            tls=self.tls,
            credentials=self.credentials,
        )
        async with client:
            task_status.started(client)
            await client.connection.wait_closed()
        if self._clients.get(address) is client:
            del self._clients[address]
