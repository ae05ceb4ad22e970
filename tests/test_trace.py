"""Message traces: the record text against RocketMQ's `TraceDataEncoder` format, the
dispatcher's bound, and our producer and push consumer tracing into an in-process
broker whose key index finds the records (`query_traces`, `mqadmin queryMsgTraceById`)."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.admin import Admin
from raftmq.client.errors import MQBrokerError
from raftmq.client.message_query import query_traces
from raftmq.client.mqadmin.queries import PUB_HEADER, SUB_HEADER, trace_table
from raftmq.client.producer import Producer
from raftmq.client.trace import (
    MessageType,
    TraceDispatcher,
    TraceRecord,
    TraceType,
    decode,
    encode,
    records_of,
    trace_keys,
)
from raftmq.protocol.message import MessageExt
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import (
    create_topic,
    group,
    mqadmin,
    traced_send_and_consumption,
    traces_of,
    wait_for,
    wait_for_route,
)

pytestmark = pytest.mark.untimed

S, F = "\u0001", "\u0002"  # TraceConstants.CONTENT_SPLITOR, FIELD_SPLITOR

# What a 4.9 Java client writes (TraceDataEncoder.encoderFromContextBean), field by field.
JAVA_PUB = S.join(
    [
        "Pub", "1764300000123", "DefaultRegion", "pg", "Orders", "7F000001000A18B4AAC2",
        "TagA", "order-1 vip", "127.0.0.1:10911", "42", "3", "0",
        "7F00000100002A9F0000000000000C5E", "true",
    ]
) + F  # fmt: skip
JAVA_SUB_BEFORE = S.join(
    [
        "SubBefore", "1764300000200", "DefaultRegion", "cg", "7F000001000B18B4AAC2",
        "7F000001000A18B4AAC2", "2", "order-1 vip",
    ]
) + F  # fmt: skip
JAVA_SUB_AFTER = S.join(
    [
        "SubAfter", "7F000001000B18B4AAC2", "7F000001000A18B4AAC2", "15", "false",
        "order-1 vip", "4", "1764300000215", "cg",
    ]
) + F  # fmt: skip


def test_java_records_decode_field_by_field_and_encode_back_to_the_same_text():
    pub, before, after = decode(JAVA_PUB + JAVA_SUB_BEFORE + JAVA_SUB_AFTER)
    assert pub == TraceRecord(
        TraceType.Pub,
        "7F000001000A18B4AAC2",
        timestamp_ms=1764300000123,
        group="pg",
        topic="Orders",
        tags="TagA",
        keys="order-1 vip",
        store_host="127.0.0.1:10911",
        body_length=42,
        cost_ms=3,
        offset_msg_id="7F00000100002A9F0000000000000C5E",
    )
    assert (before.type, before.group, before.request_id, before.retry_times) == (
        TraceType.SubBefore,
        "cg",
        "7F000001000B18B4AAC2",
        2,
    )
    assert (after.cost_ms, after.success, after.context_code, after.timestamp_ms) == (
        15,
        False,
        4,
        1764300000215,
    )
    assert after.request_id == before.request_id and after.msg_id == pub.msg_id
    texts = (JAVA_PUB, JAVA_SUB_BEFORE, JAVA_SUB_AFTER)
    for text, record in zip(texts, (pub, before, after), strict=True):
        assert encode(record) == text
    assert trace_keys(pub) == ["7F000001000A18B4AAC2", "order-1", "vip"]


def test_older_and_newer_clients_records_decode():
    """A Pub without offsetMsgId (13 fields) and RocketMQ 5's with clientHost (15); a
    SubAfter before 4.9 (7 fields: no timestamp or group); a record type 4.9 lacks
    (Recall) is skipped; a null key is written "null", as Java writes it."""
    fields = JAVA_PUB[:-1].split(S)
    (old,) = decode(S.join([*fields[:12], "true"]) + F)
    assert (old.offset_msg_id, old.success) == ("", True)
    (new,) = decode(S.join([*fields, "10.0.0.7"]) + F)
    assert new.client_host == "10.0.0.7" and new.offset_msg_id == fields[12]
    (after,) = decode(S.join(JAVA_SUB_AFTER[:-1].split(S)[:7]) + F)
    assert (after.timestamp_ms, after.group, after.context_code) == (0, "", 4)
    assert decode(S.join(["Recall", "1", "r", "g", "T", "ID", "true"]) + F) == []
    assert encode(TraceRecord(TraceType.SubBefore, "ID")).split(S)[-1] == "null" + F


def test_text_that_is_no_trace_record_is_refused_and_skipped_in_a_query():
    bad = JAVA_PUB.replace("42", "forty-two")
    with pytest.raises(ValueError, match="not a trace record"):
        decode(bad)
    with pytest.raises(ValueError, match="not a trace record"):
        decode("SubAfter" + S + "only-two" + F)
    message = MessageExt("RMQ_SYS_TRACE_TOPIC", bad.encode(), born_host=("10.0.0.9", 1))
    assert records_of("7F000001000A18B4AAC2", message) == []
    message.body = JAVA_PUB.encode()
    (record,) = records_of("7F000001000A18B4AAC2", message)
    assert record.client_host == "10.0.0.9"  # 4.9's Pub has none: the trace message's IP


_text = st.text(st.characters(blacklist_characters=S + F, blacklist_categories=("Cs",)))
_ms = st.integers(0, 2**63 - 1)
_int = st.integers(0, 2**31 - 1)
_head = {"timestamp_ms": _ms, "region_id": _text, "group": _text}
# The fields each type writes (TraceDataEncoder), and so reads back.
_FIELDS = {
    TraceType.Pub: _head
    | dict.fromkeys(("topic", "tags", "keys", "store_host", "offset_msg_id"), _text)
    | {"body_length": _int, "cost_ms": _int, "msg_type": st.sampled_from(MessageType)}
    | {"success": st.booleans()},
    TraceType.SubBefore: _head | {"request_id": _text, "retry_times": _int, "keys": _text},
    TraceType.SubAfter: dict.fromkeys(("request_id", "keys", "group"), _text)
    | {"cost_ms": _int, "success": st.booleans(), "context_code": st.integers(0, 4)}
    | {"timestamp_ms": _ms},
}
_records = st.one_of(
    *(st.builds(TraceRecord, st.just(t), _text, **fields) for t, fields in _FIELDS.items())
)


@given(st.lists(_records, max_size=5))
def test_records_round_trip_through_the_text(records):
    assert decode("".join(map(encode, records))) == records


def test_a_full_queue_drops_records_and_counts_them():
    """`submit` never waits: past the bound a record is dropped (the dispatcher is not
    even started here, so nothing leaves the queue)."""
    dispatcher = TraceDispatcher(Producer("127.0.0.1:1"), queue_records=2)
    dispatcher.submit([TraceRecord(TraceType.Pub, str(n)) for n in range(5)])
    assert dispatcher.dropped == 3


@pytest.mark.slow
async def test_a_traced_send_and_consumption_are_found_by_msg_id(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1, traceTopicEnable="true")
    await create_topic(g, "Orders", 1)
    with trio.fail_after(10):
        result, dropped = await traced_send_and_consumption(
            g.namesrv_addr, "Orders", b"x" * 42, tags="TagA", keys=["order-1", "vip"]
        )
        assert dropped == 0
        async with Admin(g.namesrv_addr) as admin:
            await wait_for_route(admin, "RMQ_SYS_TRACE_TOPIC")
            records = await traces_of(admin, result.msg_id)
            assert len(records) == 3
            by_type = {r.type: r for r in records}
            pub = by_type[TraceType.Pub]
            assert (pub.group, pub.topic, pub.tags, pub.keys, pub.body_length) == (
                "pg",
                "Orders",
                "TagA",
                "order-1 vip",
                42,
            )
            assert pub.offset_msg_id == result.offset_msg_id and pub.success
            after = by_type[TraceType.SubAfter]
            assert after.group == "cg" and after.success and after.context_code == 0
            assert after.request_id == by_type[TraceType.SubBefore].request_id
            lines = trace_table(records)
            assert lines[0].split() == list(PUB_HEADER)
            assert lines[1].startswith("Pub        pg                   ")
            assert lines[3].split() == list(SUB_HEADER)
            assert lines[4].startswith("Sub        cg ") and lines[4].endswith("success   ")
            # by one of the message's keys, the trace messages are found too
            assert await query_traces(admin, "order-1") == []
            with pytest.raises(MQBrokerError):
                await query_traces(admin, "no-such-id")


@pytest.mark.slow
async def test_tracing_to_a_missing_topic_neither_fails_nor_slows_the_send(nursery, tmp_path):
    """No trace topic on the broker (traceTopicEnable off, no automatic creation): the
    traced send succeeds as fast as an untraced one; the records are counted dropped."""
    g = await group(nursery, tmp_path, nodes=1, autoCreateTopicEnable="false")
    await create_topic(g, "Orders", 1)
    async with Producer(g.namesrv_addr, "pg", enable_trace=True) as producer:
        with trio.fail_after(1):  # the trace's send tries for its 3 s send timeout
            await producer.send("Orders", b"x")
        await wait_for(lambda: producer.trace.dropped == 1, timeout_s=10)
    assert producer.trace.sent_records == 0


@pytest.mark.processes
async def test_mqadmin_shows_a_traced_message_s_path(tmp_path):
    """A broker process with traceTopicEnable; our producer and push consumer tracing;
    `mqadmin queryMsgTraceById` prints the send and the consumption (SubAfter, as "Sub"),
    whose SubBefore the query also finds."""
    async with LocalCluster(tmp_path, nodes=1, extra_conf={"traceTopicEnable": "true"}) as c:
        await c.wait_master()
        await c.create_topic("Orders", 1)
        with trio.fail_after(10):
            result, _dropped = await traced_send_and_consumption(
                c.namesrv_addr, "Orders", b"x", keys="order-1"
            )
            async with Admin(c.namesrv_addr) as admin:
                await traces_of(admin, result.msg_id)
            shown = await mqadmin("queryMsgTraceById", "-n", c.namesrv_addr, "-i", result.msg_id)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.decode().splitlines()
        assert [line.split()[:2] for line in lines if line] == [
            list(PUB_HEADER[:2]),
            ["Pub", "pg"],
            list(SUB_HEADER[:2]),
            ["Sub", "cg"],
        ]
