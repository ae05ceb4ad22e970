"""`namesrv.conf`: RocketMQ's `key=value` properties for the name server.

Keys (defaults in brackets):

- `listenPort` [9876]: 0 lets the OS pick (the chosen port is printed);
- `bindAddress` [0.0.0.0];
- `brokerChannelExpiredTime` [120000]: ms of silence after which a broker is dropped
  (Java's `RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME`, a constant there);
- `scanNotActiveBrokerInterval` [5000]: ms between scans (5.x `NamesrvConfig` key);
- `metricsPort` [0, off]: serve Prometheus metrics at http://bindAddress:metricsPort/metrics
  (raftmq's key; RocketMQ has no metrics endpoint of its own).

A few Java keys with no meaning here (`rocketmqHome`, `kvConfigPath`, ...) are accepted
with a warning; any other key, or a value that is not a number where one is needed, is an
error naming the file, key and value, so a typo does not silently run with a default.
"""

from __future__ import annotations

import attrs

from raftmq.config.keys import Key, KeyTable, integer, read_config_file
from raftmq.transport.tls import (
    TLS_CLIENT_KEYS,
    TLS_SERVER_KEYS,
    TLS_UNUSED_KEYS,
    ServerTls,
    with_tls,
)

__all__ = ["NamesrvConfig", "load_config"]

UNUSED_KEYS = frozenset(
    {
        "rocketmqHome",
        "kvConfigPath",
        "configStorePath",
        "productEnvName",
        "clusterTest",
        "orderMessageEnable",
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
    tls_server: ServerTls = attrs.Factory(ServerTls)


KEYS = KeyTable(
    [
        Key("listenPort", "listen_port", integer(0, 65535)),
        Key("bindAddress", "bind_address", str),  # empty, like 0.0.0.0, is every interface
        Key("brokerChannelExpiredTime", "broker_channel_expired_time_ms", integer(1)),
        Key("scanNotActiveBrokerInterval", "scan_not_active_broker_interval_ms", integer(1)),
        Key("metricsPort", "metrics_port", integer(0, 65535)),
        *TLS_SERVER_KEYS,
    ],
    # a name server opens no connections of its own
    unused=UNUSED_KEYS | TLS_UNUSED_KEYS | {key.name for key in TLS_CLIENT_KEYS},
)


def load_config(path: str | None) -> tuple[NamesrvConfig, list[str]]:
    """The config in `path` (None: the defaults), and warnings for keys that have no effect.
    Raises ValueError naming the file, key and value."""
    if path is None:
        return NamesrvConfig(), []
    fields, warnings = KEYS.read_text(read_config_file(path), path)
    try:
        return NamesrvConfig(**with_tls(fields, ("tls_server",))), warnings
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
