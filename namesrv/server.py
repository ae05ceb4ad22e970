"""`NamesrvServer`: the route tables behind a RemotingServer, plus the liveness scan.

    server = NamesrvServer(NamesrvConfig(listen_port=0))
    port = await nursery.start(server.serve)

`serve` runs the remoting server, `scanNotActiveBroker` every
`scanNotActiveBrokerInterval` ms and, with `metricsPort`, the Prometheus endpoint in one
nursery; cancelling it stops them all. A broker's connection closing removes it at once
(`BrokerHousekeepingService`). With `enableControllerInNamesrv=true` a controller
(`raftmq.controller`) runs in the same nursery, on its own DLedger peer port.
"""

from __future__ import annotations

import logging

import trio
from prometheus_client import CollectorRegistry
from raftmq.controller.metrics import ControllerCollector
from raftmq.controller.server import ControllerServer
from raftmq.namesrv.config import NamesrvConfig
from raftmq.namesrv.kv_config import KVConfigManager
from raftmq.namesrv.metrics import NamesrvCollector
from raftmq.namesrv.processor import NamesrvProcessor
from raftmq.namesrv.routes import RouteInfoManager

from raftmq.process.metrics_endpoint import serve_metrics
from raftmq.remoting.server import RemotingServer, listen_host

__all__ = ["NamesrvServer"]

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


class NamesrvServer:
    def __init__(
        self, config: NamesrvConfig | None = None, kv: KVConfigManager | None = None
    ) -> None:
        """`kv`: the KV config, else one read from `kvConfigPath` (ValueError if that
        is not a kvConfig.json)."""
        config = config or NamesrvConfig()
        self.routes = RouteInfoManager()
        kv = KVConfigManager(config.kv_config_path or None) if kv is None else kv
        self.processor = NamesrvProcessor(self.routes, _now_ms, config, kv)
        self.remoting = RemotingServer(
            listen_host(config.bind_address),
            config.listen_port,
            self.processor.table(),
            on_disconnect=self.processor.on_disconnect,
            tls=config.tls_server,
        )
        self.controller = None if config.controller is None else ControllerServer(config.controller)
        self.metrics = CollectorRegistry(auto_describe=False)
        self.metrics.register(NamesrvCollector(self.processor))
        if self.controller is not None:
            self.metrics.register(ControllerCollector(self.controller))

    @property
    def config(self) -> NamesrvConfig:
        """The config now: `mqadmin updateNamesrvConfig` changes some keys at run time."""
        return self.processor.config

    @property
    def port(self) -> int:
        return self.remoting.port

    def scan_once(self) -> list[str]:
        expired = self.routes.scan_not_active_brokers(
            _now_ms(), self.config.broker_channel_expired_time_ms
        )
        for addr in expired:
            log.warning("broker %s expired: no registration for too long", addr)
        return expired

    async def _scan_forever(self) -> None:
        while True:
            await trio.sleep(self.config.scan_not_active_broker_interval_ms / 1000)
            self.scan_once()

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(self.remoting.serve)
            nursery.start_soon(self._scan_forever)
            if self.controller is not None:
                await nursery.start(self.controller.serve)
            if self.config.metrics_port:
                host = self.config.bind_address or "0.0.0.0"
                await nursery.start(serve_metrics, self.metrics, host, self.config.metrics_port)
            task_status.started(port)
