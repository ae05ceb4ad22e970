"""The broker's role in its DLedger group: master (brokerId 0) or slave, and since when.

RocketMQ spreads this over BrokerConfig.brokerId and MessageStoreConfig.brokerRole,
changed by DLedgerRoleChangeHandler. Here one object holds it, so a processor that
only needs to know whether it may write is given this and nothing more; the
controller's role loop is its only writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from raftmq.remoting import RemotingCommand, ResponseCode


class BrokerRole:
    def __init__(
        self,
        broker_name: str,
        self_id: str,
        slave_broker_id: int,
        leader_id: Callable[[], str | None],
    ) -> None:
        assert slave_broker_id > 0, "brokerId 0 is the master's"
        self.broker_name = broker_name
        self.self_id = self_id
        self.slave_broker_id = slave_broker_id
        self._leader_id = leader_id
        self.is_master = False
        self.broker_id = slave_broker_id
        self.term = 0  # the DLedger term of the current role; registrations carry it
        self.master_since: float | None = None  # time.monotonic() of becoming master

    def not_master(self, request: RemotingCommand) -> RemotingCommand | None:
        """The answer to a request only a master serves, on a slave (None if oneway)."""
        if request.is_oneway:
            return None
        leader = self._leader_id()
        return request.make_response(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"not master: {self.broker_name} member {self.self_id} is a slave"
            f" (DLedger leader: {leader or 'none yet'}); refresh the route",
        )

    def is_registered_slave(self) -> bool:
        """A slave under its slave brokerId: a role change to another follower role
        leaves nothing to change but the registration."""
        return not self.is_master and self.broker_id == self.slave_broker_id

    def become_master(self, term: int) -> None:
        self.is_master = True
        self.master_since = time.monotonic()
        self.term = term
        self.broker_id = 0

    def become_slave(self, term: int) -> None:
        self.is_master = False
        self.master_since = None
        self.term = term
        self.broker_id = self.slave_broker_id
