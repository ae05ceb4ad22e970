"""The compiled hot path and its pure-Python twin give the same bytes and the same errors.

Inputs range over what clients send and well past it (odd property lists, values out
of range, IPv6 hosts, truncated and hostile frames), since the compiled functions take
a fast path for the first and must hand the rest to the twin unchanged.
"""

from __future__ import annotations

import errno
import json
import os
import random
import select
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from raftmq.broker import send as broker_send
from raftmq.broker import send_encoding
from raftmq.broker.sql92 import compile_sql92
from raftmq.broker.store import commitlog, indexfile
from raftmq.broker.store.consumequeue import ENTRY
from raftmq.broker.store.metadata import PERM_READ, TopicConfig
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store import base as dstore
from raftmq.dledger.store import entry as dentry

from raftmq import hotpath
from raftmq.disk import fsync_thread
from raftmq.protocol import columns, message
from raftmq.protocol.headers import from_send_v2, send_header_v2
from raftmq.remoting import RemotingCommand, SerializeType, frames
from raftmq.remoting import codec as remoting_codec

TWINS = {
    "split_frames": frames.split_frames,
    "send_record": send_encoding.send_record,
    "send_responses": send_encoding.send_responses,
    "encode_entry": dentry.encode,
    "encode_entries": dentry.encode_entries,
    "index_entries": dentry.index_entries,
    "validate_continuation": dstore.validate_continuation,
    "read_dispatch_fields": message.read_dispatch_fields,
    "place_record": commitlog.place_record,
    "place_records": commitlog.place_records,
    "send_fields": send_encoding.send_fields,
    "plain_json_fields": remoting_codec.plain_json_fields,
    "properties_index_keys": message.properties_index_keys,
    "java_string_hash": message.java_string_hash,
    "pull_body": commitlog.pull_body,
    "queue_runs": commitlog.queue_runs,
    "take_raw_sends": broker_send.take_raw_sends,
    "split_requests": frames.split_requests,
    "plain_request": remoting_codec.plain_request,
    "send_values": send_encoding.send_values,
    "decode_columns": columns.decode_columns,
    "FsyncThread": fsync_thread.FsyncThread,
}

try:
    from raftmq.hotpath import _compiled as compiled
except ImportError:  # not built: CI fails on it (below), elsewhere the twins are all there is
    compiled = None


def outcome(function, *args):
    """What a call gives: ("ok", result) or ("raised", exception type, message)."""
    try:
        return ("ok", function(*args))
    except Exception as exc:  # noqa: BLE001 - an outcome the twin must match
        return ("raised", type(exc), str(exc))


def compiled_outcome(name, *args):
    """What the compiled `name` gives, and the calls it handed to its twin."""
    if compiled is None:
        pytest.skip("the extension is not built")
    handed = []
    twin = compiled.TWINS[name]
    compiled.TWINS[name] = lambda *a: handed.append(a) or twin(*a)
    try:
        return outcome(getattr(compiled, name), *args), handed
    finally:
        compiled.TWINS[name] = twin


def same(name, *args):
    if compiled is None:
        pytest.skip("the extension is not built")
    assert outcome(getattr(compiled, name), *args) == outcome(TWINS[name], *args)


def test_the_compiled_path_is_the_default():
    if compiled is None and not os.environ.get("CI"):
        pytest.skip("the extension is not built (pip install -e . builds it)")
    assert compiled is not None, "CI must build the extension"
    if not os.environ.get("RAFTMQ_NO_EXTENSIONS"):
        assert hotpath.COMPILED
        assert send_encoding.SEND_RECORD is compiled.send_record
        assert frames.SPLIT_FRAMES is compiled.split_frames
        assert frames.SPLIT_REQUESTS is compiled.split_requests
        assert fsync_thread.FSYNC_THREAD is compiled.FsyncThread


def test_no_extensions_selects_the_twins():
    code = (
        "from raftmq import hotpath; from raftmq.remoting import frames; "
        "print(hotpath.COMPILED, frames.SPLIT_FRAMES is frames.split_frames)"
    )
    env = {**os.environ, "RAFTMQ_NO_EXTENSIONS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True"]


# --------------------------------------------------------------------- frames

frame = st.binary(max_size=40).map(lambda payload: struct.pack(">I", len(payload)) + payload)


@given(
    st.lists(frame, max_size=6),
    st.binary(max_size=10),
    st.sampled_from([8, 30, 1 << 20]),
    st.booleans(),
)
def test_split_frames(frames, tail, max_frame_bytes, as_bytearray):
    src = b"".join(frames) + tail
    same("split_frames", bytearray(src) if as_bytearray else src, max_frame_bytes)


@given(st.integers(0, 0xFFFFFFFF), st.binary(max_size=8))
def test_split_frames_hostile_lengths(length, rest):
    same("split_frames", struct.pack(">I", length) + rest, 64)


# --------------------------------------------------------------------- records

name_text = st.text(st.characters(blacklist_characters="\x01\x02"), min_size=1, max_size=8)
prop_item = st.one_of(
    st.tuples(name_text, name_text).map(lambda kv: f"{kv[0]}\x01{kv[1]}"),
    st.sampled_from(["WAIT\x01true", "CLUSTER\x01c", "TAGS\x01t", "UNIQ_KEY\x01AB12", ""]),
    st.text(max_size=6),  # anything, separators included
)
properties = st.lists(prop_item, max_size=6).map("\x02".join) | st.just("")
host = st.sampled_from(
    [
        bytes([127, 0, 0, 1, 0, 0, 0x30, 0x39]),
        bytes(16) + b"\0\0\0\1",
        bytes(10) + b"\xff\xff\x7f\0\0\1\0\0\0\1",  # IPv4-mapped: written as IPv4
        bytes([0x20, 1, 0xD, 0xB8]) + bytes(12) + b"\0\0\x27\x1b",
        b"short",
        "not bytes",
    ]
)
int32 = st.integers(-(1 << 31), (1 << 31) - 1) | st.integers(-(1 << 40), 1 << 40)
int64 = st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-(1 << 70), 1 << 70)


@given(
    st.tuples(
        int64,
        host,
        host,
        st.sampled_from(["DefaultCluster", "", "a\x02b", "é"]),
        st.text(max_size=10) | st.text(min_size=126, max_size=130) | st.just("\udcff"),
        int32,
        int32,
        int32,
        int64,
        int32,
        properties | st.just("A\x01\udcff"),
        st.binary(max_size=64),
    )
)
def test_send_record(args):
    same("send_record", *args)


def test_send_record_takes_the_plain_shape():
    args = (
        1700000000000,
        bytes([10, 0, 0, 7, 0, 0, 0xD4, 0x31]),
        bytes([10, 0, 0, 2, 0, 0, 0x27, 0x1B]),
        "DefaultCluster",
        "orders",
        3,
        0,
        0,
        1699999999999,
        0,
        "UNIQ_KEY\x01C0A8\x02WAIT\x01true\x02TAGS\x01tagA\x02",
        b"x" * 1024,
    )
    same("send_record", *args)
    same("send_record", *args[:10], "A\x01" + "v" * 0x7FF0, b"")  # over the properties limit


# --------------------------------------------------------------------- responses

send = st.tuples(
    int32,
    st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ, 0, 1]),
    int64,
    int64,
    int64,
)


@given(st.lists(send, max_size=5), host)
def test_send_responses(sends, store_host):
    same("send_responses", sends, store_host)


# --------------------------------------------------------------------- DLedger entries


@given(
    st.sampled_from([1, 2, EntryType.NORMAL, -1, 1 << 33]),
    int64,
    int64,
    int64,
    st.binary(max_size=80).map(bytes) | st.binary(max_size=20).map(bytearray) | st.just("x"),
    st.integers(0, 0xFFFFFFFF) | st.just(-1),
)
def test_encode_entry(entry_type, index, term, pos, body, prev_chain):
    same("encode_entry", entry_type, index, term, pos, body, prev_chain)


@given(
    st.sampled_from([1, 2, EntryType.NORMAL, -1, 1 << 33]),
    st.lists(st.binary(max_size=80).map(bytes) | st.binary(max_size=20).map(bytearray), max_size=5)
    | st.just(["x"])
    | st.just((b"a", b"b")),
    int64,
    int64,
    int64 | st.just((1 << 63) - 60),
    st.integers(0, 0xFFFFFFFF) | st.just(-1),
)
def test_encode_entries(entry_type, bodies, index, term, pos, prev_chain):
    same("encode_entries", entry_type, bodies, index, term, pos, prev_chain)


def test_encode_entries_is_encode_entry_back_to_back():
    bodies = [b"one", bytearray(b"two"), b""]
    blob, index_bytes, chain = dentry.ENCODE_ENTRIES(1, bodies, 5, 2, 100, 9)
    parts, pos, prev = [], 100, 9
    for k, body in enumerate(bodies):
        part, prev = dentry.ENCODE(1, 5 + k, 2, pos, body, prev)
        assert index_bytes[32 * k : 32 * k + 32] == dentry.INDEX_ENTRY.pack(
            1, pos, len(part), 5 + k, 2
        )
        parts.append(part)
        pos += len(part)
    assert (blob, chain) == (b"".join(parts), prev)


@given(
    st.lists(st.binary(max_size=60), max_size=6),
    st.integers(0, 400),  # a byte to damage (past the end: none)
    st.integers(0, 255),
    st.integers(0, 30),  # bytes cut from the end
    st.booleans(),
)
def test_index_entries(bodies, at, xor, cut, as_view):
    blob = bytearray(log_of(bodies)) if bodies else bytearray()
    if at < len(blob):
        blob[at] ^= xor
    data = bytes(blob[: len(blob) - cut])
    same("index_entries", memoryview(data) if as_view else data)


def test_index_entries_are_the_stores():
    blob = log_of([b"a", b"bb", b""])
    assert dentry.INDEX_ENTRIES(blob) == b"".join(
        dentry.INDEX_ENTRY.pack(t, pos, size, index, term)
        for _o, t, size, index, term, pos, _c in dentry.iter_entries(blob)
    )


def log_of(bodies, term=3, segment_size=256):
    """Encoded entries 1.. as a leader lays them out: (blob, positions)."""
    parts, chain, pos = [], 0, 0
    for index, body in enumerate(bodies, 1):
        size = dentry.HEADER_SIZE + len(body)
        pos = dentry.place(pos, size, segment_size)
        blob, chain = dentry.encode(int(EntryType.NORMAL), index, term, pos, body, chain)
        parts.append(blob)
        pos += size
    return b"".join(parts)


def test_entries_as_dledger_writes_them_continue_a_log():
    """Apache RocketMQ's DLedger leaves chainCrc and bodyCrc at zero: such entries are
    taken unchecked (a log it wrote opens, and a raftmq leader resends them to a
    follower), and raftmq's entries after them chain on from zero; one CRC field of
    two at zero is still a damaged entry."""
    blob = bytearray(log_of([b"java-0", b"java-1", b"ours"], segment_size=1024))
    first = len(log_of([b"java-0", b"java-1"], segment_size=1024))
    entry_bytes = dentry.HEADER_SIZE + len(b"java-0")
    for start in (0, entry_bytes):  # the two DLedger entries: CRC fields zeroed
        blob[start + dentry.CHAIN_OFFSET : start + dentry.HEADER_SIZE - 4] = bytes(8)
    ours, _chain = dentry.encode(int(EntryType.NORMAL), 3, 3, first, b"ours", 0)
    blob[first:] = ours
    rows = dstore.validate_continuation(bytes(blob), 1, 0, 0, 7, 1024)
    assert [row[3] for row in rows] == [1, 2, 3] and [row[6] for row in rows][:2] == [0, 0]
    same("validate_continuation", bytes(blob), 1, 0, 0, 7, 1024)
    for start in (0, entry_bytes):
        assert dentry.check(memoryview(blob), start, None)[4] == 0
    blob[dentry.CHAIN_OFFSET] = 1  # the first entry's chainCrc alone no longer zero
    with pytest.raises(dentry.CorruptEntry, match="bodyCrc mismatch at index 1"):
        dentry.check(memoryview(blob), 0, None)
    same("validate_continuation", bytes(blob), 1, 0, 0, 7, 1024)


@given(
    st.lists(st.binary(max_size=60), min_size=1, max_size=6),
    st.integers(0, 400),  # a byte to damage (past the end: none)
    st.integers(0, 255),
    st.sampled_from([None, 0, 7]),
    st.sampled_from([1, 2]),
    st.sampled_from([256, 100, 40]),
    st.booleans(),
)
def test_validate_continuation(bodies, at, xor, prev_chain, next_index, segment, as_view):
    blob = bytearray(log_of(bodies))
    if at < len(blob):
        blob[at] ^= xor
    data = memoryview(bytes(blob)) if as_view else bytes(blob)
    same("validate_continuation", data, next_index, 0, 0, prev_chain, segment)
    same("validate_continuation", data[: len(data) // 2], 1, 0, 0, 0, 256)


# --------------------------------------------------------------------- records in place


def record_of(topic="T", queue_id=1, sysflag=0, props="TAGS\x01a\x02", body=b"hello"):
    born = bytes(16) + b"\0\0\0\1" if sysflag & 0x10 else bytes([10, 0, 0, 9, 0, 0, 1, 1])
    store = bytes(16) + b"\0\0\0\2" if sysflag & 0x20 else bytes([10, 0, 0, 2, 0, 0, 1, 2])
    return send_encoding.send_record(
        5, born, store, "C", topic, queue_id, 0, sysflag, 4, 0, props, body
    )


records = st.builds(
    record_of,
    st.sampled_from(["T", "é", "%RETRY%g"]),
    st.integers(0, 3),
    st.sampled_from([0, 0x10, 0x20, 0x30, 0x4, 0xC, 0x8]),
    st.sampled_from(["", "TAGS\x01a\x02", "K\x01" + "v" * 300, "TAGS\x01é\x02X\x01y"]),
    st.binary(max_size=20),
)


@given(records, st.integers(0, 300), st.integers(0, 255), st.integers(-2, 3))
def test_read_dispatch_fields(record, at, xor, cut):
    damaged = bytearray(record)
    if at < len(damaged):
        damaged[at] ^= xor
    data = bytes(damaged)[: len(damaged) - cut] if cut > 0 else bytes(damaged)
    same("read_dispatch_fields", data, 0)
    same("read_dispatch_fields", memoryview(b"xx" + data), 2)
    same("read_dispatch_fields", data, cut)


@given(records, st.integers(0, 300), st.integers(0, 255), st.integers(0, 1 << 40))
def test_place_record(record, at, xor, body_pos):
    if compiled is None:
        pytest.skip("the extension is not built")
    damaged = bytearray(record)
    if at < len(damaged):
        damaged[at] ^= xor
    data = bytes(damaged)
    tables = [{("T", 1): 7, ("é", 0): 1 << 63}, {("T", 1): 7, ("é", 0): 1 << 63}]
    placers = (compiled.place_record, commitlog.place_record)
    results = [outcome(f, data, body_pos, t) for f, t in zip(placers, tables, strict=True)]
    assert results[0] == results[1]
    assert tables[0] == tables[1]


@given(
    st.lists(st.tuples(records, st.integers(0, 300), st.integers(0, 255)), max_size=4),
    st.lists(st.integers(0, 1 << 40) | st.just(1 << 62) | st.just(-1), max_size=5),
    st.sampled_from([7, 1 << 63, (1 << 62) - 1, "x"]),
)
def test_place_records(damaged, body_positions, next_t1):
    if compiled is None:
        pytest.skip("the extension is not built")
    bodies = []
    for record, at, xor in damaged:
        data = bytearray(record)
        if at < len(data):
            data[at] ^= xor
        bodies.append(bytes(data))
    if len(body_positions) > len(bodies):  # mostly a position for each record
        body_positions = body_positions[: len(bodies)]
    tables = [{("T", 1): next_t1, ("é", 0): 1 << 63}, {("T", 1): next_t1, ("é", 0): 1 << 63}]
    placers = (compiled.place_records, commitlog.place_records)
    results = [
        outcome(f, list(bodies), list(body_positions), t)
        for f, t in zip(placers, tables, strict=True)
    ]
    assert results[0] == results[1]
    assert tables[0] == tables[1]


def test_place_records_tells_topics_of_one_length_apart():
    bodies = [record_of(topic, 1) for topic in ("A", "B", "A", "B", "A")]
    table = {("B", 1): 10}
    records, queue_offsets = commitlog.PLACE_RECORDS(bodies, [100, 200, 300, 400, 500], table)
    assert queue_offsets == [0, 10, 1, 11, 2]
    assert table == {("A", 1): 3, ("B", 1): 12}
    assert [message.read_dispatch_fields(r)[2] for r in records] == queue_offsets


# --------------------------------------------------------------------- send headers

header_value = st.one_of(
    st.sampled_from(["", "0", "7", "-1", "12345678901234567890", " 5", "+3", "x", "1_0"]),
    st.sampled_from(["true", "false", "TRUE", "True", "T"]),
    st.integers(-10, 10),
    st.text(max_size=4),
    st.none(),
)
header_key = st.sampled_from(
    [*"abcdefghijklmn", "topic", "queueId", "flag", "sysFlag", "batch", "properties", "zz"]
)


@given(st.dictionaries(header_key, header_value, max_size=10))
def test_send_fields(ext_fields):
    same("send_fields", ext_fields)


def test_send_fields_of_a_producers_header():
    if compiled is None:
        pytest.skip("the extension is not built")
    header = send_header_v2("PG", "T", 3, born_timestamp_ms=1700000000000, properties="A\x01b")
    wire = {k: str(v).lower() if type(v) is bool else str(v) for k, v in header.items()}
    same("send_fields", wire)
    assert compiled.send_fields(wire) == ("T", 3, 0, 0, 1700000000000, 0, "A\x01b", False)
    same("send_fields", from_send_v2(wire))


# --------------------------------------------------------------------- JSON headers

json_value = st.one_of(
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.integers(),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.lists(st.integers(), max_size=2),
)
json_header = st.fixed_dictionaries(
    {},
    optional={
        "code": json_value,
        "version": json_value,
        "opaque": json_value,
        "flag": json_value,
        "language": st.sampled_from(["JAVA", "PYTHON", "X"]) | json_value,
        "remark": json_value,
        "extFields": st.dictionaries(st.text(max_size=3), st.text(max_size=3) | json_value)
        | json_value,
    },
)


@given(json_header)
def test_plain_json_fields(header):
    same("plain_json_fields", header)


# --------------------------------------------------------------------- raw requests

RAW_CODES = frozenset({10, 310})
NAMES = send_encoding.SEND_VALUE_NAMES
RAW_FIELDS = ("src", "start", "end", "code", "opaque", "flag", "body", "values")
space = st.sampled_from(["", "", "", " ", "\n\t ", "\r"])
json_string_text = st.one_of(
    st.text(st.characters(max_codepoint=0x7E, min_codepoint=0x20), max_size=6).map(json.dumps),
    st.text(max_size=4).map(lambda t: json.dumps(t, ensure_ascii=False)),  # unicode, raw
    st.text(max_size=4).map(json.dumps),  # \uXXXX escapes, surrogate pairs
    st.sampled_from(
        [
            '"K\\u0001v\\u0002"',
            '"\\"\\\\\\/\\b\\f\\n\\r\\t"',
            '"\\u007f\\u0080"',
            '"\\ud800"',  # a lone surrogate
            '"\\x"',  # not an escape
            '"a\x01b"',  # a raw control character
            '"unterminated',
            '"\\u00',
        ]
    ),
)
json_number_text = st.one_of(
    st.integers(-(1 << 31), (1 << 31) - 1).map(str),
    st.integers(-(1 << 70), 1 << 70).map(str),
    st.sampled_from(["-0", "01", "1.5", "1e3", "-", "1E2", "2.0", "+1", "0x10", "1_0"]),
)
json_other_text = st.sampled_from(["true", "false", "null", "nul", "[1]", "{}", '{"a":"b"}', ""])
json_any_text = json_string_text | json_number_text | json_other_text
ext_key = st.sampled_from([*NAMES, "a", "zz", "", "top\\u0069c", 'to"pic']).map(
    lambda k: '"' + k + '"'
)


@st.composite
def json_object_text(draw, keys, values, max_size):
    members = draw(st.lists(st.tuples(keys, values), max_size=max_size))
    sep = draw(space)
    inner = ("," + sep).join(f"{k}{sep}:{draw(space)}{v}" for k, v in members)
    return "{" + sep + inner + draw(space) + "}"


ext_text = json_object_text(
    ext_key, json_string_text | json_string_text | json_any_text, max_size=8
) | st.sampled_from(["null", "[]", '"x"'])
top_key = st.sampled_from(
    ["code", "flag", "opaque", "version", "language", "remark", "extFields", "x", "co\\u0064e"]
)
top_value = st.one_of(
    json_number_text,
    st.sampled_from(["10", "310", "0", "1", "2", "3", '"JAVA"', '"PYTHON"', '"ext"', "null"]),
    ext_text,
    json_any_text,
)


ext_clean_text = json_object_text(ext_key, json_string_text, max_size=8)


@st.composite
def request_header(draw):
    """The JSON text of a request header: half of them what clients send (which may
    still hold odd strings), the rest anything."""
    clean = draw(st.booleans())
    members = {
        "code": draw(st.sampled_from(["10", "310", "11", "-10"]) | json_number_text),
        "extFields": draw(ext_clean_text if clean else ext_text),
        "flag": draw(st.sampled_from(["0", "2", "1", "3"])),
        "language": draw(st.sampled_from(['"JAVA"', '"GO"', "null", "7"])),
        "opaque": draw(st.integers(-(1 << 31), (1 << 31) - 1).map(str) | json_number_text),
        "serializeTypeCurrentRPC": '"JSON"',
        "version": draw(st.sampled_from(["409", "0"]) | json_number_text),
    }
    if clean:
        members["code"] = draw(st.sampled_from(["10", "310"]))
        members["flag"] = draw(st.sampled_from(["0", "2"]))
        members["language"] = draw(st.sampled_from(['"JAVA"', '"GO"', json.dumps("é\x01")]))
    if draw(st.booleans()):
        members["remark"] = draw(json_any_text)
    pairs = [(f'"{k}"', v) for k, v in members.items() if clean or draw(st.integers(0, 9))]
    extra = st.lists(st.tuples(top_key.map(lambda k: f'"{k}"'), top_value), max_size=3)
    pairs += draw(st.just([]) | extra if clean else extra)
    if draw(st.booleans()):
        pairs = draw(st.permutations(pairs))
    sep = draw(space)
    text = draw(space) + "{" + ",".join(f"{k}{sep}:{sep}{v}" for k, v in pairs) + "}"
    return text + draw(space)


@st.composite
def request_frame(draw):
    """A frame's payload (no length field): a header, maybe cut or odd, and a body."""
    header = draw(request_header()).encode("utf-8", "surrogatepass")
    cut = draw(st.integers(0, 5))
    if cut == 0:
        header = header[: draw(st.integers(0, len(header)))]
    serialize_type = draw(st.sampled_from([0, 0, 0, 1, 7]))
    header_length = len(header) + (draw(st.integers(1, 5)) if cut == 1 else 0)
    body = draw(st.binary(max_size=12))
    return struct.pack(">I", serialize_type << 24 | header_length) + header + body


def producer_frame(opaque=5, props="K\x01v\x02TAGS\x01t"):
    """A send as the producer writes it (SEND_MESSAGE_V2, the letters)."""
    header = send_header_v2("PG", "T", 3, born_timestamp_ms=1700000000000, properties=props)
    return remoting_codec.encode(
        RemotingCommand(code=310, opaque=opaque, ext_fields=header, body=b"hello")
    )


@given(request_frame(), st.binary(max_size=3), st.booleans())
@example(producer_frame()[4:], b"", False)
def test_plain_request(payload, prefix, as_bytearray):
    """The same raw request (or None) from both; and a raw request says what decoding
    the frame says: its code, opaque, flag, body and ext values."""
    src = prefix + payload
    src = bytearray(src) if as_bytearray else src
    same("plain_request", src, len(prefix), len(src), RAW_CODES, NAMES)
    raw = remoting_codec.PLAIN_REQUEST(src, len(prefix), len(src), RAW_CODES, NAMES)
    if raw is not None:
        command = remoting_codec.raw_command(raw)
        assert command.code in RAW_CODES and not command.flag & 1
        assert (raw.code, raw.opaque, raw.flag, raw.body) == (
            command.code,
            command.opaque,
            command.flag,
            command.body,
        )
        assert raw.values == tuple(command.ext_fields.get(name) for name in NAMES)
        twin = remoting_codec.RawRequest(*raw.fields())  # the record's own twin
        assert twin == raw and raw == twin and twin.fields() == raw.fields()
        assert [getattr(twin, name) for name in RAW_FIELDS] == list(raw.fields())
        assert raw != remoting_codec.RawRequest(*raw.fields()[:-1], (*raw.values, "x"))


@given(st.lists(request_frame(), max_size=5), st.binary(max_size=6), st.booleans())
def test_split_requests(payloads, tail, as_bytearray):
    src = b"".join(struct.pack(">I", len(p)) + p for p in payloads) + tail
    src = bytearray(src) if as_bytearray else src
    same("split_requests", src, 1 << 20, RAW_CODES, NAMES)
    same("split_requests", src, 40, RAW_CODES, NAMES)  # frames too large
    same("split_requests", src, 1 << 20, frozenset(), ("topic",))


def test_plain_request_reads_a_producers_header_itself(monkeypatch):
    """The compiled reader takes what producers send without its twin: the letters,
    escaped properties, a oneway flag; a response or another code is not raw."""
    if compiled is None:
        pytest.skip("the extension is not built")
    monkeypatch.setitem(compiled.TWINS, "plain_request", None)  # a call would fail
    frame = producer_frame(7)
    raw = compiled.plain_request(frame, 4, len(frame), RAW_CODES, NAMES)
    assert (raw.code, raw.opaque, raw.flag, raw.body) == (310, 7, 0, b"hello")
    values = dict(zip(NAMES, raw.values, strict=True))
    assert (values["b"], values["e"], values["i"], values["topic"]) == (
        "T",
        "3",
        "K\x01v\x02TAGS\x01t",
        None,
    )
    assert send_encoding.SEND_VALUES(raw.values) == (
        "T", 3, 0, 0, 1700000000000, 0, "K\x01v\x02TAGS\x01t", False
    )  # fmt: skip
    chunk = frame + frame[:9]
    items, pos = compiled.split_requests(chunk, 1 << 20, RAW_CODES, NAMES)
    assert (items, pos) == ([compiled.RawRequest(chunk, *raw.fields()[1:])], len(frame))
    assert compiled.plain_request(frame, 4, len(frame), frozenset({11}), NAMES) is None


send_text = st.sampled_from(
    ["", "0", "7", "-1", "12345678901234567890", " 5", "x", "true", "false"]
)
send_value = send_text | st.text(max_size=3) | st.none() | st.none()


@given(
    st.tuples(*[send_value] * 16)
    | st.lists(send_value | st.integers(), max_size=17).map(tuple)
    | st.just(["T"] * 16)
)
def test_send_values(values):
    same("send_values", values)


# A raw send's letters (b topic, e queue, h flag, f sysflag, g born, j reconsumes, i
# properties, m batch), the long names among them now and then
raw_send_values = st.fixed_dictionaries(
    {
        "b": st.sampled_from(["T", "R", "SCHEDULE_TOPIC_XXXX", "%RETRY%g", "none"]),
        "e": st.sampled_from(["0", "3", "-1", "9", "x"]),
        "h": st.sampled_from(["0", "1"]),
        "f": st.sampled_from(["0", "2", "4", "8", "1"]),
        "g": st.just("1700000000000"),
        "j": st.just("0"),
        "i": st.sampled_from(
            ["", "K\x01v", "DELAY\x012", "TIMER_DELAY_SEC\x011", "TRAN_MSG\x01true"]
        ),
    },
    optional={"m": st.sampled_from(["false", "true"]), "topic": st.just("T")},
).map(lambda header: tuple(header.get(name) for name in NAMES))


def _raw_send(opaque: int, topic: str, queue: str):
    """A plain raw send to `topic`'s `queue`."""
    header = {"b": topic, "e": queue, "h": "0", "f": "0", "g": "5", "j": "0", "i": ""}
    values = tuple(header.get(name) for name in NAMES)
    return remoting_codec.RAW_REQUEST(b"", 0, 0, 310, opaque, 0, b"m", values)


@st.composite
def raw_send_batches(draw):
    requests = []
    for opaque, values in enumerate(draw(st.lists(raw_send_values, max_size=8))):
        body = b"x" * draw(st.sampled_from([0, 5, 70]))
        requests.append(remoting_codec.RAW_REQUEST(b"", 0, 0, 310, opaque, 0, body, values))
    for at, other in draw(st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["cmd", 7])))):
        requests.insert(at, RemotingCommand(code=310, opaque=99) if other == "cmd" else other)
    return requests


SEND_TOPICS = {
    "T": TopicConfig("T", read_queue_nums=8, write_queue_nums=4),
    "R": TopicConfig("R", perm=PERM_READ),
    "SCHEDULE_TOPIC_XXXX": TopicConfig("SCHEDULE_TOPIC_XXXX"),
    "%RETRY%g": TopicConfig("%RETRY%g"),
}


@given(raw_send_batches(), st.integers(0, 10), st.sampled_from([64, 1 << 20]), st.integers(0, 9))
@example(
    [_raw_send(k, topic, queue) for k, topic in enumerate(SEND_TOPICS) for queue in ("-1", "7")],
    0,
    1 << 20,
    0,
)
def test_take_raw_sends(requests, start, max_size, seed):
    stamps = (
        1700000000001,
        b"\x7f\x00\x00\x01\x00\x00\x30\x39",
        b"\x0a\x00\x00\x02\x00\x00\x27\x1b",
    )
    if compiled is None:
        pytest.skip("the extension is not built")
    args = (requests, start, SEND_TOPICS, stamps, "C", max_size, broker_send.INLINE_RULES)
    random.seed(seed)  # the queue a send to queue -1 goes to: the same draws for both
    compiled_result = outcome(compiled.take_raw_sends, *args)
    random.seed(seed)
    assert compiled_result == outcome(TWINS["take_raw_sends"], *args)


def test_take_raw_sends_stops_where_a_send_needs_its_header_decoded():
    requests = [
        _raw_send(1, "T", "1"),
        _raw_send(2, "R", "1"),
        RemotingCommand(code=310, opaque=3),
        _raw_send(4, "T", "1"),
    ]
    stamps = (9, bytes(8), bytes(8))
    rules = broker_send.INLINE_RULES
    for function in (broker_send.TAKE_RAW_SENDS, broker_send.take_raw_sends):
        taken, records, left, end = function(requests, 0, SEND_TOPICS, stamps, "C", 100, rules)
        assert end == 2  # the decoded request: send_inline's own
        assert [(t[0], t[1], t[2]) for t in taken] == [(310, 1, 1)]
        assert [request.opaque for request in left] == [2]  # a read-only topic: `send` says so
        assert len(records) == 1
        assert function(requests, 3, SEND_TOPICS, stamps, "C", 100, rules)[3] == 4
        anywhere = function([_raw_send(5, "T", "-1")], 0, SEND_TOPICS, stamps, "C", 100, rules)
        assert anywhere[0][0][1] in range(4)  # one of T's four write queues


@given(st.dictionaries(header_key, send_text | st.text(max_size=3), max_size=10))
def test_send_values_reads_what_send_fields_reads(ext_fields):
    """Where it answers, send_values says what send_fields says of the whole header."""
    fields = send_encoding.SEND_VALUES(tuple(ext_fields.get(name) for name in NAMES))
    if fields is not None:
        assert fields == send_encoding.SEND_FIELDS(ext_fields)


# --------------------------------------------------------------------- dispatch


def same_rows(blob, last_index):
    """dispatch_rows of both: the same rows, and errors of the same type and text."""
    if compiled is None:
        pytest.skip("the extension is not built")
    results = []
    for function in (compiled.dispatch_rows, commitlog.dispatch_rows):
        rows, error = function(blob, last_index)
        results.append((rows, error and (type(error), str(error))))
    assert results[0] == results[1]


tags = st.sampled_from(["", "a", "tagA", "é", "😀", "a b"])


@given(
    st.lists(st.tuples(st.booleans(), tags, st.sampled_from([0, 0x10, 0x30])), max_size=5),
    st.integers(0, 900),
    st.integers(0, 255),
    st.integers(0, 7),
)
def test_dispatch_rows(entries, at, xor, last_index):
    parts, chain, pos = [], 0, 0
    for index, (noop, tag, sysflag) in enumerate(entries, 1):
        props = f"X\x01y\x02TAGS\x01{tag}\x02" if tag else "XTAGS\x01z"
        props += f"\x02KEYS\x01{tag} k\x02UNIQ_KEY\x01U{index}" if index % 3 else ""
        body = b"" if noop else record_of(sysflag=sysflag, props=props)
        kind = EntryType.NOOP if noop else EntryType.NORMAL
        blob, chain = dentry.encode(int(kind), index, 1, pos, body, chain)
        parts.append(blob)
        pos += len(blob)
    blob = bytearray(b"".join(parts))
    if at < len(blob):
        blob[at] ^= xor
    if blob:
        same_rows(bytes(blob), last_index)


def test_dispatch_rows_carry_the_index_keys():
    """A row's last two fields are the UNIQ_KEY and KEYS the key index takes."""
    body = record_of(props="UNIQ_KEY\x01AB12\x02KEYS\x01order-1 all\x02TAGS\x01t")
    blob, _chain = dentry.encode(int(EntryType.NORMAL), 1, 1, 0, body, 0)
    for function in (commitlog.DISPATCH_ROWS, commitlog.dispatch_rows):
        rows, error = function(blob, 1)
        assert error is None
        assert commitlog.DispatchRequest(*rows[0][1]).keys == "order-1 all"
        assert rows[0][1][-2:] == ("AB12", "order-1 all")


# A dispatch row's parts: (NOOP?, topic, queue id, offset step, sysflag, UNIQ_KEY, KEYS,
# size, tags code); the offset step is 1 in its queue but for a gap or a repeat
run_row = st.tuples(
    st.booleans(),
    st.sampled_from(["T", "U", "SPECIAL", "NEW"]),
    st.integers(0, 2),
    st.sampled_from([1, 1, 1, 1, 0, 2]),
    st.sampled_from([0, 0, 1, 4, 8, 12]),
    st.sampled_from(["", "", "U1"]),
    st.sampled_from(["", "", "k"]),
    st.integers(-1, 1 << 31),
    st.sampled_from([0, -5, 1 << 40, 1 << 63]),
)
odd_row = st.sampled_from(
    [(1, 2, 3), (9, ("T", 0)), (9, ("T", 0, 1, 2, 3, 4, 5, 6, "", 7)), (9, ("T", True) + (0,) * 8)]
)


@given(
    st.lists(run_row, max_size=40),
    st.integers(-1, 45),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 40), odd_row), max_size=1),
)
def test_queue_runs(parts, start, indexed, odd):
    next_offsets, rows = {}, []
    for index, (noop, topic, queue_id, step, sysflag, uniq, keys, size, tags) in enumerate(parts):
        if noop:
            rows.append((index, None))
            continue
        offset = next_offsets.get((topic, queue_id), 5) + step - 1
        next_offsets[(topic, queue_id)] = offset + 1
        fields = (topic, queue_id, offset, 100 * index, size, sysflag, tags, 7, uniq, keys)
        rows.append((index, fields))
    for at, row in odd:
        rows.insert(at, row)
    queues = {(t, q): None for t in ("T", "U", "SPECIAL") for q in range(3)}
    same("queue_runs", rows, start, queues, frozenset(["SPECIAL"]), indexed)


def test_queue_runs_take_a_queues_entries_in_order_up_to_what_dispatch_must_see():
    rows = [
        (1, ("T", 0, 7, 100, 50, 0, 3, 0, "", "")),
        (2, None),
        (3, ("T", 1, 0, 150, 60, 8, 0, 0, "", "")),  # a committed transaction: plain
        (4, ("T", 0, 8, 210, 70, 0, 4, 0, "", "")),
        (5, ("T", 0, 9, 280, 80, 4, 0, 0, "", "")),  # a half message: dispatch's own
        (6, ("T", 0, 9, 360, 90, 0, 0, 0, "", "")),
    ]
    queues = {("T", 0): None, ("T", 1): None}
    for function in (commitlog.QUEUE_RUNS, commitlog.queue_runs):
        runs, end = function(rows, 0, queues, frozenset(), False)
        assert end == 4
        assert runs == {
            ("T", 0): [7, 9, bytearray(ENTRY.pack(100, 50, 3) + ENTRY.pack(210, 70, 4)), 120],
            ("T", 1): [0, 1, bytearray(ENTRY.pack(150, 60, 0)), 60],
        }
        assert function(rows, 5, queues, frozenset(), False)[1] == 6
        assert function(rows, 0, queues, frozenset(["T"]), False) == ({}, 0)
        indexed = [(1, ("T", 0, 7, 100, 50, 0, 3, 0, "", "k"))]
        assert function(indexed, 0, queues, frozenset(), True) == ({}, 0)
        assert function(indexed, 0, queues, frozenset(), False)[1] == 1
        assert function(rows, 0, {}, frozenset(), False) == ({}, 0)  # no such queue yet


key_item = st.sampled_from(
    ["UNIQ_KEY\x01AB", "UNIQ_KEY\x01", "KEYS\x01a b", "KEYS\x01é", "KEYS\x01", "KEYS", "XKEYS\x01q"]
)
key_properties = st.lists(
    st.one_of(key_item, prop_item).map(lambda item: item.encode("utf-8", "surrogatepass"))
    | st.binary(max_size=6),  # malformed UTF-8 among them
    max_size=6,
).map(b"\x02".join)


@given(key_properties)
def test_properties_index_keys(properties):
    same("properties_index_keys", properties)
    assert message.properties_index_keys(properties) == (
        lambda props: (props.get("UNIQ_KEY", ""), props.get("KEYS", ""))
    )(message.string_to_properties(properties.decode("utf-8", "replace")))


# --------------------------------------------------------------------- key index


@given(st.text() | st.just("\udcff\ud800") | st.just(b"x") | st.integers())
def test_java_string_hash(text):
    same("java_string_hash", text)


def index_image(slot_num, entries, slots):
    """An IndexFile's bytes: header, `slots`, then entry 0 (unused) and `entries`."""
    head = bytes(indexfile.HEADER_SIZE)
    slot_bytes = b"".join(struct.pack(">i", v) for v in slots)
    body = b"".join(struct.pack(">iqii", h, 0, 0, 0) for h in [0, *entries])
    return bytearray(head + slot_bytes + body)


@given(
    st.integers(1, 5),
    st.lists(st.integers(-(1 << 31), (1 << 31) - 1) | st.integers(0, 20), max_size=12),
    st.lists(st.integers(-2, 14), max_size=5),
    st.integers(-1, 14),
    st.integers(-30, 10),
)
def test_recover_slots(slot_num, entries, slots, count, cut):
    """The same slots and the same count from both, in bounds or not (bytes, short
    buffers): kept when they name entries below count, rebuilt otherwise."""
    if compiled is None:
        pytest.skip("the extension is not built")
    slots = (slots + [0] * slot_num)[:slot_num]
    image = index_image(slot_num, entries, slots)
    if cut < 0:
        del image[cut:]
    images = [bytearray(image), bytearray(image)]
    functions = (compiled.recover_slots, indexfile.recover_slots)
    results = [outcome(f, b, slot_num, count) for f, b in zip(functions, images, strict=True)]
    assert results[0] == results[1]
    assert images[0] == images[1]
    same_readonly = [outcome(f, bytes(image), slot_num, count) for f in functions]
    assert same_readonly[0] == same_readonly[1]


def test_recover_slots_keeps_or_rebuilds():
    """Slots naming entries below count are kept as they are (a clean stop); one naming
    an entry at or past count is repaired, all slots then rebuilt from the entries."""
    entries = [4, 1, 7, 3]  # entries 1..4, 3 slots: slots 1, 1, 1, 0
    for function in (indexfile.RECOVER_SLOTS, indexfile.recover_slots):
        image = index_image(3, entries, [4, 3, 0])
        assert function(image, 3, 5) == 2
        assert image == index_image(3, entries, [4, 3, 0])  # untouched
        image = index_image(3, entries, [4, 3, 9])  # slot 2 names a torn entry 9
        assert function(image, 3, 5) == 2
        assert image == index_image(3, entries, [4, 3, 0])
        assert function(image, 3, 3) == 1  # entries 1 and 2 only
        assert image == index_image(3, entries, [0, 2, 0])


# --------------------------------------------------------------------- pulls


def read_from(log: bytes):
    """A log's `read_at`: IndexError for bytes it does not hold."""

    def read(pos, size):
        if pos < 0 or size < 0 or pos + size > len(log):
            raise IndexError(f"bytes [{pos}, {pos + size}) are not in the log")
        return log[pos : pos + size]

    return read


@example(64, [True], [(0, 60, 0), (0, -59, 0)], None, 8, 300, 0, 64, False)  # sizes total 1
@given(
    st.integers(1, 48),
    st.lists(st.booleans(), max_size=4),
    st.lists(st.tuples(st.integers(-8, 200), st.integers(-2, 60), st.integers(-2, 3)), max_size=12),
    st.none() | st.frozensets(st.integers(-2, 3)),
    st.integers(-1, 8),
    st.integers(-1, 300),
    st.integers(-8, 60),
    st.integers(0, 220),
    st.booleans(),
)
def test_pull_body(segment_size, mapped, entries, codes, max_count, max_bytes, low, high, short):
    """Records come from the mapped segments inside [low, high) and from `read` otherwise
    (the two differ here, so taking the wrong one shows), with the same limits, filter
    and errors; a short last segment sends what crosses its end to `read`."""
    log = bytes(range(256)) * 2
    other = bytes(255 - b for b in log)
    maps = {k * segment_size: log[k * segment_size : (k + 1) * segment_size] for k, m in
            enumerate(mapped) if m}  # fmt: skip
    if short and maps:
        last = max(maps)
        maps[last] = maps[last][: segment_size // 2]
    queue = b"".join(struct.pack(">qiq", *entry) for entry in entries)
    for blob in (queue, bytearray(queue)):
        same("pull_body", blob, codes, max_count, max_bytes, maps, segment_size, low, high,
             read_from(other))  # fmt: skip


@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 20), st.integers(0, 2)), max_size=8),
    st.integers(0, 5),
)
def test_pull_body_odd_input(entries, cut):
    """Odd sizes, a torn queue and a filter over bytes that are not records are the
    twin's: the same results and errors."""
    queue = b"".join(struct.pack(">qiq", *entry) for entry in entries)
    maps = {0: bytes(range(64)), 64: bytes(range(64, 128))}
    read = read_from(bytes(range(200)))
    same("pull_body", queue, None, 4, 50, maps, 64, 0, 128, read, lambda p: len(p) % 2 == 0)
    same("pull_body", queue[: len(queue) - cut], None, 4, 50, maps, 64, 0, 128, read)
    same("pull_body", queue, None, 4, 50, maps, 0, 0, 128, read)
    same("pull_body", queue, None, 4, 50, maps, 64, 0, 1 << 63, read)
    strange = {0: list(range(64)), 64: "not bytes"}  # segments that are no byte buffers
    same("pull_body", queue, None, 4, 50, strange, 64, 0, 128, read)
    same("pull_body", queue, None, 4, 50, strange, 64, 0, 128, read, lambda p: True)


# SQL92-like expressions over the properties the stored messages below carry
_SQL92_CONDITION = st.one_of(
    st.builds("a > {}".format, st.integers(-2, 12)),
    st.builds("a <= {}".format, st.integers(-2, 12)),
    st.builds("a BETWEEN {} AND {}".format, st.integers(-2, 4), st.integers(4, 12)),
    st.sampled_from(["TAGS = 'TagA'", "TAGS <> 'TagB'", "a IS NULL", "TAGS IS NOT NULL",
                     "b IN ('x', 'y')", "b NOT IN ('x')", "a = 3.0", "b > 1", "KEYS = 'k1'"]),
)  # fmt: skip
_SQL92 = st.recursive(
    _SQL92_CONDITION,
    lambda inner: st.one_of(
        st.builds("({}) AND ({})".format, inner, inner),
        st.builds("({}) OR ({})".format, inner, inner),
        st.builds("NOT ({})".format, inner),
    ),
    max_leaves=4,
)
_PROPERTY_VALUES = {
    "a": st.integers(-3, 14).map(str) | st.sampled_from(["x", "5.5", " 7"]),
    "b": st.sampled_from(["x", "y", "2", "é"]),
    "TAGS": st.sampled_from(["TagA", "TagB"]),
    "KEYS": st.sampled_from(["k1", "k2"]),
}
_STORED = st.lists(
    st.tuples(
        st.fixed_dictionaries({}, optional=_PROPERTY_VALUES),
        st.integers(0, 120),  # body bytes
    ),
    min_size=1,
    max_size=8,
)


@given(
    _STORED,
    st.lists(st.integers(0, 7), max_size=12),
    st.integers(40, 400),
    st.lists(st.booleans(), max_size=8),
    st.none() | st.frozensets(st.sampled_from([message.tags_code("TagA"), 0])),
    st.integers(1, 6),
    st.integers(0, 900),
    st.integers(-10, 1200),
    _SQL92,
    st.none() | st.sampled_from(["7", "TagB", "x"]),
)
def test_pull_body_by_sql92(
    stored, picks, segment_size, mapped, codes, max_count, max_bytes, high, expression, fault
):
    """The compiled call filters by SQL92 itself, with the twin's limits and results: it
    hands the filter each candidate's raw properties, from its mapped segment or from
    `read` (the two hold the same properties around different bodies here, so taking the
    wrong copy shows). A filter that raises ends the pull with its exception, in both."""
    logs = [b"", b""]  # the mapped bytes and what `read` gives
    positions = []
    for properties, body_bytes in stored:
        positions.append(len(logs[0]))
        for n, fill in enumerate((b"m", b"r")):
            msg = message.MessageExt("T", fill * body_bytes, {"UNIQ_KEY": "U", **properties})
            logs[n] += message.encode(msg)
    picked = [i % len(stored) for i in picks]
    ends = [*positions[1:], len(logs[0])]
    sizes = [end - start for start, end in zip(positions, ends, strict=True)]
    queue = b"".join(
        struct.pack(">qiq", positions[i], sizes[i], message.tags_code(stored[i][0].get("TAGS")))
        for i in picked
    )
    maps = {k * segment_size: logs[0][k * segment_size : (k + 1) * segment_size]
            for k, m in enumerate(mapped) if m}  # fmt: skip
    sql92 = compile_sql92(expression)

    def matches(properties: bytes) -> bool:
        if fault is not None and fault.encode() in properties:
            raise RuntimeError(f"a filter fault over {properties!r}")
        return sql92.matches_properties(properties)

    args = (queue, codes, max_count, max_bytes, maps, segment_size, 0, high)
    read = read_from(logs[1])
    if compiled is None:
        pytest.skip("the extension is not built")
    result, fallbacks = compiled_outcome("pull_body", *args, read, matches)
    assert result == outcome(commitlog.pull_body, *args, read, matches)
    assert not fallbacks  # what the broker stores is filtered in the compiled call
    if fault is None:  # the filter's choice: exactly the matching candidates, in order
        body, _count, scanned, _last = result[1]
        candidates = [{"UNIQ_KEY": "U", **stored[i][0]} for i in picked[:scanned]]
        wanted = [
            properties
            for properties in candidates
            if (codes is None or message.tags_code(properties.get("TAGS")) in codes)
            and sql92.matches(properties)
        ]
        assert [m.properties for m in message.decode_all(body)] == wanted


def test_pull_body_by_sql92_reads_topics_as_the_twin_does():
    """A topic beyond ASCII is read in the compiled call; one that is not UTF-8 is the
    twin's error (read_dispatch_fields refuses the record)."""
    if compiled is None:
        pytest.skip("the extension is not built")
    sql92 = compile_sql92("a = 1").matches_properties
    for topic, bad in (("Tópico", False), ("T", False), ("Tó", True)):
        record = bytearray(message.encode(message.MessageExt(topic, b"body", {"a": "1"})))
        if bad:  # ó's two bytes, as two bytes that are not UTF-8
            at = record.index("ó".encode())
            record[at : at + 2] = b"\xff\xfe"
        queue = struct.pack(">qiq", 0, len(record), 0)
        args = (queue, None, 4, 1 << 20, {0: bytes(record)}, 1 << 20, 0, len(record))
        result, fallbacks = compiled_outcome("pull_body", *args, read_from(b""), sql92)
        assert result == outcome(commitlog.pull_body, *args, read_from(b""), sql92)
        assert (result[0], bool(fallbacks)) == (("raised", True) if bad else ("ok", False))


# --------------------------------------------------------- pull replies as Arrow columns


def pulled_record(record, queue_offset, physical_offset, born_ms, store_ms, compressed):
    """`record` as the broker hands it out: offsets placed, timestamps set, and with
    `compressed` its body deflated under COMPRESSED_FLAG."""
    data = bytearray(record)
    if compressed:
        decoded, _ = message.decode(bytes(data))
        decoded.body = zlib.compress(decoded.body)
        decoded.sysflag |= message.MessageSysFlag.COMPRESSED_FLAG
        data = bytearray(message.encode(decoded))
    struct.pack_into(">qq", data, 20, queue_offset, physical_offset)
    struct.pack_into(">q", data, 40, born_ms)
    sysflag = struct.unpack_from(">i", data, 36)[0]
    store_ts = 48 + (16 if sysflag & 0x10 else 4) + 4
    struct.pack_into(">q", data, store_ts, store_ms)
    return bytes(data)


column_props = st.lists(
    st.sampled_from(
        [
            "TAGS\x01a",
            "KEYS\x01k1 k2",
            "UNIQ_KEY\x01AB01",
            "TAGS\x01é",
            "X\x01",
            "\x01y",
            "z",
            "KEYS\x01again",
            "P\x01v\x01w",
            "",
        ]
    ),
    max_size=6,
).map("\x02".join)
pulled_records = st.builds(
    pulled_record,
    st.builds(
        record_of,
        st.sampled_from(["T", "é", "%RETRY%g"]),
        st.integers(0, 3),
        st.sampled_from([0, 0x10, 0x20, 0x30, 0x4]),
        column_props,
        st.binary(max_size=20),
    ),
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 62),
    st.sampled_from([0, 1_795_000_000_000, -1, (1 << 63) // 1000, (1 << 63) - 1]),
    st.sampled_from([1_795_000_000_123, -((1 << 63) // 1000) - 1]),
    st.booleans(),
)


@given(st.lists(pulled_records, max_size=4), st.integers(0, 400), st.integers(0, 255),
       st.integers(-1, 3), st.booleans())  # fmt: skip
@example([], 0, 0, 0, False)
def test_decode_columns(records, at, xor, cut, as_view):
    blob = bytearray(b"".join(records))
    if at < len(blob):
        blob[at] ^= xor
    data = bytes(blob)[: len(blob) - cut] if cut > 0 else bytes(blob)
    same("decode_columns", memoryview(data) if as_view else data)


def test_decode_columns_takes_ordinary_records_itself():
    plain = [pulled_record(record_of(props=p), 7, 99, 1, 2, False) for p in ("", "TAGS\x01a")]
    (result, handed) = compiled_outcome("decode_columns", b"".join(plain))
    assert result[0] == "ok" and result[1][0] == 2 and not handed


# --------------------------------------------------------------------- the fsync thread

# What a batch may hold: a data file (fdatasync) or its directory (fsync), and what a
# bug would hand it: a closed descriptor (EBADF), a pipe (EINVAL), a non-integer.
sync_target = st.sampled_from(["file", "file-full", "dir", "closed", "pipe"])


def _run_batches(make, batches, tmp_path) -> list:
    """Each batch through a fresh thread of `make`: what submit raised, or the error
    number the batch reported; then what a closed thread says."""
    outcomes = []
    thread = make()
    read_end, write_end = os.pipe()
    path = tmp_path / "data"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    directory = os.open(tmp_path, os.O_RDONLY)
    closed = os.open(path, os.O_RDONLY)
    os.close(closed)
    fds = {"file": (fd, True), "file-full": (fd, False), "dir": (directory, False),
           "closed": (closed, True), "pipe": (read_end, True)}  # fmt: skip
    try:
        for batch in batches:
            os.write(fd, b"x")
            targets = [fds[kind] for kind in batch]
            submitted = outcome(thread.submit, [t[0] for t in targets], [t[1] for t in targets])
            if submitted[0] == "raised":
                outcomes.append(submitted)
                continue
            assert outcome(thread.submit, [fd], [True])[0] == "raised"  # one at a time
            assert select.select([thread.done_fd], [], [], 10)[0], "the batch never finished"
            error_number, took_s = thread.result()
            assert took_s >= 0 and thread.result() is None  # reported once
            outcomes.append(("ok", error_number))
        outcomes.append(outcome(thread.submit, [fd], [True, False]))  # flags must match
        thread.close()
        outcomes.append((outcome(thread.submit, [fd], [True]), thread.result()))
    finally:
        for opened in (fd, directory, read_end, write_end):
            os.close(opened)
    return outcomes


@given(st.lists(st.lists(sync_target, max_size=4), max_size=4))
def test_fsync_thread(batches):
    if compiled is None:
        pytest.skip("the extension is not built")
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as other:
        ours = _run_batches(compiled.FsyncThread, batches, Path(one))
        twin = _run_batches(fsync_thread.FsyncThread, batches, Path(other))
    assert ours == twin


def test_the_fsync_thread_reports_an_error_number_not_an_exception():
    """EBADF for a closed descriptor, and the batch's first error when several fail."""
    with tempfile.TemporaryDirectory() as tmp:
        for make in {fsync_thread.FSYNC_THREAD, fsync_thread.FsyncThread}:
            outcomes = _run_batches(make, [["closed", "pipe"], ["file", "dir"]], Path(tmp))
            assert outcomes[:2] == [("ok", errno.EBADF), ("ok", 0)]
