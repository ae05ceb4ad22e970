"""Client bookkeeping from HEART_BEAT (34): consumer and producer groups, their members.

Members are kept per node from heartbeats (clients heartbeat every broker address
of a topic's route, slaves included), so a slave that becomes master already
knows the group. A member expires after 120 s without a heartbeat or when its
connection closes; the group's other members are told (NOTIFY_CONSUMER_IDS_CHANGED,
oneway) so they rebalance at once instead of at their next timer. Producer groups are
kept the same way, for GET_PRODUCER_CONNECTION_LIST (`mqadmin producerConnection`)
and for the transaction check-back, which asks one of a group's producers.

A member's SQL92 subscriptions are kept with their compiled filters (the heartbeat
processor compiles them, and refuses the heartbeat when one does not compile), for
the pulls that do not carry their subscription (Java's push consumer).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from raftmq.remoting import Connection, RemotingCommand, RemotingError, RequestCode

if TYPE_CHECKING:
    from raftmq.broker.sql92 import Sql92Filter

log = logging.getLogger(__name__)

CHANNEL_EXPIRED_MS = 120_000


@attrs.define
class ClientInfo:
    """One member of a group: what a connection list (203, 204) reports of it."""

    client_id: str
    connection: Connection
    last_update_ms: int
    language: str = "JAVA"
    version: int = 0


@attrs.define
class ConsumerInfo(ClientInfo):
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: list[dict] = attrs.Factory(list)
    filters: Mapping[str, Sql92Filter] = attrs.Factory(dict)  # topic -> its SQL92 filter


def _subscription_version(data: dict) -> int:
    """A SubscriptionData's `subVersion` (its creation time in ms); 0 if unreadable."""
    try:
        return int(data.get("subVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _stale(info: ClientInfo, now_ms: int) -> bool:
    return now_ms - info.last_update_ms > CHANNEL_EXPIRED_MS


class ClientManager:
    def __init__(self) -> None:
        self.groups: dict[str, dict[str, ConsumerInfo]] = {}
        self.producers: dict[str, dict[str, ClientInfo]] = {}
        self._producer_turn = 0

    def heartbeat(
        self,
        data: dict,
        connection: Connection,
        now_ms: int,
        language: str = "JAVA",
        version: int = 0,
        filters: Mapping[str, Mapping[str, Sql92Filter]] | None = None,
    ) -> list[str]:
        """Record a heartbeat body, with the compiled SQL92 filters of its subscriptions
        (group -> topic -> filter); returns the consumer groups it names."""
        client_id = str(data.get("clientID", connection.remote_address))
        groups = []
        for consumer in data.get("consumerDataSet") or []:
            group = str(consumer.get("groupName"))
            groups.append(group)
            members = self.groups.setdefault(group, {})
            known = client_id in members
            members[client_id] = ConsumerInfo(
                client_id,
                connection,
                now_ms,
                language,
                version,
                str(consumer.get("consumeType", "CONSUME_PASSIVELY")),
                str(consumer.get("messageModel", "CLUSTERING")),
                str(consumer.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET")),
                list(consumer.get("subscriptionDataSet") or []),
                (filters or {}).get(group, {}),
            )
            if not known:
                self._notify(group)
        for producer in data.get("producerDataSet") or []:
            members = self.producers.setdefault(str(producer.get("groupName")), {})
            members[client_id] = ClientInfo(client_id, connection, now_ms, language, version)
        return groups

    def unregister(
        self, client_id: str, group: str | None, producer_group: str | None = None
    ) -> None:
        """UNREGISTER_CLIENT: from the groups named, or from every group when none is."""
        every = group is None and producer_group is None
        for name, members in list(self.groups.items()):
            if (every or name == group) and members.pop(client_id, None) is not None:
                self._notify(name)
        for name, members in self.producers.items():
            if every or name == producer_group:
                members.pop(client_id, None)

    def subscription(self, group: str, topic: str) -> tuple[int, Sql92Filter | None] | None:
        """(subVersion, SQL92 filter or None for TAG) of the newest subscription to
        `topic` among the group's members; None when no member subscribes to it."""
        newest = None
        for info in self.groups.get(group, {}).values():
            for data in info.subscriptions:
                if data.get("topic") != topic:
                    continue
                version = _subscription_version(data)
                if newest is None or version > newest[0]:
                    newest = (version, info.filters.get(topic))
        return newest

    def producer_connection(self, group: str) -> Connection | None:
        """An open connection of a producer of `group`, a different one each call
        (ProducerManager.getAvailableChannel), or None."""
        live = [i.connection for i in self.producers.get(group, {}).values()]
        live = [c for c in live if not c.closed]
        if not live:
            return None
        self._producer_turn += 1
        return live[self._producer_turn % len(live)]

    def consumer(self, group: str, client_id: str) -> ConsumerInfo | None:
        """The member `client_id` of consumer group `group` (ConsumerManager.findChannel)."""
        return self.groups.get(group, {}).get(client_id)

    def members(self, group: str) -> list[str]:
        return sorted(self.groups.get(group, {}))

    def on_disconnect(self, connection: Connection) -> None:
        for members in self.producers.values():
            for cid in [c for c, i in members.items() if i.connection is connection]:
                del members[cid]
        for name, members in list(self.groups.items()):
            gone = [cid for cid, info in members.items() if info.connection is connection]
            for cid in gone:
                del members[cid]
            if gone:
                self._notify(name)

    def expire(self, now_ms: int) -> None:
        for members in self.producers.values():
            for cid in [c for c, i in members.items() if _stale(i, now_ms)]:
                del members[cid]
        for name, members in list(self.groups.items()):
            stale = [c for c, i in members.items() if _stale(i, now_ms)]
            for cid in stale:
                del members[cid]
            if stale:
                self._notify(name)

    def _notify(self, group: str) -> None:
        for info in self.groups.get(group, {}).values():
            request = RemotingCommand(
                code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields={"consumerGroup": group}
            )
            with contextlib.suppress(RemotingError, OSError):
                info.connection.invoke_oneway(request)
