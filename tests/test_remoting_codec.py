"""The remoting codec: golden bytes as Java clients send them, round trips, and fuzzing.

The golden frames are written out field by field from RocketMQ's layout
(`RemotingCommand.encode`, `RemotingSerializable`, `RocketMQSerializable`), not
produced by our encoder, so an encoder bug cannot hide behind a matching decoder bug.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import struct

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from raftmq import hotpath
from raftmq.remoting import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    LanguageCode,
    RemotingCommand,
    RemotingError,
    RequestCode,
    ResponseCode,
    SerializeType,
    codec,
    decode,
    encode,
    frames,
)
from raftmq.remoting.codec import RAW_REQUEST, decode_payload
from raftmq.remoting.frames import FrameReader

JSON = SerializeType.JSON
ROCKETMQ = SerializeType.ROCKETMQ


@pytest.fixture(autouse=True, params=["compiled", "python"])
def frame_splitter(request, monkeypatch):
    """Every test here runs on the compiled frame splitter and on its Python twin."""
    if request.param == "python":
        monkeypatch.setattr(frames, "SPLIT_FRAMES", frames.split_frames)
    elif not hotpath.COMPILED:
        pytest.skip("the compiled hot path is not in use")


# ------------------------------------------------------------------ golden frames

# A Java 4.9.8 client asking a namesrv for a topic's route (opaque 3):
# GET_ROUTEINFO_BY_TOPIC (105), extFields {"topic": "TopicTest"}, no remark, no body.
ROUTE_JSON_HEADER = (
    b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA",'
    b'"opaque":3,"serializeTypeCurrentRPC":"JSON","version":409}'
)
ROUTE_JSON_FRAME = (
    b"\x00\x00\x00\x87"  # length = 4 + 131
    b"\x00\x00\x00\x83" + ROUTE_JSON_HEADER  # serialize type 0 (JSON) | header length 131
)
ROUTE_ROCKETMQ_FRAME = (
    b"\x00\x00\x00\x2d"  # length = 4 + 41
    b"\x01\x00\x00\x29"  # serialize type 1 (ROCKETMQ) | header length 41
    b"\x00\x69"  # short code 105
    b"\x00"  # byte language JAVA
    b"\x01\x99"  # short version 409
    b"\x00\x00\x00\x03"  # int opaque
    b"\x00\x00\x00\x00"  # int flag
    b"\x00\x00\x00\x00"  # int remark length: no remark
    b"\x00\x00\x00\x14"  # int extFields length 20
    b"\x00\x05topic"  # short key length, key
    b"\x00\x00\x00\x09TopicTest"  # int value length, value
)
ROUTE_REQUEST = RemotingCommand(
    code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
    language=LanguageCode.JAVA,
    version=409,
    opaque=3,
    ext_fields={"topic": "TopicTest"},
)

# A Java producer's SEND_MESSAGE_V2 (310) with the body "Hello". Single-letter keys
# hash to their own code, so Java's HashMap iterates them in alphabetical order; `l`
# (maxReconsumeTimes) is null outside retries and left out. fastjson escapes the
# property separators \x01 and \x02 as \u0001 and \u0002.
SEND_JSON_HEADER = (
    b'{"code":310,"extFields":{"a":"ProducerGroupA","b":"TopicTest","c":"TBW102","d":"4",'
    b'"e":"1","f":"0","g":"1700000000000","h":"0",'
    b'"i":"UNIQ_KEY\\u00017F0000010001000000000000\\u0002WAIT\\u0001true\\u0002TAGS\\u0001TagA",'
    b'"j":"0","k":"false","m":"false"},"flag":0,"language":"JAVA","opaque":7,'
    b'"serializeTypeCurrentRPC":"JSON","version":409}'
)
SEND_JSON_FRAME = (
    b"\x00\x00\x01\x53"  # length = 4 + 330 + 5
    b"\x00\x00\x01\x4a" + SEND_JSON_HEADER + b"Hello"  # JSON | header length 330
)
SEND_REQUEST = RemotingCommand(
    code=RequestCode.SEND_MESSAGE_V2,
    language=LanguageCode.JAVA,
    version=409,
    opaque=7,
    ext_fields={
        "a": "ProducerGroupA",
        "b": "TopicTest",
        "c": "TBW102",
        "d": 4,
        "e": 1,
        "f": 0,
        "g": 1700000000000,
        "h": 0,
        "i": "UNIQ_KEY\x017F0000010001000000000000\x02WAIT\x01true\x02TAGS\x01TagA",
        "j": 0,
        "k": False,
        "l": None,
        "m": False,
    },
    body=b"Hello",
)


def test_golden_json_request():
    assert len(ROUTE_JSON_HEADER) == 131
    assert encode(ROUTE_REQUEST) == ROUTE_JSON_FRAME
    assert decode(ROUTE_JSON_FRAME) == ROUTE_REQUEST


def test_golden_rocketmq_request():
    request = RemotingCommand(**{**_fields(ROUTE_REQUEST), "serialize_type": ROCKETMQ})
    assert encode(request) == ROUTE_ROCKETMQ_FRAME
    assert decode(ROUTE_ROCKETMQ_FRAME) == request


def test_golden_send_v2_with_body_coerces_values_like_java():
    assert len(SEND_JSON_HEADER) == 330
    assert encode(SEND_REQUEST) == SEND_JSON_FRAME
    decoded = decode(SEND_JSON_FRAME)
    assert decoded.body == b"Hello"
    assert decoded.ext_fields["d"] == "4"
    assert decoded.ext_fields["k"] == "false"
    assert decoded.ext_fields["i"].startswith("UNIQ_KEY\x01")
    assert "l" not in decoded.ext_fields


def test_golden_response_keeps_extfields_and_remark():
    """A TOPIC_NOT_EXIST reply to the JSON route request, as Java clients must see it."""
    response = decode(ROUTE_JSON_FRAME).make_response(
        ResponseCode.TOPIC_NOT_EXIST, "No topic route info in name server for the topic: T"
    )
    header = (
        b'{"code":17,"extFields":{},"flag":1,"language":"PYTHON","opaque":3,'
        b'"remark":"No topic route info in name server for the topic: T",'
        b'"serializeTypeCurrentRPC":"JSON","version":409}'
    )
    assert encode(response) == struct.pack(">II", 4 + len(header), len(header)) + header


def test_golden_rocketmq_response_with_remark_and_flags():
    response = RemotingCommand(
        code=ResponseCode.SYSTEM_ERROR,
        language=LanguageCode.JAVA,
        version=409,
        opaque=-2,  # Java's opaque counter wraps to negative ints
        flag=FLAG_RESPONSE,
        remark="é",
        serialize_type=ROCKETMQ,
    )
    frame = (
        b"\x00\x00\x00\x1b"  # 4 + 23
        b"\x01\x00\x00\x17"  # ROCKETMQ | 23
        b"\x00\x01\x00\x01\x99"  # code 1, JAVA, version 409
        b"\xff\xff\xff\xfe"  # opaque -2
        b"\x00\x00\x00\x01"  # flag: response
        b"\x00\x00\x00\x02\xc3\xa9"  # remark "é" in UTF-8
        b"\x00\x00\x00\x00"  # no extFields
    )
    assert encode(response) == frame
    assert decode(frame) == response


def test_ali_ons_style_json_values_are_coerced_to_java_strings():
    """`ali-ons` sends JSON numbers and booleans in extFields and leaves out remark."""
    header = (
        b'{"code":11,"language":"JAVA","opaque":5,"flag":0,"version":121,"extFields":'
        b'{"queueId":1,"queueOffset":12345678901234,"k":false,"t":true,"n":null,'
        b'"x":1.50,"o":{"a":[1,"b",null]},"s":"v"}}'
    )
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    cmd = decode(frame)
    assert cmd.code == RequestCode.PULL_MESSAGE
    assert cmd.version == 121
    assert cmd.remark is None
    assert cmd.ext_fields == {
        "queueId": "1",
        "queueOffset": "12345678901234",
        "k": "false",
        "t": "true",
        "x": "1.50",
        "o": '{"a":[1,"b",null]}',
        "s": "v",
    }


def test_json_header_defaults_and_unknown_language():
    header = b'{"code":34,"language":"COBOL"}'
    cmd = decode(struct.pack(">II", 4 + len(header), len(header)) + header)
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version) == (34, 0, 0, 0)
    assert cmd.language == LanguageCode.OTHER
    assert cmd.ext_fields == {}


@pytest.mark.parametrize("serialize_type", [JSON, ROCKETMQ])
def test_round_trip_with_everything(serialize_type):
    cmd = RemotingCommand(
        code=RequestCode.SEND_MESSAGE,
        language=LanguageCode.CPP,
        version=401,
        opaque=123456,
        flag=FLAG_RESPONSE | FLAG_ONEWAY,
        remark='a "quoted" remark\nwith ünïcode ✓',
        ext_fields={"topic": "T", "queueId": "3", "empty": "", "ключ": "значение"},
        body=bytes(range(256)) * 4,
        serialize_type=serialize_type,
    )
    decoded = decode(encode(cmd))
    assert decoded == cmd
    assert decoded.is_response and decoded.is_oneway


@pytest.mark.parametrize("serialize_type", [JSON, ROCKETMQ])
def test_ext_values_are_sent_with_java_spelling(serialize_type):
    cmd = RemotingCommand(
        ext_fields={"i": 42, "b": True, "f": False, "none": None, "code": ResponseCode.SUCCESS},
        serialize_type=serialize_type,
    )
    assert decode(encode(cmd)).ext_fields == {"i": "42", "b": "true", "f": "false", "code": "0"}


def test_make_response_echoes_opaque_and_serialize_type():
    request = RemotingCommand(code=14, opaque=99, serialize_type=ROCKETMQ)
    response = request.make_response(ResponseCode.QUERY_NOT_FOUND, "no offset")
    assert response.is_response and not response.is_oneway
    assert (response.opaque, response.serialize_type) == (99, ROCKETMQ)
    assert response.ext_fields == {}


# ------------------------------------------------------------------ malformed input


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _json(header: bytes) -> bytes:
    return _frame(struct.pack(">I", len(header)) + header)


def _rmq(header: bytes) -> bytes:
    return _frame(struct.pack(">I", 1 << 24 | len(header)) + header)


_FIXED = struct.pack(">hBhii", 10, 0, 409, 1, 0)

MALFORMED = [
    (b"", "shorter than its length field"),
    (b"\x00\x00\x00", "shorter than its length field"),
    (b"\x00\x00\x00\x02\x00\x00", "no room for the header length"),
    (b"\x00\x00\x00\x08\x00\x00\x00\x00", "says 8 bytes but 4 follow"),
    (b"\xff\xff\xff\xff\x00\x00\x00\x00", "exceeds the 16777216-byte limit"),
    (_frame(b"\x02\x00\x00\x00"), "unknown serialize type 2"),
    (_frame(b"\x00\x00\x00\x10{}"), "header length 16 exceeds"),
    (_json(b"[1,2]"), "is a array, not an object"),
    (_json(b'{"code":'), "does not parse"),
    (_json(b'{"code":1.5}'), "code 1.5 is not an integer"),
    (_json(b'{"code":"10"}'), "code is a string, not a number"),
    (_json(b'{"opaque":2147483648}'), "does not fit a Java int"),
    (_json(b'{"code":NaN}'), "NaN is not JSON"),
    (_json(b'{"extFields":[]}'), "extFields is a array"),
    (_json(b'{"language":true}'), "language is a boolean"),
    (_json(b"[" * 100_000), "JSON header"),
    (_rmq(_FIXED), "shorter than its 21-byte minimum"),
    (_rmq(_FIXED + b"\xff\xff\xff\xff" + b"\x00" * 4), "remark length -1"),
    (_rmq(_FIXED + b"\x00\x00\x00\x09" + b"\x00" * 8), "remark length 9"),
    (_rmq(_FIXED + b"\x00" * 4 + b"\x00\x00\x00\x05" + b"\x00\x01a"), "extFields length 5"),
    (_rmq(_FIXED + b"\x00" * 8 + b"\x00"), "extFields length 0 but 1"),
    (_rmq(_FIXED + b"\x00" * 4 + b"\x00\x00\x00\x01" + b"\x00"), "inside its key length"),
    (_rmq(_FIXED + b"\x00" * 4 + b"\x00\x00\x00\x06" + b"\x80\x00" + b"\x00" * 4), "key length"),
    (_rmq(_FIXED + b"\x00" * 4 + b"\x00\x00\x00\x07\x00\x01k\x00\x00\x00\x01"), "value length"),
]


@pytest.mark.parametrize(("frame", "message"), MALFORMED)
def test_malformed_frames_raise_remoting_error(frame, message):
    with pytest.raises(RemotingError, match=message.replace("(", r"\(")):
        decode(frame)


def test_frame_limit_is_configurable_and_counts_the_length_field():
    frame = encode(RemotingCommand(body=b"x" * 100))
    assert decode(frame, max_frame_bytes=len(frame)).body == b"x" * 100
    with pytest.raises(RemotingError, match="exceeds"):
        decode(frame, max_frame_bytes=len(frame) - 1)
    with pytest.raises(RemotingError, match="exceeds"):
        encode(RemotingCommand(body=b"x" * 100), max_frame_bytes=len(frame) - 1)


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (RemotingCommand(code=40000, serialize_type=ROCKETMQ), "code 40000 does not fit"),
        (RemotingCommand(opaque=1 << 31), "opaque 2147483648 does not fit"),
        (RemotingCommand(ext_fields={1: "x"}), "is not a str"),
        (RemotingCommand(ext_fields={"k": b"x"}), "cannot send a bytes"),
        (RemotingCommand(remark=5), "remark must be a str"),
        (RemotingCommand(language=99), "unknown language"),
        (RemotingCommand(serialize_type=7), "unknown serialize type"),
        (
            RemotingCommand(ext_fields={"k" * 40000: "v"}, serialize_type=ROCKETMQ),
            "name of 40000 bytes",
        ),
    ],
)
def test_unencodable_commands_raise_remoting_error(cmd, message):
    with pytest.raises(RemotingError, match=message):
        encode(cmd)


# ------------------------------------------------------------------ properties

_text = st.text(max_size=20)
_int16 = st.integers(-(1 << 15), (1 << 15) - 1)
_int32 = st.integers(-(1 << 31), (1 << 31) - 1)


@st.composite
def commands(draw):
    kind = draw(st.sampled_from([JSON, ROCKETMQ]))
    remark = draw(st.none() | _text)
    if kind == ROCKETMQ and remark == "":
        remark = None  # the binary header cannot tell "" from null
    return RemotingCommand(
        code=draw(_int16),
        language=draw(st.sampled_from(LanguageCode)),
        version=draw(_int16),
        opaque=draw(_int32),
        flag=draw(_int32),
        remark=remark,
        ext_fields=draw(st.dictionaries(_text, _text, max_size=5)),
        body=draw(st.binary(max_size=64)),
        serialize_type=kind,
    )


@given(commands())
def test_round_trip_property(cmd):
    frame = encode(cmd)
    assert decode(frame) == cmd
    assert frame[4] == cmd.serialize_type  # the high byte of the header length


def _decode_or_reject(data: bytes) -> None:
    with contextlib.suppress(RemotingError):
        decode(data)


@given(st.binary(max_size=300))
def test_decode_arbitrary_bytes_only_raises_remoting_error(data):
    _decode_or_reject(data)
    _decode_or_reject(struct.pack(">I", len(data)) + data)  # a consistent length field
    with contextlib.suppress(RemotingError):
        FrameDecoder().feed(data)


@given(commands(), st.data())
def test_decode_mutated_frames_only_raises_remoting_error(cmd, data):
    frame = bytearray(encode(cmd))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(frame) - 1))
        action = data.draw(st.sampled_from(["flip", "set", "delete", "insert"]))
        if action == "flip":
            frame[position] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set":
            frame[position] = data.draw(st.integers(0, 255))
        elif action == "delete" and len(frame) > 1:
            del frame[position]
        else:
            frame[position:position] = data.draw(st.binary(min_size=1, max_size=4))
    _decode_or_reject(bytes(frame))
    # and with the length field patched to agree, so the header parsers are reached
    if len(frame) >= 4:
        frame[:4] = struct.pack(">I", len(frame) - 4)
        _decode_or_reject(bytes(frame))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=10,
)
_json_keys = st.sampled_from(
    ["code", "extFields", "flag", "language", "opaque", "remark", "version", "other"]
)


@given(st.dictionaries(_json_keys, _json_values) | _json_values)
def test_json_headers_of_any_shape_decode_or_raise_remoting_error(header):
    with contextlib.suppress(RemotingError):
        cmd = decode(_json(json.dumps(header).encode()))
        assert all(type(v) is str for v in cmd.ext_fields.values())
        assert cmd.remark is None or type(cmd.remark) is str


@given(st.dictionaries(_json_keys, _json_values) | _json_values)
def test_the_fast_json_path_decodes_as_the_exact_one(header):
    """orjson takes the plain headers; whatever it accepts must decode exactly as the
    `json`-based path would have, and what either refuses, both refuse."""
    frame = _json(json.dumps(header).encode())
    results = []
    for decode_header in (codec._decode_json, codec._decode_json_exactly):
        try:
            results.append(decode_header(frame, 8, len(frame)))
        except RemotingError:
            results.append("refused")
    assert results[0] == results[1]


_any_text = st.text(st.characters(blacklist_categories=()), max_size=12)  # surrogates too


@given(st.dictionaries(_any_text, _any_text, max_size=4), st.none() | _any_text)
def test_json_headers_are_the_bytes_the_standard_encoder_writes(ext, remark):
    """orjson writes the header unless a string holds a lone surrogate; either way the
    bytes are those of `json` with compact separators (lone surrogates as "?")."""
    cmd = RemotingCommand(code=10, ext_fields=ext, remark=remark, serialize_type=JSON)
    expected = codec._JSON_ENCODER.encode(
        {
            "code": 10,
            "extFields": ext,
            "flag": 0,
            "language": "PYTHON",
            "opaque": 0,
            **({} if remark is None else {"remark": remark}),
            "serializeTypeCurrentRPC": "JSON",
            "version": cmd.version,
        }
    ).encode("utf-8", "replace")
    assert codec.encode_header(cmd) == expected


def _split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(stream)) for c in cuts})
    bounds = [0, *points, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


@given(st.lists(commands(), min_size=1, max_size=6), st.lists(st.integers(0, 2000), max_size=12))
def test_decoder_parses_frames_split_anywhere(cmds, cuts):
    stream = b"".join(encode(c) for c in cmds)
    decoder = FrameDecoder()
    out = []
    for chunk in _split(stream, cuts):
        out += decoder.feed(chunk)
    decoder.end_of_stream()
    assert out == cmds
    assert decoder.buffered_bytes == 0


@st.composite
def sends(draw):
    """Commands, many of them requests of the raw codes (10, 310)."""
    cmd = draw(commands())
    if draw(st.booleans()):
        cmd.code = draw(st.sampled_from([10, 310]))
        cmd.flag = draw(st.sampled_from([0, 1, 2]))
        cmd.language = LanguageCode.JAVA
        cmd.ext_fields.update(draw(st.dictionaries(st.sampled_from("bei"), _text, max_size=3)))
    return cmd


@given(st.lists(sends(), min_size=1, max_size=6), st.lists(st.integers(0, 2000), max_size=12))
def test_decoder_leaves_plain_requests_raw(cmds, cuts):
    """With `raw`, a plain JSON request of the codes comes back raw, in its place, with
    the values of the fields named; each decodes (after every later feed: its buffer
    was not reused) to what was sent."""
    stream = b"".join(encode(c) for c in cmds)
    decoder = FrameDecoder(raw=(frozenset({10, 310}), ("b", "e", "x")))
    out = []
    for chunk in _split(stream, cuts):
        out += decoder.feed(chunk)
    decoder.end_of_stream()
    assert len(out) == len(cmds)
    for item, cmd in zip(out, cmds, strict=True):
        if type(item) is RAW_REQUEST:
            assert cmd.serialize_type == JSON and cmd.code in (10, 310)
            assert not cmd.flag & 1
            assert item.fields()[3:8] == (
                cmd.code,
                cmd.opaque,
                cmd.flag,
                cmd.body,
                tuple(cmd.ext_fields.get(name) for name in ("b", "e", "x")),
            )
            item = codec.raw_command(item)
        else:  # what the encoder writes is plain
            assert cmd.serialize_type != JSON or cmd.code not in (10, 310) or cmd.flag & 1
        assert item == cmd


class _ChunkStream(trio.abc.ReceiveStream):
    """Delivers the given chunks, one per receive_some, then end of stream."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)

    async def receive_some(self, max_bytes=None) -> bytes:
        await trio.lowlevel.checkpoint()
        return self._chunks.pop(0) if self._chunks else b""

    async def aclose(self) -> None:
        pass


async def _read_all(chunks: list[bytes]) -> list[RemotingCommand]:
    return [cmd async for cmd in FrameReader(_ChunkStream(chunks))]


@given(st.lists(commands(), min_size=1, max_size=6), st.lists(st.integers(0, 2000), max_size=12))
def test_reader_parses_frames_split_anywhere(cmds, cuts):
    stream = b"".join(encode(c) for c in cmds)
    assert trio.run(_read_all, [c for c in _split(stream, cuts) if c]) == cmds


async def test_reader_one_byte_at_a_time_and_truncated_stream():
    cmds = [
        RemotingCommand(code=i, ext_fields={"i": str(i)}, body=b"b" * i, serialize_type=t)
        for i, t in zip(range(5), [JSON, ROCKETMQ] * 3, strict=False)
    ]
    stream = b"".join(encode(c) for c in cmds)
    assert await _read_all([stream[i : i + 1] for i in range(len(stream))]) == cmds
    with pytest.raises(RemotingError, match="stream ended inside a frame"):
        await _read_all([stream[:-1]])


def test_decoder_rejects_an_oversized_frame_from_its_length_alone():
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(RemotingError, match="exceeds the 1024-byte limit"):
        decoder.feed(b"\x00\x00\x04\x00")  # 4 + 1024 > 1024; nothing else was sent
    with pytest.raises(RemotingError, match="earlier error"):
        decoder.feed(encode(RemotingCommand()))


def test_decoder_large_frame_in_many_chunks():
    """A 4 MiB body through 1000-byte chunks: buffered once, not re-copied per chunk."""
    cmd = RemotingCommand(code=10, body=random.Random(1).randbytes(4 << 20))
    frame = encode(cmd)
    decoder = FrameDecoder()
    out = []
    for start in range(0, len(frame), 1000):
        out += decoder.feed(frame[start : start + 1000])
    assert out == [cmd]


def test_decode_payload_from_a_bytearray():
    frame = bytearray(encode(SEND_REQUEST))
    assert decode_payload(frame, 4).body == b"Hello"


def _fields(cmd: RemotingCommand) -> dict:
    return {
        name: getattr(cmd, name)
        for name in (
            "code",
            "language",
            "version",
            "opaque",
            "flag",
            "remark",
            "ext_fields",
            "body",
            "serialize_type",
        )
    }
