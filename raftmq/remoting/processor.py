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
`ProcessorTable` is one; a plain processor becomes one through `as_dispatcher`. A
code's processor may be a `Route`: one handling in two branches, the batch of a read
taken synchronously and what it leaves answered in a task each. A route's batch
branch may take requests raw (`raw_fields`): the frames of its codes with a plain
JSON header are not decoded into commands, only the ext fields it names are read
(`codec.plain_request`), and it decodes one (`codec.raw_command`) only to leave it to
its task branch.

Whatever a processor raises that it did not turn into an answer itself is a bug,
answered by `system_error`, the one place that maps an exception to SYSTEM_ERROR.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from raftmq.remoting.codec import as_command
from raftmq.remoting.codes import ResponseCode
from raftmq.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from raftmq.remoting.connection import Connection

__all__ = [
    "Dispatcher",
    "Processor",
    "ProcessorTable",
    "Route",
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
        return [as_command(r) for r in requests]


class Route:
    """One request code's handling, in two branches of one route.

    `batch(requests, connection)` gets every request of one read that has the code (or
    another the route is registered for), in order, synchronously, from the
    connection's read loop: it answers those it takes through `connection` later and
    returns the rest, as commands, which `processor` answers in a task each (the cases
    that wait or explain: a topic to create, an error's remark). For the hot path of a
    server (sends), where a task and an event per request cost more than the work
    itself, and one batch per read costs less than one call per request. With
    `raw_names` (the same for every route of a table), the requests come to `batch`
    raw when their header is plain JSON (`codec.plain_request`, with the values of
    those ext fields)."""

    __slots__ = ("batch", "processor", "raw_names")

    def __init__(
        self, processor: Processor, batch: InlineProcessor, raw_names: tuple[str, ...] | None = None
    ) -> None:
        self.processor = processor
        self.batch = batch
        self.raw_names = raw_names

    async def __call__(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | None:
        return await self.processor(request, connection)


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
    table.register(RequestCode.SEND_MESSAGE_V2, Route(send, send_batch))
    RemotingServer("0.0.0.0", 10911, table)
    """

    def __init__(
        self,
        processors: Mapping[int, Processor] | None = None,
        default: Processor | None = None,
    ) -> None:
        self._table: dict[int, Processor] = {}
        self._inline: dict[int, InlineProcessor] = {}
        self._raw_codes: set[int] = set()
        self._raw_names: tuple[str, ...] | None = None
        self.default = default
        for code, processor in (processors or {}).items():
            self.register(code, processor)

    def register(self, code: int, processor: Processor) -> None:
        """`processor` answers `code` (one processor, or one `Route`, per code)."""
        code = int(code)
        self._table[code] = processor
        self._inline.pop(code, None)
        self._raw_codes.discard(code)
        if isinstance(processor, Route):
            self._inline[code] = processor.batch
            if processor.raw_names is not None:
                assert self._raw_names in (None, processor.raw_names), "one set of raw names"
                self._raw_names = processor.raw_names
                self._raw_codes.add(code)

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
        for request in requests:  # (a raw request is one of a route's codes)
            handler = handlers.get(request.code)
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
