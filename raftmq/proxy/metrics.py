"""mqproxy's Prometheus metrics: calls per RPC and answer code, and their latency.

`rocketmq_proxy_rpc_total{rpc, code}` counts calls by the v2 `Code` of their answer
(gRPC-level failures are counted under the gRPC status name, e.g. INVALID_ARGUMENT);
`rocketmq_proxy_rpc_latency_seconds{rpc}` is a histogram of the time from the call's
arrival to its answer (a long-polled ReceiveMessage included). The collectors are
prometheus_client's thread-safe ones: the asyncio thread counts, the trio thread's
metrics endpoint reads.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["ProxyMetrics"]

_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.calls = Counter(
            "rocketmq_proxy_rpc",
            "gRPC calls answered, by RPC and answer code",
            ("rpc", "code"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "rocketmq_proxy_rpc_latency_seconds",
            "Time from a call's arrival to its answer",
            ("rpc",),
            buckets=_BUCKETS_S,
            registry=self.registry,
        )

    def observe(self, rpc: str, code: str, elapsed_s: float) -> None:
        self.calls.labels(rpc, code).inc()
        self.latency.labels(rpc).observe(elapsed_s)
