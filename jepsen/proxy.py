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
* cut: forward about n more bytes from client to upstream, then close the connection
  that carried them inside a frame; then back to pass. The proxy knows where the
  frames of each connection begin (every frame starts with a 4-byte big-endian
  length; see `_Frames`), so a count that lands on a frame boundary moves one byte
  on, into the next frame: a cut between two frames would be an ordinary close, not
  the fault. The upstream gets a FIN, not an RST, so the bytes are sure to arrive (an
  RST may discard what is still in flight) and the receiver reads its stream ending
  inside a frame rather than a reset.

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

from raftmq.config.address import parse_address

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
_LENGTH_BYTES = 4  # every frame starts with its length, 4 bytes big-endian


class _Mode(enum.Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    REFUSE = "refuse"
    CUT = "cut"


class _Frames:
    """Where the frames of one direction of a connection begin and end, so that a cut
    lands inside one.

    Every frame starts with a 4-byte big-endian length that counts the bytes after the
    frame's first `header_bytes`: 4 for RocketMQ remoting (the length counts what
    follows it), 5 for DLedger's peer links (a channel byte, then `length` bytes of
    payload). The proxy validates nothing: it only needs to know where frames end.
    """

    __slots__ = ("_header_bytes", "_left", "_length")

    def __init__(self, header_bytes: int) -> None:
        assert header_bytes >= _LENGTH_BYTES, header_bytes
        self._header_bytes = header_bytes
        self._length = b""  # the current frame's length field, while not all of it is in
        self._left = 0  # bytes of the current frame after its length field still to come

    def advance(self, data: bytes) -> None:
        """Account for `data` having been forwarded."""
        _, self._length, self._left = self._scan(data)

    def cut_point(self, data: bytes, n_bytes: int) -> int | None:
        """The first offset p >= n_bytes of `data` such that forwarding data[:p] leaves
        the stream inside a frame, or None if `data` holds no such offset."""
        ends = self._scan(data)[0]
        for p in (n_bytes, n_bytes + 1):  # frames are >= 4 bytes: two ends never touch
            if p <= len(data) and p not in ends:
                return p
        return None

    def _scan(self, data: bytes) -> tuple[list[int], bytes, int]:
        """The offsets p of `data` at which the stream, once data[:p] has gone, is
        between two frames; and the state after all of `data`."""
        length, left = self._length, self._left
        ends = [] if length or left else [0]
        pos, size = 0, len(data)
        while pos < size:
            if left:
                step = min(left, size - pos)
                left -= step
            else:
                step = min(_LENGTH_BYTES - len(length), size - pos)
                length += data[pos : pos + step]
                if len(length) == _LENGTH_BYTES:
                    left = self._header_bytes - _LENGTH_BYTES + int.from_bytes(length, "big")
                    length = b""
            pos += step
            if not length and not left:
                ends.append(pos)
        return ends, length, left


class _Conn:
    """One proxied connection: the scope that `reset` cancels, how to close it, and
    where its client-to-upstream frames end."""

    __slots__ = ("frames", "graceful", "scope")

    def __init__(self, frame_header_bytes: int) -> None:
        self.scope = trio.CancelScope()
        # True once both directions ended cleanly or a cut ended it: close with FIN.
        # Otherwise (reset, a peer's error, shutdown) close with RST.
        self.graceful = False
        self.frames = _Frames(frame_header_bytes)


def _close(stream: trio.SocketStream) -> None:
    """Close with a FIN. The write side is shut down first: closing a socket that still
    holds bytes it has not read (a reply the proxy had no time to forward) sends an RST
    instead of a FIN, and the peer would read a reset, not the end of its stream."""
    with contextlib.suppress(OSError):  # already shut down, or the peer is gone
        stream.socket.shutdown(socket.SHUT_WR)
    stream.socket.close()


def _abort(stream: trio.SocketStream) -> None:
    """Close with an RST (linger 0), so the peer sees ECONNRESET rather than an orderly end."""
    with contextlib.suppress(OSError):  # already broken: closing it is all that is left
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


class LinkProxy:
    """Accepts on `host:port` (127.0.0.1 and a free port by default) and forwards each
    connection to `upstream` ("host:port"), whose protocol's frames begin with a 4-byte
    length counting what follows their first `frame_header_bytes` (see `_Frames`).

    Run it with `await nursery.start(proxy.serve)`; cancelling that nursery closes
    the listener and resets every connection. The mode methods are synchronous and
    may be called from any task at any time.

    Latency is a knob separate from the mode: `latency()` keeps the mode and
    `pass_()` keeps the latency, so a partition can be laid over a slow network;
    `heal()` clears both. Jitter draws from `rng`, so a seeded run draws the same
    sequence of delays (which chunk gets which depends on scheduling).
    """

    def __init__(
        self,
        upstream: str,
        rng: random.Random,
        *,
        frame_header_bytes: int,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if frame_header_bytes < _LENGTH_BYTES:
            raise ValueError(f"a frame header holds at least its {_LENGTH_BYTES}-byte length")
        self.upstream = upstream
        self._frame_header_bytes = frame_header_bytes
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
        self.cuts = 0  # connections cut inside a frame, for the nemesis's record

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
        """Forward `n_bytes` more client-to-upstream bytes (over all connections), or
        one more if the n-th ends a frame, then close the connection that carried the
        last of them inside a frame, count it in `cuts` and go back to pass. If no
        connection sends that much, nothing is cut until the mode changes."""
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
                conn = _Conn(self._frame_header_bytes)
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

    def _cut(self, frames: _Frames, data: bytes) -> tuple[bytes, bool]:
        """What of `data` to forward while a cut is armed, and whether to cut after it."""
        cut_at = frames.cut_point(data, self._cut_budget)
        if cut_at is None:
            self._cut_budget = max(0, self._cut_budget - len(data))
            return data, False
        self._cut_budget = 0
        self._set_mode(_Mode.PASS)
        self.cuts += 1
        return data[:cut_at], True

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
                if to_upstream:
                    if self._mode is _Mode.CUT:
                        data, cut = self._cut(conn.frames, data)
                    conn.frames.advance(data)
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
    a free port on 127.0.0.1. Every link speaks a protocol whose frames start with a
    4-byte length counting what follows their first `frame_header_bytes`.
    """

    def __init__(
        self,
        links: Mapping[Link, str],
        rng: random.Random,
        listen: Mapping[Link, str] | None = None,
        *,
        frame_header_bytes: int,
    ) -> None:
        self._proxies = {
            link: LinkProxy(
                upstream, rng, frame_header_bytes=frame_header_bytes, **_bind(listen, link)
            )
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
        """On each of `links`, cut the connection carrying the n-th byte from now inside
        a frame (see `LinkProxy.cut_after`)."""
        for proxy in self._select(links):
            proxy.cut_after(n_bytes)

    def cuts(self, links: Iterable[Link]) -> int:
        """Connections cut inside a frame on `links` so far."""
        return sum(proxy.cuts for proxy in self._select(links))

    def heal(self) -> None:
        """Every link back to pass with no latency."""
        for proxy in self._proxies.values():
            proxy.heal()
        self.grudge = {}

    def _select(self, links: Iterable[Link] | None) -> list[LinkProxy]:
        if links is None:
            return list(self._proxies.values())
        return [self._proxies[link] for link in links]
