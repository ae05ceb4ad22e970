"""Bytes the client writes and reads: batch bodies, subscription data, compressed bodies."""

from __future__ import annotations

import struct
import zlib

import pytest

from raftmq.client.consumer import Subscription
from raftmq.client.producer import encode_batch
from raftmq.client.push import ConsumeFromWhere
from raftmq.protocol.message import MessageExt, MessageSysFlag, inflate, java_string_hash


def test_batch_body_matches_java_encode_message():
    props = "UNIQ_KEY\x01AB\x02WAIT\x01true\x02"
    body = encode_batch([(b"hello", props), (b"", "")])
    first = struct.pack(">iiiii", 20 + 5 + 2 + len(props), 0, 0, 0, 5) + b"hello"
    first += struct.pack(">h", len(props)) + props.encode()
    second = struct.pack(">iiiii", 22, 0, 0, 0, 0) + struct.pack(">h", 0)
    assert body == first + second


def test_subscription_data_for_tags():
    sub = Subscription("T", "TagB || TagA ||  ", version=42)
    assert sub.tags == {"TagA", "TagB"}
    assert sub.to_json() == {
        "classFilterMode": False,
        "codeSet": [java_string_hash("TagA"), java_string_hash("TagB")],
        "expressionType": "TAG",
        "subString": "TagB || TagA ||  ",
        "subVersion": 42,
        "tagsSet": ["TagA", "TagB"],
        "topic": "T",
    }
    assert sub.matches(MessageExt("T", properties={"TAGS": "TagA"}))
    assert not sub.matches(MessageExt("T", properties={"TAGS": "TagC"}))
    assert not sub.matches(MessageExt("T"))
    everything = Subscription("T", "*", version=1)
    assert everything.to_json()["tagsSet"] == [] and everything.matches(MessageExt("T"))


def test_java_string_hash_matches_known_values():
    assert java_string_hash("TagA") == 2598919  # "TagA".hashCode() in Java


def test_inflate_zlib_bodies_only():
    msg = MessageExt("T", zlib.compress(b"x" * 100), sysflag=MessageSysFlag.COMPRESSED_FLAG)
    inflate(msg)
    assert (msg.body, msg.sysflag) == (b"x" * 100, 0)
    lz4 = MessageSysFlag.COMPRESSED_FLAG | MessageSysFlag.COMPRESSION_LZ4_TYPE
    other = MessageExt("T", b"lz4 bytes", sysflag=lz4)
    inflate(other)
    assert (other.body, other.sysflag) == (b"lz4 bytes", lz4)
    plain = MessageExt("T", b"plain")
    inflate(plain)
    assert plain.body == b"plain"


def test_consume_from_accepts_java_and_short_names():
    assert (
        ConsumeFromWhere.parse("CONSUME_FROM_FIRST_OFFSET")
        is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    assert ConsumeFromWhere.parse("LAST") is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    with pytest.raises(ValueError, match="consume_from"):
        ConsumeFromWhere.parse("NEWEST")
