"""The name server's metrics, `rocketmq_namesrv_*`, read from the route tables when
scraped (rocketmq-exporter has none for a name server; these are raftmq's).

Brokers are counted per broker name with their cluster, so a DLedger group shows its
members and whether one of them is registered as master (brokerId 0), the signal a
failover dashboard watches. Route lookups are counted as they are answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from raftmq.namesrv.routes import MASTER_ID

if TYPE_CHECKING:
    from raftmq.namesrv.processor import NamesrvProcessor

__all__ = ["NamesrvCollector"]


class NamesrvCollector(Collector):
    def __init__(self, processor: NamesrvProcessor) -> None:
        self.processor = processor

    def collect(self):
        processor = self.processor
        routes = processor.routes
        members = GaugeMetricFamily(
            "rocketmq_namesrv_brokers",
            "Registered members (addresses) of each broker name",
            labels=("cluster", "broker"),
        )
        master = GaugeMetricFamily(
            "rocketmq_namesrv_broker_master",
            "1 when a member of the broker name is registered as master (brokerId 0)",
            labels=("cluster", "broker"),
        )
        for name, data in sorted(routes.broker_addr_table.items()):
            labels = [data["cluster"], name]
            members.add_metric(labels, len(data["brokerAddrs"]))
            master.add_metric(labels, 1.0 if MASTER_ID in data["brokerAddrs"] else 0.0)
        yield members
        yield master
        yield GaugeMetricFamily(
            "rocketmq_namesrv_topics", "Topics with a route", value=len(routes.topic_queue_table)
        )
        lookups = CounterMetricFamily(
            "rocketmq_namesrv_route_requests",
            "GET_ROUTEINFO_BY_TOPIC requests answered, by whether the topic had a route",
            labels=("result",),
        )
        lookups.add_metric(["found"], processor.route_requests - processor.route_misses)
        lookups.add_metric(["not_found"], processor.route_misses)
        yield lookups
        yield CounterMetricFamily(
            "rocketmq_namesrv_broker_registrations",
            "REGISTER_BROKER requests answered (every 30 s per member, and on role changes)",
            value=processor.registrations,
        )
