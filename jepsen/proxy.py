"""Network faults from a TCP proxy on every directed link, switched at run time.

This machine has no netem, no Toxiproxy server and no root for iptables, so the
harness puts a proxy in front of every connection one node opens to another (and
every client link): node `a` dials `ProxyNet.address(a, b)` instead of `b`. Because
the peer transport sends each direction's messages on the connection its sender
opened, blocking link (a, b) alone is a clean one-way partition, and blocking
both (a, b) and (b, a) is Jepsen's grudge.

Modes (see `LinkProxy`), each applied at once to live and new connections:

* pass: forward bytes, after the configured latency if any.
* blackhole: stop moving bytes in both directions but keep every socket open, so
  peers learn of the partition only by their own timeouts. The proxy stops
  *reading* rather than reading and discarding: a byte stream with a hole in it is
  not something TCP ever delivers, and with length-prefixed frames it would make
  the receiver parse payload bytes as headers after the heal — garbage messages or
  a 64 MiB "frame" that never completes — which is a harness artefact, not a
  network fault. Unread bytes wait in the kernel's socket buffers (bounded; a
  sender blocks once they fill), exactly as TCP retransmits across a partition
  that heals before the connection gives up, so after the heal the receiver sees
  late, stale messages — which a Raft node must handle. New connections are left
  in the listen backlog: the client's connect completes (the kernel answers it) and
  nothing flows, as after a SYN retransmitted into a partition.
* refuse (after `reset`): every live connection is reset (RST) and each new one is
  accepted and reset at once, so clients fail fast instead of waiting.
* cut: forward n more bytes from client to upstream, then close that connection
  mid-stream (usually mid-frame); then back to pass. The close is a FIN, not an
  RST, so the n bytes are sure to arrive (an RST may discard what is still in
  flight) and the receiver sees its stream end inside a frame.

No mode buffers without bound: each direction reads a chunk of at most 64 KiB,
keeps at most `_IN_FLIGHT` chunks between its reader and writer (the latency
pipeline), and awaits `send_all`, so a slow receiver slows the sender.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import random
import socket
import struct
from collections.abc import Iterable, Mapping

import trio

from raftmq.streams.address import parse_address

__all__ = ["Link", "LinkProxy", "ProxyNet"]

Link = tuple[str, str]

_CHUNK = 64 * 1024
# Chunks a direction may hold between reading and forwarding them: this is what
# lets latency delay every chunk by `ms` without capping throughput at one chunk
# per `ms`, while bounding memory to _IN_FLIGHT * _CHUNK per direction.
_IN_FLIGHT = 16
# accept() errors that mean "out of descriptors or memory for now": the proxy waits
# and accepts again rather than dying and taking every link of the run down with it.
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_RESOURCE_RETRY_S = 0.1


class _Mode(enum.Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    REFUSE = "refuse"
    CUT = "cut"


class _Conn:
    """One proxied connection: the scope that `reset` cancels, and how to close it."""

    __slots__ = ("graceful", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        # True once both directions ended cleanly or a cut ended it: close with FIN.
        # Otherwise (reset, a peer's error, shutdown) close with RST.
        self.graceful = False


def _close(stream: trio.SocketStream) -> None:
    stream.socket.close()


def _abort(stream: trio.SocketStream) -> None:
    """Close with an RST (linger 0), so the peer sees ECONNRESET rather than an orderly end."""
    with contextlib.suppress(OSError):  # already broken: closing it is all that is left
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


class LinkProxy:
    """Accepts on `host:port` (127.0.0.1 and a free port by default) and forwards each
    connection to `upstream` ("host:port").

    Run it with `await nursery.start(proxy.serve)`; cancelling that nursery closes
    the listener and resets every connection. The mode methods are synchronous and
    may be called from any task at any time.

    Latency is a knob separate from the mode: `latency()` keeps the mode and
    `pass_()` keeps the latency, so a partition can be laid over a slow network;
    `heal()` clears both. Jitter draws from `rng`, so a seeded run draws the same
    sequence of delays (which chunk gets which depends on scheduling).
    """

    def __init__(
        self, upstream: str, rng: random.Random, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.upstream = upstream
        self._upstream = parse_address(upstream)
        self._rng = rng
        self.host = host
        self._bind_port = port
        self.port: int | None = None
        self._mode = _Mode.PASS
        self._latency_s = 0.0
        self._jitter_s = 0.0
        self._cut_budget = 0
        self._changed = trio.Event()
        self._live: set[_Conn] = set()

    @property
    def address(self) -> str:
        """What to dial instead of the upstream; set once `serve` has started."""
        if self.port is None:
            raise RuntimeError("proxy not started")
        return f"{self.host}:{self.port}"

    @property
    def mode(self) -> str:
        """The current mode, "pass", "blackhole", "refuse" or "cut", for the nemesis's history."""
        return self._mode.value

    # -- control ------------------------------------------------------------------

    def pass_(self) -> None:
        """Forward normally (keeping any latency). Named with `_` since `pass` is a keyword."""
        self._set_mode(_Mode.PASS)

    def blackhole(self) -> None:
        """Stop moving bytes both ways on every connection; sockets stay open."""
        self._set_mode(_Mode.BLACKHOLE)

    def reset(self) -> None:
        """Reset every live connection and reset new ones until the mode changes."""
        self._set_mode(_Mode.REFUSE)
        for conn in self._live:
            conn.scope.cancel()

    def latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Delay each chunk by `ms` plus up to `jitter_ms` (uniform), order kept per direction.

        Both directions are delayed, so a request and its reply on one connection
        take 2 * ms more; on a whole ProxyNet every message is delayed once.
        """
        if ms < 0 or jitter_ms < 0:
            raise ValueError("latency and jitter must be >= 0")
        self._latency_s = ms / 1000
        self._jitter_s = jitter_ms / 1000

    def cut_after(self, n_bytes: int) -> None:
        """Forward `n_bytes` more client-to-upstream bytes (over all connections), then
        close the connection that carried the last of them and go back to pass."""
        if n_bytes < 0:
            raise ValueError("n_bytes must be >= 0")
        self._cut_budget = n_bytes
        self._set_mode(_Mode.CUT)

    def heal(self) -> None:
        """Pass with no latency."""
        self._latency_s = self._jitter_s = 0.0
        self._set_mode(_Mode.PASS)

    def _set_mode(self, mode: _Mode) -> None:
        self._mode = mode
        self._changed.set()
        self._changed = trio.Event()

    async def _unblocked(self) -> None:
        while self._mode is _Mode.BLACKHOLE:
            await self._changed.wait()

    def _delay(self) -> float:
        jitter = self._rng.uniform(0, self._jitter_s) if self._jitter_s else 0.0
        return self._latency_s + jitter

    # -- forwarding ---------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen and forward until cancelled; `started` reports `self.address`."""
        [listener] = await trio.open_tcp_listeners(self._bind_port, host=self.host)
        self.port = listener.socket.getsockname()[1]
        async with listener, trio.open_nursery() as nursery:
            task_status.started(self.address)
            while True:
                await self._unblocked()  # a blackhole leaves new connections in the backlog
                try:
                    client = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _OUT_OF_RESOURCES:
                        raise
                    await trio.sleep(_RESOURCE_RETRY_S)
                    continue
                if self._mode is _Mode.REFUSE:
                    _abort(client)
                    continue
                # Registered before the task runs, so a reset in between still reaches it.
                conn = _Conn()
                self._live.add(conn)
                nursery.start_soon(self._handle, conn, client)

    async def _handle(self, conn: _Conn, client: trio.SocketStream) -> None:
        upstream = None
        try:
            with conn.scope:
                await self._unblocked()
                try:
                    upstream = await trio.open_tcp_stream(*self._upstream)
                except OSError:
                    return  # upstream down: the client is reset, as dialing it would be
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._direction, conn, client, upstream, True)
                    nursery.start_soon(self._direction, conn, upstream, client, False)
                conn.graceful = True
        finally:
            self._live.discard(conn)
            close = _close if conn.graceful else _abort
            close(client)
            if upstream is not None:
                close(upstream)

    async def _direction(
        self,
        conn: _Conn,
        src: trio.SocketStream,
        dst: trio.SocketStream,
        to_upstream: bool,
    ) -> None:
        send, recv = trio.open_memory_channel[tuple[float, bytes]](_IN_FLIGHT)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, conn, src, send)
            await self._write(conn, recv, dst, to_upstream)

    async def _read(
        self,
        conn: _Conn,
        src: trio.SocketStream,
        send: trio.MemorySendChannel[tuple[float, bytes]],
    ) -> None:
        """Read chunks and stamp each with when it may be forwarded (never before the last)."""
        due = 0.0
        async with send:
            try:
                while True:
                    await self._unblocked()
                    data = await src.receive_some(_CHUNK)
                    if not data:
                        return  # end of stream: closing `send` lets the writer pass it on
                    due = max(due, trio.current_time() + self._delay())
                    await send.send((due, data))
            except trio.BrokenResourceError:
                conn.scope.cancel()

    async def _write(
        self,
        conn: _Conn,
        recv: trio.MemoryReceiveChannel[tuple[float, bytes]],
        dst: trio.SocketStream,
        to_upstream: bool,
    ) -> None:
        try:
            async for due, data in recv:
                await trio.sleep_until(due)
                # Chunks already read when a blackhole starts are held, like packets in flight.
                await self._unblocked()
                cut = False
                if to_upstream and self._mode is _Mode.CUT:
                    if len(data) >= self._cut_budget:
                        data, cut = data[: self._cut_budget], True
                        self._cut_budget = 0
                        self._set_mode(_Mode.PASS)
                    else:
                        self._cut_budget -= len(data)
                if data:
                    await dst.send_all(data)
                if cut:
                    conn.graceful = True
                    conn.scope.cancel()
                    return
            await self._unblocked()
            await dst.send_eof()
        except trio.BrokenResourceError:
            conn.scope.cancel()


def _bind(listen: Mapping[Link, str] | None, link: Link) -> dict:
    if listen is None or link not in listen:
        return {}
    host, port = parse_address(listen[link])
    return {"host": host, "port": port}


class ProxyNet:
    """A LinkProxy per directed link; `async with` runs them all in its own nursery.

    `links[(src, dst)]` is dst's real address; src must dial `address(src, dst)`, which
    is `listen[(src, dst)]` if given ("host:port", for a src that cannot be told where
    to dial, such as clients that take a broker's address from the name server), else
    a free port on 127.0.0.1.
    """

    def __init__(
        self,
        links: Mapping[Link, str],
        rng: random.Random,
        listen: Mapping[Link, str] | None = None,
    ) -> None:
        self._proxies = {
            link: LinkProxy(upstream, rng, **_bind(listen, link))
            for link, upstream in links.items()
        }
        self._nodes = {node for link in links for node in link}
        self.grudge: dict[str, set[str]] = {}
        self._nursery_manager: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> ProxyNet:
        manager = trio.open_nursery()
        nursery = await manager.__aenter__()
        try:
            for proxy in self._proxies.values():
                await nursery.start(proxy.serve)
        except BaseException:
            nursery.cancel_scope.cancel()
            await manager.__aexit__(None, None, None)
            raise
        self._nursery_manager, self._nursery = manager, nursery
        return self

    async def __aexit__(self, *exc_info) -> None:
        """Stop every proxy. The body's own exception propagates as itself: the
        nursery is closed as if the body had ended normally, so it is not wrapped in
        an ExceptionGroup (errors from the proxies themselves still are)."""
        assert self._nursery is not None and self._nursery_manager is not None
        self._nursery.cancel_scope.cancel()
        await self._nursery_manager.__aexit__(None, None, None)

    def address(self, src: str, dst: str) -> str:
        """What `src` dials to reach `dst`."""
        return self._proxies[src, dst].address

    def apply(self, grudge: Mapping[str, Iterable[str]]) -> None:
        """Partition by a Jepsen grudge: `grudge[a]` holds the nodes whose traffic `a` drops.

        Like an iptables INPUT DROP on `a` from `b`, that kills TCP both ways, so
        links (a, b) and (b, a) are blackholed. Every other link goes back to pass
        (any latency stays; `heal` clears it), including earlier one-way cuts.
        """
        named = set(grudge).union(*grudge.values())
        unknown = named - self._nodes
        if unknown:
            raise ValueError(f"grudge names unknown nodes {sorted(unknown)}")
        blocked = {(a, b) for a, dropped in grudge.items() for b in dropped}
        blocked |= {(b, a) for a, b in blocked}
        for link, proxy in self._proxies.items():
            if link in blocked:
                proxy.blackhole()
            else:
                proxy.pass_()
        self.grudge = {a: set(dropped) for a, dropped in grudge.items() if dropped}

    def one_way(self, src: str, dst: str) -> None:
        """Blackhole link (src, dst) only: src's connections to dst stall, dst's to src
        still work. Adds to the current faults; `net.grudge` does not record it."""
        self._proxies[src, dst].blackhole()

    def set_latency(
        self, ms: float, jitter_ms: float = 0.0, links: Iterable[Link] | None = None
    ) -> None:
        """Delay every chunk on `links` (all links if None) by ms plus up to jitter_ms."""
        for proxy in self._select(links):
            proxy.latency(ms, jitter_ms)

    def reset(self, links: Iterable[Link]) -> None:
        """Reset live connections on `links` and refuse new ones until healed."""
        for proxy in self._select(links):
            proxy.reset()

    def cut_after(self, links: Iterable[Link], n_bytes: int) -> None:
        """On each of `links`, cut the connection carrying the n-th byte from now."""
        for proxy in self._select(links):
            proxy.cut_after(n_bytes)

    def heal(self) -> None:
        """Every link back to pass with no latency."""
        for proxy in self._proxies.values():
            proxy.heal()
        self.grudge = {}

    def _select(self, links: Iterable[Link] | None) -> list[LinkProxy]:
        if links is None:
            return list(self._proxies.values())
        return [self._proxies[link] for link in links]
