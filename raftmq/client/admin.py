"""`Admin`: what an operator asks the name servers and brokers, as trio calls.

RocketMQ's `DefaultMQAdminExt`, for the questions a DLedger cluster raises: which
brokers and topics exist, create or delete a topic or a subscription group on every
master, how far each queue and each consumer group has got, who is connected, what a
broker reports about itself and how it is configured, a message by its offset msgId,
and the state of every DLedger member (`mqadmin` prints these).

    async with Admin("127.0.0.1:9876") as admin:
        for member in await admin.dledger_status():
            print(member.self_id, member.role, member.term)

All calls share one ConnectionPool. Failures are of two kinds, so a caller (and
`mqadmin`'s exit status) can tell them apart: `MQBrokerError` when a server answered
with an error code (its code and remark kept), `UnreachableError` when no server that
could answer was reached. Name servers are tried in turn; reads that any replica can
serve (topic stats, consume stats, a message by id) go to the master first and then to
the other members, so they keep working while a group elects a new master.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
import trio

from raftmq.client.connections import ConnectionPool
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.instance import parse_namesrv_addrs
from raftmq.client.route import MASTER_ID, BrokerData, TopicRouteData, parse_route
from raftmq.config.address import parse_peers
from raftmq.config.properties import format_properties, parse_properties
from raftmq.protocol import fastjson
from raftmq.protocol.message import MessageExt, MessageFormatError, decode
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import RemotingCommand, RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = [
    "UNREACHABLE",
    "Admin",
    "ClusterInfo",
    "ConsumeStats",
    "MemberStatus",
    "QueueProgress",
    "TopicOffset",
    "UnreachableError",
    "fall_behind_bytes",
    "group_members",
    "is_broker_topic",
    "is_classic",
    "parse_cluster_info",
    "table_number",
]

UNREACHABLE = "UNREACHABLE"
DEFAULT_TOPIC = "TBW102"  # what UPDATE_AND_CREATE_TOPIC names as `defaultTopic`
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"
_NO_ANSWER = (RemotingConnectError, RemotingTimeoutError)
# RocketMQ's TopicValidator system topics, and its prefix for the ones it adds later
SYSTEM_TOPICS = frozenset(
    {"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"}
)
SYSTEM_TOPIC_PREFIXES = ("RMQ_SYS_", "rmq_sys_")


def is_broker_topic(topic: str, info: ClusterInfo) -> bool:
    """A topic the brokers keep for themselves (TopicValidator.isSystemTopic): the
    system topics, and each broker's and cluster's own name."""
    return (
        topic in SYSTEM_TOPICS
        or topic.startswith(SYSTEM_TOPIC_PREFIXES)
        or topic in info.clusters
        or topic in info.brokers
    )


class UnreachableError(MQClientError):
    """No server that could answer was reached: every name server, or every member
    of a broker group, refused the connection or did not answer in time."""


def _loads(body: bytes, address: str):
    """JSON from a server, or fastjson's: integer map keys unquoted (a Java name
    server), MessageQueue objects as keys (the stats of 202 and 208)."""
    try:
        text = body.decode("utf-8")
        try:
            return json.loads(text)
        except ValueError:
            return fastjson.loads(text)
    except ValueError as exc:
        raise MQClientError(f"{address} answered a body that is not JSON: {exc}") from None


def _queue_map(doc: dict) -> list[tuple[dict, dict]]:
    """The (MessageQueue, value) pairs of a stats body's `offsetTable`."""
    table = doc.get("offsetTable") or []
    return [] if isinstance(table, dict) else table


@attrs.frozen
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO: broker groups by brokerName, and each cluster's names.

    Only registered members are listed: a killed master is gone from `brokers`
    at once (its connection to the name server closed)."""

    brokers: dict[str, BrokerData]
    clusters: dict[str, tuple[str, ...]]

    def broker_datas(self, cluster: str | None = None) -> list[BrokerData]:
        """The broker groups of `cluster` (of every cluster when None), by name."""
        names = self.brokers if cluster is None else self.clusters.get(cluster, ())
        return [self.brokers[n] for n in sorted(names) if n in self.brokers]

    def cluster_of(self, broker_name: str) -> str | None:
        return next((c for c, names in self.clusters.items() if broker_name in names), None)


def parse_cluster_info(body: bytes, address: str = "name server") -> ClusterInfo:
    doc = _loads(body, address)
    try:
        brokers = {
            str(name): BrokerData(
                str(data.get("cluster", "")),
                str(name),
                {int(k): str(v) for k, v in (data.get("brokerAddrs") or {}).items()},
            )
            for name, data in (doc.get("brokerAddrTable") or {}).items()
        }
        clusters = {
            str(c): tuple(sorted(map(str, names)))
            for c, names in (doc.get("clusterAddrTable") or {}).items()
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise MQClientError(f"{address} answered a malformed cluster info: {exc!r}") from None
    return ClusterInfo(brokers, clusters)


@attrs.frozen(order=True)
class TopicOffset:
    """One queue's span in GET_TOPIC_STATS_INFO: [min_offset, max_offset)."""

    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_ms: int = 0


@attrs.frozen(order=True)
class QueueProgress:
    """One queue of GET_CONSUME_STATS: how far the broker and the group have got."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp_ms: int = 0
    # a POP consumer's messages popped and neither acknowledged nor redelivered (None
    # for a queue the group does not pop; raftmq's field, Java brokers have none)
    pop_in_flight: int | None = None

    @property
    def diff(self) -> int:
        return self.broker_offset - self.consumer_offset


@attrs.frozen
class ConsumeStats:
    queues: list[QueueProgress]
    consume_tps: float

    @property
    def diff_total(self) -> int:
        return sum(q.diff for q in self.queues)


@attrs.frozen(order=True)
class MemberStatus:
    """One DLedger member as it reports itself (GET_BROKER_RUNTIME_INFO's dLeger* keys).

    An unreachable member has role UNREACHABLE and no numbers; `addr` (its broker
    address) is None when the name server no longer lists it, `peer_addr` (its DLedger
    address) comes from the peers its siblings report."""

    group: str
    self_id: str
    addr: str | None
    peer_addr: str | None
    role: str
    term: int | None = None
    ledger_end_index: int | None = None
    committed_index: int | None = None

    @property
    def reachable(self) -> bool:
        return self.role != UNREACHABLE


def table_number(table: dict, key: str) -> int | None:
    """A runtime table's integer value (they are all strings), None when absent."""
    try:
        return int(table[key])
    except (KeyError, TypeError, ValueError):
        return None


def is_classic(table: dict | None) -> bool:
    """A classic (master/slave HA) broker's runtime table: it has an HA port."""
    return table is not None and "haListenPort" in table


def fall_behind_bytes(broker_id: int, tables: dict[int, dict | None]) -> int | None:
    """How far a classic group's slaves are behind, in CommitLog bytes, from the
    members' runtime tables (brokerId -> table, None for one that did not answer).
    The master's row is its own "slave fall behind master" figure (its end minus the
    best offset a slave acknowledged; -1 with no slave connected), which it reports
    while a slave is silent; a slave's is the master's end minus its own, as
    rocketmq-exporter's commitlog_diff. None when a table needed is missing."""
    table = tables.get(broker_id)
    if not is_classic(table):
        return None
    if broker_id == MASTER_ID:
        return table_number(table, "slaveFallBehindBytes")
    master_end = table_number(tables.get(MASTER_ID) or {}, "commitLogMaxOffset")
    own_end = table_number(table, "commitLogMaxOffset")
    return None if master_end is None or own_end is None else max(0, master_end - own_end)


def _peers(table: dict) -> dict[str, str]:
    try:
        return parse_peers(table.get("dLegerPeers") or "")
    except ValueError:
        return {}


def group_members(broker: BrokerData, tables: dict[int, dict | None]) -> list[MemberStatus]:
    """Every member of one DLedger group, from the runtime tables of its registered
    members (brokerId -> table, None for one that did not answer).

    The name server lists only registered members, so the full membership comes from
    the dLegerPeers the answering members report. A silent member's broker address is
    known when it is still registered: a slave by RocketMQ's rule (brokerId = selfId
    number + 1), the master when exactly one member is left unaccounted for.
    """
    answered = {bid: t for bid, t in tables.items() if t is not None}
    peers: dict[str, str] = {}
    for table in answered.values():
        peers.update(_peers(table))
    group = next(
        (t["dLegerGroup"] for t in answered.values() if t.get("dLegerGroup")), broker.broker_name
    )
    rows: dict[str, MemberStatus] = {}
    for bid, table in answered.items():
        self_id = table.get("dLegerSelfId") or f"?{bid}"
        rows[self_id] = MemberStatus(
            group,
            self_id,
            broker.addrs[bid],
            peers.get(self_id),
            table.get("dLegerRole") or "?",
            table_number(table, "dLegerTerm"),
            table_number(table, "dLegerLedgerEndIndex"),
            table_number(table, "dLegerCommittedIndex"),
        )
    silent = {bid: broker.addrs[bid] for bid, t in tables.items() if t is None}
    self_ids = {bid: f"n{bid - 1}" for bid in silent if bid != MASTER_ID}
    if MASTER_ID in silent:
        left = [s for s in peers if s not in rows and s not in self_ids.values()]
        self_ids[MASTER_ID] = left[0] if len(left) == 1 else f"?{MASTER_ID}"
    for bid, self_id in self_ids.items():
        rows.setdefault(
            self_id, MemberStatus(group, self_id, silent[bid], peers.get(self_id), UNREACHABLE)
        )
    for self_id, peer_addr in peers.items():
        rows.setdefault(self_id, MemberStatus(group, self_id, None, peer_addr, UNREACHABLE))
    return sorted(rows.values())


class Admin:
    """`async with Admin(namesrv_addr) as admin:`; `namesrv_addr` is a list or
    RocketMQ's `host:port;host:port` form."""

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        timeout_s: float = 3.0,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        # none: the caller names each server (the controller's verbs)
        self.namesrv_addrs = parse_namesrv_addrs(namesrv_addr) if namesrv_addr else []
        self.timeout_s = timeout_s
        self.tls = tls
        self.credentials = credentials  # RocketMQ's ACL account; every request is signed
        self.pool = ConnectionPool(connect_timeout_s=timeout_s, tls=tls, credentials=credentials)

    async def __aenter__(self) -> Admin:
        await self.pool.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.pool.__aexit__(*exc_info)

    # ------------------------------------------------------------------ transport
    async def call(
        self,
        address: str,
        code: int,
        ext: dict | None = None,
        body: bytes = b"",
        timeout_s: float | None = None,
    ) -> RemotingCommand:
        """One request; the SUCCESS answer, or MQBrokerError for any other code."""
        request = RemotingCommand(code, ext_fields=dict(ext or {}), body=body)
        response = await self.pool.invoke(address, request, timeout_s or self.timeout_s)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        return response

    async def _first_answer(
        self, addresses: Sequence[str], what: str, code: int, ext: dict | None = None
    ) -> tuple[str, RemotingCommand]:
        """Ask `addresses` in turn until one answers: (its address, its answer)."""
        reasons = []
        for address in addresses:
            try:
                return address, await self.call(address, code, ext)
            except _NO_ANSWER as exc:
                reasons.append(f"{address}: {exc}")
        raise UnreachableError(f"no {what} answered: {'; '.join(reasons) or 'none known'}")

    async def _namesrv(self, code: int, ext: dict | None = None) -> tuple[str, RemotingCommand]:
        return await self._first_answer(self.namesrv_addrs, "name server", code, ext)

    async def _group(self, broker: BrokerData, code: int, ext: dict) -> dict:
        """A read any replica serves, as JSON: the master first, then the slaves."""
        address, response = await self._first_answer(
            broker.addresses(), f"member of {broker.broker_name}", code, ext
        )
        return _loads(response.body, address)

    # ------------------------------------------------------------------ name server
    async def cluster_info(self) -> ClusterInfo:
        address, response = await self._namesrv(RequestCode.GET_BROKER_CLUSTER_INFO)
        return parse_cluster_info(response.body, address)

    async def topic_list(self) -> list[str]:
        address, response = await self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return sorted(_loads(response.body, address).get("topicList") or ())

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The route; MQBrokerError TOPIC_NOT_EXIST (17) when no broker serves it."""
        address, response = await self._namesrv(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}
        )
        try:
            return parse_route(topic, response.body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise MQClientError(f"{address} answered a malformed route: {exc}") from None

    async def each_namesrv(
        self, code: int, ext: dict | None = None, body: bytes = b"", addrs: Sequence[str] = ()
    ) -> dict[str, RemotingCommand]:
        """One request to every name server (or to `addrs`), as DefaultMQAdminExt sends
        the KV and config changes: {address: answer}; the first failure raises, an
        unanswered one as UnreachableError."""
        answers = {}
        for address in addrs or self.namesrv_addrs:
            try:
                answers[address] = await self.call(address, code, ext, body)
            except _NO_ANSWER as exc:
                raise UnreachableError(f"name server {address}: {exc}") from None
        return answers

    async def put_kv_config(self, namespace: str, key: str, value: str) -> None:
        ext = {"namespace": namespace, "key": key, "value": value}
        await self.each_namesrv(RequestCode.PUT_KV_CONFIG, ext)

    async def delete_kv_config(self, namespace: str, key: str) -> None:
        ext = {"namespace": namespace, "key": key}
        await self.each_namesrv(RequestCode.DELETE_KV_CONFIG, ext)

    async def kv_config(self, namespace: str, key: str) -> str:
        """GET_KV_CONFIG from the first name server that answers; MQBrokerError
        QUERY_NOT_FOUND (22) when it has no such entry."""
        _, response = await self._namesrv(
            RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}
        )
        return str(response.ext_fields.get("value", ""))

    async def change_write_perm(self, namesrv_addr: str, broker_name: str, writable: bool) -> int:
        """WIPE_WRITE_PERM_OF_BROKER or ADD_WRITE_PERM_OF_BROKER on one name server: the
        number of topics of `broker_name` it changed."""
        code, count_field = (
            (RequestCode.ADD_WRITE_PERM_OF_BROKER, "addTopicCount")
            if writable
            else (RequestCode.WIPE_WRITE_PERM_OF_BROKER, "wipeTopicCount")
        )
        answers = await self.each_namesrv(code, {"brokerName": broker_name}, addrs=[namesrv_addr])
        return int(answers[namesrv_addr].ext_fields.get(count_field) or 0)

    async def namesrv_configs(self, addrs: Sequence[str] = ()) -> dict[str, dict[str, str]]:
        """GET_NAMESRV_CONFIG from every name server (or `addrs`): {address: keys}."""
        configs = {}
        for address, response in (
            await self.each_namesrv(RequestCode.GET_NAMESRV_CONFIG, addrs=addrs)
        ).items():
            try:
                configs[address] = parse_properties(response.body.decode("utf-8"), address)
            except (UnicodeDecodeError, ValueError) as exc:
                raise MQClientError(f"{address} answered a malformed config: {exc}") from None
        return configs

    async def update_namesrv_config(
        self, changes: dict[str, str], addrs: Sequence[str] = ()
    ) -> list[str]:
        """UPDATE_NAMESRV_CONFIG on every name server (or `addrs`); the addresses."""
        body = format_properties(changes).encode()
        return list(
            await self.each_namesrv(RequestCode.UPDATE_NAMESRV_CONFIG, body=body, addrs=addrs)
        )

    # ------------------------------------------------------------------ brokers
    async def create_topic(
        self,
        topic: str,
        read_queues: int = 8,
        write_queues: int = 8,
        perm: int = 6,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        order: bool = False,
        attributes: str | None = None,
    ) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC on one broker, or on the master of every broker group
        of `cluster` (of every cluster when neither is given). Returns the addresses
        written to. Nothing is sent unless every group has a master to send it to.
        `attributes` is RocketMQ 5's change of the topic's attributes, e.g.
        "+message.type=FIFO" (`+k=v` adds or replaces, `-k` removes; joined by ',')."""
        targets = await self._masters(cluster, broker_addr)
        ext = {
            "topic": topic,
            "defaultTopic": DEFAULT_TOPIC,
            "readQueueNums": read_queues,
            "writeQueueNums": write_queues,
            "perm": perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": order,
        }
        if attributes:
            ext["attributes"] = attributes
        for address in targets:
            await self.call(address, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        return targets

    async def _masters(self, cluster: str | None, broker_addr: str | None = None) -> list[str]:
        """`[broker_addr]`, or the master of every broker group of `cluster` (of every
        cluster when neither is given); UnreachableError if a group has none."""
        if cluster is not None and broker_addr is not None:
            raise ValueError("give a cluster or a broker address, not both")
        if broker_addr is not None:
            return [broker_addr]
        groups = (await self.cluster_info()).broker_datas(cluster)
        if not groups:
            raise MQClientError(f"the name servers know no broker of cluster {cluster!r}")
        headless = [b.broker_name for b in groups if b.master is None]
        if headless:
            raise UnreachableError(f"no master registered for {', '.join(headless)}")
        return [b.master for b in groups]

    async def cluster_masters(self, cluster: str) -> list[str]:
        """The master of every broker group of `cluster`; UnreachableError if one has none."""
        return await self._masters(cluster)

    async def _members(self, cluster: str | None, broker_addr: str | None = None) -> list[str]:
        """`[broker_addr]`, or every registered member of `cluster`'s groups."""
        if broker_addr is not None:
            return [broker_addr]
        groups = (await self.cluster_info()).broker_datas(cluster)
        if not groups:
            raise MQClientError(f"the name servers know no broker of cluster {cluster!r}")
        return [address for b in groups for address in b.addresses()]

    async def delete_topic(self, topic: str, cluster: str) -> list[str]:
        """DELETE_TOPIC_IN_BROKER on the master of every group of `cluster` (the log
        carries it to the slaves), then DELETE_TOPIC_IN_NAMESRV on every name server, so
        the route is gone at once instead of lingering. Returns the brokers written to."""
        targets = await self._masters(cluster)
        for address in targets:
            await self.call(address, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        for address in self.namesrv_addrs:
            try:
                await self.call(address, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})
            except _NO_ANSWER as exc:
                raise UnreachableError(f"name server {address}: {exc}") from None
        return targets

    async def create_subscription_group(
        self, config: dict, *, cluster: str | None = None, broker_addr: str | None = None
    ) -> list[str]:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with `config` (SubscriptionGroupConfig's
        JSON) on one broker or every master of `cluster`; the addresses written to."""
        targets = await self._masters(cluster, broker_addr)
        body = json.dumps(config).encode()
        for address in targets:
            await self.call(address, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        return targets

    async def delete_subscription_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        remove_offset: bool = False,
    ) -> list[str]:
        """DELETE_SUBSCRIPTIONGROUP on one broker or every master of `cluster`; with
        `remove_offset`, the group's committed offsets go too."""
        targets = await self._masters(cluster, broker_addr)
        ext = {"groupName": group, "removeOffset": str(remove_offset).lower()}
        for address in targets:
            await self.call(address, RequestCode.DELETE_SUBSCRIPTIONGROUP, ext)
        return targets

    async def acl_change(
        self, code: int, ext: dict, *, cluster: str | None = None, broker_addr: str | None = None
    ) -> list[str]:
        """An ACL change (UPDATE_AND_CREATE_ACL_CONFIG, DELETE_ACL_CONFIG,
        UPDATE_GLOBAL_WHITE_ADDRS_CONFIG) on one broker or every master of `cluster`; the
        log carries it to the slaves. Returns the addresses written to."""
        targets = await self._masters(cluster, broker_addr)
        for address in targets:
            await self.call(address, code, ext)
        return targets

    async def acl_answers(
        self, code: int, *, cluster: str | None = None, broker_addr: str | None = None
    ) -> list[RemotingCommand]:
        """GET_BROKER_CLUSTER_ACL_INFO or GET_BROKER_CLUSTER_ACL_CONFIG from one broker
        or every master of `cluster`."""
        return [await self.call(a, code) for a in await self._masters(cluster, broker_addr)]

    async def subscription_groups(self, broker_addr: str) -> dict[str, dict]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: group name -> its config's JSON."""
        response = await self.call(broker_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        return dict(_loads(response.body, broker_addr).get("subscriptionGroupTable") or {})

    async def topic_configs(self, broker_addr: str) -> dict[str, dict]:
        """GET_ALL_TOPIC_CONFIG: topic name -> its TopicConfig's JSON."""
        response = await self.call(broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        return dict(_loads(response.body, broker_addr).get("topicConfigTable") or {})

    async def update_consume_offset(
        self, broker_addr: str, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        """UPDATE_CONSUMER_OFFSET: `group`'s committed offset of one queue, on its master."""
        ext = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset}
        await self.call(broker_addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext)

    async def broker_config(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_CONFIG: the broker's keys and values, as its properties text has them."""
        response = await self.call(broker_addr, RequestCode.GET_BROKER_CONFIG)
        try:
            return parse_properties(response.body.decode("utf-8"), broker_addr)
        except (UnicodeDecodeError, ValueError) as exc:
            raise MQClientError(f"{broker_addr} answered a malformed config: {exc}") from None

    async def update_broker_config(
        self, key: str, value: str, *, cluster: str | None = None, broker_addr: str | None = None
    ) -> list[str]:
        """UPDATE_BROKER_CONFIG on one broker or every member of `cluster` (each broker
        keeps its own config); the addresses written to."""
        targets = await self._members(cluster, broker_addr)
        body = format_properties({key: value}).encode()
        for address in targets:
            await self.call(address, RequestCode.UPDATE_BROKER_CONFIG, body=body)
        return targets

    async def consumer_connection(self, group: str, broker_addr: str | None = None) -> dict:
        """GET_CONSUMER_CONNECTION_LIST from `broker_addr`, else from the master of a
        broker group serving the group's retry topic, as DefaultMQAdminExt asks:
        ConsumerConnection's JSON."""
        code, ext = RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}
        if broker_addr is not None:
            return _loads((await self.call(broker_addr, code, ext)).body, broker_addr)
        return await self._connections(RETRY_PREFIX + group, code, ext)

    async def producer_connection(self, group: str, topic: str) -> dict:
        """GET_PRODUCER_CONNECTION_LIST from the master of a group serving `topic`."""
        return await self._connections(
            topic, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group}
        )

    async def consumer_running_info(
        self, group: str, client_id: str, jstack: bool = False, broker_addr: str | None = None
    ) -> dict:
        """GET_CONSUMER_RUNNING_INFO, through `broker_addr` or the master of a broker
        group serving the group's retry topic, to the consumer `client_id`:
        ConsumerRunningInfo's JSON (its `mqTable` as (MessageQueue, info) pairs)."""
        ext = {"consumerGroup": group, "clientId": client_id, "jstackEnable": jstack}
        code = RequestCode.GET_CONSUMER_RUNNING_INFO
        if broker_addr is not None:
            return _loads((await self.call(broker_addr, code, ext)).body, broker_addr)
        return await self._connections(RETRY_PREFIX + group, code, ext)

    async def consumer_status(
        self, topic: str, group: str, client_id: str = ""
    ) -> dict[str, list[tuple[dict, int]]]:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS on the first master of `topic`'s route,
        as DefaultMQAdminExt asks: each online member's (or only `client_id`'s) owned
        queues of the topic and their offsets, {clientId: [(MessageQueue, offset)]}."""
        ext = {"topic": topic, "group": group, "clientAddr": client_id}
        doc = await self._connections(topic, RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, ext)
        table = doc.get("consumerTable") or {}
        return {cid: list(mqs) if isinstance(mqs, list) else [] for cid, mqs in table.items()}

    async def broker_json(
        self, broker_addr: str, code: int, ext: dict | None = None, timeout_s: float | None = None
    ):
        """One request to a broker whose answer is (fast)JSON: GET_BROKER_CONSUME_STATS,
        QUERY_CONSUME_QUEUE, GET_ALL_PRODUCER_INFO; the body read, maps keyed by
        MessageQueue as (key, value) pairs."""
        response = await self.call(broker_addr, code, ext, timeout_s=timeout_s)
        return _loads(response.body, broker_addr)

    async def _connections(self, topic: str, code: int, ext: dict) -> dict:
        masters = await self.route_masters(topic)
        if not masters:
            raise UnreachableError(f"no master registered for the brokers of {topic}")
        address, response = await self._first_answer(masters, "master", code, ext)
        return _loads(response.body, address)

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int, force: bool = True
    ) -> list[tuple[str, int, int]]:
        """INVOKE_BROKER_TO_RESET_OFFSET on the master of every broker group of `topic`:
        `group`'s offsets move to the first message stored at or after `timestamp_ms`
        (-1: the end). Returns (brokerName, queueId, new offset), sorted."""
        route = await self.topic_route(topic)
        ext = {"topic": topic, "group": group, "timestamp": timestamp_ms, "isForce": force}
        rows = []
        for name, broker in sorted(route.brokers.items()):
            if broker.master is None:
                raise UnreachableError(f"no master registered for {name}")
            response = await self.call(
                broker.master, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext
            )
            doc = _loads(response.body, broker.master)
            rows += [
                (str(mq["brokerName"]), int(mq["queueId"]), int(o)) for mq, o in _queue_map(doc)
            ]
        return sorted(rows)

    async def topic_consumed_by(self, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO on the master of every broker group of `topic`:
        the groups subscribed to it or with offsets on it, sorted."""
        groups: set[str] = set()
        for address in await self.route_masters(topic):
            response = await self.call(
                address, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic}
            )
            groups.update(_loads(response.body, address).get("groupList") or ())
        return sorted(groups)

    async def broker_stats(self, broker_addr: str, name: str, key: str) -> dict:
        """VIEW_BROKER_STATS_DATA: {statsMinute, statsHour, statsDay: {sum, tps, avgpt}}."""
        ext = {"statsName": name, "statsKey": key}
        response = await self.call(broker_addr, RequestCode.VIEW_BROKER_STATS_DATA, ext)
        return _loads(response.body, broker_addr)

    async def route_masters(self, topic: str) -> list[str]:
        """The master of every broker group serving `topic` (the registered ones)."""
        route = await self.topic_route(topic)
        return [b.master for _, b in sorted(route.brokers.items()) if b.master is not None]

    async def topic_status(self, topic: str) -> list[TopicOffset]:
        """GET_TOPIC_STATS_INFO from every broker group of the topic's route."""
        route = await self.topic_route(topic)
        rows = []
        for name in sorted(route.brokers):
            doc = await self._group(
                route.brokers[name], RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}
            )
            rows += [
                TopicOffset(
                    str(mq.get("brokerName", name)),
                    int(mq["queueId"]),
                    int(row["minOffset"]),
                    int(row["maxOffset"]),
                    int(row.get("lastUpdateTimestamp") or 0),
                )
                for mq, row in _queue_map(doc)
            ]
        return sorted(rows)

    async def consumer_progress(self, group: str, topic: str | None = None) -> ConsumeStats:
        """GET_CONSUME_STATS from every broker group: where `group` is against each
        queue it has committed an offset for."""
        ext = {"consumerGroup": group}
        if topic is not None:
            ext["topic"] = topic
        rows, tps = [], 0.0
        for broker in (await self.cluster_info()).broker_datas():
            doc = await self._group(broker, RequestCode.GET_CONSUME_STATS, ext)
            tps += float(doc.get("consumeTps") or 0)
            rows += [
                QueueProgress(
                    str(mq["topic"]),
                    str(mq.get("brokerName", broker.broker_name)),
                    int(mq["queueId"]),
                    int(row["brokerOffset"]),
                    int(row["consumerOffset"]),
                    int(row.get("lastTimestamp") or 0),
                    None if row.get("popInFlight") is None else int(row["popInFlight"]),
                )
                for mq, row in _queue_map(doc)
            ]
        return ConsumeStats(sorted(rows), tps)

    async def broker_status(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO: the broker's key/value table."""
        response = await self.call(broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        return dict(_loads(response.body, broker_addr).get("table") or {})

    async def ha_status(self, broker_addr: str) -> dict:
        """GET_BROKER_HA_STATUS (RocketMQ 5): a classic broker's HARuntimeInfo."""
        response = await self.call(broker_addr, RequestCode.GET_BROKER_HA_STATUS)
        info = _loads(response.body, broker_addr)
        if not isinstance(info, dict):
            raise MQClientError(f"{broker_addr} answered an HA status that is not an object")
        return info

    async def dledger_members(
        self, broker_addr: str, change: str = "", member: str = "", address: str = ""
    ) -> dict:
        """DLEDGER_MEMBERS (ours): the DLedger group of the broker at `broker_addr`,
        `{"voters", "learners", "peers", "leaderId"}`, after `change` (add, promote or
        remove `member`, at `address` to add; or lead: `member` takes over) has taken
        effect when one is given; the broker asks its DLedger leader. A change may take
        an election and a catch-up: it is given 15 s."""
        fields = {"change": change, "memberId": member, "address": address} if change else {}
        timeout_s = 15.0 if change else None
        response = await self.call(
            broker_addr, RequestCode.DLEDGER_MEMBERS, fields, timeout_s=timeout_s
        )
        members = _loads(response.body, broker_addr)
        if not isinstance(members, dict):
            raise MQClientError(f"{broker_addr} answered members that are not an object")
        return members

    async def add_dledger_member(
        self, broker_addr: str, member: str, address: str, timeout_s: float = 60.0
    ) -> dict:
        """Add `member` (a broker started with joinAsLearner=true, its DLedger peer
        `address`) to the group of the broker at `broker_addr`: two changes, each
        committed before the next (docs/membership.md), as a learner, then promoted once
        it has caught up (within `timeout_s`); a step already made is skipped, so running
        it again after a timeout is safe. The group's members after."""
        if member not in (await self.dledger_members(broker_addr))["peers"]:
            await self.dledger_members(broker_addr, "add", member, address)
        deadline = trio.current_time() + timeout_s
        while member in (members := await self.dledger_members(broker_addr))["learners"]:
            try:
                await self.dledger_members(broker_addr, "promote", member)
            except MQBrokerError as exc:  # still catching up, or the add not yet committed
                retry = "FALL_BEHIND_TOO_MUCH" in exc.remark or "LEADER_NOT_READY" in exc.remark
                if not retry or trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.1)
        return members

    async def query_msg_by_id(self, msg_id: str) -> MessageExt:
        """The message an offset msgId names (ValueError if it is not one)."""
        return (await self.locate_msg_by_id(msg_id))[1]

    async def locate_msg_by_id(self, msg_id: str) -> tuple[str, MessageExt]:
        """(address of a member holding it, the message) for an offset msgId.

        The id holds the store host and the physical offset. The store host is asked
        first; if it is gone (the old master after a failover) every registered member
        is, its own group first: the offset is the same on every replica. An answer
        is taken only if the record there carries this very id, so asking a member of
        another group cannot return a stranger's message.
        """
        wanted = decode_message_id(msg_id)
        ip, port = wanted.host
        store_addr = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        ext = {"offset": wanted.offset}
        answers: list[MQClientError] = []
        unreachable: list[str] = []

        async def view(address: str) -> tuple[str, MessageExt] | None:
            try:
                response = await self.call(address, RequestCode.VIEW_MESSAGE_BY_ID, ext)
                msg, _ = decode(response.body)
            except _NO_ANSWER as exc:
                unreachable.append(f"{address}: {exc}")
            except MQClientError as exc:
                answers.append(exc)
            except MessageFormatError as exc:
                answers.append(MQClientError(f"{address} answered a bad record: {exc}"))
            else:
                if msg.msg_id == msg_id.upper():
                    return address, msg
                answers.append(MQClientError(f"{address} holds another message there"))
            return None

        found = await view(store_addr)
        if found is not None:
            return found
        groups = (await self.cluster_info()).broker_datas()
        groups.sort(key=lambda b: store_addr not in b.addrs.values())
        for address in (a for b in groups for a in b.addresses() if a != store_addr):
            found = await view(address)
            if found is not None:
                return found
        if answers:
            raise answers[0]
        raise UnreachableError(f"no member holding {msg_id} answered: {'; '.join(unreachable)}")

    async def dledger_status(self, cluster: str | None = None) -> list[MemberStatus]:
        """Every member of every DLedger group (of `cluster`), registered or not."""
        members = []
        for broker in (await self.cluster_info()).broker_datas(cluster):
            members += group_members(broker, await self.runtime_tables(broker.addrs))
        return members

    async def runtime_tables(self, addrs: dict[int, str]) -> dict[int, dict | None]:
        """GET_BROKER_RUNTIME_INFO from every address at once (brokerId -> table, None
        for no answer), so silent members cost one timeout, not one each."""
        tables: dict[int, dict | None] = {}
        errors: list[MQClientError] = []

        async def ask(broker_id: int, address: str) -> None:
            try:
                tables[broker_id] = await self.broker_status(address)
            except _NO_ANSWER:
                tables[broker_id] = None
            except MQClientError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for broker_id, address in addrs.items():
                nursery.start_soon(ask, broker_id, address)
        if errors:
            raise errors[0]
        return tables
