"""`namesrv.conf`: RocketMQ's `key=value` properties for the name server.

Keys (defaults in brackets):

- `listenPort` [9876]: 0 lets the OS pick (the chosen port is printed);
- `bindAddress` [0.0.0.0];
- `brokerChannelExpiredTime` [120000]: ms of silence after which a broker is dropped
  (Java's `RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME`, a constant there);
- `scanNotActiveBrokerInterval` [5000]: ms between scans (5.x `NamesrvConfig` key).

A few Java keys with no meaning here (`rocketmqHome`, `kvConfigPath`, ...) are accepted
and ignored; any other key, or a value that is not a number where one is needed, is an
error naming the key, so a typo does not silently run with a default.
"""

from __future__ import annotations

import attrs

__all__ = ["NamesrvConfig", "load_config", "parse_properties"]

IGNORED_KEYS = frozenset(
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
    listen_port: int = 9876
    bind_address: str = "0.0.0.0"
    broker_channel_expired_time_ms: int = 120_000
    scan_not_active_broker_interval_ms: int = 5_000


_INT_KEYS = {
    "listenPort": "listen_port",
    "brokerChannelExpiredTime": "broker_channel_expired_time_ms",
    "scanNotActiveBrokerInterval": "scan_not_active_broker_interval_ms",
}


def parse_properties(text: str, source: str = "<config>") -> dict[str, str]:
    """Java `Properties` lite: `key=value` (or `key: value`) lines, `#`/`!` comments."""
    values: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        positions = [i for i in (line.find("="), line.find(":")) if i > 0]
        if not positions:
            raise ValueError(f"{source}:{lineno}: expected key=value, got {raw!r}")
        cut = min(positions)
        values[line[:cut].strip()] = line[cut + 1 :].strip()
    return values


def config_from_keys(values: dict[str, str], source: str = "<config>") -> NamesrvConfig:
    kwargs: dict[str, object] = {}
    for key, value in values.items():
        if key in IGNORED_KEYS:
            continue
        if key == "bindAddress":
            kwargs["bind_address"] = value
        elif key in _INT_KEYS:
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"{source}: {key}={value!r} is not an integer") from None
            low = 0 if key == "listenPort" else 1
            if number < low or (key == "listenPort" and number > 65535):
                raise ValueError(f"{source}: {key}={number} is out of range")
            kwargs[_INT_KEYS[key]] = number
        else:
            known = ", ".join(sorted(["bindAddress", *_INT_KEYS]))
            raise ValueError(f"{source}: unknown key {key!r} (known: {known})")
    return NamesrvConfig(**kwargs)


def load_config(path: str | None) -> NamesrvConfig:
    if path is None:
        return NamesrvConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None
    return config_from_keys(parse_properties(text, path), path)
