"""`RouteInfoManager`: the name server's route tables, sans-IO (RocketMQ 4.9's).

The tables are Java's, as plain dicts:

- `topic_queue_table`: topic -> [QueueData], one per broker group (brokerName) holding
  the topic, learnt only from master (brokerId 0) registrations;
- `broker_addr_table`: brokerName -> BrokerData {cluster, brokerName, brokerAddrs
  {brokerId: addr}};
- `cluster_addr_table`: cluster -> {brokerName};
- `broker_live_table`: brokerAddr -> BrokerLiveInfo (last heartbeat, data version,
  HA address, the connection it came on).

Nothing here reads a clock or a socket: callers pass `now_ms` and an opaque
`channel` token, so the same object runs under a test's fake time. Dicts returned by
`pickup_topic_route_data` and `get_all_cluster_info` are fresh copies in the JSON shape
Java clients decode (broker ids as string keys).

Master changes (a DLedger group electing a new leader) need no special case, as in
Java: when a broker registers as brokerId 0 its address replaces the old master's, and
any other id it held before is dropped, because one address has one id.
"""

from __future__ import annotations

import attrs

__all__ = ["MASTER_ID", "BrokerLiveInfo", "RegisterResult", "RouteInfoManager"]

MASTER_ID = 0
PERM_READ, PERM_WRITE = 4, 2  # PermName's
# RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME: silence after which a broker is dropped.
DEFAULT_BROKER_EXPIRY_MS = 120_000


@attrs.define
class BrokerLiveInfo:
    last_update_ms: int
    data_version: dict | None
    ha_server_addr: str | None
    channel: object = None
    timeout_ms: int | None = None  # 5.x `heartbeatTimeoutMillis`; None: the default


@attrs.frozen
class RegisterResult:
    """What REGISTER_BROKER answers: a slave learns its master and the master's HA port."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


def _queue_data(broker_name: str, config: dict) -> dict:
    """QueueData from a TopicConfig; absent (or null) fields take TopicConfig's defaults."""

    def get(key: str, default: int) -> int:
        value = config.get(key)
        return default if value is None else int(value)

    return {
        "brokerName": broker_name,
        "readQueueNums": get("readQueueNums", 16),
        "writeQueueNums": get("writeQueueNums", 16),
        "perm": get("perm", 6),
        "topicSysFlag": get("topicSysFlag", 0),
    }


class RouteInfoManager:
    def __init__(self) -> None:
        self.topic_queue_table: dict[str, list[dict]] = {}
        self.broker_addr_table: dict[str, dict] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}
        # brokerName -> the highest DLedger term a master of it registered with
        self._master_terms: dict[str, int] = {}
        # topic -> {brokerName: writeQueueNums} for topics a master registered `order`.
        self._order_topics: dict[str, dict[str, int]] = {}

    # -- registration --------------------------------------------------------------

    def register_broker(
        self,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str | None,
        topic_config_wrapper: dict[str, dict] | None,
        data_version: dict | None,
        now_ms: int,
        *,
        filter_servers: list[str] | None = None,
        channel: object = None,
        timeout_ms: int | None = None,
        term: int | None = None,
    ) -> RegisterResult:
        """`RouteInfoManager.registerBroker`: record a heartbeat and, from a master whose
        topic configs changed (or that is new), the topics' queue data.

        `topic_config_wrapper` is the `topicConfigTable` (topic -> TopicConfig dict).

        `term` (raftmq brokers send their DLedger term; Java brokers send none): a
        claim to be master from a term older than one already seen is a deposed
        master's late registration — one sent just before a pause ended, say — and
        is ignored: otherwise it would displace the real master, and the deposed
        master's next registration (as a slave, same address) would then remove the
        master entry altogether until the real master's next periodic registration.
        """
        if broker_id == MASTER_ID and term is not None:
            if term < self._master_terms.get(broker_name, -1):
                known = self.broker_addr_table.get(broker_name, {}).get("brokerAddrs", {})
                return RegisterResult(known.get(MASTER_ID), None)
            self._master_terms[broker_name] = term
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)

        broker_data = self.broker_addr_table.get(broker_name)
        register_first = broker_data is None
        if broker_data is None:
            broker_data = {"cluster": cluster, "brokerName": broker_name, "brokerAddrs": {}}
            self.broker_addr_table[broker_name] = broker_data
        broker_data["cluster"] = cluster
        addrs: dict[int, str] = broker_data["brokerAddrs"]
        # One address has one id: a slave promoted to master loses its slave entry.
        for other_id, addr in list(addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del addrs[other_id]
        old_addr = addrs.get(broker_id)
        addrs[broker_id] = broker_addr
        register_first = register_first or old_addr is None

        if topic_config_wrapper is not None and broker_id == MASTER_ID:
            previous = self.broker_live_table.get(broker_addr)
            changed = previous is None or previous.data_version != data_version
            if changed or register_first or old_addr != broker_addr:
                for topic, config in topic_config_wrapper.items():
                    self._create_and_update_queue_data(broker_name, topic, config)

        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            now_ms, data_version, ha_server_addr, channel, timeout_ms
        )
        if filter_servers:
            self.filter_server_table[broker_addr] = list(filter_servers)
        else:
            self.filter_server_table.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = addrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                if master_live is not None:
                    return RegisterResult(master_addr, master_live.ha_server_addr)
        return RegisterResult()

    def _create_and_update_queue_data(self, broker_name: str, topic: str, config: dict) -> None:
        queue_data = _queue_data(broker_name, config)
        queue_datas = self.topic_queue_table.setdefault(topic, [])
        for i, existing in enumerate(queue_datas):
            if existing["brokerName"] == broker_name:
                queue_datas[i] = queue_data
                break
        else:
            queue_datas.append(queue_data)
        order = self._order_topics.setdefault(topic, {})
        if config.get("order") in (True, "true"):
            order[broker_name] = queue_data["writeQueueNums"]
        else:
            order.pop(broker_name, None)

    def unregister_broker(
        self, cluster: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> None:
        """`RouteInfoManager.unregisterBroker`: a broker shutting down says goodbye."""
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is None:
            return
        addrs = broker_data["brokerAddrs"]
        if addrs.get(broker_id) == broker_addr:
            del addrs[broker_id]
        if not addrs:
            self._remove_broker_name(broker_name, cluster)

    # -- liveness -------------------------------------------------------------------

    def scan_not_active_brokers(
        self, now_ms: int, expiry_ms: int = DEFAULT_BROKER_EXPIRY_MS
    ) -> list[str]:
        """`scanNotActiveBroker`: drop brokers silent for longer than their timeout.

        Returns the addresses removed.
        """
        expired = [
            addr
            for addr, live in self.broker_live_table.items()
            if live.last_update_ms + (live.timeout_ms or expiry_ms) < now_ms
        ]
        for addr in expired:
            self._destroy(addr)
        return expired

    def on_channel_destroy(self, channel: object) -> list[str]:
        """`onChannelDestroy`: the connection brokers registered on closed."""
        gone = [a for a, live in self.broker_live_table.items() if live.channel is channel]
        for addr in gone:
            self._destroy(addr)
        return gone

    def _destroy(self, broker_addr: str) -> None:
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        for broker_name, broker_data in list(self.broker_addr_table.items()):
            addrs = broker_data["brokerAddrs"]
            for broker_id, addr in list(addrs.items()):
                if addr == broker_addr:
                    del addrs[broker_id]
            if not addrs:
                self._remove_broker_name(broker_name, broker_data["cluster"])

    def _remove_broker_name(self, broker_name: str, cluster: str | None) -> None:
        """A broker group with no address left: forget it, the queues it served and its
        masters' term (a group rebuilt from scratch under the same name starts over)."""
        self.broker_addr_table.pop(broker_name, None)
        self._master_terms.pop(broker_name, None)
        for name, names in list(self.cluster_addr_table.items()):
            if cluster is not None and name != cluster:
                continue
            names.discard(broker_name)
            if not names:
                del self.cluster_addr_table[name]
        for topic, queue_datas in list(self.topic_queue_table.items()):
            queue_datas[:] = [q for q in queue_datas if q["brokerName"] != broker_name]
            self._order_topics.get(topic, {}).pop(broker_name, None)
            if not queue_datas:
                del self.topic_queue_table[topic]
                self._order_topics.pop(topic, None)

    # -- queries --------------------------------------------------------------------

    def pickup_topic_route_data(self, topic: str) -> dict | None:
        """`pickupTopicRouteData`: TopicRouteData as a JSON-ready dict, or None.

        None unless the topic has queue data and at least one of its broker groups is
        known, as in Java. `orderTopicConf` ("brokerName:queues;...") is present only
        for topics a master registered with `order` true.
        """
        queue_datas = self.topic_queue_table.get(topic)
        if not queue_datas:
            return None
        broker_datas = []
        filter_server_table: dict[str, list[str]] = {}
        for broker_name in sorted({q["brokerName"] for q in queue_datas}):
            broker_data = self.broker_addr_table.get(broker_name)
            if broker_data is None:
                continue
            broker_datas.append(_broker_data_json(broker_data))
            for addr in broker_data["brokerAddrs"].values():
                if addr in self.filter_server_table:
                    filter_server_table[addr] = list(self.filter_server_table[addr])
        if not broker_datas:
            return None
        route: dict = {
            "brokerDatas": broker_datas,
            "queueDatas": [dict(q) for q in queue_datas],
            "filterServerTable": filter_server_table,
        }
        order = self._order_topics.get(topic)
        if order:
            route["orderTopicConf"] = ";".join(f"{b}:{n}" for b, n in sorted(order.items()))
        return route

    def get_all_cluster_info(self) -> dict:
        """ClusterInfo: {"brokerAddrTable": {name: BrokerData}, "clusterAddrTable": ...}."""
        return {
            "brokerAddrTable": {
                name: _broker_data_json(data) for name, data in self.broker_addr_table.items()
            },
            "clusterAddrTable": {
                cluster: sorted(names) for cluster, names in self.cluster_addr_table.items()
            },
        }

    def delete_topic(self, topic: str) -> None:
        """DELETE_TOPIC_IN_NAMESRV: drop the topic's route. A broker that still has the
        topic adds it back with its next registration, as in RocketMQ."""
        self.topic_queue_table.pop(topic, None)

    def get_all_topic_list(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        """GET_TOPICS_BY_CLUSTER: the topics any broker group of `cluster` serves."""
        names = self.cluster_addr_table.get(cluster, set())
        return sorted(
            topic
            for topic, queue_datas in self.topic_queue_table.items()
            if any(q["brokerName"] in names for q in queue_datas)
        )

    def change_write_perm(self, broker_name: str, writable: bool) -> int:
        """`operateWritePermOfBroker`: take the write permission from every queue of
        `broker_name` (wipe), or make them readable and writable (add), so clients stop
        or resume sending there; the number of topics it serves, as RocketMQ counts. A
        master's registration puts its own perm back only when its topics change (a new
        dataVersion), as in RocketMQ."""
        topics = 0
        for queue_datas in self.topic_queue_table.values():
            for queue_data in queue_datas:
                if queue_data["brokerName"] == broker_name:
                    perm = queue_data["perm"]
                    queue_data["perm"] = PERM_READ | PERM_WRITE if writable else perm & ~PERM_WRITE
                    topics += 1
        return topics


def _broker_data_json(broker_data: dict) -> dict:
    return {
        "cluster": broker_data["cluster"],
        "brokerName": broker_data["brokerName"],
        "brokerAddrs": {str(i): a for i, a in sorted(broker_data["brokerAddrs"].items())},
    }
