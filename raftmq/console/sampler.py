"""Where the charts' numbers come from: the cluster itself, sampled into a `History`, or
a Prometheus server that scrapes it (`mqconsole --prometheus URL`).

`Sampler` reads the same documents the pages show (`views.cluster_view`, `topics_view`,
`groups_view`) every `interval_s` and keeps, per chart:

    brokerPutTps, brokerGetTps   each member's msgPutTotalTodayNow / msgGetTotalTodayNow, as rates
    topicPutTps                  each topic's stored messages (its queues' max offsets), as a rate
    topicGetTps                  each topic's committed consumer offsets, all groups, as a rate
    groupLag                     each consumer group's lag (consumerProgress's diff total)
    commitLag                    each DLedger member's ledger end minus its committed index

and a mark whenever a group's term rises (a classic group under a controller: its
master epoch). A sample the cluster cannot answer is skipped; the next one is tried.

`PrometheusSeries` answers the same document from query_range, with expressions over
the families the Grafana dashboard (docs/grafana/raftmq.json) reads.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request

import trio

from raftmq.client.admin import Admin
from raftmq.client.errors import MQClientError
from raftmq.console import views
from raftmq.console.history import History
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError

DEFAULT_INTERVAL_S = 5.0
_NO_ANSWER = (MQClientError, RemotingConnectError, RemotingTimeoutError)


class Sampler:
    """The cluster's numbers every `interval_s` into `history` (module doc)."""

    source = "memory"

    def __init__(self, admin: Admin, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        assert interval_s > 0, interval_s
        self.admin = admin
        self.interval_s = interval_s
        self.history = History()
        self.failed_samples = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            started = trio.current_time()
            try:
                await self.sample_once()
            except _NO_ANSWER:
                self.failed_samples += 1  # the page's banner says why; try again later
            except BaseExceptionGroup as group:
                if group.split(_NO_ANSWER)[1] is not None:
                    raise
                self.failed_samples += 1
            await trio.sleep_until(started + self.interval_s)

    async def sample_once(self) -> None:
        cluster = await views.cluster_view(self.admin)
        topics = await views.topics_view(self.admin)
        groups = await views.groups_view(self.admin)
        now_s = time.time()
        record_cluster(self.history, now_s, cluster)
        record_topics(self.history, now_s, topics)
        record_groups(self.history, now_s, groups)
        self.history.forget_stale(now_s)

    async def series(self, window_s: float) -> dict:
        document = self.history.document(time.time(), window_s)
        return {**document, "source": self.source, "stepS": self.interval_s}


def record_cluster(history: History, now_s: float, cluster: dict) -> None:
    """Members' put and get totals, DLedger commit lag, terms (`views.cluster_view`)."""
    for group in cluster["groups"]:
        broker_name = group["brokerName"]
        for member in group["members"]:
            name = f"{broker_name} {member['addr']}"
            for chart, field in (("brokerPutTps", "inTotal"), ("brokerGetTps", "outTotal")):
                if member["addr"] is not None and member.get(field) is not None:
                    history.counter(chart, name, now_s, int(member[field]))
            end, committed = member.get("ledgerEndIndex"), member.get("committedIndex")
            if end is not None and committed is not None:
                name = f"{broker_name} {member['selfId']}"
                history.gauge("commitLag", name, now_s, end - committed)
        if group["replication"] == "dledger":
            terms = [m["term"] for m in group["members"] if m["term"] is not None]
            leader = group["leader"]
        else:
            terms = [m["masterEpoch"] for m in group["members"] if m["masterEpoch"] is not None]
            leader = group["master"]["addr"] if group["master"] else None
        if terms:
            history.term(broker_name, now_s, max(terms), leader)


def record_topics(history: History, now_s: float, topics: dict) -> None:
    """Each topic's stored messages (`views.topics_view`), as a rate."""
    for topic in topics["topics"]:
        if "error" not in topic:
            stored = sum(q["maxOffset"] for q in topic["queues"])
            history.counter("topicPutTps", topic["topic"], now_s, stored)


def record_groups(history: History, now_s: float, groups: dict) -> None:
    """Each group's lag, and each topic's committed offsets over all groups
    (`views.groups_view`), as a rate."""
    consumed: dict[str, int] = {}
    for group in groups["groups"]:
        if "error" in group:
            continue
        history.gauge("groupLag", group["group"], now_s, group["diffTotal"])
        for queue in group["queues"]:
            consumed[queue["topic"]] = consumed.get(queue["topic"], 0) + queue["consumerOffset"]
    for topic, offsets in consumed.items():
        history.counter("topicGetTps", topic, now_s, offsets)


# ---------------------------------------------------------------------- Prometheus

# chart: (PromQL, the labels naming a series); the families are the dashboard's
PROMETHEUS_CHARTS = {
    "brokerPutTps": ("rocketmq_brokeruntime_put_tps60", ("broker", "brokerIP")),
    "brokerGetTps": ("rocketmq_brokeruntime_gettransfered_tps60", ("broker", "brokerIP")),
    "topicPutTps": ("sum by (topic) (rocketmq_producer_tps)", ("topic",)),
    "topicGetTps": ("sum by (topic) (rocketmq_consumer_tps)", ("topic",)),
    "groupLag": ("sum by (group) (rocketmq_group_diff)", ("group",)),
    "commitLag": (
        "dledger_ledger_end_index - dledger_committed_index",
        ("dledger_group", "self_id"),
    ),
}
PROMETHEUS_TERMS = ("max by (dledger_group) (dledger_term)", "dledger_group")
POINTS_PER_CHART = 240  # query_range's step is the window over this, 5 s at least
MIN_STEP_S = 5.0


class PrometheusError(Exception):
    """The Prometheus server did not answer a query, or answered with an error."""


class PrometheusSeries:
    """The charts from a Prometheus server's query_range (module doc)."""

    source = "prometheus"

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    async def series(self, window_s: float) -> dict:
        end_s = time.time()
        step_s = max(MIN_STEP_S, window_s / POINTS_PER_CHART)
        answers: dict[str, list] = {}

        async def one(chart: str, expr: str) -> None:
            answers[chart] = await trio.to_thread.run_sync(
                self._query_range, expr, end_s - window_s, end_s, step_s
            )

        async with trio.open_nursery() as nursery:
            for chart, (expr, _) in PROMETHEUS_CHARTS.items():
                nursery.start_soon(one, chart, expr)
            nursery.start_soon(one, "terms", PROMETHEUS_TERMS[0])
        return {**prometheus_document(answers), "source": self.source, "stepS": step_s}

    def _query_range(self, expr: str, start_s: float, end_s: float, step_s: float) -> list:
        fields = {"query": expr, "start": start_s, "end": end_s, "step": step_s}
        query = urllib.parse.urlencode(fields)
        url = f"{self.url}/api/v1/query_range?{query}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:  # Prometheus says why in its JSON body
            try:
                answer = json.load(exc)
            except ValueError:
                raise PrometheusError(f"{self.url}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"{self.url}: {exc}") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"{self.url}: {answer.get('error', answer)} in {expr}")
        return answer["data"]["result"]


def prometheus_document(answers: dict[str, list]) -> dict:
    """query_range's matrices (`answers[chart]`, and `answers["terms"]`) as the charts'
    document: a series per result, named by the chart's labels, without the NaN and
    infinite values PromQL can give (a division by zero); an election mark at each
    point where a group's term is higher than at the one before."""
    charts = {}
    for chart, (_, labels) in PROMETHEUS_CHARTS.items():
        charts[chart] = sorted(
            (
                {
                    "name": " ".join(str(result["metric"].get(label, "")) for label in labels),
                    "points": [
                        [round(t * 1000), round(float(v), 3)]
                        for t, v in result["values"]
                        if math.isfinite(float(v))  # NaN, +Inf: not JSON, not drawn
                    ],
                }
                for result in answers[chart]
            ),
            key=lambda series: series["name"],
        )
    elections = []
    for result in answers["terms"]:
        group = result["metric"].get(PROMETHEUS_TERMS[1], "")
        values = [(t, int(float(v))) for t, v in result["values"] if math.isfinite(float(v))]
        for (_, before), (t, term) in itertools.pairwise(values):
            if term > before:
                elections.append(
                    {"timeMs": round(t * 1000), "brokerName": group, "term": term, "leader": None}
                )
    return {"charts": charts, "elections": sorted(elections, key=lambda e: e["timeMs"])}
