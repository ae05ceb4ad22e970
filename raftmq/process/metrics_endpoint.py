"""A Prometheus `/metrics` endpoint served from inside a server's trio loop.

The broker and the name server each hold a `CollectorRegistry` of their own whose
collectors read the live state (queues, offsets, the DLedger replica) when scraped.
The collectors run on the event loop, between the tasks that change that state, so
they read a consistent picture without locks; what they return is plain data, which
prometheus_client then writes out as text (or OpenMetrics when the scraper asks for
it) in a worker thread, so the loop keeps serving while a scrape of thousands of
series is written (writing is about half a scrape's time). hypercorn, which runs on
trio, serves it over HTTP.

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SomeCollector(...))
    await nursery.start(serve_metrics, registry, "0.0.0.0", 5557)
"""

from __future__ import annotations

import functools
import logging

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from raftmq.process.errors import first_leaf

__all__ = ["METRICS_PATH", "MetricsPortError", "metrics_app", "serve_metrics"]

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"  # Prometheus's default metrics_path


class MetricsPortError(OSError):
    """The metrics port cannot be bound; the text names the `metricsPort` key."""


class _Collected:
    """Metric families already collected: what the encoder reads in its thread."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


async def _respond(send, status: int, content_type: str, body: bytes) -> None:
    headers = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def metrics_app(registry: CollectorRegistry):
    """The ASGI app: `registry`'s exposition at METRICS_PATH, 404 elsewhere."""

    async def exposition(scope, send) -> None:
        accept = ",".join(v.decode("latin-1") for k, v in scope["headers"] if k == b"accept")
        encode, content_type = choose_encoder(accept)
        families = list(registry.collect())  # on the loop: the live state, read at once
        body = await trio.to_thread.run_sync(encode, _Collected(families))
        await _respond(send, 200, content_type, body)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rpartition(".")[2]  # startup or shutdown
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return  # a websocket: closed unanswered
        if scope["path"] == METRICS_PATH:
            await exposition(scope, send)
        else:
            text = f"not found; metrics are at {METRICS_PATH}\n"
            await _respond(send, 404, "text/plain; charset=utf-8", text.encode())

    return app


async def serve_metrics(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `registry` on http://host:port/metrics until cancelled; reports the port
    it listens on (port 0 picks a free one). MetricsPortError when it cannot bind."""
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.errorlog = log  # hypercorn's messages go where the server's own go
    config.accesslog = None
    config.graceful_timeout = 0.0  # a stopping server does not wait for scrapers

    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            binds = await nursery.start(functools.partial(serve, metrics_app(registry), config))
        except* OSError as group:  # from inside hypercorn's nurseries
            failure = first_leaf(group)
        else:
            bound_port = int(binds[0].rpartition(":")[2])
            log.info("metrics at http://%s:%d%s", host, bound_port, METRICS_PATH)
            task_status.started(bound_port)
    if failure is not None:  # raised here, not inside the nursery, to come out unwrapped
        reason = getattr(failure, "strerror", None) or str(failure)
        raise MetricsPortError(getattr(failure, "errno", None), f"metricsPort={port}: {reason}")
