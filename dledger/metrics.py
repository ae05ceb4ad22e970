"""DLedger's own metrics, `dledger_*`, read from the replica when scraped.

Every sample carries `dledger_group` and `self_id`, so one dashboard shows all the
members of a group side by side. Only the fsync latency is recorded as it happens
(one observation per group-commit fsync, not per entry); everything else is read
from the replica's state and counters at scrape time, so replication pays nothing
for being watched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from prometheus_client import Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from raftmq.dledger.codes import Role

if TYPE_CHECKING:
    from raftmq.dledger.config import DLedgerConfig
    from raftmq.dledger.core.replica import Replica
    from raftmq.dledger.store.base import LogStore

__all__ = ["DLedgerCollector", "fsync_histogram"]

MEMBER_LABELS = ("dledger_group", "self_id")
# From a fast NVMe flush to a disk in trouble; the group commit acks after it.
FSYNC_BUCKETS_S = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip


def fsync_histogram(config: DLedgerConfig):
    """The member's fsync latency histogram (seconds from handing a sync plan to its
    thread until every fsync in it returned), to `observe` once per plan."""
    histogram = Histogram(
        "dledger_fsync_seconds",
        "Seconds one group-commit fsync of the log took (data, index and directories)",
        MEMBER_LABELS,
        buckets=FSYNC_BUCKETS_S,
        registry=None,
    )
    return histogram, histogram.labels(config.group, config.self_id)


class Member(Protocol):
    """What the collector reads of a member (a `DLedgerServer`, which creates its fsync
    histogram here and so sits above this module), at each scrape."""

    config: DLedgerConfig
    replica: Replica
    store: LogStore
    fsync_seconds_family: Histogram


class DLedgerCollector(Collector):
    """The state of one member's replica, as Prometheus samples."""

    def __init__(self, server: Member) -> None:
        self.server = server

    def collect(self):
        server = self.server
        replica, store = server.replica, server.store
        member = [server.config.group, server.config.self_id]

        def gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, text, labels=MEMBER_LABELS)
            family.add_metric(member, value)
            return family

        def counter(name: str, text: str, value: int) -> CounterMetricFamily:
            family = CounterMetricFamily(name, text, labels=MEMBER_LABELS)
            family.add_metric(member, value)
            return family

        role = GaugeMetricFamily(
            "dledger_role",
            "1 for the role this member has now (LEADER, FOLLOWER or CANDIDATE), 0 for the others",
            labels=(*MEMBER_LABELS, "role"),
        )
        for each in (Role.LEADER, Role.FOLLOWER, Role.CANDIDATE):
            role.add_metric([*member, each.name], 1.0 if replica.role is each else 0.0)
        yield role
        yield gauge("dledger_term", "The member's current term", replica.term)
        yield gauge(
            "dledger_ledger_begin_index", "Index of the first entry held", store.begin_index
        )
        yield gauge("dledger_ledger_end_index", "Index of the last entry held", store.end_index)
        yield gauge(
            "dledger_committed_index",
            "Index of the last entry known committed",
            replica.committed_index,
        )
        yield gauge(
            "dledger_persisted_index",
            "Index of the last entry fsynced on this member",
            replica.persisted_index,
        )
        match = GaugeMetricFamily(
            "dledger_follower_match_index",
            "On the leader: the last index each follower holds durably, agreeing with the leader",
            labels=(*MEMBER_LABELS, "peer"),
        )
        lag = GaugeMetricFamily(
            "dledger_follower_lag_entries",
            "On the leader: entries of the leader's log each follower does not hold yet",
            labels=(*MEMBER_LABELS, "peer"),
        )
        stalled = GaugeMetricFamily(
            "dledger_follower_stalled",
            "On the leader: 1 for a follower that stored nothing it lacks for "
            "followerStallTimeoutMs and no longer holds back retention",
            labels=(*MEMBER_LABELS, "peer"),
        )
        if replica.role is Role.LEADER:
            for peer, progress in sorted(replica.replication.progress.items()):
                match.add_metric([*member, peer], progress.match_index)
                lag.add_metric([*member, peer], store.end_index - progress.match_index)
                stalled.add_metric([*member, peer], int(peer in replica.stalled_followers))
        yield match
        yield lag
        yield stalled
        yield counter(
            "dledger_elections_started",
            "Vote rounds this member started as a candidate (DLedger may re-vote in a term)",
            replica.election.vote_rounds_started,
        )
        yield counter(
            "dledger_elections_won",
            "Elections this member won (it became leader)",
            replica.elections_won,
        )
        yield counter(
            "dledger_leader_changes",
            "Leaders this member recognised, itself included (at most one per term)",
            replica.leaders_seen,
        )
        yield from server.fsync_seconds_family.collect()
