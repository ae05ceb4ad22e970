"""The CommitLog message record (clients_spark.md §A.8, §A.10; dledger.md §5.2).

Golden bytes are written field by field from the reference layout, not produced by
the encoder; tagsCode values are Java's String.hashCode worked out by hand (or
well-known Java values); decode is fuzzed to show that malformed input only ever
raises MessageFormatError.
"""

import contextlib
import datetime
import ipaddress
import random
import struct
import zlib

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.protocol.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    MessageConst,
    MessageExt,
    MessageFormatError,
    MessageSysFlag,
    body_crc,
    decode,
    decode_all,
    encode,
    java_string_hash,
    patch_offsets,
    properties_tags_code,
    properties_to_string,
    read_dispatch_fields,
    read_store_timestamp,
    store_timestamp_position,
    string_to_properties,
    tags_code,
)
from raftmq.protocol.msgid import (
    MessageId,
    UniqIdGenerator,
    create_message_id,
    decode_message_id,
    month_start_ms,
    parse_uniq_id,
    uniq_id_nearly_time,
)

V6_BITS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG


def stored(msg: MessageExt) -> MessageExt:
    """What decode(encode(msg)) must return: the real CRC, host flags from the hosts."""
    sysflag = msg.sysflag & ~V6_BITS
    if ":" in msg.born_host[0]:
        sysflag |= MessageSysFlag.BORNHOST_V6_FLAG
    if ":" in msg.store_host[0]:
        sysflag |= MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
    return attrs.evolve(msg, sysflag=sysflag, body_crc=zlib.crc32(msg.body) & 0x7FFFFFFF)


def roundtrip(msg: MessageExt) -> None:
    raw = encode(msg)
    decoded, size = decode(raw, check_crc=True)
    assert size == len(raw) == read_dispatch_fields(raw)[0]
    assert decoded == stored(msg)
    assert encode(decoded) == raw


# --- golden bytes ------------------------------------------------------------------

GOLDEN_V4_FIELDS = [
    ("TOTALSIZE", "0000006C"),  # 84 fixed + 4+9 body + 1+1 topic + 2+7 properties = 108
    ("MAGICCODE", "DAA320A7"),
    ("BODYCRC", "4BF43926"),  # CRC-32 check value of "123456789" is CBF43926; & 7FFFFFFF
    ("QUEUEID", "00000001"),
    ("FLAG", "00000007"),
    ("QUEUEOFFSET", "0000000000000002"),
    ("PHYSICALOFFSET", "0000000000000003"),
    ("SYSFLAG", "00000002"),  # MULTI_TAGS
    ("BORNTIMESTAMP", "0000000000000004"),
    ("BORNHOST", "0A00000100000005"),  # 10.0.0.1:5
    ("STORETIMESTAMP", "0000000000000006"),
    ("STOREHOST", "0A00000200002A9F"),  # 10.0.0.2:10911
    ("RECONSUMETIMES", "00000008"),
    ("PREPARED_TX_OFFSET", "0000000000000009"),
    ("BODY", "00000009313233343536373839"),  # "123456789"
    ("TOPIC", "0154"),  # "T"
    ("PROPERTIES", "000754414753016102"),  # "TAGS\x01a\x02"
]
GOLDEN_V4 = bytes.fromhex("".join(h for _, h in GOLDEN_V4_FIELDS))
GOLDEN_V4_MSG = MessageExt(
    topic="T",
    body=b"123456789",
    properties={"TAGS": "a"},
    queue_id=1,
    flag=7,
    sysflag=MessageSysFlag.MULTI_TAGS_FLAG,
    born_timestamp=4,
    born_host=("10.0.0.1", 5),
    store_timestamp=6,
    store_host=("10.0.0.2", 10911),
    reconsume_times=8,
    prepared_transaction_offset=9,
    queue_offset=2,
    physical_offset=3,
    body_crc=0x4BF43926,
)

GOLDEN_V6 = bytes.fromhex(
    "00000074"  # TOTALSIZE: 84 + 12 + 12 (two IPv6 hosts) + 4 + 1+1 + 2 = 116
    "DAA320A7"
    "00000000"  # crc32 of the empty body
    "00000003"  # QUEUEID
    "00000000"  # FLAG
    "0000000000000000"  # QUEUEOFFSET
    "0000000000000000"  # PHYSICALOFFSET
    "00000030"  # SYSFLAG: BORNHOST_V6 | STOREHOSTADDRESS_V6
    "0000018E0A3B5C00"  # BORNTIMESTAMP
    "00000000000000000000000000000001"
    "0000D431"  # [::1]:54321
    "0000018E0A3B5C01"  # STORETIMESTAMP, at 68
    "20010DB8000000000000000000000002"
    "00002A9F"  # [2001:db8::2]:10911
    "00000000"
    "0000000000000000"
    "00000000"  # empty body
    "01"
    "51"  # "Q"
    "0000"  # no properties
)


def test_golden_v4_record_byte_for_byte():
    assert len(GOLDEN_V4) == 108
    assert encode(GOLDEN_V4_MSG) == GOLDEN_V4
    assert decode(GOLDEN_V4, check_crc=True) == (GOLDEN_V4_MSG, 108)
    # the fixed positions RocketMQ and DLedger read directly
    assert GOLDEN_V4[20:28] == bytes.fromhex("0000000000000002")
    assert GOLDEN_V4[28:36] == bytes.fromhex("0000000000000003")
    assert GOLDEN_V4[56:64] == bytes.fromhex("0000000000000006")


def test_golden_v6_record_byte_for_byte():
    msg = MessageExt(
        topic="Q",
        queue_id=3,
        born_timestamp=0x18E0A3B5C00,
        born_host=("::1", 54321),
        store_timestamp=0x18E0A3B5C01,
        store_host=("2001:db8::2", 10911),
    )
    assert encode(msg) == GOLDEN_V6  # the host flags are set from the hosts
    decoded, size = decode(GOLDEN_V6)
    assert size == 116
    assert decoded.sysflag == V6_BITS
    assert decoded.born_host == ("::1", 54321)
    assert decoded.store_host == ("2001:db8::2", 10911)
    assert store_timestamp_position(decoded.sysflag) == 68
    assert read_store_timestamp(GOLDEN_V6) == 0x18E0A3B5C01


def test_magic_codes_are_rocketmqs():
    # MessageDecoder: MESSAGE_MAGIC_CODE = 0xAABBCCDD ^ 1880681586 + 8 (+ binds first)
    assert MESSAGE_MAGIC_CODE == (0xAABBCCDD ^ (1880681586 + 8)) - (1 << 32) == -626843481
    assert MESSAGE_MAGIC_CODE & 0xFFFFFFFF == 0xDAA320A7
    assert MESSAGE_MAGIC_CODE_V2 & 0xFFFFFFFF == 0xDAA320AB
    assert BLANK_MAGIC_CODE & 0xFFFFFFFF == 0xCBD43194


def test_v2_record_with_two_byte_topic_length_decodes():
    topic = "t" * 200
    v1_like = encode(MessageExt(topic="x", body=b"b"))
    head = v1_like[: -(1 + 1 + 2)]  # everything up to the topic length
    tail = struct.pack(">h", len(topic)) + topic.encode() + b"\x00\x00"
    raw = bytearray(head + tail)
    struct.pack_into(">ii", raw, 0, len(raw), MESSAGE_MAGIC_CODE_V2)
    msg, size = decode(raw)
    assert (msg.topic, msg.body, size) == (topic, b"b", len(raw))


# --- round trips -------------------------------------------------------------------


def test_roundtrip_empty_body_and_defaults():
    roundtrip(MessageExt(topic="TopicTest"))
    roundtrip(MessageExt(topic=""))


def test_roundtrip_unicode_topic_and_properties():
    roundtrip(
        MessageExt(
            topic="主题-😀",
            body="héllo".encode(),
            properties={"TAGS": "标签", "KEYS": "ключ 鍵", "emoji😀": "v\x01with-sep"},
        )
    )


def test_roundtrip_many_properties_and_extreme_ints():
    props = {f"k{i}": f"v{i}" * 3 for i in range(500)}
    roundtrip(
        MessageExt(
            topic="T" * 127,
            body=bytes(range(256)) * 40,
            properties=props,
            queue_id=-(1 << 31),
            flag=(1 << 31) - 1,
            sysflag=MessageSysFlag.COMPRESSED_FLAG | MessageSysFlag.TRANSACTION_PREPARED_TYPE,
            born_timestamp=(1 << 63) - 1,
            store_timestamp=-(1 << 63),
            queue_offset=(1 << 63) - 1,
            physical_offset=(1 << 40) + 48,
            prepared_transaction_offset=-1,
            reconsume_times=16,
            born_host=("255.255.255.255", 65535),
            store_host=("0.0.0.0", 0),
        )
    )


def test_roundtrip_mixed_host_families():
    roundtrip(MessageExt(topic="a", born_host=("fe80::1", 1), store_host=("1.2.3.4", 2)))
    roundtrip(MessageExt(topic="a", born_host=("1.2.3.4", 1), store_host=("fe80::1", 2)))


def test_host_flags_follow_the_hosts_and_other_bits_survive():
    bits = MessageSysFlag.MULTI_TAGS_FLAG | MessageSysFlag.TRANSACTION_COMMIT_TYPE
    v4 = decode(encode(MessageExt(topic="a", sysflag=bits | V6_BITS)))[0]
    assert v4.sysflag == bits  # IPv4 hosts: stale V6 bits cleared (ali-ons reads 4 bytes)
    mapped = MessageExt(topic="a", born_host=("::ffff:10.1.2.3", 9), store_host=("::1", 1))
    decoded = decode(encode(mapped))[0]
    assert decoded.born_host == ("10.1.2.3", 9)  # Java's InetAddress makes it Inet4Address
    assert decoded.sysflag == MessageSysFlag.STOREHOSTADDRESS_V6_FLAG


CHARS = st.characters(exclude_categories=("Cs",))
hosts_v4 = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 0xFFFF))
hosts_v6 = st.tuples(
    st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None).map(str),
    st.integers(0, 0xFFFF),
)
hosts = st.one_of(hosts_v4, hosts_v6)
int32 = st.integers(-(1 << 31), (1 << 31) - 1)
int64 = st.integers(-(1 << 63), (1 << 63) - 1)
prop_names = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x01\x02"),
    min_size=1,
    max_size=12,
)
prop_values = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x02"), min_size=1, max_size=20
)
messages = st.builds(
    MessageExt,
    topic=st.text(CHARS, max_size=31),  # at most 4 UTF-8 bytes a character: <= 124
    body=st.binary(max_size=300),
    properties=st.dictionaries(prop_names, prop_values, max_size=20),
    queue_id=int32,
    flag=int32,
    sysflag=st.integers(0, 0x7FF),
    born_timestamp=int64,
    born_host=hosts,
    store_timestamp=int64,
    store_host=hosts,
    reconsume_times=int32,
    prepared_transaction_offset=int64,
    queue_offset=int64,
    physical_offset=int64,
)


@given(messages)
def test_roundtrip_property(msg):
    roundtrip(msg)
    raw = encode(msg)
    total, queue_id, queue_offset, sysflag, store_timestamp, topic, properties = (
        read_dispatch_fields(raw)
    )
    assert (total, queue_id, queue_offset, sysflag, store_timestamp, topic) == (
        len(raw),
        msg.queue_id,
        msg.queue_offset,
        stored(msg).sysflag,
        msg.store_timestamp,
        msg.topic,
    )
    assert string_to_properties(properties.decode()) == msg.properties
    assert properties_tags_code(properties) == tags_code(msg.properties.get("TAGS"))
    assert read_store_timestamp(raw) == msg.store_timestamp
    head, _ = decode(raw, read_body=False)
    assert head.body is None and head.topic == msg.topic


# --- properties --------------------------------------------------------------------


def test_properties_string_format():
    props = {"KEYS": "k1 k2", "TAGS": "TagA", "UNIQ_KEY": "AB"}
    text = properties_to_string(props)
    assert text == "KEYS\x01k1 k2\x02TAGS\x01TagA\x02UNIQ_KEY\x01AB\x02"
    assert string_to_properties(text) == props


def test_properties_parser_follows_java():
    # MessageDecoder.string2messageProperties: split at \x02, then at the first \x01;
    # empty names or values are skipped; no trailing separator needed; last one wins.
    text = "a\x01\x02\x01b\x02c\x01d\x01e\x02\x02junk\x02f\x011\x02f\x012"
    assert string_to_properties(text) == {"c": "d\x01e", "f": "2"}
    assert string_to_properties("") == {}


@pytest.mark.parametrize(
    "props",
    [{"": "v"}, {"a\x01": "v"}, {"a\x02": "v"}, {"a": ""}, {"a": "x\x02y"}, {"a": 1}],
)
def test_properties_that_would_not_read_back_are_refused(props):
    with pytest.raises(MessageFormatError):
        properties_to_string(props)
    with pytest.raises(MessageFormatError):
        encode(MessageExt(topic="t", properties=props))


def test_property_helpers():
    msg = MessageExt(topic="t")
    assert msg.tags is None and msg.keys is None and msg.key_list == []
    assert msg.wait_store_msg_ok and msg.delay_time_level == 0 and msg.tags_code == 0
    msg.tags = "TagA"
    msg.keys = ["order-1", "user-2"]
    msg.uniq_key = "C0A80001234500000000000000000000"
    msg.put_property(MessageConst.PROPERTY_WAIT_STORE_MSG_OK, "false")
    msg.put_property(MessageConst.PROPERTY_DELAY_TIME_LEVEL, "3")
    assert msg.properties == {
        "TAGS": "TagA",
        "KEYS": "order-1 user-2",
        "UNIQ_KEY": "C0A80001234500000000000000000000",
        "WAIT": "false",
        "DELAY": "3",
    }
    assert msg.key_list == ["order-1", "user-2"]
    assert not msg.wait_store_msg_ok and msg.delay_time_level == 3
    assert msg.tags_code == 2598919
    msg.clear_property(MessageConst.PROPERTY_WAIT_STORE_MSG_OK)
    msg.tags = None
    assert "WAIT" not in msg.properties and "TAGS" not in msg.properties
    msg.sysflag = MessageSysFlag.reset_transaction_value(
        MessageSysFlag.COMPRESSED_FLAG, MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
    )
    assert msg.transaction_type == MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
    assert MessageSysFlag.clear_compressed_flag(msg.sysflag) == 0xC


# --- tagsCode: Java's String.hashCode ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # 'T'=84 'a'=97 'g'=103 'A'=65: 84*31^3 + 97*31^2 + 103*31 + 65
        ("TagA", 84 * 29791 + 97 * 961 + 103 * 31 + 65),
        ("TagA", 2598919),
        # ((((104*31 + 101)*31 + 108)*31 + 108)*31 + 111)
        ("hello", 99162322),
        ("Hello World", -862545276),  # overflows: Java's well-known value
        ("polygenelubricants", -(1 << 31)),  # the Java puzzler that hashes to MIN_VALUE
        # U+1F600 is the UTF-16 pair D83D DE00: 0xD83D*31 + 0xDE00
        ("\U0001f600", 0xD83D * 31 + 0xDE00),
        ("a", 97),
        ("", 0),
    ],
)
def test_java_string_hash(text, expected):
    assert java_string_hash(text) == expected


def test_tags_code_of_a_record():
    assert tags_code(None) == 0 and tags_code("") == 0
    raw = encode(MessageExt(topic="t", properties={"TAGS": "TagA || TagB"}))
    assert record_tags_code(raw) == java_string_hash("TagA || TagB")  # the whole string
    assert record_tags_code(encode(MessageExt(topic="t"))) == 0
    assert record_tags_code(GOLDEN_V4) == 97
    after = encode(MessageExt(topic="t", properties={"XTAGS": "no", "TAGS": "yes"}))
    assert record_tags_code(after) == java_string_hash("yes")


def record_tags_code(raw: bytes) -> int:
    return properties_tags_code(read_dispatch_fields(raw)[6])


# --- in-place patching (the DLedger append path) -----------------------------------


def test_patch_offsets_visible_through_decode():
    buf = bytearray(GOLDEN_V4)
    entry_pos = 3 << 30  # a DLedger entry at the start of the fourth 1 GiB file
    patch_offsets(buf, 41, entry_pos + 48)
    msg, _ = decode(buf, check_crc=True)
    assert msg == attrs.evolve(GOLDEN_V4_MSG, queue_offset=41, physical_offset=entry_pos + 48)
    assert read_dispatch_fields(buf)[2] == 41
    assert msg.msg_id == "0A00000200002A9F00000000C0000030"
    assert buf[:20] == GOLDEN_V4[:20] and buf[36:] == GOLDEN_V4[36:]  # nothing else moved


def test_patch_offsets_at_an_offset_inside_a_larger_buffer():
    second = encode(MessageExt(topic="b", body=b"xyz", born_host=("::2", 1)))
    buf = bytearray(b"\xee" * 48 + second)  # as in a DLedger entry: header, then body
    patch_offsets(memoryview(buf), 7, 1000, offset=48)
    msg, size = decode(buf, 48)
    assert (msg.queue_offset, msg.physical_offset, size) == (7, 1000, len(second))
    assert buf[:48] == b"\xee" * 48


def test_patch_offsets_refuses_what_it_cannot_patch():
    with pytest.raises(TypeError):
        patch_offsets(GOLDEN_V4, 1, 2)  # bytes are read-only
    with pytest.raises(MessageFormatError):
        patch_offsets(bytearray(GOLDEN_V4), 1, 2, offset=1)  # not a record start
    with pytest.raises(MessageFormatError):
        patch_offsets(bytearray(GOLDEN_V4), 1 << 63, 2)
    with pytest.raises(MessageFormatError):
        patch_offsets(bytearray(GOLDEN_V4[:50]), 1, 2)


# --- msgId and UNIQ_KEY ------------------------------------------------------------


def test_offset_msg_id_format_and_parse():
    msg_id = create_message_id(("10.0.0.2", 10911), 0x1234)
    assert msg_id == "0A00000200002A9F0000000000001234"
    assert decode_message_id(msg_id) == MessageId(("10.0.0.2", 10911), 0x1234)
    assert decode_message_id(msg_id.lower()) == MessageId(("10.0.0.2", 10911), 0x1234)
    v6 = create_message_id(("2001:db8::2", 30911), (1 << 30) + 48)
    assert v6 == "20010DB8000000000000000000000002000078BF0000000040000030"
    assert len(v6) == 56
    assert decode_message_id(v6) == MessageId(("2001:db8::2", 30911), (1 << 30) + 48)
    assert GOLDEN_V4_MSG.msg_id == "0A00000200002A9F0000000000000003"


@given(hosts, int64)
def test_offset_msg_id_roundtrip(host, offset):
    msg_id = create_message_id(host, offset)
    assert msg_id == msg_id.upper() and len(msg_id) in (32, 56)
    parsed = decode_message_id(msg_id)
    assert parsed.offset == offset and parsed.host[1] == host[1]
    assert ipaddress.ip_address(parsed.host[0]) == ipaddress.ip_address(host[0])


@pytest.mark.parametrize(
    "bad", ["", "0A00", "0A000002" * 5, "Z" * 32, "0A000002FFFFFFFF" + "0" * 16]
)
def test_bad_offset_msg_ids(bad):
    with pytest.raises(ValueError):
        decode_message_id(bad)


def test_uniq_id_layout_and_counter():
    utc = datetime.UTC
    now = int(datetime.datetime(2024, 3, 2, 0, 0, 1, 500000, tzinfo=utc).timestamp() * 1000)
    clock = [now]
    gen = UniqIdGenerator("192.168.0.1", 0x12345, -1, clock_ms=lambda: clock[0], tz=utc)
    first = gen.next_id()
    # ip C0A80001, pid & 0xFFFF, class-loader hash -1, 86401500 ms since 1 March, counter
    assert first == "C0A800012345FFFFFFFF052661DC0000"
    assert gen.next_id() == "C0A800012345FFFFFFFF052661DC0001"
    parsed = parse_uniq_id(first)
    assert (parsed.ip, parsed.pid, parsed.class_loader_hash) == ("192.168.0.1", 0x2345, -1)
    assert (parsed.millis_since_month_start, parsed.counter) == (86401500, 0)
    assert uniq_id_nearly_time(first, now_ms=now + 5000, tz=utc) == now
    # a new month restarts the span
    clock[0] = int(datetime.datetime(2024, 4, 1, 0, 0, 0, 7000, tzinfo=utc).timestamp() * 1000)
    assert gen.next_id().endswith("000000070002")
    assert month_start_ms(clock[0], utc) == clock[0] - 7
    # the counter is a Java short: it wraps
    for _ in range(65532):  # counters 3 .. 65534
        gen.next_id()
    assert gen.next_id().endswith("FFFF")
    assert gen.next_id().endswith("0000")


def test_uniq_id_ipv6_is_56_characters():
    gen = UniqIdGenerator("2001:db8::1", 1, 2, clock_ms=lambda: 0, tz=datetime.UTC)
    uniq = gen.next_id()
    assert len(uniq) == 56
    assert parse_uniq_id(uniq).ip == "2001:db8::1"
    with pytest.raises(ValueError):
        parse_uniq_id(uniq[:-2])


# --- malformed records -------------------------------------------------------------


def _with(raw: bytes, fmt: str, position: int, value: int) -> bytes:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, position, value)
    return bytes(buf)


PROPS_LEN_AT = 108 - 2 - 7
TOPIC_LEN_AT = PROPS_LEN_AT - 2
BODY_LEN_AT = TOPIC_LEN_AT - 9 - 4


@pytest.mark.parametrize(
    ("raw", "remark"),
    [
        (b"", "truncated"),
        (GOLDEN_V4[:7], "truncated"),
        (GOLDEN_V4[:107], "truncated"),
        (_with(GOLDEN_V4, ">i", 4, 0x12345678), "bad magic"),
        (_with(GOLDEN_V4, ">i", 4, BLANK_MAGIC_CODE), "BLANK"),
        (_with(GOLDEN_V4, ">i", 0, MIN_RECORD_SIZE - 1), "below the smallest"),
        (_with(GOLDEN_V4, ">i", 0, 107), "add up"),
        (_with(GOLDEN_V4, ">i", 0, 109), "truncated"),  # one byte more than there is
        (_with(GOLDEN_V4 + b"\0", ">i", 0, 109), "add up"),  # a stray byte at the end
        (_with(GOLDEN_V4, ">i", 36, V6_BITS), "too small"),  # hosts now 24 bytes wider
        (_with(GOLDEN_V4, ">i", BODY_LEN_AT, 1000), "bodyLen"),
        (_with(GOLDEN_V4, ">i", BODY_LEN_AT, -1), "bodyLen"),
        (_with(GOLDEN_V4, ">b", TOPIC_LEN_AT, -1), "topic length"),
        (_with(GOLDEN_V4, ">b", TOPIC_LEN_AT, 100), "topic length"),
        (_with(GOLDEN_V4, ">h", PROPS_LEN_AT, -1), "add up"),
        (_with(GOLDEN_V4, ">h", PROPS_LEN_AT, 6), "add up"),
        (_with(GOLDEN_V4, ">B", TOPIC_LEN_AT + 1, 0xFF), "topic"),  # bad UTF-8
        (_with(GOLDEN_V4, ">B", PROPS_LEN_AT + 2, 0xC3), "properties"),  # bad UTF-8
        (_with(GOLDEN_V4, ">i", 52, 70000), "port"),
        (_with(GOLDEN_V4, ">i", 68, -1), "port"),  # the store host's port
    ],
)
def test_malformed_records_raise_message_format_error(raw, remark):
    with pytest.raises(MessageFormatError, match=remark):
        decode(raw)


def test_body_crc_checked_only_when_asked():
    raw = _with(GOLDEN_V4, ">B", BODY_LEN_AT + 4, ord("X"))  # body "X23456789"
    msg, _ = decode(raw)
    assert msg.body == b"X23456789" and msg.body_crc == 0x4BF43926
    with pytest.raises(MessageFormatError, match="BODYCRC"):
        decode(raw, check_crc=True)
    with pytest.raises(MessageFormatError, match="BODYCRC"):
        decode(raw, read_body=False, check_crc=True)
    assert body_crc(b"123456789") == 0x4BF43926


def test_offset_outside_the_buffer():
    for offset in (-1, len(GOLDEN_V4) + 1):
        with pytest.raises(MessageFormatError):
            decode(GOLDEN_V4, offset)
    with pytest.raises(MessageFormatError, match="truncated"):
        decode(GOLDEN_V4, len(GOLDEN_V4))


@pytest.mark.parametrize(
    "msg",
    [
        MessageExt(topic="t" * 128),
        MessageExt(topic="é" * 64),  # 128 bytes
        MessageExt(topic="t", properties={"k": "v" * 40000}),
        MessageExt(topic="t", queue_id=1 << 31),
        MessageExt(topic="t", queue_offset=-(1 << 63) - 1),
        MessageExt(topic="t", born_host=("not-an-ip", 1)),
        MessageExt(topic="t", store_host=("1.2.3.4", 65536)),
        MessageExt(topic="\ud800"),
        MessageExt(topic="t", body=None),
    ],
)
def test_encode_refuses_what_v1_cannot_hold(msg):
    with pytest.raises(MessageFormatError):
        encode(msg)


def _decode_or_format_error(raw, **kwargs):
    try:
        msg, size = decode(raw, **kwargs)
    except MessageFormatError:
        return None
    assert MIN_RECORD_SIZE <= size <= len(raw)
    return msg


@given(st.binary(max_size=400))
def test_decode_random_bytes_only_raises_message_format_error(raw):
    _decode_or_format_error(raw)
    _decode_or_format_error(raw, read_body=False, check_crc=True)
    with contextlib.suppress(MessageFormatError):
        decode_all(raw)
    assert isinstance(decode_all(raw, strict=False), list)


@given(
    st.binary(min_size=83, max_size=300),
    st.sampled_from([MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2]),
)
def test_decode_random_bytes_behind_a_valid_header(tail, magic):
    # A plausible TOTALSIZE and magic get the fuzzer past the first checks.
    raw = struct.pack(">ii", 8 + len(tail), magic) + tail
    _decode_or_format_error(raw)
    _decode_or_format_error(raw, check_crc=True)


@given(
    messages,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(-20, 20),
)
def test_decode_mutated_records_only_raises_message_format_error(msg, flips, resize):
    buf = bytearray(encode(msg))
    for position, value in flips:
        buf[position % len(buf)] = value
    if resize < 0:
        del buf[resize:]
    else:
        buf += bytes(resize)
    _decode_or_format_error(bytes(buf), check_crc=True)
    _decode_or_format_error(bytes(buf), read_body=False)


def test_every_single_byte_corruption_and_truncation_of_a_record():
    """Exhaustive over one small record: each prefix, and each byte set to 0, 0x7F,
    0x80 and 0xFF, decodes or raises MessageFormatError, and a body byte flip is
    caught by the CRC."""
    raw = encode(
        MessageExt(
            topic="tópic",
            body=b"payload",
            properties={"TAGS": "TagA", "UNIQ_KEY": "C0A8000100010000000000000000"},
            born_host=("::1", 1),
            store_host=("10.0.0.9", 10911),
        )
    )
    for cut in range(len(raw)):
        with pytest.raises(MessageFormatError):
            decode(raw[:cut])
    body_at = 48 + 16 + 4 + 8 + 4 + 4 + 4 + 8 + 4  # IPv6 born host, IPv4 store host
    assert raw[body_at - 4 : body_at + 7] == b"\0\0\0\x07payload"
    for position in range(len(raw)):
        for value in (0x00, 0x7F, 0x80, 0xFF):
            if raw[position] == value:
                continue
            mutated = bytearray(raw)
            mutated[position] = value
            msg = _decode_or_format_error(bytes(mutated), check_crc=True)
            if body_at <= position < body_at + 7:
                assert msg is None  # the CRC catches any body change


# --- pull bodies -------------------------------------------------------------------


def test_decode_all_over_concatenated_records():
    rng = random.Random(7)
    msgs = [
        MessageExt(
            topic=f"topic-{i}",
            body=rng.randbytes(rng.randrange(0, 50)),
            properties={"TAGS": f"tag{i}", "UNIQ_KEY": f"{i:032X}"},
            queue_id=i % 4,
            queue_offset=i,
            physical_offset=1000 * i,
            born_host=("::1", 5000 + i) if i % 3 == 0 else ("127.0.0.1", 5000 + i),
        )
        for i in range(8)
    ]
    body = b"".join(encode(m) for m in msgs)
    assert decode_all(body, check_crc=True) == [stored(m) for m in msgs]
    heads = decode_all(memoryview(body), read_body=False)
    assert [h.queue_offset for h in heads] == list(range(8))
    assert all(h.body is None for h in heads)
    assert decode_all(b"") == []
    # A damaged third record: strict names it; lenient stops there, as Java clients do.
    second_end = len(encode(msgs[0])) + len(encode(msgs[1]))
    damaged = bytearray(body)
    damaged[second_end + 4] ^= 0xFF
    with pytest.raises(MessageFormatError, match=f"offset {second_end}"):
        decode_all(damaged)
    assert decode_all(damaged, strict=False) == [stored(m) for m in msgs[:2]]
