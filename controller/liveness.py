"""Which brokers are alive, by their heartbeats (`DefaultBrokerHeartbeatManager`).

Brokers heartbeat every controller, not only the leader, so every controller keeps
this table from what it hears itself; it is not replicated. A broker is alive until
`heartbeatTimeoutMills` (its own, sent in each heartbeat) pass without one, or at once
when its connection closes. The epoch and offsets a heartbeat carries only move
forward: epoch first, then maxOffset (a heartbeat that overtakes a newer one must not
make a broker look behind). Sans-IO: every call takes the time in ms.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

__all__ = ["BrokerLiveInfo", "Liveness"]

BrokerKey = tuple[str, str, int]  # (clusterName, brokerName, brokerId)


@attrs.define
class BrokerLiveInfo:
    cluster_name: str
    broker_name: str
    broker_id: int
    broker_addr: str
    last_update_ms: float
    heartbeat_timeout_ms: int
    epoch: int = 0
    max_offset: int = 0
    confirm_offset: int = 0
    election_priority: int = 2**31 - 1  # Integer.MAX_VALUE: no preference
    channel: Hashable | None = None


@attrs.define
class Liveness:
    """The heartbeat table; `started_ms` is when this controller began hearing them."""

    started_ms: float
    brokers: dict[BrokerKey, BrokerLiveInfo] = attrs.Factory(dict)
    heard: set[BrokerKey] = attrs.Factory(set)  # every broker heard since started_ms
    closed_ms: dict[BrokerKey, float] = attrs.Factory(dict)  # when its connection closed
    timeouts_ms: dict[BrokerKey, int] = attrs.Factory(dict)  # its last heartbeat's timeout

    def heartbeat(self, info: BrokerLiveInfo) -> None:
        key = (info.cluster_name, info.broker_name, info.broker_id)
        self.heard.add(key)
        self.closed_ms.pop(key, None)
        self.timeouts_ms[key] = info.heartbeat_timeout_ms
        old = self.brokers.get(key)
        if old is not None and (old.epoch, old.max_offset) > (info.epoch, info.max_offset):
            info.epoch, info.max_offset = old.epoch, old.max_offset
            info.confirm_offset = max(old.confirm_offset, info.confirm_offset)
        self.brokers[key] = info

    def get(self, cluster: str, broker_name: str, broker_id: int) -> BrokerLiveInfo | None:
        return self.brokers.get((cluster, broker_name, broker_id))

    def alive(self, cluster: str, broker_name: str, broker_id: int | None, now_ms: float) -> bool:
        info = None if broker_id is None else self.brokers.get((cluster, broker_name, broker_id))
        return info is not None and now_ms - info.last_update_ms <= info.heartbeat_timeout_ms

    def expire(self, now_ms: float) -> list[BrokerLiveInfo]:
        """Drop and return the brokers whose heartbeat timeout has passed."""
        gone = [
            i for i in self.brokers.values() if now_ms - i.last_update_ms > i.heartbeat_timeout_ms
        ]
        for info in gone:
            del self.brokers[(info.cluster_name, info.broker_name, info.broker_id)]
        return gone

    def next_deadline_ms(self) -> float | None:
        """When the first heartbeat timeout of the brokers tracked passes, if any."""
        deadlines = (i.last_update_ms + i.heartbeat_timeout_ms for i in self.brokers.values())
        return min(deadlines, default=None)

    def channel_closed(self, channel: Hashable, now_ms: float) -> list[BrokerLiveInfo]:
        """Drop and return the brokers that heartbeat on `channel`, which closed."""
        gone = [i for i in self.brokers.values() if i.channel is channel]
        for info in gone:
            key = (info.cluster_name, info.broker_name, info.broker_id)
            del self.brokers[key]
            self.closed_ms[key] = now_ms
        return gone

    def heard_for_ms(self, now_ms: float) -> float:
        return now_ms - self.started_ms
