"""The broker's metrics under rocketmq-exporter's names and labels, read when scraped.

rocketmq-exporter asks each master over admin calls (VIEW_BROKER_STATS_DATA,
GET_CONSUME_STATS, GET_BROKER_RUNTIME_INFO, ...) and republishes the answers; here
each broker serves its own, so the families and labels a Grafana board charts
(`rocketmq_producer_tps{cluster,broker,topic}`, `rocketmq_group_diff`, ...) come
straight from the process, read from the live state at scrape time:

- topics and groups (producer_*, consumer_*, group_*, broker_tps/qps) from the
  master only, as the exporter asks only masters: every member of a DLedger group
  shares the brokerName label and holds the same queues, so a sum over the
  members would count each message three times. After a failover the new master
  reports them, its rates continuing from its own samples;
- `rocketmq_brokeruntime_*` from every member, told apart by `brokerIP`;
- a classic broker's replication (`ClassicHACollector`): on the master, each slave
  connection's acknowledged offset and the exporter's `rocketmq_broker_commitlog_diff`
  (how many bytes it is behind); on a slave, its offset and the master's.

Message counts come from the ConsumeQueues (a topic's messages are the sum of its
queues' max offsets) and the pull counters; nothing is counted per message on the
send path. Rates are RocketMQ's: samples every 10 s, a rate over the window's start
to now (`stats.Rates`).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.registry import Collector
from raftmq.broker.admin_queries import VERSION_DESC
from raftmq.broker.stats import SAMPLE_INTERVAL_S, Rates
from raftmq.broker.store.metadata import DLQ_PREFIX, META_TOPIC, RETRY_PREFIX

from raftmq.disk.filesystem import used_ratio

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.classic import ClassicReplica
    from raftmq.broker.clients import ClientManager
    from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.stats import BrokerStats
    from raftmq.broker.store.messagestore import MessageStore

__all__ = ["BrokerCollector", "ClassicHACollector"]

VERSION_ORDINAL = "409"  # MQVersion.Version.V4_9_8.ordinal(), the brokerVersion we report
CLUSTERING = "1"  # MessageModel.CLUSTERING.ordinal(): the exporter's msgModel label
TOPIC = ("cluster", "broker", "topic")
GROUP = ("cluster", "broker", "topic", "group")
BROKER = ("cluster", "brokerIP", "broker")
RUNTIME = ("cluster", "brokerIP", "brokerHost", "des", "boottime", "broker_version")
RUNTIME_WINDOWS_S = (10, 60, 600)  # putTps and getTransferedTps: 10 s, 1 min, 10 min
MINUTE_S = 60  # the exporter's rates are statsMinute's


def _family(name: str, text: str, labels: tuple[str, ...], rows) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=labels)
    for label_values, value in rows:
        family.add_metric(list(label_values), value)
    return family


@attrs.define(eq=False)  # a registry keys its collectors by identity
class BrokerCollector(Collector):
    role: BrokerRole
    store: MessageStore
    offsets: ConsumerOffsetManager
    clients: ClientManager
    stats: BrokerStats
    address: BrokerAddress
    cluster: str = attrs.field(kw_only=True)
    broker_name: str = attrs.field(kw_only=True)
    # broker.timer's TimerService.status: the timer gauges
    timer_status: Callable[[], dict[str, int]] = attrs.field(kw_only=True, default=dict)
    rates: Rates = attrs.Factory(Rates)
    boot_ms: int = attrs.Factory(lambda: int(time.time() * 1000))

    # ------------------------------------------------------------------ counts
    def counts(self) -> dict:
        """Every count a rate is kept of, now: messages and bytes stored per topic,
        pulled per topic and group, stored and pulled by this broker."""
        counts: dict = defaultdict(int)
        for (topic, _queue_id), queue in self.store.queues.queues.items():
            counts["put", topic] += queue.max_offset
            counts["put_bytes", topic] += queue.dispatched_bytes
        for (topic, group), (messages, size_bytes) in self.stats.pulled.items():
            counts["get", topic, group] = messages
            counts["get_bytes", topic, group] = size_bytes
        counts["broker_put"] = self.stats.put_messages
        counts["broker_get"] = self.stats.got_messages
        return dict(counts)

    async def run_sampler(self) -> None:
        """Sample the counts every SAMPLE_INTERVAL_S, for the rates."""
        while True:
            self.rates.sample(trio.current_time(), self.counts())
            await trio.sleep(SAMPLE_INTERVAL_S)

    # ------------------------------------------------------------------ collect
    def collect(self):
        now_s = trio.current_time()
        counts = self.counts()
        yield from self._runtime(now_s, counts)
        yield from self._timers()
        if self.role.is_master:
            yield from self._topics(now_s, counts)
            yield from self._groups(now_s, counts)
            yield from self._pop()

    def _timers(self):
        """Timer messages (broker.timer). RocketMQ 5 reports its timer backlog as
        `rocketmq_timer_message_snapshot` and its lag as histograms; here gauges."""
        own = (self.cluster, self.address.address, self.broker_name)
        status = self.timer_status()
        for name, key, text in (
            ("rocketmq_timer_backlog", "timerBacklog",
             "Timer messages filed by due time and not yet past the fired progress"),
            ("rocketmq_timer_in_memory", "timerInMemory",
             "Timer messages held in memory: the master's heap of what is due soon"),
            ("rocketmq_timer_lateness_ms", "timerLatenessMs",
             "How late the last delivery's latest message went out, ms after the time asked"),
            ("rocketmq_timer_fired_ms", "timerFiredMs",
             "The replicated firing progress: every message due by then has gone out"),
        ):  # fmt: skip
            if key in status:
                yield _family(name, text, BROKER, [(own, status[key])])

    def _rate(self, now_s: float, window_s: float, counts: dict, key) -> float:
        return Rates.per_second(self.rates.base(now_s, window_s), now_s, key, counts.get(key, 0))

    def _runtime(self, now_s: float, counts: dict):
        """rocketmq_brokeruntime_*: what GET_BROKER_RUNTIME_INFO would report."""
        labels = (
            self.cluster,
            self.address.address,
            "",
            VERSION_DESC,
            str(self.boot_ms),
            VERSION_ORDINAL,
        )
        log = self.store.server.store
        total_bytes, free_bytes = self.disk_bytes()
        values = {
            "msg_put_total_today_now": self.stats.put_messages,
            "msg_gettotal_today_now": self.stats.got_messages,
            "commitlog_maxoffset": self.store.physical_max,
            "commitlog_minoffset": log.end_pos if log.empty else log.pos_at(log.begin_index),
            "commitlog_disk_ratio": self.disk_ratio(),
            "commitlogdir_capacity_total": total_bytes,
            "commitlogdir_capacity_free": free_bytes,
        }
        for window_s in RUNTIME_WINDOWS_S:
            values[f"put_tps{window_s}"] = self._rate(now_s, window_s, counts, "broker_put")
            values[f"gettransfered_tps{window_s}"] = self._rate(
                now_s, window_s, counts, "broker_get"
            )
        for name, value in values.items():
            yield _family(f"rocketmq_brokeruntime_{name}", name, RUNTIME, [(labels, value)])

    def disk_bytes(self) -> tuple[int, int]:
        """The store's file system: total and free bytes."""
        disk = os.statvfs(self.store.root)
        return disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize

    def disk_ratio(self) -> float:
        """commitLogDiskRatio: the used fraction of the store's file system, as the disk
        check counts it (df's Use%), so it reads against diskSpaceWarningLevelRatio."""
        return used_ratio(self.store.root)

    def runtime_keys(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's rates and disk use in RocketMQ's formats (putTps and
        getTransferedTps: 10 s, 1 min and 10 min rates; what `mqadmin clusterList`'s
        #InTPS, #OutTPS and #SPACE read). Only the two broker counts are read, not the
        queues: consoles ask for this table often."""
        now_s = trio.current_time()
        counts = {"broker_put": self.stats.put_messages, "broker_get": self.stats.got_messages}

        def rates(key: str) -> str:
            return " ".join(
                f"{self._rate(now_s, window_s, counts, key):.2f}" for window_s in RUNTIME_WINDOWS_S
            )

        store = self.store
        messages = store.dispatched_messages
        disk_ratio = str(self.disk_ratio())
        return {
            "putTps": rates("broker_put"),
            "getTransferedTps": rates("broker_get"),
            "commitLogDiskRatio": disk_ratio,
            # the ConsumeQueues are under the same store root: the same file system
            "consumeQueueDiskRatio": disk_ratio,
            # the average size of the messages stored since start (dispatched, on a
            # slave too), as StoreStatsService's, which counts the master's puts
            "putMessageAverageSize": str(
                store.dispatched_message_bytes / messages if messages else 0.0
            ),
            "totalMemKBytes": str(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 1024),
        }

    def group_get_tps(self, topic: str, group: str) -> float:
        """Messages `group` pulled from `topic` per second over the last minute: RocketMQ's
        tpsGroupGetNums, ConsumeStats.consumeTps (`mqadmin consumerProgress`)."""
        now_s = trio.current_time()
        key = ("get", topic, group)
        pulled = self.stats.pulled.get((topic, group))
        return self._rate(now_s, MINUTE_S, {key: pulled[0] if pulled else 0}, key)

    def _topics(self, now_s: float, counts: dict):
        """Per topic: what was stored, and how fast (the master's rocketmq_producer_*)."""
        base = self.cluster, self.broker_name
        tps, size, offset, retry, dlq = [], [], [], [], []
        for topic in sorted({key[1] for key in counts if key[0] == "put"} - {META_TOPIC}):
            stored = counts["put", topic]
            if topic.startswith(RETRY_PREFIX):
                retry.append(((*base, topic), stored))
            elif topic.startswith(DLQ_PREFIX):
                dlq.append(((*base, topic[len(DLQ_PREFIX) :]), stored))
            else:
                offset.append(((*base, topic), stored))
            tps.append(((*base, topic), self._rate(now_s, MINUTE_S, counts, ("put", topic))))
            size.append(((*base, topic), self._rate(now_s, MINUTE_S, counts, ("put_bytes", topic))))
        yield _family(
            "rocketmq_producer_tps", "Messages stored per second (last minute)", TOPIC, tps
        )
        yield _family(
            "rocketmq_producer_message_size", "Bytes stored per second (last minute)", TOPIC, size
        )
        yield _family(
            "rocketmq_producer_offset", "Messages stored (sum of max offsets)", TOPIC, offset
        )
        yield _family("rocketmq_topic_retry_offset", "Messages in retry topics", TOPIC, retry)
        yield _family(
            "rocketmq_topic_dlq_offset",
            "Messages in dead-letter topics",
            ("cluster", "broker", "group"),
            dlq,
        )
        broker = (self.cluster, self.address.address, self.broker_name)
        yield _family(
            "rocketmq_broker_tps",
            "Messages stored per second by this broker (last minute)",
            BROKER,
            [(broker, self._rate(now_s, MINUTE_S, counts, "broker_put"))],
        )
        yield _family(
            "rocketmq_broker_qps",
            "Messages pulled per second from this broker (last minute)",
            BROKER,
            [(broker, self._rate(now_s, MINUTE_S, counts, "broker_get"))],
        )
        producers = [
            ((*base, group), len(members))
            for group, members in sorted(self.clients.producers.items())
        ]
        yield _family(
            "rocketmq_producer_count",
            "Producers of each group heartbeating here",
            ("cluster", "broker", "group"),
            producers,
        )

    def _groups(self, now_s: float, counts: dict):
        """Per consumer group: pull rates, committed offsets, lag and its age."""
        base = self.cluster, self.broker_name
        tps = [
            ((*base, key[1], key[2]), self._rate(now_s, MINUTE_S, counts, key))
            for key in sorted(k for k in counts if k[0] == "get")
        ]
        size = [
            ((*base, key[1], key[2]), self._rate(now_s, MINUTE_S, counts, key))
            for key in sorted(k for k in counts if k[0] == "get_bytes")
        ]
        yield _family(
            "rocketmq_consumer_tps", "Messages pulled per second (last minute)", GROUP, tps
        )
        yield _family(
            "rocketmq_consumer_message_size", "Bytes pulled per second (last minute)", GROUP, size
        )
        consumed: dict[tuple[str, str], int] = defaultdict(int)
        lag: dict[tuple[str, str], int] = defaultdict(int)
        age_ms: dict[tuple[str, str], int] = defaultdict(int)
        per_queue = []
        now_ms = self.store.now_ms()
        for group, topic, queue_id in sorted(self.store.metadata.offsets):
            offset = self.offsets.query(group, topic, queue_id) or 0
            behind = max(0, self.store.max_offset(topic, queue_id) - offset)
            consumed[topic, group] += offset
            lag[topic, group] += behind
            per_queue.append(((*base, topic, group, str(queue_id)), behind))
            if behind:
                oldest_ms = self._oldest_unconsumed_ms(topic, queue_id, offset)
                if oldest_ms is not None:
                    age_ms[topic, group] = max(age_ms[topic, group], now_ms - oldest_ms)
        yield _family(
            "rocketmq_consumer_offset",
            "Sum of the group's committed offsets",
            GROUP,
            [((*base, t, g), value) for (t, g), value in consumed.items()],
        )
        diff = {"": [], "retry": [], "dlq": []}
        for (topic, group), behind in lag.items():
            kind = (
                "retry"
                if topic.startswith(RETRY_PREFIX)
                else "dlq"
                if topic.startswith(DLQ_PREFIX)
                else ""
            )
            online = self.clients.groups.get(group, {})
            models = {m.message_model for m in online.values()}
            model = "0" if models == {"BROADCASTING"} else CLUSTERING
            diff[kind].append(((*base, group, topic, str(len(online)), model), behind))
        labels = ("cluster", "broker", "group", "topic", "countOfOnlineConsumers", "msgModel")
        for kind, rows in diff.items():
            yield _family(
                f"rocketmq_group_{kind}diff",
                f"Messages the group has not consumed ({kind or 'normal'} topics)",
                labels,
                rows,
            )
        yield _family(
            "rocketmq_group_queue_diff",
            "Messages the group has not consumed, per queue (max offset - committed offset)",
            (*GROUP, "queueid"),
            per_queue,
        )
        yield _family(
            "rocketmq_group_get_latency_by_storetime",
            "Milliseconds since the oldest message the group has not consumed was stored",
            GROUP,
            [((*base, t, g), age_ms[t, g]) for (t, g) in lag],
        )

    def _pop(self):
        """POP consumption: messages in flight per group and topic (a retry topic is its
        own row), and how many were redelivered and dead-lettered (replicated counts:
        they carry on across a failover)."""
        base = self.cluster, self.broker_name
        state = self.store.metadata.pop
        in_flight: dict[tuple[str, str], int] = defaultdict(int)
        for (group, topic, _queue_id), count in state.in_flight_by_queue().items():
            in_flight[topic, group] += count
        yield _family(
            "rocketmq_pop_inflight_messages",
            "Messages popped and neither acknowledged nor redelivered",
            GROUP,
            [((*base, t, g), n) for (t, g), n in sorted(in_flight.items())],
        )
        yield _family(
            "rocketmq_pop_revived_messages",
            "Popped messages redelivered after their invisible time (to a retry topic or the DLQ)",
            ("cluster", "broker"),
            [(base, state.revived)],
        )
        yield _family(
            "rocketmq_pop_dlq_messages",
            "Popped messages moved to %DLQ%<group> after retryMaxTimes redeliveries",
            ("cluster", "broker"),
            [(base, state.dead_lettered)],
        )

    def _oldest_unconsumed_ms(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Store time of the first message at or after `offset` the queue still holds."""
        queue = self.store.queue(topic, queue_id)
        if queue is None:
            return None
        offset = max(offset, queue.min_offset)
        if offset >= queue.max_offset:
            return None
        physical_offset, _size, _tags = queue.get(offset)
        return self.store.store_time(physical_offset)


@attrs.define(eq=False)
class _ReplicaCollector(Collector):
    """A collector of a classic broker's replication, labelled as the broker."""

    replica: ClassicReplica
    address: BrokerAddress
    cluster: str = attrs.field(kw_only=True)
    broker_name: str = attrs.field(kw_only=True)

    def own(self) -> tuple[str, str, str]:
        return (self.cluster, self.address.address, self.broker_name)


@attrs.define(eq=False)
class ClassicHACollector(_ReplicaCollector):
    """Classic master/slave replication (store.ha), read when scraped.

    RocketMQ 5's own metrics have no HA family and the exporter has one,
    `rocketmq_broker_commitlog_diff` (master minus slave commitLogMaxOffset, which it
    computes from both brokers' runtime tables): here the master serves it for each
    slave connection, from the offset the slave last acknowledged, so it keeps rising
    while a slave is stalled and cannot answer a scrape of its own. Its `brokerIP` is the
    slave's address as the master sees the HA connection (the exporter's is the
    slave's broker address, which the HA protocol does not carry)."""

    def collect(self):
        own = self.own()
        ha, client = self.replica.ha, self.replica.client
        end = self.replica.log.write_pos
        connections = sorted(
            (c for c in ha.connections if c.start_offset is not None), key=lambda c: c.peer
        )
        yield _family(
            "rocketmq_ha_connections",
            "Slaves connected to this broker's HA port",
            BROKER,
            [(own, len(connections))],
        )
        yield _family(
            "rocketmq_ha_slave_ack_offset_bytes",
            "On a master: the CommitLog offset each slave connection last acknowledged",
            (*BROKER, "slave"),
            [((*own, c.peer), max(c.acked_offset, 0)) for c in connections],
        )
        yield _family(
            "rocketmq_broker_commitlog_diff",
            "On a master: bytes of its CommitLog each slave (brokerIP) has not acknowledged",
            BROKER,
            [
                ((self.cluster, c.peer, self.broker_name), end - max(c.acked_offset, 0))
                for c in connections
            ],
        )
        if not self.replica.config.is_slave:
            return
        yield _family(
            "rocketmq_ha_slave_max_offset_bytes",
            "On a slave: the end of its CommitLog copy",
            BROKER,
            [(own, end)],
        )
        yield _family(
            "rocketmq_ha_master_offset_bytes",
            "On a slave: the end of the master's CommitLog as of the master's last frame",
            BROKER,
            [(own, client.master_offset)],
        )
        yield _family(
            "rocketmq_ha_master_connected",
            "On a slave: 1 while connected to the master's HA port",
            BROKER,
            [(own, 1 if client.connected_to is not None else 0)],
        )


@attrs.define(eq=False)
class AutoSwitchHACollector(_ReplicaCollector):
    """Controller mode's replication (AutoSwitch HA), read when scraped: the master
    epoch the controller last named to this broker, whether it acts as master (elected
    and not fenced), and, on the master, its SyncStateSet (the brokers a send waits for
    with allAckInSyncStateSet) and that set's epoch. raftmq's families: RocketMQ 5
    exports none of these from a broker."""

    role: BrokerRole

    def collect(self):
        own = self.own()
        ha = self.replica.ha
        master = self.role.is_master and ha.fenced is None
        yield _family(
            "rocketmq_ha_master_epoch",
            "The master epoch the controller last named to this broker (0: none yet)",
            BROKER,
            [(own, self.role.term)],
        )
        yield _family(
            "rocketmq_ha_is_master", "1 while this broker acts as master", BROKER,
            [(own, 1 if master else 0)],
        )  # fmt: skip
        if not master:
            return
        yield _family(
            "rocketmq_ha_in_sync_replicas",
            "On a master: members of its SyncStateSet, itself included",
            BROKER,
            [(own, len(ha.sync_state.members))],
        )
        yield _family(
            "rocketmq_ha_sync_state_set_epoch",
            "On a master: the epoch of the SyncStateSet it applies",
            BROKER,
            [(own, ha.sync_state.epoch)],
        )
