"""The TCP transport between replicas, which also serves client RPCs on the same port.

Every node sends everything — requests and responses — over its own outgoing
connection to the destination, and reads only from incoming connections. One
connection per direction per pair keeps each link FIFO (a response never overtakes
an earlier push on the same link) and lets each side's writer batch freely.

`send` is synchronous and never blocks: the replica is a state machine that emits a
step's messages as a list, and its driver must not stall on a slow peer. A peer that
cannot be reached is reported through `on_send_failed` for request messages, so an
election or heartbeat round learns at once that a vote or beat will not come back,
and messages to it are dropped rather than buffered: Raft retransmits what matters
(heartbeats, push timeouts), while an unbounded buffer would replay stale messages
and eat memory while the peer is down.

Callbacks (`on_message`, `on_send_failed`) are called from the transport's own
tasks, never from inside `send`, so the driver is never re-entered while it is
handing out an Output. The messages of one chunk read from a connection are handed
over one after another with nothing else in between, and `on_chunk_end` follows
them: a driver can do once per chunk what each message asks for (an fsync).

With `tls` (a `transport.tls.PeerTls`: `dLegerTlsCertPath`, `dLegerTlsKeyPath`,
`dLegerTlsTrustCertPath`), every connection on the port, peer link or client RPC, is
mutual TLS: a connection whose certificate does not chain to the trust file (a
stranger's self-signed one, or none) is logged and dropped before one frame is read,
so it can neither vote nor append; an outgoing link to a listener whose certificate
does not verify counts as a failed connect. Members all hold certificates of one CA, so
the certificate proves membership, not which member: the checks below still bind a
connection to one member and its host.

Without TLS the port is not authenticated; with or without it, what arrives is
screened for what can be checked without credentials. A connection speaks for the
one member named as the sender (`local_id`) of its first peer message; it is closed,
with one warning, when that sender is not a configured peer (a stranger, or this
replica's own id), when a later message names another sender or a receiver other
than this replica, and — with `check_peer_hosts`, the default — when it does not
come from an address the sender's configured host resolves to (a host name that
resolves to a loopback address matches any loopback source). Without TLS, anyone
who can connect from a member's host can still speak for that member. Incoming
connections are also capped in number and closed when idle (`transport.idle`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable

import trio
from raftmq.dledger.codes import Code
from raftmq.dledger.core.messages import REQUESTS
from raftmq.dledger.net.codec import (
    FrameError,
    decode_message,
    decode_rpc,
    encode_message,
    encode_rpc,
)
from raftmq.dledger.net.frames import (
    MAX_FRAME_BYTES,
    PEER,
    RPC,
    SNIFF_BYTES,
    FrameReader,
    FrameWriter,
    opens_peer_frame,
)

from raftmq.config.address import parse_address
from raftmq.transport.idle import ConnectionCap, ReceiveClock, close_when_idle, close_when_stalled
from raftmq.transport.tls import PeerTls

__all__ = ["PeerTransport", "RpcHandler", "set_nodelay"]

log = logging.getLogger(__name__)

RpcHandler = Callable[[dict], Awaitable[dict]]
# Takes a request and a `reply(response)` callable; returns False to leave the request
# to the task-per-request RpcHandler. Lets a hot request (append) skip a task spawn.
RpcFastHandler = Callable[[dict, Callable[[dict], None]], bool]
# Serves a connection that does not open with a peer frame (`PeerTransport`'s `foreign`).
ForeignHandler = Callable[[trio.SocketStream], Awaitable[None]]
SNIFF_TIMEOUT_S = 5.0  # a connection that sends fewer bytes than a frame header is dropped
SNIFF_POLL_S = 0.005

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

# Link states
_IDLE = 0  # no connection; the next send starts one
_CONNECTING = 1  # a connect is under way; sends wait in a bounded backlog
_CONNECTED = 2
_DOWN = 3  # the last connect failed; sends are reported and dropped until retry_at

TLS_HANDSHAKE_TIMEOUT_S = 5.0  # an incoming connection that stalls its handshake is dropped


def set_nodelay(stream) -> None:
    """Disable Nagle: a lone heartbeat or vote must not wait for an ACK to leave.

    trio's SocketStream already does this; doing it here keeps the requirement
    visible and holds if a different stream type is ever passed in.
    """
    sock = getattr(stream, "socket", None)
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)


class _Link:
    """The outgoing connection to one peer, opened on demand."""

    def __init__(self, transport: PeerTransport, peer_id: str, address: str) -> None:
        self.transport = transport
        self.peer_id = peer_id
        self.host, self.port = parse_address(address)
        self.state = _IDLE
        self.writer: FrameWriter | None = None
        self.backlog: list[tuple[object, bytes]] = []
        self.backlog_bytes = 0
        self.retry_at = 0.0
        self.wake = trio.Event()
        self.reported_down = False

    def send(self, msg, payload: bytes) -> None:
        t = self.transport
        state = self.state
        if state == _CONNECTED:
            writer = self.writer
            if writer.pending_bytes + len(payload) > t.max_pending_bytes:
                t._fail(msg, "peer is not keeping up")
                return
            try:
                writer.write(PEER, payload)
            except trio.ClosedResourceError:
                t._fail(msg, "connection lost")
            return
        if state == _DOWN:
            if trio.current_time() < self.retry_at:
                t._fail(msg, "peer unreachable")
                return
            state = _IDLE
        if state == _IDLE:
            self.state = _CONNECTING
            self.wake.set()
        if self.backlog_bytes + len(payload) > t.max_pending_bytes:
            t._fail(msg, "connect backlog full")
            return
        self.backlog.append((msg, payload))
        self.backlog_bytes += len(payload)

    async def run(self) -> None:
        t = self.transport
        while True:
            if self.state != _CONNECTING:
                await self.wake.wait()
                self.wake = trio.Event()
                continue
            try:
                with trio.fail_after(t.connect_timeout_s):
                    stream = await trio.open_tcp_stream(self.host, self.port)
                if t.tls is not None:
                    stream = await secure_connect(stream, t.tls, self.host, t.connect_timeout_s)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                self._connect_failed(exc.__cause__ or exc)
                continue
            await self._use(stream)

    def _connect_failed(self, exc: BaseException) -> None:
        t = self.transport
        self.state = _DOWN
        self.retry_at = trio.current_time() + t.reconnect_backoff_s
        if not self.reported_down:
            self.reported_down = True
            log.info(
                "%s: peer %s (%s:%s) unreachable: %r",
                t.self_id,
                self.peer_id,
                self.host,
                self.port,
                exc,
            )
        backlog, self.backlog, self.backlog_bytes = self.backlog, [], 0
        for msg, _ in backlog:
            t._fail(msg, "peer unreachable")

    async def _use(self, stream: trio.abc.Stream) -> None:
        t = self.transport
        writer = FrameWriter(stream, t.max_frame_bytes)
        for _, payload in self.backlog:
            writer.write(PEER, payload)
        self.backlog, self.backlog_bytes = [], 0
        self.writer = writer
        self.state = _CONNECTED
        if self.reported_down:
            self.reported_down = False
            log.info("%s: connected to peer %s", t.self_id, self.peer_id)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, writer, nursery.cancel_scope)
                nursery.start_soon(_drain, stream, nursery.cancel_scope)
        finally:
            # A lost connection is re-opened by the next send, without backoff: the
            # peer was reachable a moment ago (e.g. it restarted).
            self.writer = None
            self.state = _IDLE
            await stream.aclose()


async def secure_connect(
    stream: trio.SocketStream, tls: PeerTls, host: str, timeout_s: float
) -> trio.SSLStream:
    """`stream` (TCP_NODELAY set) after a mutual TLS handshake as a client of the peer
    port; the stream is closed if the handshake fails or takes over `timeout_s`."""
    set_nodelay(stream)
    secured = trio.SSLStream(stream, tls.client_context(), server_hostname=host)
    try:
        with trio.fail_after(timeout_s):
            await secured.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return secured


async def _pump(writer: FrameWriter, scope: trio.CancelScope) -> None:
    """Run a writer; a broken stream ends the connection instead of the transport."""
    try:
        await writer.run()
    except _STREAM_ERRORS as exc:
        log.debug("send failed: %r", exc)
    finally:
        scope.cancel()


async def _drain(stream: trio.abc.ReceiveStream, scope: trio.CancelScope) -> None:
    """Read (and ignore) an outgoing connection, to notice at once when the peer closes it."""
    try:
        while await stream.receive_some(65536):
            pass
    except _STREAM_ERRORS:
        pass
    finally:
        scope.cancel()


class PeerTransport:
    """One replica's network: outgoing links to its peers and a listener for peers and clients.

    `peers` maps every replica id, this one included, to `host:port`; the listener
    binds this replica's own address (port 0 picks a free port; `serve` reports the
    port it bound). `rpc_handler`, if given, answers client RPC frames; each request
    runs in its own task so a long append does not hold up later requests on the same
    connection, and the response carries the request's `opaque`.

    `foreign`, if given, serves the connections whose first bytes are not a peer frame
    (`frames.opens_peer_frame`): RocketMQ's controller answers its remoting requests on
    its DLedger peer port, and so does ours. Not with TLS, which hides those bytes.
    """

    def __init__(
        self,
        self_id: str,
        peers: dict[str, str],
        on_message: Callable[[object], None],
        on_send_failed: Callable[[object], None],
        rpc_handler: RpcHandler | None = None,
        rpc_fast_handler: RpcFastHandler | None = None,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_pending_bytes: int = 64 * 1024 * 1024,
        connect_timeout_s: float = 0.2,
        reconnect_backoff_s: float = 0.03,
        check_peer_hosts: bool = True,
        idle_s: float = 120.0,
        max_connections: int = 1024,
        tls: PeerTls | None = None,
        frame_deadline_s: float = 60.0,
        foreign: ForeignHandler | None = None,
        on_chunk_end: Callable[[], None] | None = None,
    ) -> None:
        if self_id not in peers:
            raise ValueError(f"self id {self_id!r} is not among peers {list(peers)}")
        self.self_id = self_id
        self.peers = dict(peers)
        self.on_message = on_message
        self.on_chunk_end = on_chunk_end
        self.on_send_failed = on_send_failed
        self.rpc_handler = rpc_handler
        self.rpc_fast_handler = rpc_fast_handler
        self.max_frame_bytes = max_frame_bytes
        self.max_pending_bytes = max_pending_bytes
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_backoff_s = reconnect_backoff_s
        self.check_peer_hosts = check_peer_hosts
        self.tls = tls
        if foreign is not None and tls is not None:
            raise ValueError("a port shared with another protocol cannot use peer TLS")
        self.foreign = foreign
        # Built here so that a bad certificate, key or trust file fails the start.
        self._tls_server_context = None if tls is None else tls.server_context()
        if tls is not None:
            tls.client_context()
        # Incoming connections: closed after `idle_s` without a byte (a link that is
        # needed again is reopened by its sender), at most `max_connections` at once.
        self.idle_s = idle_s
        # ... and when a frame begun on them is not complete within `frame_deadline_s`
        # (a peer that trickles a frame is never idle; see transport.idle).
        self.frame_deadline_s = frame_deadline_s
        self._cap = ConnectionCap(f"{self_id}: peer port", max_connections)
        # member id -> the addresses its configured host resolves to (resolved by `serve`;
        # a member missing here is not checked: its host did not resolve, or is a wildcard)
        self._peer_hosts: dict[str, frozenset[str]] = {}
        self.listen_host, self.listen_port = parse_address(peers[self_id])
        self._links = {pid: _Link(self, pid, addr) for pid, addr in peers.items() if pid != self_id}
        self._nursery: trio.Nursery | None = None  # where the links run, once serving
        self._failed: list = []
        self._failed_wake = trio.Event()

    # ------------------------------------------------------------------ sending
    def send(self, msg) -> None:
        """Queue `msg` for `msg.remote_id`; never blocks, never calls back from here.

        A message too large for one frame raises FrameError here, at its sender: it is
        a bug in whoever built it (push batches are bounded far below the limit), and
        the receiver would only drop the connection over it.
        """
        link = self._links.get(msg.remote_id)
        if link is None:
            self._fail(msg, "unknown peer")
            return
        payload = encode_message(msg)
        if len(payload) > self.max_frame_bytes:
            raise FrameError(
                f"{type(msg).__name__} of {len(payload)} bytes exceeds the "
                f"{self.max_frame_bytes}-byte frame limit"
            )
        link.send(msg, payload)

    def _fail(self, msg, why: str) -> None:
        log.debug(
            "%s: dropping %s to %s: %s",
            self.self_id,
            type(msg).__name__,
            getattr(msg, "remote_id", "?"),
            why,
        )
        if isinstance(msg, REQUESTS):
            self._failed.append(msg)
            self._failed_wake.set()

    async def _report_failures(self) -> None:
        while True:
            await self._failed_wake.wait()
            self._failed_wake = trio.Event()
            failed, self._failed = self._failed, []
            for msg in failed:
                self.on_send_failed(msg)

    def set_addresses(self, peers: dict[str, str]) -> None:
        """The group's members changed (core.membership): links to members that joined
        start now. A link to a member that left stays, idle: nothing is sent on it."""
        for peer_id, address in peers.items():
            if peer_id == self.self_id or peer_id in self._links:
                continue
            self.peers[peer_id] = address
            link = self._links[peer_id] = _Link(self, peer_id, address)
            if self._nursery is not None:
                self._nursery.start_soon(link.run)

    def is_connected(self, peer_id: str) -> bool:
        link = self._links.get(peer_id)
        return link is not None and link.state == _CONNECTED

    # ------------------------------------------------------------------ serving
    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen and keep the outgoing links until cancelled; reports the bound port."""
        listeners = await trio.open_tcp_listeners(self.listen_port, host=self.listen_host)
        self.listen_port = listeners[0].socket.getsockname()[1]
        if self.check_peer_hosts:
            await self._resolve_peer_hosts()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._handle_incoming, listeners)
            nursery.start_soon(self._report_failures)
            for link in self._links.values():
                nursery.start_soon(link.run)
            self._nursery = nursery
            task_status.started(self.listen_port)

    async def _resolve_peer_hosts(self) -> None:
        for peer_id, link in self._links.items():
            if link.host in _WILDCARD_HOSTS:
                continue
            try:
                infos = await trio.socket.getaddrinfo(link.host, link.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning(
                    "%s: cannot resolve peer %s's host %s, so connections claiming to be %s "
                    "are not checked against it: %r",
                    self.self_id,
                    peer_id,
                    link.host,
                    peer_id,
                    exc,
                )
                continue
            addresses = {_plain_ip(info[4][0]) for info in infos}
            if _ip(link.host) is None and any(_is_loopback(a) for a in addresses):
                # A name for this machine (Debian maps its hostname to 127.0.1.1) while
                # local connections come from 127.0.0.1: any loopback source is this host.
                addresses.add(_ANY_LOOPBACK)
            self._peer_hosts[peer_id] = frozenset(addresses)

    def _check_sender(self, sender: str, stream) -> None:
        """FrameError unless `sender` is a peer that may speak on a connection from `stream`."""
        if sender not in self._links:
            raise FrameError(f"message from {sender!r}, which is not a peer of {self.self_id}")
        hosts = self._peer_hosts.get(sender)
        if hosts is None:
            return
        address = _peer_address(stream)
        ip = None if address is None else _plain_ip(address[0])
        if ip is None or (ip not in hosts and not (_ANY_LOOPBACK in hosts and _is_loopback(ip))):
            raise FrameError(
                f"message from {sender!r}, whose configured host is {self._links[sender].host}, "
                f"on a connection from {address[0] if address else '?'}"
            )

    async def _handle_incoming(self, stream: trio.SocketStream) -> None:
        if not self._cap.admit():
            await trio.aclose_forcefully(stream)
            return
        set_nodelay(stream)
        try:
            if self.foreign is not None and not await _opens_peer_frame(stream):
                await self.foreign(stream)
                return
            if self.tls is not None:
                secured = await self._authenticate(stream)
                if secured is None:
                    return
                stream = secured
            writer = FrameWriter(stream, self.max_frame_bytes)
            clock = ReceiveClock(stream)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, writer, nursery.cancel_scope)
                nursery.start_soon(close_when_idle, clock, self.idle_s, nursery.cancel_scope.cancel)
                await self._read_incoming(clock, writer, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self._cap.release()
            await stream.aclose()

    def _stalled(self, nursery: trio.Nursery) -> Callable[[], None]:
        def close() -> None:
            log.warning(
                "%s: closing a peer connection that did not complete a frame in %s s",
                self.self_id,
                self.frame_deadline_s,
            )
            nursery.cancel_scope.cancel()

        return close

    async def _authenticate(self, stream: trio.SocketStream) -> trio.SSLStream | None:
        """`stream` after the mutual TLS handshake, or None (logged, closed) when the
        other end does not present a certificate the trust file vouches for."""
        secured = trio.SSLStream(stream, self._tls_server_context, server_side=True)
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT_S):
                await secured.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError, OSError) as exc:
            cause = exc.__cause__ or exc
            log.warning(
                "%s: dropping a connection from %s that failed TLS authentication: %s: %s",
                self.self_id,
                _peer_name(stream),
                type(cause).__name__,
                cause,
            )
            await trio.aclose_forcefully(stream)
            return None
        return secured

    async def _read_incoming(
        self, stream: trio.SocketStream, writer: FrameWriter, nursery: trio.Nursery
    ) -> None:
        sender = None  # the member this connection speaks for, from its first peer message
        reader = FrameReader(stream, self.max_frame_bytes)
        nursery.start_soon(
            close_when_stalled, reader, self.frame_deadline_s, self._stalled(nursery)
        )
        try:
            while (frames := await reader.receive_batch()) is not None:
                try:
                    sender = self._handle_frames(frames, sender, stream, writer, nursery)
                except FrameError:  # what came before the bad frame was handed over
                    self._chunk_ended()
                    raise
                self._chunk_ended()
        except FrameError as exc:
            log.warning("%s: closing connection from %s: %s", self.self_id, _peer_name(stream), exc)
        except _STREAM_ERRORS as exc:
            log.debug("%s: incoming connection ended: %r", self.self_id, exc)

    def _chunk_ended(self) -> None:
        if self.on_chunk_end is not None:
            self.on_chunk_end()

    def _handle_frames(self, frames, sender, stream, writer: FrameWriter, nursery) -> str | None:
        """Hand over the frames of one chunk (peer messages in order, RPCs to their
        handlers); returns the member the connection speaks for (FrameError if a
        message claims another, or comes from a stranger)."""
        on_message = self.on_message
        for channel, payload in frames:
            if channel == PEER:
                msg = decode_message(payload)
                if msg.local_id != sender:
                    if sender is not None:
                        raise FrameError(
                            f"message from {msg.local_id!r} on {sender!r}'s connection"
                        )
                    self._check_sender(msg.local_id, stream)
                    sender = msg.local_id
                if msg.remote_id != self.self_id:
                    raise FrameError(f"{type(msg).__name__} addressed to {msg.remote_id!r}")
                on_message(msg)
            elif channel == RPC:
                request = decode_rpc(payload)
                fast = self.rpc_fast_handler
                scope = nursery.cancel_scope
                if fast is None or not fast(request, self._replier(request, writer, scope)):
                    nursery.start_soon(self._serve_rpc, request, writer, scope)
            else:
                raise FrameError(f"unknown channel {channel}")
        return sender

    async def _serve_rpc(self, request: dict, writer: FrameWriter, scope: trio.CancelScope) -> None:
        if self.rpc_handler is None:
            response = {"code": Code.UNSUPPORTED, "remark": "this node serves no RPCs"}
        else:
            try:
                response = await self.rpc_handler(request)
            except Exception as exc:  # one bad request must not take the server down
                log.exception("%s: RPC handler failed on code %s", self.self_id, request["code"])
                response = {"code": Code.INTERNAL_ERROR, "remark": f"{type(exc).__name__}: {exc}"}
        self._replier(request, writer, scope)(response)

    def _replier(
        self, request: dict, writer: FrameWriter, scope: trio.CancelScope
    ) -> Callable[[dict], None]:
        """A callable that sends the response to `request` back on its connection.

        A client that sends requests but does not read the answers would have them
        queue without end: past `max_pending_bytes` queued, its connection is closed.
        """
        opaque = request["opaque"]

        def reply(response: dict) -> None:
            if writer.pending_bytes > self.max_pending_bytes:
                if not scope.cancel_called:
                    log.warning(
                        "%s: closing an RPC connection that does not read its answers "
                        "(%d bytes queued)",
                        self.self_id,
                        writer.pending_bytes,
                    )
                    scope.cancel()
                return
            try:
                writer.write(RPC, encode_rpc({"remark": "", **response, "opaque": opaque}))
            except (TypeError, ValueError, OverflowError) as exc:  # unencodable or oversized
                log.error("%s: cannot send RPC response: %r", self.self_id, exc)
                payload = encode_rpc(
                    {
                        "code": Code.INTERNAL_ERROR,
                        "opaque": opaque,
                        "remark": f"bad response: {exc}",
                    }
                )
                _write_quietly(writer, payload)
            except trio.ClosedResourceError:
                pass  # the client went away

        return reply


async def _opens_peer_frame(stream: trio.SocketStream) -> bool:
    """Whether `stream`'s first bytes, left unread, open a peer frame; True for one that
    closes or stalls before sending enough to tell (the peer path then drops it)."""
    with trio.move_on_after(SNIFF_TIMEOUT_S):
        while True:
            try:
                prefix = await stream.socket.recv(SNIFF_BYTES, socket.MSG_PEEK)
            except OSError:
                return True
            if len(prefix) >= SNIFF_BYTES or not prefix:
                return not prefix or opens_peer_frame(prefix)
            await trio.sleep(SNIFF_POLL_S)  # part of a header: wait for the rest
    return True


def _write_quietly(writer: FrameWriter, payload: bytes) -> None:
    with contextlib.suppress(trio.ClosedResourceError):
        writer.write(RPC, payload)


_WILDCARD_HOSTS = ("", "0.0.0.0", "::")
_ANY_LOOPBACK = "loopback"  # in a member's addresses: any loopback source address is it


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def _plain_ip(address: str) -> str:
    """An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, from a dual-stack socket) as IPv4."""
    return address.removeprefix("::ffff:")


def _peer_address(stream) -> tuple[str, int] | None:
    try:
        # A TLS stream's socket is its transport's.
        return getattr(stream, "transport_stream", stream).socket.getpeername()[:2]
    except (AttributeError, OSError):
        return None


def _peer_name(stream) -> str:
    address = _peer_address(stream)
    return "?" if address is None else f"{address[0]}:{address[1]}"
