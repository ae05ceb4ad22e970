"""Sends that outlive their master: `Hedger` sends a slow request to a new master too.

A DLedger group elects a new master in a few hundred milliseconds when its master is
paused (SIGSTOP), cut off from its peers or stepping down, but that master's TCP
connections stay open, so a request to it is answered by nothing but its timeout. A
`Hedger` watches the requests it carries: once one has had no answer for
`hedge_after_s`, it asks a name server for the route (at most once per HEDGE_POLL_S
per topic, however many requests wait) and, as soon as the route names another master
for the request's broker group, sends the request there too, marked a resend
(`make_request(mq, True)`). The first stored answer wins; the attempts still out are
cancelled and their answers dropped.

A resend is only safe where the broker recognises one: a raftmq broker answers a resend
of a message it already stores (the same UNIQ_KEY, an earlier attempt that reached a
quorum under the old master) with that copy (broker.send). RocketMQ's brokers store it
again.

The request in the caller's task costs a cancel scope and a set entry; the one
watching task runs only while some request is out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import attrs
import trio

from raftmq.client.errors import RouteNotFoundError
from raftmq.client.instance import ClientInstance
from raftmq.client.route import MessageQueue
from raftmq.remoting import (
    RemotingCommand,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from raftmq.remoting.codes import ResponseCode

__all__ = ["HEDGE_AFTER_S", "HEDGE_POLL_S", "Attempt", "Hedger", "attempt"]

log = logging.getLogger(__name__)

HEDGE_AFTER_S = 0.3  # how long a request goes unanswered before a new master is looked for
HEDGE_POLL_S = 0.05  # how often the route is asked for while a request waits
# The answers that mean "stored" (SendStatus): SUCCESS, and a classic store's
# FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE.
STORED_CODES = frozenset(
    (
        ResponseCode.SUCCESS,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
    )
)
# The one error answer that leaves the outcome open: the broker failed after accepting
# the request (a processor error, or a quorum-ack timeout: the entry may still commit).
# Every other error code is a refusal.
OUTCOME_UNKNOWN_CODES = frozenset((ResponseCode.SYSTEM_ERROR,))


@attrs.frozen
class Attempt:
    """What came of a request and its resends: the first stored answer, else the last
    answer or None (`response`); what went wrong (`reason`); whether any attempt may
    have stored the message (`unknown`); the address that answered (`address`)."""

    response: RemotingCommand | None
    reason: str
    unknown: bool
    address: str

    @property
    def stored(self) -> bool:
        return self.response is not None and self.response.code in STORED_CODES


@attrs.define(eq=False)
class _Out:
    """One request a Hedger carries: where it went, what came back."""

    mq: MessageQueue
    make_request: Callable[[MessageQueue, bool], RemotingCommand]
    deadline: float
    started: float
    tried: list[str]
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)  # the caller's attempt
    resends: list[trio.CancelScope] = attrs.Factory(list)
    outcomes: list[Attempt] = attrs.Factory(list)
    malformed: list[RemotingError] = attrs.Factory(list)
    waiting: int = 1  # attempts without an outcome yet
    settled: trio.Event = attrs.Factory(trio.Event)

    def record(self, outcome: Attempt) -> None:
        self.outcomes.append(outcome)
        self.waiting -= 1
        assert self.waiting >= 0, self
        if outcome.stored:
            self.cancel()
        if outcome.stored or not self.waiting:
            self.settled.set()

    def cancel(self) -> None:
        self.scope.cancel()
        for scope in self.resends:
            scope.cancel()


class Hedger:
    """`await hedger.send(mq, address, make_request, deadline, resend=...)`: one
    request, sent to new masters too while it goes unanswered (see the module).
    `hedge_after_s=math.inf` sends it once."""

    def __init__(self, instance: ClientInstance, hedge_after_s: float = HEDGE_AFTER_S) -> None:
        self.instance = instance
        self.hedge_after_s = hedge_after_s
        self._out: set[_Out] = set()
        self._watching = False

    async def send(
        self,
        mq: MessageQueue,
        address: str,
        make_request: Callable[[MessageQueue, bool], RemotingCommand],
        deadline: float,
        *,
        resend: bool,
    ) -> Attempt:
        """`make_request(mq, resend)` sent to `address` within `deadline`, and to each
        new master of `mq`'s group while it has no answer (marked resend there)."""
        out = _Out(mq, make_request, deadline, trio.current_time(), [address])
        if self.hedge_after_s < math.inf:
            self._out.add(out)
            if not self._watching:
                self._watching = True
                self.instance.nursery.start_soon(self._watch)
        try:
            with out.scope:
                await self._attempt(out, address, resend)
            if not out.settled.is_set():  # resends are still out
                await out.settled.wait()
        finally:
            self._out.discard(out)
            for scope in out.resends:  # the caller's own attempt is over
                scope.cancel()
        stored = [outcome for outcome in out.outcomes if outcome.stored]
        if out.malformed and not stored:
            raise out.malformed[0]
        last = stored[0] if stored else out.outcomes[-1]
        unknown = any(outcome.unknown for outcome in out.outcomes)
        return attrs.evolve(last, unknown=unknown)

    async def _attempt(self, out: _Out, address: str, resend: bool) -> None:
        try:
            response, reason, sent = await attempt(
                self.instance, address, out.make_request(out.mq, resend), out.deadline
            )
        except RemotingError as exc:  # an answer that does not decode: raised if none stored
            out.malformed.append(exc)
            response, reason, sent = None, str(exc), True
        code = None if response is None else response.code
        unknown = sent and (code is None or code in OUTCOME_UNKNOWN_CODES)
        out.record(Attempt(response, reason, unknown, address))

    async def _resend(self, out: _Out, address: str, scope: trio.CancelScope) -> None:
        with scope:
            await self._attempt(out, address, True)

    async def _watch(self) -> None:
        """While requests are out: send the ones slow past `hedge_after_s` to each new
        master the route names for their group."""
        try:
            while self._out:
                await trio.sleep(HEDGE_POLL_S)
                now = trio.current_time()
                for out in list(self._out):
                    if now - out.started < self.hedge_after_s or now >= out.deadline:
                        continue
                    if out.settled.is_set():
                        continue
                    try:
                        route = await self.instance.routes.fresh(out.mq.topic, HEDGE_POLL_S)
                    except RouteNotFoundError as exc:
                        log.debug("%s", exc)
                        continue
                    master = route.master(out.mq.broker_name)
                    if master is None or master in out.tried or out.settled.is_set():
                        continue
                    log.debug("no answer from %s yet: sending to %s too", out.tried[-1], master)
                    out.tried.append(master)
                    out.waiting += 1
                    scope = trio.CancelScope()
                    out.resends.append(scope)
                    self.instance.nursery.start_soon(self._resend, out, master, scope)
        finally:
            self._watching = False


async def attempt(
    instance: ClientInstance, address: str, request: RemotingCommand, deadline: float
) -> tuple[RemotingCommand | None, str, bool]:
    """One request: (response or None, what went wrong, whether the request left)."""
    pool = instance.pool
    client = pool.open_client(address)
    if client is None:
        with trio.move_on_after(max(0.0, deadline - trio.current_time())):
            try:
                client = await pool.get(address)
            except RemotingConnectError as exc:
                return None, str(exc), False
    if client is None:
        return None, f"connecting to {address} timed out", False
    # One RPC timeout at most: a master that hangs (stopped, cut off) should not
    # use up the time in which its successor could take the send.
    timeout_s = min(instance.rpc_timeout_s, max(0.001, deadline - trio.current_time()))
    try:
        response = await client.invoke(request, timeout_s)
    except (RemotingConnectError, RemotingTimeoutError) as exc:
        return None, str(exc), True
    # Its answer: what the result reports (stored or not, queue offset, msgId) is
    # this message's, never another send's on the same connection.
    assert response.is_response and response.opaque == request.opaque, (request, response)
    return response, f"broker {address} answered {response.code}: {response.remark}", True
