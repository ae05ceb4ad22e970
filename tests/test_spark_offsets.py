"""The Spark source's planning without Spark or brokers: offsets per queue as JSON text,
where a query starts, how each micro-batch's end is chosen while routes change,
replicas lag and retention deletes, and how an executor reads one range exactly.
Only the stream reader's own tests import pyspark (no session)."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.consumer import MessageSelector, PullResult, PullStatus
from raftmq.client.errors import MQBrokerError
from raftmq.client.spark import offsets as plan
from raftmq.client.spark.offsets import Bounds, DataLossError, QueueRange
from raftmq.client.spark.options import NO_TAG, SourceOptions
from raftmq.client.spark.reading import FilterRefusedError, StalledError, read_joined
from raftmq.protocol.message import MessageExt, decode_all, encode
from raftmq.remoting import RemotingConnectError, ResponseCode

A0, A1, A2, B0 = "RaftNode00:0", "RaftNode00:1", "RaftNode00:2", "RaftNode01:0"


# ---------------------------------------------------------------- offsets as text


def test_offsets_print_the_same_whatever_order_they_were_built_in():
    one = plan.ordered({"b:10": 1, "a:2": 3, "b:9": 4, "a:10": 5})
    two = plan.ordered({"a:10": 5, "b:9": 4, "a:2": 3, "b:10": 1})
    assert json.dumps(one) == json.dumps(two)
    assert list(one) == ["a:2", "a:10", "b:9", "b:10"]  # queue ids in numeric order


def test_queue_keys_keep_colons_in_broker_names():
    assert plan.split_key("host:port-group:3") == ("host:port-group", 3)
    for bad in ("RaftNode00", ":1", "RaftNode00:x", "RaftNode00:-1"):
        with pytest.raises(ValueError):
            plan.split_key(bad)


# ---------------------------------------------------------------- where a query starts

BOUNDS = {A0: Bounds(0, 10), A1: Bounds(5, 7), B0: Bounds(0, 0)}


def test_earliest_latest_and_explicit_starts():
    assert plan.initial_offsets("earliest", BOUNDS, fail_on_data_loss=True).offsets == {
        A0: 0,
        A1: 5,
        B0: 0,
    }
    assert plan.initial_offsets("latest", BOUNDS, fail_on_data_loss=True).offsets == {
        A0: 10,
        A1: 7,
        B0: 0,
    }
    explicit = plan.initial_offsets({A0: 4, A1: -1}, BOUNDS, fail_on_data_loss=True)
    assert explicit.offsets == {A0: 4, A1: 7, B0: 0}  # B0 not named: earliest


def test_explicit_start_errors_name_the_queue():
    with pytest.raises(ValueError, match="RaftNode09:0"):
        plan.initial_offsets({"RaftNode09:0": 1}, BOUNDS, fail_on_data_loss=True)
    with pytest.raises(ValueError, match="past its end 10"):
        plan.initial_offsets({A0: 11}, BOUNDS, fail_on_data_loss=True)


def test_explicit_start_below_retention_is_data_loss():
    with pytest.raises(DataLossError, match=r"RaftNode00:1: offsets 2\.\.4 were deleted"):
        plan.initial_offsets({A1: 2}, BOUNDS, fail_on_data_loss=True)
    lenient = plan.initial_offsets({A1: 2}, BOUNDS, fail_on_data_loss=False)
    assert lenient.offsets[A1] == 5 and lenient.losses


def test_batch_end_offsets():
    assert plan.ending_offsets("latest", BOUNDS) == {A0: 10, A1: 7, B0: 0}
    assert plan.ending_offsets({A0: 3, A1: -2}, BOUNDS) == {A0: 3, A1: 5, B0: 0}
    with pytest.raises(ValueError, match="past its end"):
        plan.ending_offsets({A0: 30}, BOUNDS)


# ---------------------------------------------------------------- micro-batch ends


def test_next_batch_reads_everything_committed():
    result = plan.next_offsets(
        {A0: 2, A1: 5}, {A0: Bounds(0, 9), A1: Bounds(0, 5)}, fail_on_data_loss=True
    )
    assert result.offsets == {A0: 9, A1: 5}
    assert plan.ranges({A0: 2, A1: 5}, result.offsets) == [QueueRange("RaftNode00", 0, 2, 9)]


def test_new_queues_are_introduced_first_and_read_from_the_next_batch():
    start = {A0: 3}
    grown = {A0: Bounds(0, 3), A1: Bounds(0, 4), B0: Bounds(0, 2)}  # expansion + a new group
    first = plan.next_offsets(start, grown, fail_on_data_loss=True)
    assert first.offsets == {A0: 3, A1: 0, B0: 0}
    assert plan.ranges(start, first.offsets) == []  # introduced, nothing read yet
    assert json.dumps(first.offsets) != json.dumps(start)  # so Spark records the batch
    second = plan.next_offsets(first.offsets, grown, fail_on_data_loss=True)
    assert plan.ranges(first.offsets, second.offsets) == [
        QueueRange("RaftNode00", 1, 0, 4),
        QueueRange("RaftNode01", 0, 0, 2),
    ]


def test_a_new_queue_whose_first_messages_are_gone_is_data_loss():
    with pytest.raises(DataLossError, match=r"new queue RaftNode00:1: offsets 0\.\.5"):
        plan.next_offsets({A0: 0}, {A0: Bounds(0, 0), A1: Bounds(6, 9)}, fail_on_data_loss=True)
    lenient = plan.next_offsets(
        {A0: 0}, {A0: Bounds(0, 0), A1: Bounds(6, 9)}, fail_on_data_loss=False
    )
    assert lenient.offsets == {A0: 0, A1: 6}


def test_a_queue_missing_from_the_answers_keeps_its_offset():
    # its group is unreachable, or the route dropped it for a moment: no progress, no reset
    result = plan.next_offsets({A0: 4, B0: 7}, {A0: Bounds(0, 6)}, fail_on_data_loss=True)
    assert result.offsets == {A0: 6, B0: 7}
    assert any("RaftNode01:0" in note for note in result.notes)
    assert not result.losses


def test_offsets_never_go_backwards():
    start = {A0: 50, A1: 10}
    lagging = {A0: Bounds(0, 45), A1: Bounds(0, 12)}
    assert plan.regressed(start, lagging) == [A0]
    with pytest.raises(DataLossError, match="now ends at 45, below offset 50"):
        plan.next_offsets(start, lagging, fail_on_data_loss=True)
    lenient = plan.next_offsets(start, lagging, fail_on_data_loss=False)
    assert lenient.offsets == {A0: 50, A1: 12}  # kept, never re-read
    assert lenient.losses


def test_retention_past_the_start_is_data_loss_or_skipped():
    start = {A0: 3}
    with pytest.raises(DataLossError, match=r"offsets 3\.\.7 were deleted"):
        plan.next_offsets(start, {A0: Bounds(8, 20)}, fail_on_data_loss=True)
    lenient = plan.next_offsets(start, {A0: Bounds(8, 20)}, fail_on_data_loss=False, max_rows=5)
    assert lenient.offsets == {A0: 13}  # the 5 rows counted from where the store starts
    # with nothing new to read, the query still moves past what was deleted
    assert plan.next_offsets(start, {A0: Bounds(8, 8)}, fail_on_data_loss=False).offsets == {A0: 8}


def test_max_rows_splits_the_budget_by_backlog():
    start = {A0: 0, A1: 0, A2: 0}
    bounds = {A0: Bounds(0, 1000), A1: Bounds(0, 100), A2: Bounds(0, 1)}
    result = plan.next_offsets(start, bounds, fail_on_data_loss=True, max_rows=100)
    assert result.offsets[A2] == 1  # a small queue is not starved
    assert sum(result.offsets.values()) == 100
    assert result.offsets[A0] > 8 * result.offsets[A1]


@given(
    st.dictionaries(st.integers(0, 15).map(lambda q: f"b:{q}"), st.integers(0, 10_000), min_size=1),
    st.integers(1, 5_000),
)
def test_rate_limit_never_exceeds_the_budget_nor_a_backlog(backlog, max_rows):
    taken = plan.rate_limit(backlog, max_rows)
    assert all(0 <= taken[k] <= backlog[k] for k in backlog)
    assert sum(taken.values()) == min(max_rows, sum(backlog.values()))
    waiting = [k for k, n in backlog.items() if n]
    if max_rows >= len(waiting):
        assert all(taken[k] >= 1 for k in waiting)


def test_available_now_stops_at_its_target():
    target = {A0: 10, A1: 4}
    start = {A0: 2, A1: 4}
    bounds = {A0: Bounds(0, 30), A1: Bounds(0, 9), B0: Bounds(0, 5)}  # B0 appeared after
    first = plan.next_offsets(start, bounds, fail_on_data_loss=True, max_rows=5, target=target)
    assert first.offsets == {A0: 7, A1: 4}
    last = plan.next_offsets(first.offsets, bounds, fail_on_data_loss=True, target=target)
    assert last.offsets == {A0: 10, A1: 4}
    done = plan.next_offsets(last.offsets, bounds, fail_on_data_loss=True, target=target)
    assert json.dumps(done.offsets) == json.dumps(last.offsets)  # the query ends here


# ---------------------------------------------------------------- the driver's stream reader


class Answers:
    """The driver's broker session: bounds answered in turn (the last one repeats)."""

    def __init__(self, *answers: dict) -> None:
        self.answers = list(answers)
        self.forgotten = 0

    def bounds(self, topic):
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def forget_route(self, topic):
        self.forgotten += 1


def stream_reader(monkeypatch, session, **options):
    from raftmq.client.spark import source

    monkeypatch.setattr(source, "session_for", lambda *args: session)
    return source.RocketMQStreamReader(SourceOptions.parse({**BASE, **options}, streaming=True))


@pytest.mark.requires("pyspark")
def test_the_driver_asks_again_while_a_lagging_member_answers(monkeypatch):
    from pyspark.sql.streaming import datasource as limits

    lagging, caught_up = (
        {A0: Bounds(0, 40), A1: Bounds(0, 9)},
        {A0: Bounds(0, 90), A1: Bounds(0, 9)},
    )
    session = Answers(lagging, lagging, caught_up)
    reader = stream_reader(monkeypatch, session)
    assert reader.latestOffset({A1: 0, A0: 50}, limits.ReadAllAvailable()) == {A0: 90, A1: 9}
    assert session.forgotten == 2  # each retry with a fresh route
    assert reader.reportLatestOffset() == {A0: 90, A1: 9}

    stuck = stream_reader(monkeypatch, Answers(lagging), **{"fetchOffset.timeoutMs": "1"})
    with pytest.raises(DataLossError, match="below offset 50"):
        stuck.latestOffset({A0: 50, A1: 0}, limits.ReadAllAvailable())


@pytest.mark.requires("pyspark")
def test_the_stream_reader_pickles_and_plans_with_spark_limits(monkeypatch):
    import pickle

    from pyspark.sql.streaming import datasource as limits

    session = Answers(
        {A0: Bounds(0, 10), A1: Bounds(0, 30)}, {A0: Bounds(0, 99), A1: Bounds(0, 99)}
    )
    reader = stream_reader(monkeypatch, session, maxMessagesPerTrigger="8")
    assert reader.getDefaultReadLimit() == limits.ReadMaxRows(8)
    reader.prepareForTriggerAvailableNow()  # snapshot: A0 up to 10, A1 up to 30
    end = reader.latestOffset({A0: 0, A1: 0}, limits.ReadMaxRows(8))
    assert end == {A0: 2, A1: 6}
    [first, second] = reader.partitions({A0: 0, A1: 0}, end)
    assert (first.queue, second.queue) == (
        QueueRange("RaftNode00", 0, 0, 2),
        QueueRange("RaftNode00", 1, 0, 6),
    )
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.target == {A0: 10, A1: 30}
    assert clone.latestOffset({A0: 10, A1: 30}, limits.ReadMaxRows(8)) == {A0: 10, A1: 30}


# ---------------------------------------------------------------- one range, on an executor


RECORD_BYTES = len(encode(MessageExt("T", b"100", queue_offset=100)))  # offsets 100..199


def found(status: PullStatus, offsets, next_begin: int, low: int, high: int) -> PullResult:
    """An answer as a raw pull brings it: the records of `offsets`, undecoded."""
    body = b"".join(encode(MessageExt("T", b"%d" % o, queue_offset=o)) for o in offsets)
    return PullResult(status, [], next_begin, low, high, body)


class Member:
    """A queue as one member holds it: offsets [low, high), answers as the broker does."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def pull(self, offset: int, count: int) -> PullResult:
        if offset < self.low or offset > self.high:
            return PullResult(PullStatus.OFFSET_ILLEGAL, [], self.low, self.low, self.high)
        if offset == self.high:
            return PullResult(PullStatus.NO_NEW_MSG, [], offset, self.low, self.high)
        # a broker may answer more than asked (up to its own cap): the reader must cut
        end = min(offset + count + 3, self.high)
        return found(PullStatus.FOUND, range(offset, end), end, self.low, self.high)


class Cluster:
    """What the session would reach: a script of members (or errors) answering in turn."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.forgotten = 0
        self.pulls: list[int] = []

    async def pull(self, topic, broker_name, queue_id, offset, count, until, selector):
        self.pulls.append(offset)
        answer = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer.pull(offset, count)

    async def forget_route(self, topic):
        self.forgotten += 1


def read(
    cluster,
    queue,
    *,
    fail=True,
    timeout_s=30.0,
    selector=None,
    rows=1,
    max_bytes=1 << 30,
    sizes=None,
):
    """The queue offsets `read_joined` hands out (chunks of at least `rows` or
    `max_bytes`; their sizes in bytes added to `sizes`), on a virtual clock: the
    back-off sleeps take no time."""
    sizes = [] if sizes is None else sizes

    async def offsets():
        got = []
        async for chunk in read_joined(
            cluster, "T", queue, rows, max_bytes,
            fail_on_data_loss=fail, timeout_s=timeout_s, selector=selector,
        ):  # fmt: skip
            records = decode_all(chunk.records)
            assert len(records) == chunk.count and chunk.count > 0
            sizes.append(len(chunk.records))
            got.append([m.queue_offset for m in records])
        for c in got[:-1]:
            assert len(c) >= rows or len(c) * RECORD_BYTES >= max_bytes
        return [offset for c in got for offset in c]

    return trio.run(offsets, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_range_is_read_exactly_even_when_pulls_overshoot():
    queue = QueueRange("RaftNode00", 0, 5, 70)  # the second pull brings 40..72
    assert read(Cluster(Member(0, 200)), queue) == list(range(5, 70))


def test_chunks_are_joined_up_to_a_row_or_byte_bound():
    queue = QueueRange("RaftNode00", 0, 0, 200)
    assert read(Cluster(Member(0, 200)), queue, rows=50) == list(range(200))
    sizes = []
    bound = 40 * RECORD_BYTES
    assert read(Cluster(Member(0, 200)), queue, rows=10**6, max_bytes=bound, sizes=sizes) == (
        list(range(200))
    )
    assert len(sizes) > 1 and max(sizes) < bound + 32 * RECORD_BYTES  # a pull over at most


def test_the_read_resumes_on_the_new_master_after_a_leader_change():
    master, lagging, new_master = Member(0, 100), Member(0, 30), Member(0, 100)
    dead = RemotingConnectError("connection refused")
    cluster = Cluster(master, dead, lagging, lagging, new_master)
    assert read(cluster, QueueRange("RaftNode00", 0, 0, 100)) == list(range(100))
    assert cluster.forgotten == 3  # each failed step asked the name server again
    assert cluster.pulls.count(35) == 4  # where the master died, until a member had it


def test_a_range_that_makes_no_progress_fails_after_the_timeout():
    cluster = Cluster(Member(0, 10))  # planned up to 20: no member ever gets there
    with pytest.raises(StalledError, match=r"offset 10 of the range \[0, 20\) for 5 s"):
        read(cluster, QueueRange("RaftNode00", 0, 0, 20), timeout_s=5)


def test_retention_inside_a_range_is_data_loss_or_skipped():
    trimmed = Member(30, 100)
    queue = QueueRange("RaftNode00", 0, 10, 50)
    with pytest.raises(DataLossError, match=r"offsets 10\.\.29"):
        read(Cluster(trimmed), queue)
    assert read(Cluster(trimmed), queue, fail=False) == list(range(30, 50))
    assert read(Cluster(Member(60, 100)), queue, fail=False) == []


def test_a_gap_between_pulled_messages_is_data_loss():
    class Gappy(Member):
        def pull(self, offset, count):
            kept = [o for o in range(offset, offset + 4) if o != 12]
            return found(PullStatus.FOUND, kept, offset + 4, 0, 100)

    with pytest.raises(DataLossError, match=r"offsets 12\.\.12"):
        read(Cluster(Gappy(0, 100)), QueueRange("RaftNode00", 0, 10, 20))
    assert 12 not in read(Cluster(Gappy(0, 100)), QueueRange("RaftNode00", 0, 10, 20), fail=False)


class Tagged(Member):
    """A member answering a TAG filter as a broker does: up to `count` matching messages
    (tag "A" at offsets divisible by `every`) from a scan of at most `scan` entries,
    nextBeginOffset past what it scanned, PULL_RETRY_IMMEDIATELY when none matched."""

    def __init__(self, low: int, high: int, every: int, scan: int = 50) -> None:
        super().__init__(low, high)
        self.every, self.scan = every, scan

    def pull(self, offset, count):
        if offset < self.low or offset >= self.high:
            return super().pull(offset, count)
        matched, scanned = [], offset
        while scanned < min(offset + self.scan, self.high) and len(matched) < count:
            if scanned % self.every == 0:
                matched.append(scanned)
            scanned += 1
        status = PullStatus.FOUND if matched else PullStatus.NO_MATCHED_MSG
        return found(status, matched, scanned, self.low, self.high)


def test_a_filtered_range_skips_what_the_broker_did_not_select_and_loses_nothing():
    """Offsets between two selected messages are not data loss, and a pull that matched
    nothing moves the read on by nextBeginOffset; without the selector the same answers
    are data loss."""
    queue = QueueRange("RaftNode00", 0, 5, 290)
    only_a = MessageSelector.by_tag("A")
    assert read(Cluster(Tagged(0, 300, every=100)), queue, selector=only_a) == [100, 200]
    assert read(Cluster(Tagged(0, 300, every=7)), queue, selector=only_a) == list(range(7, 290, 7))
    with pytest.raises(DataLossError):
        read(Cluster(Tagged(0, 300, every=7)), queue)


def test_a_filtered_read_retries_a_replica_that_has_not_the_offset_yet():
    """PULL_RETRY_IMMEDIATELY with the offset unchanged is a lagging slave (it holds the
    pull, then answers so), not an empty stretch: the read asks again, fresh route."""

    class Lagging(Member):
        def pull(self, offset, count):
            return PullResult(PullStatus.NO_MATCHED_MSG, [], offset, 0, 10)

    cluster = Cluster(Tagged(0, 300, every=10), Lagging(0, 10), Tagged(0, 300, every=10))
    got = read(cluster, QueueRange("RaftNode00", 0, 0, 100), selector=MessageSelector.by_tag("A"))
    assert got == list(range(0, 100, 10)) and cluster.forgotten == 1


def test_a_selector_the_broker_refuses_fails_the_read_at_once():
    refused = MQBrokerError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "invalid SQL92", "b:1")
    with pytest.raises(FilterRefusedError, match="invalid SQL92"):
        read(Cluster(refused), QueueRange("RaftNode00", 0, 0, 10), selector=SQL)
    disabled = MQBrokerError(ResponseCode.SYSTEM_ERROR, "enablePropertyFilter=false", "b:1")
    with pytest.raises(FilterRefusedError, match="enablePropertyFilter"):
        read(Cluster(disabled), QueueRange("RaftNode00", 0, 0, 10), selector=SQL)


def test_filters_on_the_tags_column_are_pushed_as_a_tag_expression_and_others_are_not():
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNotNull

    from raftmq.client.spark.source import RocketMQFilteringBatchReader

    def push(filters, **given):
        options = SourceOptions.parse({**BASE, "pushFilters": "true", **given}, streaming=False)
        reader = RocketMQFilteringBatchReader(options)
        return reader.pushFilters(filters), reader.options.selector

    other = GreaterThan(("queueOffset",), 3)
    not_null = IsNotNull(("tags",))
    pushed = [EqualTo(("tags",), "A"), In(("tags",), ("A", "B")), not_null, other]
    assert push(pushed) == ([other], MessageSelector.by_tag("A"))
    assert push([In(("tags",), ("A", "B"))], subExpression="B || C")[1] == (
        MessageSelector.by_tag("B")
    )
    for unsaid in ("A || B", " A", "", 7):  # not a tag a TAG expression can name
        assert push([EqualTo(("tags",), unsaid), not_null]) == (
            [EqualTo(("tags",), unsaid), not_null],
            MessageSelector.by_tag("*"),
        )
    assert push([EqualTo(("keys",), "A")])[1] == MessageSelector.by_tag("*")
    sql = {"subExpressionType": "SQL92", "subExpression": "a > 1"}
    assert push([EqualTo(("tags",), "A")], **sql) == ([EqualTo(("tags",), "A")], SQL)


# ---------------------------------------------------------------- options


def test_sub_expression_selects_by_tag_or_sql92_and_filtered_says_whether_pulls_skip():
    def options(**given):
        return SourceOptions.parse({"nameSrvAddr": "h:1", "topic": "T", **given}, streaming=True)

    assert not options().filtered and not options(subExpression=" * ").filtered
    tagged = options(subExpression="A || B")
    assert tagged.filtered and tagged.selector == MessageSelector.by_tag("A || B")
    sql = options(subexpressiontype="sql92", subExpression="a > 1")
    assert sql.filtered and sql.selector == SQL
    assert tagged.with_tags(frozenset({"B", "C"})).selector == MessageSelector.by_tag("B")
    assert options().with_tags(frozenset({"C", "B"})).selector == MessageSelector.by_tag("B || C")
    assert tagged.with_tags(frozenset({"C"})).selector == MessageSelector.by_tag(NO_TAG)


def test_options_defaults_and_names_in_any_case():
    stream = SourceOptions.parse({"namesrvaddr": "h:1", "TOPIC": "T"}, streaming=True)
    assert (stream.starting, stream.fail_on_data_loss, stream.max_messages_per_trigger) == (
        "latest",
        True,
        None,
    )
    batch = SourceOptions.parse(
        {
            "nameSrvAddr": "h:1",
            "topic": "T",
            "endingOffsets": '{"RaftNode00:0": 3}',
            "maxMessagesPerTrigger": "100",
            "failOnDataLoss": "False",
        },
        streaming=False,
    )
    assert batch.starting == "earliest" and batch.ending == {A0: 3}
    assert (batch.max_messages_per_trigger, batch.fail_on_data_loss) == (100, False)


BASE = {"nameSrvAddr": "h:1", "topic": "T"}
SQL = MessageSelector.by_sql("a > 1")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"topic": "T"}, "nameSrvAddr is required"),
        ({"nameSrvAddr": "h:1"}, "topic is required"),
        ({**BASE, "startingOffsets": "{nope"}, "startingOffsets"),
        ({**BASE, "startingOffsets": '{"RaftNode00": 1}'}, "not a queue key"),
        ({**BASE, "startingOffsets": '{"RaftNode00:0": -3}'}, ">= -2"),
        ({**BASE, "startingOffsets": "timestamp"}, "startingTimestamp"),
        ({**BASE, "maxMessagesPerTrigger": "0"}, "must be positive"),
        ({**BASE, "failOnDataLoss": "yes"}, "failOnDataLoss"),
        ({**BASE, "endingOffsets": "latest"}, "batch reads"),
        ({**BASE, "subExpressionType": "SQL"}, "TAG or SQL92"),
        ({**BASE, "subExpressionType": "SQL92"}, "an SQL92 expression is required"),
    ],
)
def test_bad_options_fail_with_the_option_named(options, match):
    with pytest.raises(ValueError, match=match):
        SourceOptions.parse(options, streaming=True)
