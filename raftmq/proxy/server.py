"""mqproxy's gRPC server: grpcio's `grpc.aio` on its own thread, the work in trio.

`serve_proxy` runs the whole proxy in the caller's trio run: the broker access
(`Brokers`), the RPCs (`MessagingService`), the metrics endpoint, and a thread whose
asyncio loop serves `apache.rocketmq.v2.MessagingService`. Each call's metadata is
read on the asyncio side (x-mq-client-id required: CLIENT_ID_REQUIRED; the
authorization header checked when ACL is on: UNAUTHORIZED), then the call is handed
to trio through `TrioPortal` and its answer handed back. A handler that raises is
answered INTERNAL_SERVER_ERROR with the exception's text and logged: bad input never
stops the proxy. PullMessage, UpdateOffset, GetOffset, QueryOffset and
SyncLiteSubscription are left to grpcio's default, gRPC UNIMPLEMENTED, as Apache's
proxy answers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import trio

from raftmq.process.metrics_endpoint import serve_metrics
from raftmq.proxy.apis import definition, service, service_grpc
from raftmq.proxy.auth import Authenticator
from raftmq.proxy.bridge import AsyncioThread, Outbox, TrioPortal
from raftmq.proxy.brokers import Brokers
from raftmq.proxy.config import ProxyConfig
from raftmq.proxy.metrics import ProxyMetrics
from raftmq.proxy.permissive import serve_permissive
from raftmq.proxy.renewal import Renewals
from raftmq.proxy.sending import Refusal
from raftmq.proxy.service import CallContext, MessagingService, status
from raftmq.remoting.signing import SessionCredentials

__all__ = ["serve_proxy"]

log = logging.getLogger(__name__)

Code = definition.Code
CLIENT_ID = "x-mq-client-id"
MAX_MESSAGE_BYTES = 130 * 1024 * 1024  # Apache's grpcMaxInboundMessageSize
GRACE_S = 1.0


def _peer_host(peer: str) -> str:
    """The host of grpc's peer string (`ipv4:1.2.3.4:5`, `ipv6:[::1]:5`)."""
    _scheme, _, address = peer.partition(":")
    host = address.rpartition(":")[0]
    return host.strip("[]")


class _Servicer(service_grpc.MessagingServiceServicer):
    """The asyncio side: metadata, auth, metrics; the work goes to `svc` in trio."""

    def __init__(
        self,
        portal: TrioPortal,
        svc: MessagingService,
        metrics: ProxyMetrics,
        authenticator: Authenticator | None,
    ) -> None:
        self._portal = portal
        self._svc = svc
        self._metrics = metrics
        self._authenticator = authenticator

    def _context(self, context) -> CallContext | definition.Status:
        metadata = {key: value for key, value in context.invocation_metadata() or ()}
        client_id = metadata.get(CLIENT_ID, "")
        if not client_id.strip():
            return status(Code.CLIENT_ID_REQUIRED, f"the {CLIENT_ID} header is required")
        host = _peer_host(context.peer() or "")
        if self._authenticator is not None:
            refusal = self._authenticator.refusal(metadata, host)
            if refusal is not None:
                return status(Code.UNAUTHORIZED, refusal)
        return CallContext(client_id, host, context.time_remaining())

    async def _unary(self, rpc: str, method: Callable, response_type, request, context):
        started = time.perf_counter()
        ctx = self._context(context)
        if isinstance(ctx, definition.Status):
            response = response_type(status=ctx)
        else:
            try:
                response = await self._portal.call(method, ctx, request)
            except Exception as exc:
                log.exception("%s failed", rpc)
                response = response_type(status=status(Code.INTERNAL_SERVER_ERROR, repr(exc)))
        self._metrics.observe(rpc, Code.Name(response.status.code), time.perf_counter() - started)
        return response

    async def QueryRoute(self, request, context):
        return await self._unary(
            "QueryRoute", self._svc.query_route, service.QueryRouteResponse, request, context
        )

    async def Heartbeat(self, request, context):
        return await self._unary(
            "Heartbeat", self._svc.heartbeat, service.HeartbeatResponse, request, context
        )

    async def SendMessage(self, request, context):
        return await self._unary(
            "SendMessage", self._svc.send_message, service.SendMessageResponse, request, context
        )

    async def QueryAssignment(self, request, context):
        return await self._unary(
            "QueryAssignment",
            self._svc.query_assignment,
            service.QueryAssignmentResponse,
            request,
            context,
        )

    async def AckMessage(self, request, context):
        return await self._unary(
            "AckMessage", self._svc.ack_message, service.AckMessageResponse, request, context
        )

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        return await self._unary(
            "ForwardMessageToDeadLetterQueue",
            self._svc.forward_message_to_dead_letter_queue,
            service.ForwardMessageToDeadLetterQueueResponse,
            request,
            context,
        )

    async def EndTransaction(self, request, context):
        return await self._unary(
            "EndTransaction",
            self._svc.end_transaction,
            service.EndTransactionResponse,
            request,
            context,
        )

    async def NotifyClientTermination(self, request, context):
        return await self._unary(
            "NotifyClientTermination",
            self._svc.notify_client_termination,
            service.NotifyClientTerminationResponse,
            request,
            context,
        )

    async def ChangeInvisibleDuration(self, request, context):
        return await self._unary(
            "ChangeInvisibleDuration",
            self._svc.change_invisible_duration,
            service.ChangeInvisibleDurationResponse,
            request,
            context,
        )

    async def RecallMessage(self, request, context):
        return await self._unary(
            "RecallMessage",
            self._svc.recall_message,
            service.RecallMessageResponse,
            request,
            context,
        )

    async def ReceiveMessage(self, request, context):
        """Server streaming: the items the trio side gathered (a status, the messages,
        a delivery timestamp), written in order; the stream always ends."""
        started = time.perf_counter()
        ctx = self._context(context)
        if isinstance(ctx, definition.Status):
            items = [service.ReceiveMessageResponse(status=ctx)]
        else:
            try:
                items = await self._portal.call(self._svc.receive_message, ctx, request)
            except Exception as exc:
                log.exception("ReceiveMessage failed")
                failure = status(Code.INTERNAL_SERVER_ERROR, repr(exc))
                items = [service.ReceiveMessageResponse(status=failure)]
        code = next((i.status.code for i in items if i.HasField("status")), Code.OK)
        self._metrics.observe("ReceiveMessage", Code.Name(code), time.perf_counter() - started)
        for item in items:
            yield item

    async def Telemetry(self, request_iterator, context):
        """Bidi: each command the client writes goes to trio; answers and the commands
        the proxy starts (transaction checks) come back through one Outbox."""
        started = time.perf_counter()
        ctx = self._context(context)
        if isinstance(ctx, definition.Status):
            self._metrics.observe("Telemetry", Code.Name(ctx.code), 0.0)
            refused = grpc.StatusCode.INVALID_ARGUMENT  # no client id: a 400xx code
            if ctx.code == Code.UNAUTHORIZED:
                refused = grpc.StatusCode.UNAUTHENTICATED
            await context.abort(refused, ctx.message)
        outbox = Outbox(asyncio.get_running_loop())

        async def read() -> None:
            try:
                async for command in request_iterator:
                    answer = await self._portal.call(self._svc.telemetry, ctx, command, outbox)
                    if answer is not None:
                        outbox.put(answer)
            except Refusal as refusal:
                outbox.put(refusal)
            except Exception as exc:
                log.exception("Telemetry failed")
                outbox.put(exc)
            finally:
                outbox.close()

        reader = asyncio.create_task(read())
        code = "OK"
        try:
            async for item in outbox:
                if isinstance(item, Refusal):
                    code = "INVALID_ARGUMENT"
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, item.message)
                if isinstance(item, Exception):
                    code = "INTERNAL"
                    await context.abort(grpc.StatusCode.INTERNAL, repr(item))
                yield item
        finally:
            reader.cancel()
            outbox.close()
            with contextlib.suppress(trio.RunFinishedError):
                await self._portal.call(self._svc.telemetry_closed, ctx, outbox)
            self._metrics.observe("Telemetry", code, time.perf_counter() - started)


def _server_credentials(config: ProxyConfig) -> grpc.ServerCredentials | None:
    if config.tls_cert_path is None:
        return None
    key = Path(config.tls_key_path).read_bytes()
    chain = Path(config.tls_cert_path).read_bytes()
    return grpc.ssl_server_credentials([(key, chain)])


async def _grpc_main(servicer: _Servicer, config: ProxyConfig, ready, stop: asyncio.Event):
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", -1),
        ]
    )
    service_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    address = f"{config.grpc_host}:{config.grpc_port}"
    credentials = _server_credentials(config)
    if credentials is not None and config.tls_mode == "permissive":
        # two inner ports behind raftmq.proxy.permissive's front on the public one
        ports = (
            server.add_secure_port("127.0.0.1:0", credentials),
            server.add_insecure_port("127.0.0.1:0"),
        )
        if 0 in ports:
            raise OSError("tls.server.mode=permissive: cannot bind the inner ports")
    else:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
        if port == 0:
            raise OSError(f"grpcServerPort={config.grpc_port}: cannot bind {address}")
        ports = (port,)
    await server.start()
    ready(ports)
    try:
        await stop.wait()
    finally:
        await server.stop(GRACE_S)


async def serve_proxy(config: ProxyConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; reports (gRPC port, metrics port or None) once serving.
    ValueError for an unreadable aclFile or TLS file, OSError for a port in use."""
    authenticator = Authenticator(config.acl_file) if config.acl_enable else None
    _server_credentials(config)  # unreadable TLS files fail here, before anything starts
    metrics = ProxyMetrics()
    credentials = None
    if config.access_key is not None:
        credentials = SessionCredentials(config.access_key, config.secret_key)
    brokers = Brokers(config.namesrv_addr, credentials=credentials)
    async with brokers, trio.open_nursery() as nursery:
        renewals = Renewals(
            brokers.change_invisible_time,
            default_invisible_ms=config.default_invisible_ms,
            ahead_ms=config.renew_ahead_ms,
            period_s=config.renew_period_ms / 1000,
            max_ms=config.renew_max_ms,
        )
        nursery.start_soon(renewals.run)
        svc = MessagingService(brokers, renewals)
        portal = TrioPortal(trio.lowlevel.current_trio_token(), nursery)
        servicer = _Servicer(portal, svc, metrics, authenticator)
        main = functools.partial(_grpc_main, servicer, config)
        async with AsyncioThread(main, "mqproxy-grpc") as ports:
            if len(ports) == 2:
                grpc_port = await nursery.start(
                    serve_permissive, config.grpc_host, config.grpc_port, *ports
                )
            else:
                (grpc_port,) = ports
            metrics_port = None
            if config.metrics_port is not None:
                metrics_port = await nursery.start(
                    serve_metrics, metrics.registry, config.metrics_host, config.metrics_port
                )
            log.info("mqproxy serving gRPC on port %d", grpc_port)
            task_status.started((grpc_port, metrics_port))
            await trio.sleep_forever()
