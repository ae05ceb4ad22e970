"""The console's chart history (raftmq.console.history) and its Prometheus source's
conversion (raftmq.console.sampler), in process: rates from counters, counters that
restart, the rings' resolutions, the memory bound, election marks."""

from __future__ import annotations

from raftmq.console.history import LONGEST_S, MAX_ELECTIONS, POINTS_PER_SERIES, History
from raftmq.console.sampler import PROMETHEUS_CHARTS, PROMETHEUS_TERMS, prometheus_document
from tests.helpers import DLEDGER_GROUP_FAMILIES, dashboard_metrics, metric_names

START_S = 1_800_000_000.0  # a wall-clock time on a 1-minute boundary


def points(history: History, chart: str, name: str, now_s: float, window_s: float) -> list:
    [series] = [s for s in history.document(now_s, window_s)["charts"][chart] if s["name"] == name]
    return series["points"]


def test_a_counter_is_charted_as_its_rate_from_its_second_sample():
    history = History()
    history.counter("brokerPutTps", "b", START_S, 1_000)
    assert history.document(START_S, 60)["charts"] == {}  # one sample: no rate yet
    history.counter("brokerPutTps", "b", START_S + 10, 1_500)
    history.counter("brokerPutTps", "b", START_S + 20, 1_500)
    [first, second] = points(history, "brokerPutTps", "b", START_S + 20, 60)
    assert first == [round((START_S + 10.5) * 1000), 50.0]  # 500 in 10 s, in the 10-11 s bucket
    assert second[1] == 0.0


def test_a_counter_that_went_down_restarted_from_zero():
    """A broker restarted between two samples: its msgPutTotalTodayNow starts again from
    0, so the increase is the new value (Prometheus's rule), never a negative rate."""
    history = History()
    for offset_s, total in ((0, 9_000), (10, 9_500), (20, 300), (30, 400)):
        history.counter("brokerPutTps", "b", START_S + offset_s, total)
    rates = [v for _, v in points(history, "brokerPutTps", "b", START_S + 30, 60)]
    assert rates == [50.0, 30.0, 10.0]


def test_a_short_window_has_fine_buckets_a_long_one_coarse_means():
    history = History()
    for second in range(2 * 3600 + 1):  # a sample a second for two hours; the value its age
        history.gauge("groupLag", "g", START_S + second, second)
    now_s = START_S + 2 * 3600
    assert len(points(history, "groupLag", "g", now_s, 300)) == 300  # 1-second buckets
    recent = points(history, "groupLag", "g", now_s, 900)
    assert 180 <= len(recent) <= 181  # 5-second buckets
    assert recent[-2][1] == 7197.0  # the mean of 7195..7199
    hour = points(history, "groupLag", "g", now_s, 3600)
    assert 60 <= len(hour) <= 61  # 1-minute buckets: the 5-second ring spans 20 minutes
    assert hour[-2][1] == 7169.5  # the mean of 7140..7199
    assert hour[0][0] <= (now_s - 3600 + 60) * 1000  # an hour back, to the bucket


def test_memory_is_bounded_per_series_and_in_series_count():
    history = History(max_series=3)
    for second in range(0, 8 * 3600, 5):  # longer than the longest ring
        history.gauge("groupLag", "g", START_S + second, 1)
    [series] = history.charts["groupLag"].values()
    assert sum(len(ring) for ring in series.rings) == POINTS_PER_SERIES
    now_s = START_S + 8 * 3600
    assert len(points(history, "groupLag", "g", now_s, LONGEST_S)) <= 361
    for name in ("h", "i", "j"):
        history.gauge("groupLag", name, now_s, 1)
    assert history.series_count() == 3 and history.dropped_series == 1
    history.forget_stale(now_s + LONGEST_S)  # "g" stopped at now_s - 5; the others at now_s
    assert set(history.charts["groupLag"]) == {"h", "i"}
    history.gauge("groupLag", "k", now_s + LONGEST_S, 1)  # room again
    assert "k" in history.charts["groupLag"]


def test_a_rising_term_is_an_election_mark():
    history = History()
    history.term("broker-a", START_S, 3, "n0")  # first seen: no mark
    history.term("broker-a", START_S + 1, 3, "n0")
    history.term("broker-a", START_S + 2, 5, None)  # a candidate's term, no leader yet
    history.term("broker-a", START_S + 3, 4, "n1")  # a stale member's answer: not a mark
    history.term("broker-a", START_S + 4, 5, "n2")  # the leader elected in that term
    assert history.document(START_S + 4, 60)["elections"] == [
        {"timeMs": round((START_S + 2) * 1000), "brokerName": "broker-a", "term": 5, "leader": "n2"}
    ]
    assert history.document(START_S + 600, 60)["elections"] == []  # outside the window
    for term in range(6, 6 + 2 * MAX_ELECTIONS):
        history.term("broker-a", START_S + term, term, None)
    assert len(history.elections) == MAX_ELECTIONS


def test_the_prometheus_charts_read_the_dashboard_s_families():
    """The console's PromQL over Prometheus reads only families the Grafana dashboard
    reads, which tests/test_metrics.py checks the processes export."""
    exprs = [expr for expr, _ in PROMETHEUS_CHARTS.values()] + [PROMETHEUS_TERMS[0]]
    read = set().union(*(metric_names(expr, *DLEDGER_GROUP_FAMILIES) for expr in exprs))
    assert len(read) == 8
    assert read <= dashboard_metrics(*DLEDGER_GROUP_FAMILIES)


def test_prometheus_matrices_become_the_charts_and_term_rises_marks():
    """query_range's answer, as Prometheus's HTTP API documents it (values as strings,
    times in seconds), becomes the document /api/series answers from memory."""
    answers = {chart: [] for chart in PROMETHEUS_CHARTS}
    answers["topicPutTps"] = [
        {
            "metric": {"topic": "Orders"},
            "values": [[START_S, "12.5"], [START_S + 5, "13"], [START_S + 10, "NaN"]],
        }
    ]
    answers["terms"] = [
        {
            "metric": {"dledger_group": "broker-a"},
            "values": [[START_S, "2"], [START_S + 5, "3"], [START_S + 10, "3"]],
        }
    ]
    document = prometheus_document(answers)
    assert document["charts"]["topicPutTps"] == [
        {"name": "Orders", "points": [[START_S * 1000, 12.5], [(START_S + 5) * 1000, 13.0]]}
    ]
    assert document["charts"]["groupLag"] == []
    assert document["elections"] == [
        {"timeMs": (START_S + 5) * 1000, "brokerName": "broker-a", "term": 3, "leader": None}
    ]
