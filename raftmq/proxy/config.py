"""`rmq-proxy.json`, mqproxy's config, with Apache RocketMQ proxy's key names.

Used: `namesrvAddr` (required), `grpcServerPort` (8081; 0 picks a free one),
`metricsPromExporterPort` (Prometheus metrics; unset = off) and
`metricsPromExporterHost`, `tls.server.certPath` / `tls.server.keyPath` (PEM; both
given = the gRPC port speaks TLS) with `tls.server.mode` (`enforcing`, TLS only, by
default; or `permissive`, plaintext too, as Apache's default), and
`aclEnable` / `aclFile` (the brokers' plain_acl.yml: MQv2-HMAC-SHA1 signatures are
checked against its accounts), `accessKey` / `secretKey` (the proxy's own account:
it signs its remoting requests with it, for brokers with aclEnable), and the renewal
of auto_renew receives: `defaultInvisibleTimeMills` (60 s), `renewAheadTimeMillis` (10 s),
`renewSchedulePeriodMillis` (5 s), `renewMaxTimeMillis` (3 h). Accepted and not used:
`rocketMQClusterName` (every cluster the name servers know is served),
`remotingListenPort` (4.x remoting clients go to the brokers directly), `proxyMode` (a
standalone mqproxy is cluster mode).
"""

from __future__ import annotations

import json

import attrs

from raftmq.config.keys import (
    Key,
    KeyTable,
    boolean,
    choice,
    file_path,
    integer,
    ip_address,
    text,
)

__all__ = ["ProxyConfig", "load_proxy_config"]

GRPC_PORT = 8081


@attrs.frozen
class ProxyConfig:
    namesrv_addr: str
    grpc_port: int = GRPC_PORT
    grpc_host: str = "0.0.0.0"
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    tls_cert_path: str | None = None
    tls_key_path: str | None = None
    # with the TLS files: `enforcing` (TLS only) or `permissive` (TLS or plaintext, told
    # apart by the first byte: raftmq.proxy.permissive); Apache's default is permissive
    tls_mode: str = "enforcing"
    acl_enable: bool = False
    acl_file: str | None = None
    access_key: str | None = None  # the proxy's own account at brokers with aclEnable
    secret_key: str | None = None
    # auto_renew receives (raftmq.proxy.renewal)
    default_invisible_ms: int = 60_000
    renew_ahead_ms: int = 10_000
    renew_period_ms: int = 5_000
    renew_max_ms: int = 3 * 3600 * 1000


KEYS = KeyTable(
    (
        Key("namesrvAddr", "namesrv_addr", text),
        Key("grpcServerPort", "grpc_port", integer(0, 65535)),
        Key("grpcServerHost", "grpc_host", ip_address),
        Key("metricsPromExporterPort", "metrics_port", integer(0, 65535)),
        Key("metricsPromExporterHost", "metrics_host", ip_address),
        Key("tls.server.certPath", "tls_cert_path", file_path),
        Key("tls.server.keyPath", "tls_key_path", file_path),
        Key("tls.server.mode", "tls_mode", choice(["enforcing", "permissive"])),
        Key("aclEnable", "acl_enable", boolean),
        Key("aclFile", "acl_file", file_path),
        Key("accessKey", "access_key", text),
        Key("secretKey", "secret_key", text),
        Key("defaultInvisibleTimeMills", "default_invisible_ms", integer(1000)),
        Key("renewAheadTimeMillis", "renew_ahead_ms", integer(0)),
        Key("renewSchedulePeriodMillis", "renew_period_ms", integer(10)),
        Key("renewMaxTimeMillis", "renew_max_ms", integer(0)),
    ),
    unused=frozenset({"rocketMQClusterName", "remotingListenPort", "proxyMode"}),
)


def _as_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def load_proxy_config(
    path: str | None, overrides: dict[str, str] | None = None
) -> tuple[ProxyConfig, list[str]]:
    """The config of `path` (a JSON object), then `overrides` ({key: text}, from the
    command line); ValueError naming the file or key."""
    given: dict[str, tuple[str, str]] = {}
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as exc:
            raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: expected a JSON object of keys")
        given = {key: (path, _as_text(value)) for key, value in doc.items()}
    for key, value in (overrides or {}).items():
        given[key] = ("command line", value)
    values, warnings = KEYS.read(given)
    if "namesrv_addr" not in values:
        raise ValueError("namesrvAddr is required (in the config file, or -n)")
    if ("tls_cert_path" in values) != ("tls_key_path" in values):
        raise ValueError("tls.server.certPath and tls.server.keyPath go together")
    if ("access_key" in values) != ("secret_key" in values):
        raise ValueError("accessKey and secretKey go together")
    if values.get("acl_enable") and "acl_file" not in values:
        raise ValueError("aclEnable=true needs aclFile (the brokers' plain_acl.yml)")
    return ProxyConfig(**values), warnings
