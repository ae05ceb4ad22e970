"""The name server's request processors (`DefaultRequestProcessor`), on `RemotingCommand`.

Handled: REGISTER_BROKER (103), UNREGISTER_BROKER (104), GET_ROUTEINFO_BY_TOPIC (105),
GET_BROKER_CLUSTER_INFO (106), GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206),
DELETE_TOPIC_IN_NAMESRV (216), GET_TOPICS_BY_CLUSTER (224); the operators' requests
PUT_KV_CONFIG (100), GET_KV_CONFIG (101), DELETE_KV_CONFIG (102),
GET_KVLIST_BY_NAMESPACE (219) (namesrv.kv_config), WIPE_WRITE_PERM_OF_BROKER (205),
ADD_WRITE_PERM_OF_BROKER (327), UPDATE_NAMESRV_CONFIG (318) and GET_NAMESRV_CONFIG
(319). Anything else gets REQUEST_CODE_NOT_SUPPORTED from `ProcessorTable`.

Bodies are written as a 4.9.4+ namesrv writes them for `acceptStandardJsonOnly`:
standard, compact JSON with sorted keys, so broker ids are quoted (`"0"`), which every
client checked accepts (reference A.7). Bad input (a missing or non-numeric header
field, a body that is not the JSON expected, a CRC mismatch) is answered SYSTEM_ERROR
with a remark naming what was wrong, as Java's processor does when it throws; the
compressed (Deflate) registration body is refused the same way.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable

from raftmq.namesrv.config import NamesrvConfig, config_properties, updated
from raftmq.namesrv.kv_config import ORDER_TOPIC_CONFIG, KVConfigManager
from raftmq.namesrv.routes import RouteInfoManager

from raftmq.config.properties import format_properties, parse_properties
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.command import RemotingCommand
from raftmq.remoting.connection import Connection
from raftmq.remoting.processor import ProcessorTable

__all__ = ["BadRequest", "NamesrvProcessor", "dumps"]


def dumps(value: object) -> bytes:
    """fastjson's standard form: compact, keys sorted, non-ASCII escaped."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class BadRequest(ValueError):
    """A request the processor cannot act on; its text becomes the response remark."""


def _field(request: RemotingCommand, name: str, *, required: bool = True) -> str | None:
    value = request.ext_fields.get(name)
    if value is None or value == "":
        if required:
            raise BadRequest(f"missing header field {name!r}")
        return None
    return str(value)


def _int_field(request: RemotingCommand, name: str, *, required: bool = True) -> int | None:
    value = _field(request, name, required=required)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"header field {name!r} is not an integer: {value!r}") from None


def _crc_matches(body: bytes, expected: int) -> bool:
    crc = zlib.crc32(body)
    # UtilAll.crc32 masks to 31 bits; accept the raw value (signed or not) too.
    signed = crc - (1 << 32) if crc >= 1 << 31 else crc
    return expected in (crc & 0x7FFFFFFF, crc, signed)


def parse_register_body(body: bytes) -> tuple[dict[str, dict], dict | None, list[str]]:
    """RegisterBrokerBody JSON -> (topicConfigTable, dataVersion, filterServerList)."""
    if not body:
        return {}, None, []
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"register body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("register body is not a JSON object")
    wrapper = doc.get("topicConfigSerializeWrapper") or {}
    if not isinstance(wrapper, dict):
        raise BadRequest("topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise BadRequest("topicConfigTable is not an object")
    for topic, config in table.items():
        if not isinstance(config, dict):
            raise BadRequest(f"topic config for {topic!r} is not an object")
        for key in ("readQueueNums", "writeQueueNums", "perm", "topicSysFlag"):
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise BadRequest(f"topic {topic!r}: {key} is not an integer: {value!r}")
    data_version = wrapper.get("dataVersion")
    if data_version is not None and not isinstance(data_version, dict):
        raise BadRequest("dataVersion is not an object")
    filter_servers = doc.get("filterServerList") or []
    if not isinstance(filter_servers, list) or not all(isinstance(s, str) for s in filter_servers):
        raise BadRequest("filterServerList is not a list of addresses")
    return table, data_version, filter_servers


class NamesrvProcessor:
    """Processors for a `RouteInfoManager`; `table()` is what a RemotingServer serves.

    `clock` returns milliseconds (trio's clock in the server, anything in tests);
    `config` is the name server's, which UPDATE_NAMESRV_CONFIG replaces.
    """

    def __init__(
        self,
        routes: RouteInfoManager,
        clock: Callable[[], int],
        config: NamesrvConfig | None = None,
        kv: KVConfigManager | None = None,
    ) -> None:
        self.routes = routes
        self.clock = clock
        self.config = config or NamesrvConfig()
        self.kv = kv or KVConfigManager()
        # counted for monitoring (namesrv.metrics)
        self.route_requests = 0
        self.route_misses = 0  # of those, for a topic with no route
        self.registrations = 0

    def table(self) -> ProcessorTable:
        return ProcessorTable(
            {
                RequestCode.REGISTER_BROKER: self._guard(self.register_broker),
                RequestCode.UNREGISTER_BROKER: self._guard(self.unregister_broker),
                RequestCode.GET_ROUTEINFO_BY_TOPIC: self._guard(self.get_route_info),
                RequestCode.GET_BROKER_CLUSTER_INFO: self._guard(self.get_cluster_info),
                RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._guard(self.get_topic_list),
                RequestCode.DELETE_TOPIC_IN_NAMESRV: self._guard(self.delete_topic),
                RequestCode.GET_TOPICS_BY_CLUSTER: self._guard(self.topics_by_cluster),
                # operators' requests (mqadmin)
                RequestCode.PUT_KV_CONFIG: self._guard(self.put_kv_config),
                RequestCode.GET_KV_CONFIG: self._guard(self.get_kv_config),
                RequestCode.DELETE_KV_CONFIG: self._guard(self.delete_kv_config),
                RequestCode.GET_KVLIST_BY_NAMESPACE: self._guard(self.kv_list),
                RequestCode.WIPE_WRITE_PERM_OF_BROKER: self._guard(self.wipe_write_perm),
                RequestCode.ADD_WRITE_PERM_OF_BROKER: self._guard(self.add_write_perm),
                RequestCode.UPDATE_NAMESRV_CONFIG: self._guard(self.update_config),
                RequestCode.GET_NAMESRV_CONFIG: self._guard(self.get_config),
            }
        )

    @staticmethod
    def _guard(handler):
        async def processor(request: RemotingCommand, connection: Connection | None):
            try:
                return handler(request, connection)
            except BadRequest as exc:
                return request.make_response(ResponseCode.SYSTEM_ERROR, str(exc))

        return processor

    def on_disconnect(self, connection: Connection) -> None:
        """BrokerHousekeepingService: a broker's connection closed, so is the broker."""
        self.routes.on_channel_destroy(connection)

    # -- handlers (synchronous: the tables are in memory) -----------------------------

    def register_broker(self, request: RemotingCommand, connection) -> RemotingCommand:
        cluster = _field(request, "clusterName")
        broker_addr = _field(request, "brokerAddr")
        broker_name = _field(request, "brokerName")
        broker_id = _int_field(request, "brokerId")
        ha_server_addr = _field(request, "haServerAddr", required=False)
        timeout_ms = _int_field(request, "heartbeatTimeoutMillis", required=False)
        term = _int_field(request, "dLegerTerm", required=False)
        if str(request.ext_fields.get("compressed", "false")).lower() == "true":
            raise BadRequest("compressed register body is not supported; send it uncompressed")
        crc = _int_field(request, "bodyCrc32", required=False) or 0
        if crc and not _crc_matches(request.body, crc):
            raise BadRequest("crc32 not match")
        topics, data_version, filter_servers = parse_register_body(request.body)
        self.registrations += 1
        result = self.routes.register_broker(
            cluster,
            broker_addr,
            broker_name,
            broker_id,
            ha_server_addr,
            topics,
            data_version,
            self.clock(),
            filter_servers=filter_servers,
            channel=connection,
            timeout_ms=timeout_ms,
            term=term,
        )
        ext = {}
        if result.master_addr is not None:
            ext["masterAddr"] = result.master_addr
        if result.ha_server_addr is not None:
            ext["haServerAddr"] = result.ha_server_addr
        # The body is the ORDER_TOPIC_CONFIG KV table (KVTable), as Java's answers.
        body = dumps({"table": self.kv.namespace(ORDER_TOPIC_CONFIG)})
        return request.make_response(ResponseCode.SUCCESS, None, ext_fields=ext, body=body)

    def unregister_broker(self, request: RemotingCommand, connection) -> RemotingCommand:
        self.routes.unregister_broker(
            _field(request, "clusterName"),
            _field(request, "brokerAddr"),
            _field(request, "brokerName"),
            _int_field(request, "brokerId"),
        )
        return request.make_response(ResponseCode.SUCCESS)

    def get_route_info(self, request: RemotingCommand, connection) -> RemotingCommand:
        topic = _field(request, "topic")
        route = self.routes.pickup_topic_route_data(topic)
        self.route_requests += 1
        if route is None:
            self.route_misses += 1
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        order = self.kv.get(ORDER_TOPIC_CONFIG, topic)
        if self.config.order_message_enable and order is not None:  # over the registered one
            route["orderTopicConf"] = order
        return request.make_response(ResponseCode.SUCCESS, body=dumps(route))

    def get_cluster_info(self, request: RemotingCommand, connection) -> RemotingCommand:
        return request.make_response(
            ResponseCode.SUCCESS, body=dumps(self.routes.get_all_cluster_info())
        )

    def get_topic_list(self, request: RemotingCommand, connection) -> RemotingCommand:
        body = dumps({"topicList": self.routes.get_all_topic_list()})
        return request.make_response(ResponseCode.SUCCESS, body=body)

    def delete_topic(self, request: RemotingCommand, connection) -> RemotingCommand:
        self.routes.delete_topic(_field(request, "topic"))
        return request.make_response(ResponseCode.SUCCESS)

    def topics_by_cluster(self, request: RemotingCommand, connection) -> RemotingCommand:
        topics = self.routes.topics_of_cluster(_field(request, "cluster"))
        return request.make_response(ResponseCode.SUCCESS, body=dumps({"topicList": topics}))

    # -- operators' requests ----------------------------------------------------------

    def put_kv_config(self, request: RemotingCommand, connection) -> RemotingCommand:
        self.kv.put(_field(request, "namespace"), _field(request, "key"), _field(request, "value"))
        return request.make_response(ResponseCode.SUCCESS)

    def get_kv_config(self, request: RemotingCommand, connection) -> RemotingCommand:
        namespace, key = _field(request, "namespace"), _field(request, "key")
        value = self.kv.get(namespace, key)
        if value is None:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"value": value})

    def delete_kv_config(self, request: RemotingCommand, connection) -> RemotingCommand:
        self.kv.delete(_field(request, "namespace"), _field(request, "key"))
        return request.make_response(ResponseCode.SUCCESS)

    def kv_list(self, request: RemotingCommand, connection) -> RemotingCommand:
        namespace = _field(request, "namespace")
        table = self.kv.namespace(namespace)
        if not table:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}"
            )
        return request.make_response(ResponseCode.SUCCESS, body=dumps({"table": table}))

    def wipe_write_perm(self, request: RemotingCommand, connection) -> RemotingCommand:
        count = self.routes.change_write_perm(_field(request, "brokerName"), writable=False)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"wipeTopicCount": count})

    def add_write_perm(self, request: RemotingCommand, connection) -> RemotingCommand:
        count = self.routes.change_write_perm(_field(request, "brokerName"), writable=True)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"addTopicCount": count})

    def get_config(self, request: RemotingCommand, connection) -> RemotingCommand:
        body = format_properties(config_properties(self.config)).encode()
        return request.make_response(ResponseCode.SUCCESS, body=body)

    def update_config(self, request: RemotingCommand, connection) -> RemotingCommand:
        """Keys outside `RUNTIME_KEYS` are refused (Java refuses only its black list,
        configStorePath and kvConfigPath, and takes a new listenPort it cannot use)."""
        try:
            changes = parse_properties(request.body.decode("utf-8"), "UPDATE_NAMESRV_CONFIG")
            self.config = updated(self.config, changes, "UPDATE_NAMESRV_CONFIG")
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadRequest(str(exc)) from None
        return request.make_response(ResponseCode.SUCCESS)
