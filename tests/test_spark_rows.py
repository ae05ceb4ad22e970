"""The Spark source's rows, made from pulled records without a MessageExt: each value
what decode_all and inflate say of the same bytes (what PullConsumer hands out), and
the tag check the broker leaves to the reader."""

from __future__ import annotations

import datetime
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.spark.rows import records_batch, tagged
from raftmq.protocol.message import (
    MessageExt,
    MessageFormatError,
    MessageSysFlag,
    decode_all,
    encode,
    inflate,
    java_string_hash,
)


def expected_rows(broker_name: str, records: bytes) -> list[dict]:
    rows = []
    for m in decode_all(records):
        inflate(m)
        rows.append(
            {
                "topic": m.topic,
                "brokerName": broker_name,
                "queueId": m.queue_id,
                "queueOffset": m.queue_offset,
                "msgId": m.uniq_key or m.msg_id,
                "keys": m.keys,
                "tags": m.tags,
                "body": m.body,
                "properties": list(m.properties.items()),
                "bornTimestamp": _moment(m.born_timestamp),
                "storeTimestamp": _moment(m.store_timestamp),
            }
        )
    return rows


def _moment(ms: int) -> datetime.datetime:
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=ms)


def stored(properties: dict[str, str], body: bytes, compressed: bool, v6: bool, n: int):
    sysflag = 0
    if compressed:
        body, sysflag = zlib.compress(body), MessageSysFlag.COMPRESSED_FLAG
    return MessageExt(
        "Orders",
        body,
        dict(properties),
        queue_id=n % 4,
        sysflag=sysflag,
        born_timestamp=1_795_000_000_000 + n,
        born_host=("10.0.0.9", 40000),
        store_timestamp=1_795_000_000_100 + n,
        store_host=("fe80::1", 10911) if v6 else ("10.0.0.2", 10911),
        queue_offset=1000 + n,
        physical_offset=4096 * n,
    )


property_maps = st.dictionaries(
    st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "é"]),
    st.text(
        st.characters(exclude_categories=("Cs",), exclude_characters="\x00\x01\x02"),
        min_size=1,
        max_size=5,
    ),
    max_size=4,
)


@given(
    st.lists(
        st.tuples(property_maps, st.binary(max_size=40), st.booleans(), st.booleans()),
        max_size=6,
    )
)
def test_a_batch_holds_what_a_pull_consumer_reads(messages):
    records = b"".join(encode(stored(*m, n)) for n, m in enumerate(messages))
    batch = records_batch("RaftNode00", records)
    assert batch.to_pylist() == expected_rows("RaftNode00", records)


def test_a_malformed_record_fails_the_batch_with_its_offset():
    record = encode(stored({"TAGS": "a"}, b"x", False, False, 0))
    with pytest.raises(MessageFormatError, match="at offset 0"):
        records_batch("RaftNode00", record[:-1])


def test_rows_whose_tag_only_shares_a_hash_with_the_asked_one_are_dropped():
    assert java_string_hash("Aa") == java_string_hash("BB")  # a broker cannot tell them apart
    records = b"".join(
        encode(stored({"TAGS": tag} if tag else {}, b"", False, False, n))
        for n, tag in enumerate(["Aa", "BB", None, "Aa"])
    )
    kept = tagged(records_batch("RaftNode00", records), frozenset({"Aa"}))
    assert kept.column("queueOffset").to_pylist() == [1000, 1003]
