"""The controller's metrics, `rocketmq_controller_*` (raftmq's: RocketMQ 5's controller
exports OpenTelemetry request and election counts, not the groups' state), read from
the applied state when scraped: per broker group, the master's brokerId and epoch, the
SyncStateSet's size and epoch, and the masters elected since the log began. Every
controller applies the same log, so each serves the same group figures (a follower's
lag behind its leader aside); `rocketmq_controller_leader` tells which one leads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from raftmq.controller.server import ControllerServer

__all__ = ["ControllerCollector"]

GROUP = ("cluster", "broker")


class ControllerCollector(Collector):
    def __init__(self, server: ControllerServer) -> None:
        self.server = server

    def collect(self):
        state = self.server.state
        yield GaugeMetricFamily(
            "rocketmq_controller_leader",
            "1 while this controller leads and may answer (caught up, holding its lease)",
            value=1.0 if self.server.leading() else 0.0,
        )
        families = {
            "master_id": "The master's brokerId (-1 while the group has none)",
            "master_epoch": "The master epoch: masters elected or cleared so far",
            "sync_state_set_size": "Members of the SyncStateSet: the brokers in sync",
            "sync_state_set_epoch": "The SyncStateSet's epoch: its changes so far",
        }
        gauges = {
            name: GaugeMetricFamily(f"rocketmq_controller_{name}", text, labels=GROUP)
            for name, text in families.items()
        }
        elections = CounterMetricFamily(
            "rocketmq_controller_elections",
            "Masters elected for the group since the controllers' log began",
            labels=GROUP,
        )
        for name, sync in sorted(state.sync_states.items()):
            labels = [sync.cluster_name, name]
            master = sync.master_broker_id
            gauges["master_id"].add_metric(labels, -1 if master is None else master)
            gauges["master_epoch"].add_metric(labels, sync.master_epoch)
            gauges["sync_state_set_size"].add_metric(labels, len(sync.sync_state_set))
            gauges["sync_state_set_epoch"].add_metric(labels, sync.sync_state_set_epoch)
            elections.add_metric(labels, state.elections.get(name, 0))
        yield from gauges.values()
        yield elections
