"""The group address (`groupAddress`, raftmq's own key): one IP:port that follows the
master of a DLedger group, or of a controller-mode group.

A client that holds a route keeps dialling the address in it. RocketMQ's C++ client
asks the name server again only on its poll timer (every 30 s) or when its route has
no writable queue, so after a master dies its sends fail at the dead address for up
to 30 s, however fast the group elects. With a group address every member is
configured with the same IP:port; the master listens there too (besides its own
brokerIP1:listenPort) and registers it as brokerId 0's address, so the address
clients hold is served by whoever is master now. Until it has bound the address it
registers its own: a paused predecessor (SIGSTOP: alive, answering nothing) holds the
address until it runs again, and clients that ask the name server should not be sent
to it meanwhile.

A member listens there only while it is master: it binds once it has become master
(after committing an entry of its term and dispatching everything before it; in
controller mode, once the controller named it master and its lease is renewed),
retrying every BIND_RETRY_S while the address is in use (a deposed master that has
not yet heard it is deposed still holds it), and closes the listener and every
connection accepted through it the moment it stops being master, so that those
clients reconnect and reach the new master. A connection is closed once it has answered
a request since ("not master"), nothing has passed on it either way for FINISH_QUIET_S
and every request on it is answered, at most FINISH_LIMIT_S after the release (an
idle client's), not at once: a C++ client's send written just
before an abrupt close waited out that client's 3 s timeout (`Connection.finish`). A
deposed master that still holds the address acknowledges nothing: DLedger refuses its
appends.

On one host any 127.x.y.z is bindable, so a local group can use 127.0.0.2:port.
Across hosts the operator must route the address to the master's host (a virtual IP
that keepalived or the like moves): raftmq binds when master and releases when
deposed, nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from raftmq.remoting import RemotingServer

log = logging.getLogger(__name__)

BIND_RETRY_S = 0.03  # while a deposed master still holds the address
# A released connection closes once it has been quiet this long (longer than the C++
# client takes to resend a refused send, 0.1-0.3 ms here) with every request
# answered, or this late at most: DLedger decides an append's outcome within
# maxWaitAckTimeMs (2.5 s by default), so an answer owed by then is still given, and
# a client that sends nothing meanwhile is cut off then.
FINISH_QUIET_S = 0.0015
FINISH_LIMIT_S = 3.0


class GroupListener:
    """`server` (a RemotingServer on the group address, serving the broker's
    processors) listening while this member is master."""

    def __init__(
        self, server: RemotingServer, on_listening: Callable[[bool], None] = lambda _: None
    ) -> None:
        """`on_listening(listening)` is told when this member starts and stops listening
        on the group address (the broker registers it with the name servers only then)."""
        self.server = server
        self._on_listening = on_listening
        self._wanted = False
        self._changed = trio.Event()
        self._scope: trio.CancelScope | None = None
        self._listening = False

    @property
    def address(self) -> str:
        return self.server.address

    def claim(self) -> None:
        """This member is master: listen on the group address as soon as it is free."""
        self._wanted = True
        self._changed.set()

    def release(self) -> None:
        """This member is no longer master: stop listening at once, and close every
        connection accepted on the group address once it has answered (see above)."""
        self._wanted = False
        self._changed.set()
        if self._listening:
            self.server.finish(FINISH_QUIET_S, FINISH_LIMIT_S)
            self._on_listening(False)
        elif self._scope is not None:  # still binding
            self._scope.cancel()

    async def run(self) -> None:
        async with trio.open_nursery() as connections:  # they outlive a release
            await self._serve_while_master(connections)

    async def _serve_while_master(self, connections: trio.Nursery) -> None:
        while True:
            while not self._wanted:
                self._changed = trio.Event()
                await self._changed.wait()
            listeners = None
            with trio.CancelScope() as self._scope:
                listeners = await self._bind()
            self._scope = None
            if listeners is None:  # released while binding
                continue
            self._listening = True
            log.warning("group address %s: listening as master", self.address)
            self._on_listening(True)
            try:
                await self.server.serve_listeners(listeners, handler_nursery=connections)
            finally:
                self._listening = False
                self._on_listening(False)  # release() told it at once; this, however it ended
            log.warning("group address %s released", self.address)

    async def _bind(self) -> list[trio.SocketListener]:
        """Listeners on the group address, retrying while another member holds it."""
        said_busy = False
        while True:
            try:
                return await trio.open_tcp_listeners(self.server.port, host=self.server.host)
            except OSError as exc:
                if not said_busy:
                    said_busy = True
                    log.warning("group address %s: %s; retrying", self.address, exc)
                await trio.sleep(BIND_RETRY_S)
