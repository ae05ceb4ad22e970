"""The broker's role in its group: master (brokerId 0) or slave, and since when.

RocketMQ spreads this over BrokerConfig.brokerId and MessageStoreConfig.brokerRole,
changed by DLedgerRoleChangeHandler. Here one object holds it, so a processor that
only needs to know whether it may write is given this and nothing more; the
controller is its only writer. A classic broker (`classic`) keeps the role its
config gives it (`brokerRole`) for life.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from raftmq.remoting import RemotingCommand, RequestCode, ResponseCode

_SENDS = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
     RequestCode.CONSUMER_SEND_MSG_BACK}
)  # fmt: skip


@attrs.define
class BrokerRole:
    broker_name: str
    self_id: str  # the DLedger member id
    slave_broker_id: int  # 0 for a classic master, which is never a slave
    _leader_id: Callable[[], str | None]  # the DLedger leader's member id, if known
    master_role: str = "SYNC_MASTER"  # as runtime info reports a master (brokerRole)
    classic: bool = False
    is_master: bool = attrs.field(default=False, init=False)
    broker_id: int = attrs.field(init=False)
    term: int = attrs.field(default=0, init=False)  # the DLedger term of the current role
    master_since: float | None = attrs.field(default=None, init=False)  # time.monotonic()

    def __attrs_post_init__(self) -> None:
        assert self.slave_broker_id > 0 or self.classic, "brokerId 0 is the master's"
        self.broker_id = self.slave_broker_id

    def not_master(self, request: RemotingCommand) -> RemotingCommand | None:
        """The answer to a request only a master serves, on a slave (None if oneway)."""
        if request.is_oneway:
            return None
        if self.classic:
            slave = f"{self.broker_name} brokerId {self.broker_id} is a SLAVE"
            if request.code in _SENDS:  # DefaultMessageStore.checkStoreStatus, as worded
                remark = (
                    "service not available now. It may be caused by one of the following"
                    " reasons: the broker's disk is full, messages are put to the slave,"
                    f" message store has been shut down, etc. ({slave})"
                )
            else:
                remark = f"not master: {slave}; ask the master (brokerId 0)"
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, remark)
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
        assert self.slave_broker_id > 0, "a classic master never becomes a slave"
        self.is_master = False
        self.master_since = None
        self.term = term
        self.broker_id = self.slave_broker_id
