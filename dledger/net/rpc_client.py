"""A pipelining client for the RPCs a replica serves (CLI, tests, benchmark load).

One connection carries any number of concurrent calls: each request gets a fresh
`opaque`, a reader task routes responses back by it, and all requests written
while a send is in flight leave together in one batch. That is what lets one load
generator keep hundreds of appends in flight without a connection per request.

    async with RpcClient("127.0.0.1:20911") as client:
        resp = await client.call({"code": RpcCode.APPEND, "group": "g0", ...}, timeout_s=3)
"""

from __future__ import annotations

import itertools
import logging
from contextlib import AsyncExitStack

import trio
from raftmq.dledger.net.codec import FrameError, decode_rpc, encode_rpc
from raftmq.dledger.net.frames import MAX_FRAME_BYTES, RPC, FrameReader, FrameWriter
from raftmq.dledger.net.tcp import secure_connect, set_nodelay

from raftmq.config.address import parse_address
from raftmq.transport.deadlines import DeadlineReaper
from raftmq.transport.tls import PeerTls

__all__ = ["RpcClient", "RpcTimeout", "RpcUnavailable"]

log = logging.getLogger(__name__)

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class RpcUnavailable(ConnectionError):
    """The server could not be reached, or the connection broke before the answer came."""


class RpcTimeout(TimeoutError):
    """No answer within the call's timeout (the request may still take effect)."""


class _Call:
    __slots__ = ("code", "deadline", "error", "event", "response", "timeout_s")

    def __init__(self, code, timeout_s: float) -> None:
        self.deadline = trio.current_time() + timeout_s
        self.event = trio.Event()
        self.response: dict | None = None
        self.error: BaseException | None = None
        self.code = code
        self.timeout_s = timeout_s


class RpcClient:
    """`async with RpcClient(address) as c: await c.call(request)`.

    The connection and its reader and writer tasks live in a nursery opened by
    `__aenter__` and closed by `__aexit__`, so leaving the block cancels everything.
    Once the connection fails, every pending and later call raises RpcUnavailable;
    open a new client to reconnect.

    Timeouts are enforced by one reaper task over a heap of deadlines rather than a
    cancel scope per call: a trio `move_on_after` costs well over 10 us once
    thousands are live, more than the rest of a call's client-side work.
    """

    def __init__(
        self,
        address: str,
        *,
        connect_timeout_s: float = 3.0,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        tls: PeerTls | None = None,
    ) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.tls = tls  # a group whose peer port is mutual TLS: the client needs a cert too
        self._opaque = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._deadlines = DeadlineReaper(self._expire, self._is_pending)
        self._writer: FrameWriter | None = None
        self._error: RpcUnavailable | None = RpcUnavailable("client is not open")
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> RpcClient:
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(self.host, self.port)
            if self.tls is None:
                set_nodelay(stream)
            else:
                stream = await secure_connect(stream, self.tls, self.host, self.connect_timeout_s)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            cause = exc.__cause__ or exc
            raise RpcUnavailable(f"cannot connect to {self.address}: {cause!r}") from exc
        stack = AsyncExitStack()
        await stack.enter_async_context(stream)
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        self._writer = FrameWriter(stream, self.max_frame_bytes)
        self._error = None
        self._nursery.start_soon(self._run_connection, stream)
        self._nursery.start_soon(self._deadlines.run)
        return self

    async def __aexit__(self, *exc_info) -> None:
        # The body's exception is not handed to the nursery, which would wrap it in an
        # ExceptionGroup: an RpcTimeout leaving the `async with` stays an RpcTimeout.
        self._fail(RpcUnavailable("client closed"))
        self._nursery.cancel_scope.cancel()
        stack, self._stack = self._stack, None
        await stack.aclose()

    @property
    def closed(self) -> bool:
        """True once the connection has failed or the client was closed."""
        return self._error is not None

    async def call(self, request: dict, timeout_s: float = 3.0) -> dict:
        """Send `request` (a map with `code`, usually `group` and fields) and await its answer.

        `opaque` is filled in here. Raises RpcUnavailable if the connection is or
        goes down, RpcTimeout if no answer comes within `timeout_s`.
        """
        if self._error is not None:
            raise self._error
        opaque = next(self._opaque)
        payload = encode_rpc({**request, "opaque": opaque})
        pending = _Call(request.get("code"), timeout_s)
        calls = self._calls
        calls[opaque] = pending
        try:
            self._writer.write(RPC, payload)
            self._deadlines.add(pending.deadline, opaque)
            await pending.event.wait()
        except trio.ClosedResourceError:
            raise self._error or RpcUnavailable("connection closed") from None
        finally:
            calls.pop(opaque, None)
        if pending.response is not None:
            return pending.response
        raise pending.error

    def _is_pending(self, opaque: int) -> bool:
        return opaque in self._calls

    def _expire(self, opaque: int) -> None:
        pending = self._calls.pop(opaque)
        pending.error = RpcTimeout(f"no answer to code {pending.code} within {pending.timeout_s}s")
        pending.event.set()

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def _fail(self, error: RpcUnavailable) -> None:
        """Fail every pending call and all later ones with `error` (first error wins)."""
        if self._error is None:
            self._error = error
        calls, self._calls = self._calls, {}
        for pending in calls.values():
            pending.error = self._error
            pending.event.set()

    async def _run_connection(self, stream: trio.SocketStream) -> None:
        """Reader and writer in their own nursery: a broken connection stops both of them
        but must not cancel the caller's `async with` body, which shares the outer one."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop, nursery.cancel_scope)
            nursery.start_soon(self._read_loop, stream, nursery.cancel_scope)

    async def _write_loop(self, scope: trio.CancelScope) -> None:
        try:
            await self._writer.run()
        except _STREAM_ERRORS as exc:
            self._fail(RpcUnavailable(f"connection to {self.address} broke: {exc!r}"))
            scope.cancel()

    async def _read_loop(self, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        try:
            async for channel, payload in FrameReader(stream, self.max_frame_bytes):
                if channel != RPC:
                    raise FrameError(f"unexpected channel {channel} from an RPC server")
                response = decode_rpc(payload)
                pending = self._calls.pop(response["opaque"], None)
                if pending is not None:  # else the call timed out already
                    pending.response = response
                    pending.event.set()
            error = RpcUnavailable(f"{self.address} closed the connection")
        except FrameError as exc:
            error = RpcUnavailable(f"bad frame from {self.address}: {exc}")
        except _STREAM_ERRORS as exc:
            error = RpcUnavailable(f"connection to {self.address} broke: {exc!r}")
        self._fail(error)
        scope.cancel()
