"""Request processors, and a table routing request codes to them.

A processor is `async def processor(request, connection) -> RemotingCommand | None`,
RocketMQ's `NettyRequestProcessor.processRequest`. Returning None sends nothing:
the processor either answers later through `connection.send` (as Java's
asynchronous processors do) or the request was oneway. The transport stamps the
request's opaque and serialize type and the response flag on whatever is returned.

`ProcessorTable` is `NettyRemotingAbstract.processorTable` with its
`defaultRequestProcessor`: a code with no processor and no default is answered
REQUEST_CODE_NOT_SUPPORTED with Java's exact remark.

A connection hands its requests to a `Dispatcher`: a processor that may also take
requests synchronously, in the read loop, all those of one read at a time (`inline`).
`ProcessorTable` is one; a plain processor becomes one through `as_dispatcher`. Its
inline handlers may also take requests raw (`raw_fields`): the frames of their codes
with a plain JSON header are not decoded into commands, only the ext fields they name
are read (`codec.plain_request`), and a handler decodes one (`codec.raw_command`)
only to leave it to its processor.

Whatever a processor raises that it did not turn into an answer itself is a bug,
answered by `system_error`, the one place that maps an exception to SYSTEM_ERROR.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from raftmq.remoting.codec import raw_command
from raftmq.remoting.codes import ResponseCode
from raftmq.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from raftmq.remoting.connection import Connection

__all__ = [
    "Dispatcher",
    "Processor",
    "ProcessorTable",
    "as_dispatcher",
    "not_supported",
    "system_error",
    "take_inline",
]

log = logging.getLogger(__name__)

Processor = Callable[[RemotingCommand, "Connection"], Awaitable[RemotingCommand | None]]
# requests (commands, or raw requests: codec.plain_request) -> those left, as commands
InlineProcessor = Callable[[list, "Connection"], list[RemotingCommand]]


def not_supported(request: RemotingCommand) -> RemotingCommand:
    """The answer to a request code nobody handles (`processRequestCommand`'s wording)."""
    return request.make_response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {request.code} not supported"
    )


def system_error(request: RemotingCommand, exc: Exception, peer: str = "?") -> RemotingCommand:
    """The answer to a request whose processor failed unexpectedly: logged with its
    traceback, answered SYSTEM_ERROR with the exception as remark (as
    `processRequestCommand` does), and the connection carries on."""
    log.error("processor failed on request code %s from %s", request.code, peer, exc_info=exc)
    return request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")


def take_inline(
    inline: InlineProcessor, requests: list, connection: Connection
) -> list[RemotingCommand]:
    """What `inline` leaves of `requests` to the task path, as commands: all of them if
    it raised, which it does only before it has taken any (`Dispatcher.inline`), but
    for an AssertionError (a broken invariant, perhaps after it took some), which ends
    the connection."""
    try:
        return inline(requests, connection)
    except AssertionError:  # a broken invariant: nothing is re-run, the connection ends
        raise
    except Exception:  # the task path will answer them, with the error if it recurs
        log.exception("inline processor failed on %d requests", len(requests))
        return [raw_command(r) if type(r) is tuple else r for r in requests]


@runtime_checkable
class Dispatcher(Protocol):
    """What a connection hands each request to."""

    raw_fields: tuple[frozenset[int], tuple[str, ...]] | None
    """(codes, ext field names) of the requests `inline` takes raw, or None."""

    def inline(self, requests: list, connection: Connection) -> list[RemotingCommand]:
        """Take what it can of `requests` (the requests of one read, in order, raw
        requests among them if `raw_fields` says so) synchronously, from the
        connection's read loop, and answer them through `connection` later; returns
        the rest, as commands, left to `__call__` in a task each. It raises only before
        it has taken any of them (then `__call__` gets them all): a request it took,
        answered or handed to the store, is its own to answer whatever fails after, so
        that none is answered twice or stored twice."""

    async def __call__(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | None:
        """Answer `request` (None: answered later through `connection`, or oneway)."""


def as_dispatcher(processor: Dispatcher | Processor | None) -> Dispatcher:
    """`processor` as a dispatcher: a plain processor takes every request in a task; None
    answers every request REQUEST_CODE_NOT_SUPPORTED (an end that serves nothing)."""
    if isinstance(processor, Dispatcher):
        return processor
    return ProcessorTable(default=processor)


class ProcessorTable:
    """A dispatcher that routes each request by code; unknown codes are not supported.

    table = ProcessorTable({RequestCode.HEART_BEAT: heartbeat})
    table.register(RequestCode.SEND_MESSAGE_V2, send)
    RemotingServer("0.0.0.0", 10911, table)
    """

    def __init__(
        self,
        processors: Mapping[int, Processor] | None = None,
        default: Processor | None = None,
    ) -> None:
        self._table: dict[int, Processor] = dict(processors or {})
        self._inline: dict[int, InlineProcessor] = {}
        self._raw_codes: set[int] = set()
        self._raw_names: tuple[str, ...] | None = None
        self.default = default

    def register(self, code: int, processor: Processor) -> None:
        self._table[int(code)] = processor

    def register_inline(
        self, code: int, handler: InlineProcessor, raw_names: tuple[str, ...] | None = None
    ) -> None:
        """A synchronous first try for `code`, called from the connection's read loop.

        It gets every request of one read that has its code (or another code it is
        registered for), in order, and returns those it did not take, which go to the
        task-per-request processor; it answers the others through `connection` later.
        For the hot path of a server (sends), where a task and an event per request
        cost more than the work itself, and one batch per read costs less than one
        call per request.

        With `raw_names` (the same for every code of a table), the requests of `code`
        with a plain JSON header come to `handler` raw (`codec.plain_request`, with
        the values of those ext fields), and the requests it returns are commands.
        """
        self._inline[int(code)] = handler
        if raw_names is not None:
            assert self._raw_names in (None, raw_names), "one set of raw ext field names"
            self._raw_names = raw_names
            self._raw_codes.add(int(code))

    @property
    def raw_fields(self) -> tuple[frozenset[int], tuple[str, ...]] | None:
        """(codes, ext field names) of the requests the inline handlers take raw."""
        if self._raw_names is None:
            return None
        return frozenset(self._raw_codes), self._raw_names

    @property
    def inline_codes(self) -> frozenset[int]:
        """The codes with an inline handler (a dispatcher wrapping this one checks those
        requests before handing them to `inline`)."""
        return frozenset(self._inline)

    def inline(self, requests: list, connection: Connection) -> list[RemotingCommand]:
        handlers = self._inline
        if not handlers:
            return requests
        left = []
        batches: dict[InlineProcessor, list] = {}
        for request in requests:
            # a raw request (a tuple) is one of a handler's codes
            handler = handlers.get(request[3] if type(request) is tuple else request.code)
            if handler is None:
                left.append(request)
            else:
                batches.setdefault(handler, []).append(request)
        for handler, batch in batches.items():  # one handler failing leaves the others' taken
            left += take_inline(handler, batch, connection)
        return left

    def __contains__(self, code: int) -> bool:
        return code in self._table

    async def __call__(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | None:
        processor = self._table.get(request.code, self.default)
        if processor is None:
            return not_supported(request)
        return await processor(request, connection)
