"""`namesrv.conf`: RocketMQ's `key=value` properties for the name server.

Keys (defaults in brackets):

- `listenPort` [9876]: 0 lets the OS pick (the chosen port is printed);
- `bindAddress` [0.0.0.0];
- `brokerChannelExpiredTime` [120000]: ms of silence after which a broker is dropped
  (Java's `RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME`, a constant there);
- `scanNotActiveBrokerInterval` [5000]: ms between scans (5.x `NamesrvConfig` key);
- `metricsPort` [0, off]: serve Prometheus metrics at http://bindAddress:metricsPort/metrics
  (raftmq's key; RocketMQ has no metrics endpoint of its own);
- `kvConfigPath` [none]: the file that keeps the KV config (`mqadmin updateKvConfig`,
  `updateOrderConf`) across restarts; without it the KV config lasts as long as the
  process (RocketMQ's default is ~/namesrv/kvConfig.json);
- `orderMessageEnable` [false]: routes carry the ORDER_TOPIC_CONFIG KV entry of their
  topic as `orderTopicConf`, as RocketMQ's do;
- `enableControllerInNamesrv` [false]: run a controller in this process, configured by
  the controller's keys in this same file (`raftmq.controller.config`).

`mqadmin getNamesrvConfig` reads the keys (`config_properties`); `updateNamesrvConfig`
changes those in `RUNTIME_KEYS` until the name server restarts (`updated`).

A few Java keys with no meaning here (`rocketmqHome`, `configStorePath`, ...) are accepted
with a warning; any other key, or a value that is not a number where one is needed, is an
error naming the file, key and value, so a typo does not silently run with a default.
"""

from __future__ import annotations

import attrs
from raftmq.controller.config import CONTROLLER_KEYS, UNUSED_CONTROLLER_KEYS, ControllerConfig

from raftmq.config.keys import Key, KeyTable, boolean, file_path, integer, read_config_file
from raftmq.transport.tls import (
    TLS_CLIENT_KEYS,
    TLS_SERVER_KEYS,
    TLS_UNUSED_KEYS,
    ServerTls,
    with_tls,
)

__all__ = ["RUNTIME_KEYS", "NamesrvConfig", "config_properties", "load_config", "updated"]

UNUSED_KEYS = frozenset(
    {
        "rocketmqHome",
        "configStorePath",
        "productEnvName",
        "clusterTest",
        "serverWorkerThreads",
        "serverCallbackExecutorThreads",
        "serverSelectorThreads",
        "serverOnewaySemaphoreValue",
        "serverAsyncSemaphoreValue",
        "serverChannelMaxIdleTimeSeconds",
        "serverSocketSndBufSize",
        "serverSocketRcvBufSize",
        "serverPooledByteBufAllocatorEnable",
        "useEpollNativeSelector",
    }
)


@attrs.frozen
class NamesrvConfig:
    """namesrv.conf; the `tls.server.*` keys set the remoting server's TLS (transport.tls)."""

    listen_port: int = 9876
    bind_address: str = "0.0.0.0"
    broker_channel_expired_time_ms: int = 120_000
    scan_not_active_broker_interval_ms: int = 5_000
    metrics_port: int = 0  # 0: no metrics endpoint
    kv_config_path: str = ""  # "": the KV config is not kept in a file
    order_message_enable: bool = False
    tls_server: ServerTls = attrs.Factory(ServerTls)
    controller: ControllerConfig | None = None  # enableControllerInNamesrv=true


_NAMESRV_KEYS = (
    Key("listenPort", "listen_port", integer(0, 65535)),
    Key("bindAddress", "bind_address", str),  # empty, like 0.0.0.0, is every interface
    Key("brokerChannelExpiredTime", "broker_channel_expired_time_ms", integer(1)),
    Key("scanNotActiveBrokerInterval", "scan_not_active_broker_interval_ms", integer(1)),
    Key("metricsPort", "metrics_port", integer(0, 65535)),
    Key("kvConfigPath", "kv_config_path", file_path),
    Key("orderMessageEnable", "order_message_enable", boolean),
    *TLS_SERVER_KEYS,
    Key("enableControllerInNamesrv", "enable_controller_in_namesrv", boolean),
)
# a key both configs have (scanNotActiveBrokerInterval) sets both, as in Java
_SHARED = frozenset(key.name for key in _NAMESRV_KEYS) & {key.name for key in CONTROLLER_KEYS}
KEYS = KeyTable(
    [*_NAMESRV_KEYS, *(key for key in CONTROLLER_KEYS if key.name not in _SHARED)],
    # a name server opens no connections of its own
    unused=UNUSED_KEYS
    | TLS_UNUSED_KEYS
    | {key.name for key in TLS_CLIENT_KEYS}
    | UNUSED_CONTROLLER_KEYS,
)
_CONTROLLER_FIELDS = frozenset(key.field for key in CONTROLLER_KEYS if key.name not in _SHARED)
_SHARED_FIELDS = frozenset(key.field for key in CONTROLLER_KEYS if key.name in _SHARED)


def load_config(path: str | None) -> tuple[NamesrvConfig, list[str]]:
    """The config in `path` (None: the defaults), and warnings for keys that have no effect.
    Raises ValueError naming the file, key and value."""
    if path is None:
        return NamesrvConfig(), []
    fields, warnings = KEYS.read_text(read_config_file(path), path)
    controller = {f: fields.pop(f) for f in _CONTROLLER_FIELDS & fields.keys()}
    controller |= {f: fields[f] for f in _SHARED_FIELDS & fields.keys()}
    if fields.pop("enable_controller_in_namesrv", False):
        fields["controller"] = ControllerConfig(**controller)
    elif controller.keys() - _SHARED_FIELDS:
        warnings.append(f"{path}: controller keys without enableControllerInNamesrv=true: unused")
    try:
        if fields.get("controller") is not None:
            fields["controller"].check()
        return NamesrvConfig(**with_tls(fields, ("tls_server",))), warnings
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# what UPDATE_NAMESRV_CONFIG may change: read on every scan or route lookup
RUNTIME_KEYS = frozenset(
    {"brokerChannelExpiredTime", "scanNotActiveBrokerInterval", "orderMessageEnable"}
)
_TLS_KEYS = frozenset(key.name for key in TLS_SERVER_KEYS)


def config_properties(config: NamesrvConfig) -> dict[str, str]:
    """Every key but the TLS ones, as GET_NAMESRV_CONFIG reports it."""
    values = {}
    for key in _NAMESRV_KEYS:
        if key.name not in _TLS_KEYS and hasattr(config, key.field):
            value = getattr(config, key.field)
            values[key.name] = str(value).lower() if isinstance(value, bool) else str(value)
    return values


def updated(config: NamesrvConfig, changes: dict[str, str], source: str) -> NamesrvConfig:
    """`config` with `changes` applied; ValueError naming a key that is unknown, does
    not parse, or is not in RUNTIME_KEYS."""
    return KEYS.updated(config, changes, source, RUNTIME_KEYS, "namesrv.conf")
