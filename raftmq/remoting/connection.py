"""One remoting connection, either end: requests both ways, responses matched by opaque.

RocketMQ puts this logic in `NettyRemotingAbstract`, shared by client and server,
because the protocol is symmetric: a client sends requests and also answers the
broker's (NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO); a broker answers
requests and also sends its own. Each incoming frame is either a response (flag bit
0), routed to the waiting `invoke` by its opaque, or a request, handed to the
processor in a task of its own so that a long-polling pull does not hold up the
requests behind it.

Rules from `processRequestCommand`, kept here:

- the response carries the request's opaque and serialize type and the response flag;
- a oneway request (flag bit 1) gets no response, whatever the processor returns;
- a processor exception is logged and answered SYSTEM_ERROR with its text, and the
  connection carries on;
- a malformed frame closes the connection (Java's decoder closes the channel): the
  framing of what follows can no longer be trusted.

When the connection's I/O ends — the peer closed it, a frame was malformed, a send
failed, or `close()` was called — every pending `invoke` fails at once with
RemotingConnectError and `on_close` runs. Requests already received keep running to
completion, as they would on Java's executor threads (a oneway offset commit sent
just before a client exits must not be lost); their responses are dropped. A
processor that waits for a long time can watch `closed` or `wait_closed()`.

`finish()` ends a connection without leaving a request unanswered where that can be
helped: once it has answered something, a moment has passed with nothing received or
sent, and every request received is answered (a peer that sends nothing is cut off at
a time limit). Closed at an arbitrary moment, a request the peer had just
written goes unanswered, and RocketMQ's C++ client fails a request on a closed
connection only when its own timeout expires (3 s for a send); it also resends a
refused send at once on the same connection, before it has read an end that followed
the refusal, hence the quiet moment after the last answer too. What the peer writes
in the instant before it reads the end is still lost: only the peer can close that.

Requests processed in tasks are capped per connection (`max_running_requests`):
past the cap a request is answered SYSTEM_BUSY at once, as Java's broker answers
when a processor's queue is full, so a client pipelining held pulls without end
costs bounded memory.

Sending is synchronous and never blocks: `send` queues the frame for the writer
task, which batches everything queued into one `send_all`. The queue is bounded by
`max_pending_bytes`; a peer that stops reading past it has its connection closed,
so a stuck client costs bounded memory.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable

import trio

from raftmq.remoting.codec import MAX_FRAME_BYTES
from raftmq.remoting.codes import ResponseCode
from raftmq.remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from raftmq.remoting.errors import RemotingConnectError, RemotingError, RemotingTimeoutError
from raftmq.remoting.frames import FrameReader, FrameWriter
from raftmq.remoting.processor import (
    Dispatcher,
    Processor,
    as_dispatcher,
    system_error,
    take_inline,
)
from raftmq.transport.deadlines import DeadlineReaper
from raftmq.transport.frames import RECEIVE_CHUNK
from raftmq.transport.idle import close_when_stalled
from raftmq.transport.writer import unread_bytes

__all__ = ["DEFAULT_MAX_PENDING_BYTES", "DEFAULT_MAX_RUNNING_REQUESTS", "Connection"]

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_RUNNING_REQUESTS = 16_384

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_OPAQUE_MASK = 0x7FFFFFFF  # opaques are Java ints; ours stay positive and wrap


class _Call:
    __slots__ = ("code", "deadline", "error", "event", "response", "timeout_s")

    def __init__(self, code: int, timeout_s: float) -> None:
        self.code = code
        self.timeout_s = timeout_s
        self.deadline = trio.current_time() + timeout_s
        self.event = trio.Event()
        self.response: RemotingCommand | None = None
        self.error: BaseException | None = None


class Connection:
    """A connected trio stream speaking remoting; `run()` drives it until it closes.

    `processor` answers requests from the peer (see `as_dispatcher`); None answers
    every request REQUEST_CODE_NOT_SUPPORTED (a client that serves nothing). `on_close(connection)`
    is called once, when the I/O has ended. Hashable by identity, so a broker can key
    its client tables by connection.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        processor: Dispatcher | Processor | None = None,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
        on_close: Callable[[Connection], None] | None = None,
        receive_size: int = RECEIVE_CHUNK,
        frame_deadline_s: float | None = None,
    ) -> None:
        self._stream = stream
        self._frame_deadline_s = frame_deadline_s  # a frame begun must complete by then
        self._dispatcher = as_dispatcher(processor)
        self._max_pending_bytes = max_pending_bytes
        self._max_running = max_running_requests
        self._running = 0
        self._on_close = on_close
        self._writer = FrameWriter(stream, max_frame_bytes)
        self._reader = FrameReader(
            stream, max_frame_bytes, receive_size=receive_size, raw=self._dispatcher.raw_fields
        )
        self.remote_address = _socket_name(stream, "getpeername")
        self.local_address = _socket_name(stream, "getsockname")
        self._opaque = 0
        self._calls: dict[int, _Call] = {}
        # One task over a heap of deadlines instead of a cancel scope per call.
        self._deadlines = DeadlineReaper(self._expire, self._is_pending)
        self._error: RemotingConnectError | None = None
        self._io_scope: trio.CancelScope | None = None
        self._tasks: trio.Nursery | None = None
        self._closed_event = trio.Event()
        self._started = False
        # While finishing: trio time of the last request read or answer queued, and
        # whether an answer has been queued since `finish`.
        self._last_exchange_s = -math.inf
        self._answered_since_finish = trio.Event()
        # Answers an inline processor took on and has not given yet (a batch of sends
        # waiting for its append): kept by the processor, waited for by `finish`.
        self.answers_owed = 0
        self._finishing: tuple[float, float] | None = None  # `finish`'s (quiet_s, limit_s)
        self._io: trio.Nursery | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Connection {self.local_address} <-> {self.remote_address} {state}>"

    @property
    def closed(self) -> bool:
        """True once the connection can no longer send (closed, or closing)."""
        return self._error is not None

    @property
    def in_flight(self) -> int:
        """Requests sent by this end that still await their response."""
        return len(self._calls)

    @property
    def unsent_bytes(self) -> int:
        """Bytes queued to send and not yet handed to the socket."""
        return self._writer.pending_bytes

    async def wait_closed(self) -> None:
        """Return once the connection's I/O has ended."""
        await self._closed_event.wait()

    # ------------------------------------------------------------------ sending
    def send(self, command: RemotingCommand) -> None:
        """Queue `command` exactly as given (a response, or a request built by hand).

        Never blocks. Raises RemotingConnectError if the connection is closed (or is
        closed now because the peer stopped reading), RemotingError if the command
        cannot be encoded.
        """
        if self._error is not None:
            raise self._closed_error()
        writer = self._writer
        try:
            writer.write(command)
        except trio.ClosedResourceError:
            raise self._closed_error() from None
        if self._finishing is not None:  # the peer may answer this at once
            self._last_exchange_s = trio.current_time()
            self._answered_since_finish.set()
        if self._backlog_too_long():
            raise self._closed_error()

    def send_encoded(self, frames: bytes) -> None:
        """Queue response frames already encoded (a batch answered at once); dropped
        when the peer is gone, as `respond` drops a response."""
        if self._error is not None:
            log.debug("%s went away before %d bytes of responses", self, len(frames))
            return
        try:
            self._writer.write_encoded(frames)
        except trio.ClosedResourceError:
            return
        if self._finishing is not None:  # the peer may answer these at once
            self._last_exchange_s = trio.current_time()
            self._answered_since_finish.set()
        self._backlog_too_long()

    def _backlog_too_long(self) -> bool:
        """Close the connection (True) if more than max_pending_bytes wait to be sent."""
        pending = self._writer.pending_bytes
        if pending <= self._max_pending_bytes:
            return False
        log.warning(
            "closing %s: %d bytes queued, the peer is not reading", self.remote_address, pending
        )
        self.close("the peer is not reading its responses")
        return True

    def invoke_oneway(self, request: RemotingCommand) -> None:
        """Send `request` with the oneway flag and a fresh opaque; no response will come."""
        request.opaque = self._next_opaque()
        request.flag = (request.flag & ~FLAG_RESPONSE) | FLAG_ONEWAY
        self.send(request)

    async def invoke(self, request: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        """Send `request` with a fresh opaque and return the peer's response.

        The response is returned whatever its code; checking it is the caller's job,
        as in Java's `invokeSync`. Raises RemotingConnectError if the connection is or
        goes down before the response, RemotingTimeoutError after `timeout_s`.
        """
        if self._error is not None:
            raise self._closed_error()
        opaque = self._next_opaque()
        request.opaque = opaque
        request.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        call = _Call(request.code, timeout_s)
        calls = self._calls
        calls[opaque] = call
        try:
            self.send(request)
            self._deadlines.add(call.deadline, opaque)
            await call.event.wait()
        finally:
            calls.pop(opaque, None)
        if call.response is not None:
            return call.response
        raise call.error

    def _next_opaque(self) -> int:
        opaque = (self._opaque + 1) & _OPAQUE_MASK
        while opaque in self._calls:  # only after 2**31 requests with one still waiting
            opaque = (opaque + 1) & _OPAQUE_MASK
        self._opaque = opaque
        return opaque

    def _is_pending(self, opaque: int) -> bool:
        return opaque in self._calls

    def _expire(self, opaque: int) -> None:
        call = self._calls.pop(opaque)
        call.error = RemotingTimeoutError(
            f"no response to request code {call.code} from {self.remote_address} "
            f"within {call.timeout_s} s"
        )
        call.event.set()

    # ------------------------------------------------------------------ lifetime
    def close(self, reason: str = "closed locally") -> None:
        """End the connection's I/O now; pending and later calls fail. Never blocks."""
        self._fail_all(reason)
        if self._io_scope is not None:
            self._io_scope.cancel()

    def finish(self, quiet_s: float, limit_s: float) -> None:
        """End the connection once it has answered a request, nothing has been received
        or sent for `quiet_s` and every request received is answered (see the module's
        docstring), or after `limit_s` whatever is owed. Never blocks."""
        if self._finishing is not None or self._error is not None:
            return
        self._finishing = (quiet_s, limit_s)
        self._last_exchange_s = trio.current_time()
        if self._io is not None:
            self._io.start_soon(self._finish, quiet_s, limit_s)

    async def _finish(self, quiet_s: float, limit_s: float) -> None:
        with trio.move_on_after(limit_s):
            # Not while the peer is idle: it may be about to write. Just after an answer
            # it reads, then resends at once or pauses.
            await self._answered_since_finish.wait()
            while True:
                quiet_at_s = self._last_exchange_s + quiet_s
                if trio.current_time() < quiet_at_s:
                    await trio.sleep_until(quiet_at_s)
                elif self._running or self.answers_owed or unread_bytes(self._stream):
                    await trio.sleep(quiet_s)  # answered, or read, by other tasks
                else:
                    break
            self._writer.finish()  # a FIN now, then the I/O ends
            return
        self.close(f"not quiet within {limit_s} s of finishing")

    def _fail_all(self, reason: str) -> None:
        """Fail every pending call and all later ones (the first reason wins)."""
        if self._error is None:
            self._error = RemotingConnectError(f"connection to {self.remote_address}: {reason}")
            self._writer.abort()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.error = self._closed_error()
            call.event.set()

    def _closed_error(self) -> RemotingConnectError:
        # A fresh exception per raise: one instance raised in many tasks would pile
        # all their tracebacks onto itself.
        if self._error is None:
            return RemotingConnectError(f"connection to {self.remote_address} is closed")
        return RemotingConnectError(*self._error.args)

    async def run(self) -> None:
        """Read, write and serve until the connection ends; never raises for a peer's fault.

        Returns after the I/O has ended and every request received has been processed.
        The stream is closed on the way out.
        """
        if self._started:
            raise RuntimeError("Connection.run() can only be called once")
        self._started = True
        try:
            async with trio.open_nursery() as tasks:
                self._tasks = tasks
                try:
                    async with trio.open_nursery() as io:
                        self._io_scope = io.cancel_scope
                        self._io = io
                        if self._error is not None:  # closed before it ran
                            io.cancel_scope.cancel()
                        if self._finishing is not None:  # finished before it ran
                            io.start_soon(self._finish, *self._finishing)
                        io.start_soon(self._write_loop, io.cancel_scope)
                        io.start_soon(self._deadlines.run)
                        if self._frame_deadline_s is not None:
                            io.start_soon(
                                close_when_stalled,
                                self._reader,
                                self._frame_deadline_s,
                                lambda: self.close(
                                    f"a frame not completed within {self._frame_deadline_s} s"
                                ),
                            )
                        reason = await self._read_loop()
                        self._fail_all(reason)
                        io.cancel_scope.cancel()
                finally:
                    self._io = None
                    # Synchronous steps first: under cancellation the await below raises
                    # Cancelled, and waiters and on_close must hear of the end anyway.
                    self._fail_all("connection closed")
                    self._closed_event.set()
                    self._notify_closed()
                    await trio.aclose_forcefully(self._stream)
        finally:
            self._tasks = None

    def _notify_closed(self) -> None:
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:
                log.exception("on_close callback failed for %s", self.remote_address)

    async def _write_loop(self, io_scope: trio.CancelScope) -> None:
        try:
            await self._writer.run()
        except _STREAM_ERRORS as exc:
            self._fail_all(f"send failed: {exc!r}")
        finally:
            io_scope.cancel()

    async def _read_loop(self) -> str:
        """Dispatch incoming frames; returns why reading stopped."""
        reader = self._reader
        on_response = self._on_response
        start_soon = self._tasks.start_soon
        process = self._process
        inline = self._dispatcher.inline
        try:
            while True:
                commands = await reader.receive_batch()
                if commands is None:
                    return "closed by the peer"
                requests = []
                for command in commands:  # (a raw request is a request: its flag says so)
                    if command.flag & FLAG_RESPONSE:
                        on_response(command)
                    else:
                        requests.append(command)
                if not requests:
                    continue
                if self._finishing is not None:
                    self._last_exchange_s = trio.current_time()
                for request in take_inline(inline, requests, self):
                    if self._running >= self._max_running:
                        self._refuse_busy(request)
                    else:
                        self._running += 1
                        start_soon(process, request)
        except RemotingError as exc:
            log.warning("closing connection from %s: %s", self.remote_address, exc)
            return f"malformed frame: {exc}"
        except _STREAM_ERRORS as exc:
            log.debug("connection from %s ended: %r", self.remote_address, exc)
            return f"connection broke: {exc!r}"

    def _on_response(self, response: RemotingCommand) -> None:
        call = self._calls.pop(response.opaque, None)
        if call is None:
            log.debug(
                "%s: response to unknown opaque %d (timed out?)",
                self.remote_address,
                response.opaque,
            )
            return
        call.response = response
        call.event.set()

    # ------------------------------------------------------------------ serving
    def _refuse_busy(self, request: RemotingCommand) -> None:
        remark = (
            f"[OVERLOAD]system busy: {self._running} requests in flight on this connection, "
            "start flow control for a while"
        )
        self.respond(request, request.make_response(ResponseCode.SYSTEM_BUSY, remark))

    async def _process(self, request: RemotingCommand) -> None:
        try:
            await self._answer(request)
        finally:
            self._running -= 1

    async def _answer(self, request: RemotingCommand) -> None:
        try:
            response = await self._dispatcher(request, self)
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the connection
            response = system_error(request, exc, self.remote_address)
        self.respond(request, response)

    def respond(self, request: RemotingCommand, response: RemotingCommand | None) -> None:
        """Send `response` to `request` (stamped with its opaque and serialize type);
        nothing for a oneway request, or when the peer is gone."""
        if response is None or request.flag & FLAG_ONEWAY:
            return
        response.opaque = request.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = request.serialize_type
        try:
            self.send(response)
        except RemotingError as exc:  # unencodable or too large: still answer
            log.error("cannot send the response to request code %s: %s", request.code, exc)
            error = request.make_response(ResponseCode.SYSTEM_ERROR, f"bad response: {exc}")
            with contextlib.suppress(RemotingConnectError):
                self.send(error)
        except RemotingConnectError:
            log.debug("%s went away before the response to code %s", self, request.code)


def _socket_name(stream, method: str) -> str:
    try:
        # A TLS stream's socket is its transport's.
        address = getattr(getattr(stream, "transport_stream", stream).socket, method)()
    except (AttributeError, OSError):
        return "?"
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(address)
