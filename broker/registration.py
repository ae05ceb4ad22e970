"""Registering with every name server: REGISTER_BROKER (103).

RocketMQ re-registers every 30 s, and on a DLedger role change registers oneway,
so the name servers (and through them the clients) may learn of a new master only
at the next tick. Here a role change registers at once and waits for each name
server's answer, retrying a failed one quickly; the periodic registration remains
as the heartbeat that keeps the broker from expiring.

Each name server has a lane of its own: one task, one connection, one request in
flight (RocketMQ sends to all in parallel but waits for all before the next round).
A name server that accepts and never answers (SIGSTOPped, say) holds up only its
own lane, for registerBrokerTimeoutMills at a time; the others hear of a new master
at once. A lane closes a failed connection before it opens the next, so retries
against a hung name server never pile up connections. The connection stays open
between registrations: a name server drops a broker whose connection closes, so a
stopped broker leaves the routes at once.

A classic slave learns its master's addresses from the answers. While it has no
connection to its master (`master_wanted`) every lane registers again after
MASTER_ASK_S instead of registerNameServerPeriod, so a slave that registered before
its master (or whose master went away and came back, perhaps on another HA port)
hears of it within half a second; RocketMQ's slave waits for its next periodic
registration, up to 30 s.

With a group address (`groupAddress`, broker.group_address) the master registers that
address as brokerId 0 and unregisters its own address's slave entry once it listens
there (its own address until then); a slave registers its own address, as without one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from raftmq.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingError,
    RequestCode,
    ResponseCode,
)

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.config import BrokerConfig
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.store.metadata import Metadata

log = logging.getLogger(__name__)

RETRY_S = 0.2  # the first retry; doubled per failure in a row, up to MAX_RETRY_S
MAX_RETRY_S = 3.0
# between registrations of a slave without its master: half of the second within which
# a group whose slave registered first takes its first acknowledged send
MASTER_ASK_S = 0.5


class _Lane:
    """One name server's registrations."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.wanted = trio.Event()
        self.settled = 0  # the newest request (see Registration._requested) answered or failed
        self.failures = 0  # in a row; reset by an answer


class Registration:
    """Registers `metadata`'s topics under `role`'s brokerId and term with every name
    server of `config`."""

    def __init__(
        self,
        config: BrokerConfig,
        role: BrokerRole,
        address: BrokerAddress,
        metadata: Metadata,
        ha_server_addr: Callable[[], str] | None = None,
        on_answer: Callable[[dict[str, str]], None] | None = None,
        master_wanted: Callable[[], bool] = lambda: False,
    ) -> None:
        """A classic broker gives its HA address to advertise (`ha_server_addr`) and
        learns its master's addresses from every answer (`on_answer`, given the
        answer's header: haServerAddr and masterAddr, absent while its group has no
        live master); a slave asks again every MASTER_ASK_S while `master_wanted()`."""
        self.config = config
        self.ha_server_addr = ha_server_addr
        self.on_answer = on_answer
        self.master_wanted = master_wanted
        self.role = role
        self.address = address
        self.metadata = metadata
        self._lanes = [_Lane(namesrv) for namesrv in config.namesrv_addr]
        self._requested = 0  # registrations asked for; each lane sends the state at its turn
        self._progress = trio.Event()

    def register_soon(self) -> None:
        self._requested += 1
        for lane in self._lanes:
            lane.wanted.set()

    async def register_now(self) -> None:
        """Register what is known now with every name server; return when each has
        answered it or failed since. A name server that never answers holds this up
        until the attempt under way times out (registerBrokerTimeoutMills), and the
        others not at all."""
        self.register_soon()
        target = self._requested
        while any(lane.settled < target for lane in self._lanes):
            await self._progress.wait()

    def _settle(self, lane: _Lane, requested: int) -> None:
        lane.settled = max(lane.settled, requested)
        self._progress.set()
        self._progress = trio.Event()

    def _request(self) -> RemotingCommand:
        body = {
            "topicConfigSerializeWrapper": self.metadata.topics_wrapper(),
            "filterServerList": [],
        }
        address = self.address.registered(self.role.is_master)
        return RemotingCommand(
            code=RequestCode.REGISTER_BROKER,
            ext_fields={
                "brokerAddr": address,
                "brokerId": str(self.role.broker_id),
                "brokerName": self.config.broker_name,
                "clusterName": self.config.broker_cluster_name,
                "haServerAddr": address if self.ha_server_addr is None else self.ha_server_addr(),
                "compressed": "false",
                "bodyCrc32": "0",
                # not RocketMQ's: lets a name server ignore a deposed master's late claim
                "dLegerTerm": str(self.role.term),
            },
            body=json.dumps(body, separators=(",", ":")).encode(),
        )

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for lane in self._lanes:
                nursery.start_soon(self._run_lane, lane, name=f"register with {lane.address}")

    async def _run_lane(self, lane: _Lane) -> None:
        while True:
            try:
                async with RemotingClient(lane.address, tls=self.config.tls_client) as client:
                    await self._register_on(client, lane)
            except (RemotingError, OSError) as exc:
                # Said once per outage: a name server down for hours is one line.
                level = logging.WARNING if lane.failures == 0 else logging.DEBUG
                log.log(level, "register with name server %s failed: %s", lane.address, exc)
                lane.failures += 1
                self._settle(lane, self._requested)
            await trio.sleep(min(MAX_RETRY_S, RETRY_S * 2 ** (lane.failures - 1)))

    async def _register_on(self, client: RemotingClient, lane: _Lane) -> None:
        """Register at once, then whenever asked or due, until the connection fails."""
        period = self.config.register_name_server_period / 1000.0
        timeout = self.config.register_broker_timeout_mills / 1000.0
        while True:
            lane.wanted = trio.Event()  # a request from now on is one this send may predate
            requested = self._requested
            response = await client.invoke(self._request(), timeout)
            if response.code != ResponseCode.SUCCESS:
                raise RemotingError(f"answered {response.code}: {response.remark}")
            if self.on_answer is not None:
                self.on_answer(response.ext_fields or {})
            if self.address.registered(self.role.is_master) != self.address.address:
                await self._drop_slave_entry(client, timeout)
            self._settle(lane, requested)
            if lane.failures:
                log.warning("registered with name server %s again", lane.address)
                lane.failures = 0
            with trio.move_on_after(MASTER_ASK_S if self.master_wanted() else period):
                await _first_of(lane.wanted.wait, client.connection.wait_closed)

    async def _drop_slave_entry(self, client: RemotingClient, timeout_s: float) -> None:
        """A master registered under the group address: remove its own address's entry
        as a slave, which would otherwise stay in the routes until it expires (the name
        server's rule that a promoted slave loses its slave entry holds for one address)."""
        response = await client.invoke(
            RemotingCommand(
                code=RequestCode.UNREGISTER_BROKER,
                ext_fields={
                    "brokerAddr": self.address.address,
                    "brokerId": str(self.role.slave_broker_id),
                    "brokerName": self.config.broker_name,
                    "clusterName": self.config.broker_cluster_name,
                },
            ),
            timeout_s,
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemotingError(f"answered {response.code}: {response.remark}")


async def _first_of(*waits) -> None:
    """Return when the first of `waits` does (a closed connection fails the next send,
    so a restarted name server hears from the broker within RETRY_S, not a period later)."""
    async with trio.open_nursery() as nursery:
        for wait in waits:
            nursery.start_soon(_then_cancel, wait, nursery.cancel_scope)


async def _then_cancel(wait, scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()
