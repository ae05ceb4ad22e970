"""RocketMQ's CommitLog message record, byte for byte.

The same record is what the broker stores, what a pull reply's body concatenates and
what a 4.x client decodes (`MessageDecoder.decode`, `CommitLog.checkMessageAndReturnSize`,
`DLedgerCommitLog.MessageSerializer`), so it is RocketMQ's V1 layout exactly. All
fields are big-endian:

    pos  size  field
      0     4  TOTALSIZE          the whole record, these 4 bytes included
      4     4  MAGICCODE          V1 0xDAA320A7 (V2 0xDAA320AB: 2-byte topic length)
      8     4  BODYCRC            zlib crc32(body) & 0x7FFFFFFF (`UtilAll.crc32`)
     12     4  QUEUEID
     16     4  FLAG               the producer's int flag
     20     8  QUEUEOFFSET        logical offset in the ConsumeQueue
     28     8  PHYSICALOFFSET     offset of this record in the CommitLog
     36     4  SYSFLAG            `MessageSysFlag`; bits 0x10 / 0x20 widen the hosts
     40     8  BORNTIMESTAMP
     48   4+4  BORNHOST           ip + int port; 16+4 with BORNHOST_V6_FLAG
     56     8  STORETIMESTAMP     at 68 when the born host is IPv6
        4+4  STOREHOST          16+4 with STOREHOSTADDRESS_V6_FLAG
          4  RECONSUMETIMES
          8  PREPARED_TX_OFFSET
      4 + n  BODY               int length + bytes (possibly compressed, sysflag 0x1)
      1 + n  TOPIC              byte length (<= 127) + UTF-8
      2 + n  PROPERTIES         short length (<= 32767) + `name\\x01value\\x02`...

With DLedger each entry's body is exactly one such record (dledger.md §5.2): the
leader serializes the message before it knows where it goes, then patches
QUEUEOFFSET (under the topic-queue lock) and PHYSICALOFFSET (= entry pos + 48, in
DLedger's AppendHook) in place; `patch_offsets` is that step. Because every replica
writes the entry at the same position, the physical offset and the offset msgId
(store host + physical offset) are the same on every node.

4.x clients read only V1 and stop silently at the first record they cannot parse,
so `encode` writes only V1 and refuses what V1 cannot express (a topic over 127
bytes, properties over 32767) instead of truncating a length as Java's casts would.
`decode` accepts V1 and V2 and is strict where Java is not: any record whose length
fields do not add up to TOTALSIZE, whose text is not UTF-8 or whose port is not a
port raises one `MessageFormatError`, never a struct or Unicode error.
"""

from __future__ import annotations

import functools
import logging
import struct
import zlib
from collections.abc import Iterable, Mapping

import attrs

from raftmq.hotpath import compiled_or
from raftmq.protocol.msgid import Host, create_message_id, pack_ip, unpack_ip

log = logging.getLogger(__name__)

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7, MessageDecoder.MESSAGE_MAGIC_CODE (V1)
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB, 5.x, for topics longer than 127 bytes
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194, the filler at the end of a CommitLog file

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
_PROPERTY_SEPARATOR_BYTES = PROPERTY_SEPARATOR.encode()

# Fixed positions (MessageDecoder's *_POSITION constants). Everything after the born
# host moves by 12 bytes when the born host is IPv6.
TOTAL_SIZE_POSITION = 0
MAGIC_CODE_POSITION = 4
BODY_CRC_POSITION = 8
QUEUE_ID_POSITION = 12
FLAG_POSITION = 16
QUEUE_OFFSET_POSITION = 20
PHYSICAL_OFFSET_POSITION = 28
SYSFLAG_POSITION = 36
BORN_TIMESTAMP_POSITION = 40
BORN_HOST_POSITION = 48
STORE_TIMESTAMP_POSITION = 56  # RocketMQ's constant; right only for an IPv4 born host

TOPIC_MAX_BYTES = 127  # V1's signed byte
PROPERTIES_MAX_BYTES = 0x7FFF  # a signed short

_HEAD = struct.Struct(">iiiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP, 48 bytes
_DISPATCH_HEAD = struct.Struct(">iiiiiqqi")  # TOTALSIZE .. SYSFLAG
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")
_BYTE = struct.Struct(">b")
_TAIL = struct.Struct(">iqi")  # RECONSUMETIMES, PREPARED_TX_OFFSET, bodyLen
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class MessageFormatError(ValueError):
    """Bytes that are not a valid CommitLog record, or a message the record cannot hold.

    The remark says what failed and where, for a response's remark or a log line.
    """


class MessageSysFlag:
    """`org.apache.rocketmq.common.sysflag.MessageSysFlag`."""

    COMPRESSED_FLAG = 0x1
    MULTI_TAGS_FLAG = 0x1 << 1
    TRANSACTION_NOT_TYPE = 0
    TRANSACTION_PREPARED_TYPE = 0x1 << 2
    TRANSACTION_COMMIT_TYPE = 0x2 << 2
    TRANSACTION_ROLLBACK_TYPE = 0x3 << 2
    BORNHOST_V6_FLAG = 0x1 << 4
    STOREHOSTADDRESS_V6_FLAG = 0x1 << 5
    NEED_UNWRAP_FLAG = 0x1 << 6
    INNER_BATCH_FLAG = 0x1 << 7
    # 5.x: the compression type in bits 8-10 (4.x bodies with COMPRESSED_FLAG are zlib)
    COMPRESSION_LZ4_TYPE = 0x1 << 8
    COMPRESSION_ZSTD_TYPE = 0x2 << 8
    COMPRESSION_ZLIB_TYPE = 0x3 << 8
    COMPRESSION_TYPE_COMPARATOR = 0x7 << 8

    @staticmethod
    def get_transaction_value(flag: int) -> int:
        return flag & MessageSysFlag.TRANSACTION_ROLLBACK_TYPE

    @staticmethod
    def reset_transaction_value(flag: int, transaction_type: int) -> int:
        return (flag & ~MessageSysFlag.TRANSACTION_ROLLBACK_TYPE) | transaction_type

    @staticmethod
    def clear_compressed_flag(flag: int) -> int:
        return flag & ~MessageSysFlag.COMPRESSED_FLAG


class MessageConst:
    """Property names (`org.apache.rocketmq.common.message.MessageConst`)."""

    PROPERTY_KEYS = "KEYS"
    PROPERTY_TAGS = "TAGS"
    PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
    PROPERTY_DELAY_TIME_LEVEL = "DELAY"
    PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
    PROPERTY_REAL_TOPIC = "REAL_TOPIC"
    PROPERTY_REAL_QUEUE_ID = "REAL_QID"
    PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
    PROPERTY_PRODUCER_GROUP = "PGROUP"
    PROPERTY_MIN_OFFSET = "MIN_OFFSET"
    PROPERTY_MAX_OFFSET = "MAX_OFFSET"
    PROPERTY_BUYER_ID = "BUYER_ID"
    PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    PROPERTY_TRANSFER_FLAG = "TRANSFER_FLAG"
    PROPERTY_CORRECTION_FLAG = "CORRECTION_FLAG"
    PROPERTY_MQ2_FLAG = "MQ2_FLAG"
    PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
    PROPERTY_MSG_REGION = "MSG_REGION"
    PROPERTY_TRACE_SWITCH = "TRACE_ON"
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    PROPERTY_CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    PROPERTY_INSTANCE_ID = "INSTANCE_ID"
    PROPERTY_CORRELATION_ID = "CORRELATION_ID"
    PROPERTY_MESSAGE_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    PROPERTY_MESSAGE_TTL = "TTL"
    PROPERTY_REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
    PROPERTY_PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
    PROPERTY_CLUSTER = "CLUSTER"
    PROPERTY_MESSAGE_TYPE = "MSG_TYPE"
    # RocketMQ 5's timer messages (broker.timer)
    PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # absolute, ms since the epoch
    PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
    PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
    PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"  # the due time the broker rounded it to
    PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"  # when the broker delivered it
    PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"  # a recall's: <topic>+<UNIQ_KEY>
    KEY_SEPARATOR = " "


# raftmq's: set by a producer on a send that repeats one whose outcome it does not know
# (same UNIQ_KEY). The broker takes it off and answers with the copy it already stores,
# if any, instead of storing the message twice (broker.send). RocketMQ has none.
PROPERTY_RESEND = "RAFTMQ_RESEND"


# --- properties ----------------------------------------------------------------------


def properties_to_string(properties: Mapping[str, str]) -> str:
    """`MessageDecoder.messageProperties2String`: `name\\x01value\\x02` per property.

    Java writes whatever it is given; here a property that would not read back the
    same (`string2messageProperties` drops empty names and values, and splits on the
    separators) raises MessageFormatError instead of vanishing. A value may contain
    \\x01: the parser splits at the first one, so it reads back intact.
    """
    parts = []
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise MessageFormatError(f"property {name!r}: names and values must be str")
        if not name or NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name:
            raise MessageFormatError(f"property name {name!r} is empty or holds \\x01/\\x02")
        if not value or PROPERTY_SEPARATOR in value:
            raise MessageFormatError(f"property {name!r}: value is empty or holds \\x02")
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts)


def string_to_properties(text: str) -> dict[str, str]:
    """`MessageDecoder.string2messageProperties` (4.9 / 5.x), lenient as Java is.

    Items are separated by \\x02; an item is `name\\x01value` split at its first \\x01;
    items with an empty name or value are skipped; a later duplicate wins.
    """
    properties: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            properties[name] = value
    return properties


# --- Java's String.hashCode, the ConsumeQueue tagsCode -------------------------------


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()`: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units,
    in wrapping 32-bit arithmetic, as a signed int."""
    h = 0
    for (unit,) in struct.iter_unpack(">H", text.encode("utf-16-be", "surrogatepass")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


# `java_string_hash`, compiled where the build allows (raftmq.hotpath): the key index
# hashes every key of every message.
JAVA_STRING_HASH = compiled_or("java_string_hash", java_string_hash)


@functools.lru_cache(maxsize=4096)
def tags_code(tags: str | None) -> int:
    """`MessageExtBrokerInner.tagsString2tagsCode`: 0 without tags, else the TAGS
    string's hashCode widened to long (the whole string, even with several tags).
    Cached: a topic's messages carry a handful of tags, and the hash loops in Python.

    The ConsumeQueue stores it; a delayed message in SCHEDULE_TOPIC_XXXX stores its
    deliver time there instead, which the dispatcher decides, not this codec.
    """
    return java_string_hash(tags) if tags else 0


# --- the message ---------------------------------------------------------------------


def body_crc(body: bytes) -> int:
    """`UtilAll.crc32`: zlib's CRC-32 of the body, masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


@attrs.define(slots=True)
class MessageExt:
    """A stored message: RocketMQ's `MessageExt`, as the broker builds it
    (`MessageExtBrokerInner`) and as `MessageDecoder.decode` returns it.

    `body` is the stored body, compressed if sysflag says so (the store never
    decompresses; clients do); None when decoded with `read_body=False`. Hosts are
    `(ip, port)`. `body_crc` is what a decoded record carried; `encode` always writes
    the body's real CRC, as `CommitLog.putMessage` sets it just before storing.
    """

    topic: str
    body: bytes | None = b""
    properties: dict[str, str] = attrs.field(factory=dict)
    queue_id: int = 0
    flag: int = 0
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("0.0.0.0", 0)
    store_timestamp: int = 0
    store_host: Host = ("0.0.0.0", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    body_crc: int = 0

    # properties, by MessageConst name

    def get_property(self, name: str) -> str | None:
        return self.properties.get(name)

    def put_property(self, name: str, value: str) -> None:
        self.properties[name] = value

    def clear_property(self, name: str) -> None:
        self.properties.pop(name, None)

    @property
    def tags(self) -> str | None:
        return self.properties.get(MessageConst.PROPERTY_TAGS)

    @tags.setter
    def tags(self, value: str | None) -> None:
        self._set_or_clear(MessageConst.PROPERTY_TAGS, value)

    @property
    def keys(self) -> str | None:
        """The KEYS property as stored: keys joined by a space."""
        return self.properties.get(MessageConst.PROPERTY_KEYS)

    @keys.setter
    def keys(self, value: str | Iterable[str] | None) -> None:
        if value is not None and not isinstance(value, str):
            value = MessageConst.KEY_SEPARATOR.join(value)
        self._set_or_clear(MessageConst.PROPERTY_KEYS, value)

    @property
    def key_list(self) -> list[str]:
        """The individual keys, as the index service splits them."""
        return [k for k in (self.keys or "").split(MessageConst.KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        """The producer's UNIQ_KEY (`MessageClientIDSetter.getUniqID`)."""
        return self.properties.get(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @uniq_key.setter
    def uniq_key(self, value: str | None) -> None:
        self._set_or_clear(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, value)

    @property
    def wait_store_msg_ok(self) -> bool:
        """`Message.isWaitStoreMsgOK`: true unless WAIT says otherwise."""
        value = self.properties.get(MessageConst.PROPERTY_WAIT_STORE_MSG_OK)
        return value is None or value.lower() == "true"

    @property
    def delay_time_level(self) -> int:
        """`Message.getDelayTimeLevel`: the DELAY property, 0 when absent or not a number."""
        try:
            return int(self.properties.get(MessageConst.PROPERTY_DELAY_TIME_LEVEL, "0"))
        except ValueError:
            return 0

    @property
    def transaction_type(self) -> int:
        return MessageSysFlag.get_transaction_value(self.sysflag)

    @property
    def tags_code(self) -> int:
        return tags_code(self.tags)

    @property
    def msg_id(self) -> str:
        """The offset msgId: store host + physical offset (`MessageDecoder.createMessageId`)."""
        return create_message_id(self.store_host, self.physical_offset)

    def _set_or_clear(self, name: str, value: str | None) -> None:
        if value is None:
            self.properties.pop(name, None)
        else:
            self.properties[name] = value


# --- encode --------------------------------------------------------------------------


_HOST_V6_FLAGS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
# A record's size less its hosts, body, topic and properties: the fixed fields, the
# store timestamp and the topic and properties length prefixes.
_FIXED_SIZE = _HEAD.size + 8 + _TAIL.size + 1 + 2
_INT_FIELDS = (
    ("queue_id", _INT32),
    ("flag", _INT32),
    ("sysflag", _INT32),
    ("reconsume_times", _INT32),
    ("queue_offset", _INT64),
    ("physical_offset", _INT64),
    ("born_timestamp", _INT64),
    ("store_timestamp", _INT64),
    ("prepared_transaction_offset", _INT64),
)


def _check_int(name: str, value: int, bounds: tuple[int, int]) -> None:
    if not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
        raise MessageFormatError(f"{name} {value!r} does not fit the record's field")


def _bad_int_field(msg: MessageExt) -> MessageFormatError:
    """Which integer field made the record's struct refuse to pack (the slow path)."""
    try:
        for name, bounds in _INT_FIELDS:
            _check_int(name, getattr(msg, name), bounds)
    except MessageFormatError as exc:
        return exc
    return MessageFormatError("an integer field does not fit the record")


def _pack_host(name: str, host: Host) -> tuple[bytes, bool]:
    try:
        ip, port = host
        packed = pack_ip(ip)
    except (TypeError, ValueError):
        raise MessageFormatError(f"{name} {host!r} is not an (ip, port) pair") from None
    if type(port) is not int or not 0 <= port <= 0xFFFF:
        raise MessageFormatError(f"{name} port {port!r} out of range")
    return packed + _INT.pack(port), len(packed) == 16


def _utf8(name: str, text: str) -> bytes:
    if not isinstance(text, str):
        raise MessageFormatError(f"{name} must be str, not {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise MessageFormatError(f"{name} is not encodable as UTF-8") from None


def encode(msg: MessageExt) -> bytes:
    """Serialize `msg` as a V1 CommitLog record (`MessageDecoder.encode`, `CommitLog`'s
    DefaultAppendMessageCallback, `DLedgerCommitLog.MessageSerializer`).

    As the put path does, the record's BODYCRC is computed from the body and the two
    host-width sysflag bits are set from the hosts' address families (an IPv4-mapped
    IPv6 address is written as IPv4), whatever `msg` carries. Raises
    MessageFormatError for what the layout cannot hold. This is on every send's path:
    integer fields are checked by packing them, and only a failure looks for the culprit.
    """
    if msg.body is None:
        raise MessageFormatError("message has no body (decoded with read_body=False?)")
    body = bytes(msg.body)
    topic = _utf8("topic", msg.topic)
    if len(topic) > TOPIC_MAX_BYTES:
        raise MessageFormatError(f"topic is {len(topic)} bytes, V1 holds {TOPIC_MAX_BYTES}")
    properties = _utf8("properties", properties_to_string(msg.properties))
    if len(properties) > PROPERTIES_MAX_BYTES:
        raise MessageFormatError(
            f"properties are {len(properties)} bytes, the record holds {PROPERTIES_MAX_BYTES}"
        )
    born_host, born_v6 = _pack_host("born_host", msg.born_host)
    store_host, store_v6 = _pack_host("store_host", msg.store_host)
    sysflag = msg.sysflag
    if type(sysflag) is int:  # else left for the pack below to refuse
        sysflag &= ~_HOST_V6_FLAGS
        if born_v6:
            sysflag |= MessageSysFlag.BORNHOST_V6_FLAG
        if store_v6:
            sysflag |= MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
    variable = len(born_host) + len(store_host) + len(body) + len(topic) + len(properties)
    total = _FIXED_SIZE + variable
    if total > _INT32[1]:
        raise MessageFormatError(f"record of {total} bytes is too large")
    try:
        head = _HEAD.pack(
            total,
            MESSAGE_MAGIC_CODE,
            body_crc(body),
            msg.queue_id,
            msg.flag,
            msg.queue_offset,
            msg.physical_offset,
            sysflag,
            msg.born_timestamp,
        )
        store_timestamp = _LONG.pack(msg.store_timestamp)
        tail = _TAIL.pack(msg.reconsume_times, msg.prepared_transaction_offset, len(body))
    except struct.error:
        raise _bad_int_field(msg) from None
    return b"".join(
        (
            head,
            born_host,
            store_timestamp,
            store_host,
            tail,
            body,
            _BYTE.pack(len(topic)),
            topic,
            _SHORT.pack(len(properties)),
            properties,
        )
    )


# --- decode --------------------------------------------------------------------------

# The smallest record: IPv4 hosts, empty body, topic and properties.
MIN_RECORD_SIZE = _HEAD.size + 8 + 8 + 8 + _TAIL.size + 1 + 2  # 91


def _as_view(buf) -> memoryview:
    view = memoryview(buf)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return view


def _locate(view: memoryview, offset: int) -> tuple[int, int, int]:
    """Check that the record at `offset` is whole, has a message magic and room for
    the fixed fields its sysflag implies; returns (total, magic, sysflag)."""
    if not isinstance(offset, int) or not 0 <= offset <= len(view):
        raise MessageFormatError(f"offset {offset!r} outside a buffer of {len(view)} bytes")
    remaining = len(view) - offset
    if remaining < 8:
        raise MessageFormatError(
            f"truncated: {remaining} bytes at offset {offset}, too few for TOTALSIZE and MAGICCODE"
        )
    total, magic = struct.unpack_from(">ii", view, offset)
    if magic == BLANK_MAGIC_CODE:
        raise MessageFormatError(f"BLANK end-of-file record at offset {offset}, not a message")
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise MessageFormatError(f"bad magic code 0x{magic & 0xFFFFFFFF:08X} at offset {offset}")
    if total < MIN_RECORD_SIZE:
        raise MessageFormatError(
            f"TOTALSIZE {total} at offset {offset} is below the smallest record ({MIN_RECORD_SIZE})"
        )
    if total > remaining:
        raise MessageFormatError(
            f"truncated: record at offset {offset} says {total} bytes, {remaining} remain"
        )
    (sysflag,) = _INT.unpack_from(view, offset + SYSFLAG_POSITION)
    born_len, store_len = _host_widths(sysflag)
    topic_len_size = 1 if magic == MESSAGE_MAGIC_CODE else 2
    smallest = _HEAD.size + born_len + 4 + 8 + store_len + 4 + _TAIL.size + topic_len_size + 2
    if total < smallest:
        raise MessageFormatError(
            f"TOTALSIZE {total} at offset {offset} is too small for sysflag {sysflag:#x}"
            f" (at least {smallest})"
        )
    return total, magic, sysflag


def _host_widths(sysflag: int) -> tuple[int, int]:
    born = 16 if sysflag & MessageSysFlag.BORNHOST_V6_FLAG else 4
    store = 16 if sysflag & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG else 4
    return born, store


def _text(view: memoryview, start: int, end: int, what: str, offset: int) -> str:
    try:
        return str(view[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise MessageFormatError(
            f"{what} of the record at offset {offset}: bad UTF-8 ({exc.reason})"
        ) from None


def _host(view: memoryview, pos: int, ip_len: int, what: str, offset: int) -> Host:
    ip = unpack_ip(bytes(view[pos : pos + ip_len]))
    (port,) = _INT.unpack_from(view, pos + ip_len)
    if not 0 <= port <= 0xFFFF:
        raise MessageFormatError(
            f"{what} port {port} out of range in the record at offset {offset}"
        )
    return ip, port


def decode(
    buf, offset: int = 0, read_body: bool = True, check_crc: bool = False
) -> tuple[MessageExt, int]:
    """Parse the record at `offset` of `buf` (bytes, bytearray, memoryview, mmap).

    Returns (message, record size). With `read_body=False` the body is skipped and
    left None (`MessageDecoder.decode(buf, readBody=false)`); with `check_crc` the
    stored BODYCRC must match the body (`checkMessageAndReturnSize(checkCRC=true)`).
    Every field must lie inside TOTALSIZE and the fields must add up to it exactly.
    Raises MessageFormatError, and nothing else, for any malformed record.
    """
    view = _as_view(buf)
    total, magic, _sysflag = _locate(view, offset)
    end = offset + total
    (
        _total,
        _magic,
        stored_crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sysflag,
        born_timestamp,
    ) = _HEAD.unpack_from(view, offset)
    born_len, store_len = _host_widths(sysflag)
    topic_len_size = 1 if magic == MESSAGE_MAGIC_CODE else 2
    pos = offset + _HEAD.size
    born_host = _host(view, pos, born_len, "born host", offset)
    pos += born_len + 4
    (store_timestamp,) = _LONG.unpack_from(view, pos)
    pos += 8
    store_host = _host(view, pos, store_len, "store host", offset)
    pos += store_len + 4
    reconsume_times, prepared_offset, body_len = _TAIL.unpack_from(view, pos)
    pos += _TAIL.size
    if body_len < 0 or pos + body_len + topic_len_size + 2 > end:
        raise MessageFormatError(
            f"bodyLen {body_len} does not fit TOTALSIZE {total} of the record at offset {offset}"
        )
    body_view = view[pos : pos + body_len]
    pos += body_len
    if topic_len_size == 1:
        (topic_len,) = _BYTE.unpack_from(view, pos)
    else:
        (topic_len,) = _SHORT.unpack_from(view, pos)
    pos += topic_len_size
    if topic_len < 0 or pos + topic_len + 2 > end:
        raise MessageFormatError(
            f"topic length {topic_len} does not fit TOTALSIZE {total}"
            f" of the record at offset {offset}"
        )
    topic = _text(view, pos, pos + topic_len, "topic", offset)
    pos += topic_len
    (properties_len,) = _SHORT.unpack_from(view, pos)
    pos += 2
    if properties_len < 0 or pos + properties_len != end:
        raise MessageFormatError(
            f"fields of the record at offset {offset} add up to {pos + properties_len - offset}"
            f" bytes, TOTALSIZE says {total}"
        )
    properties = string_to_properties(_text(view, pos, end, "properties", offset))
    if check_crc and body_crc(body_view) != stored_crc:
        raise MessageFormatError(
            f"BODYCRC mismatch in the record at offset {offset}: stored {stored_crc},"
            f" body has {body_crc(body_view)}"
        )
    msg = MessageExt(
        topic=topic,
        body=bytes(body_view) if read_body else None,
        properties=properties,
        queue_id=queue_id,
        flag=flag,
        sysflag=sysflag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_timestamp=store_timestamp,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_offset,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        body_crc=stored_crc,
    )
    return msg, total


def decode_all(
    buf, read_body: bool = True, check_crc: bool = False, strict: bool = True
) -> list[MessageExt]:
    """Decode a pull reply body: records back to back (`MessageDecoder.decodes`).

    Java clients stop at the first record they cannot parse and keep what came
    before, which hides layout bugs as "no messages"; that is `strict=False`. By
    default a bad record raises MessageFormatError naming its offset.
    """
    view = _as_view(buf)
    messages = []
    offset = 0
    while offset < len(view):
        try:
            msg, size = decode(view, offset, read_body=read_body, check_crc=check_crc)
        except MessageFormatError:
            if strict:
                raise
            break
        messages.append(msg)
        offset += size
    return messages


def inflate(msg: MessageExt) -> None:
    """Inflate a zlib-compressed body in place (4.x COMPRESSED_FLAG, or 5.x's ZLIB type);
    5.x LZ4/ZSTD bodies are left as they are, flag set."""
    if not msg.sysflag & MessageSysFlag.COMPRESSED_FLAG:
        return
    kind = msg.sysflag & MessageSysFlag.COMPRESSION_TYPE_COMPARATOR
    if kind not in (0, MessageSysFlag.COMPRESSION_ZLIB_TYPE):
        return
    try:
        msg.body = zlib.decompress(msg.body)
    except zlib.error as exc:
        log.warning("message %s: cannot inflate its body: %s", msg.msg_id, exc)
        return
    msg.sysflag &= ~(MessageSysFlag.COMPRESSED_FLAG | MessageSysFlag.COMPRESSION_TYPE_COMPARATOR)


# --- in place: the append path and the dispatcher ------------------------------------


def patch_offsets(buf, queue_offset: int, physical_offset: int, offset: int = 0) -> None:
    """Write QUEUEOFFSET (@20) and PHYSICALOFFSET (@28) into an encoded record in place.

    The DLedger append path serializes a message before it is placed, then sets
    its queue offset under the topic-queue lock and its physical offset (entry pos
    + 48) once the leader has chosen the entry's position. `buf` must be writable
    (bytearray, writable memoryview or mmap); the record's magic and size are
    checked first so a wrong `offset` cannot scribble over other data.
    """
    view = _as_view(buf)
    if view.readonly:
        raise TypeError("patch_offsets needs a writable buffer (bytearray, memoryview, mmap)")
    _locate(view, offset)
    _check_int("queue_offset", queue_offset, _INT64)
    _check_int("physical_offset", physical_offset, _INT64)
    struct.pack_into(">qq", view, offset + QUEUE_OFFSET_POSITION, queue_offset, physical_offset)


def store_timestamp_position(sysflag: int) -> int:
    """Where STORETIMESTAMP sits: 56, or 68 behind an IPv6 born host. (RocketMQ's
    MESSAGE_STORE_TIMESTAMP_POSITION is the constant 56; recovery code that reads it
    from a raw record must account for the wider born host.)"""
    return BORN_HOST_POSITION + _host_widths(sysflag)[0] + 4


def read_store_timestamp(buf, offset: int = 0) -> int:
    """STORETIMESTAMP without a full decode, as recovery checks a file's first message."""
    view = _as_view(buf)
    _total, _magic, sysflag = _locate(view, offset)
    return _LONG.unpack_from(view, offset + store_timestamp_position(sysflag))[0]


def read_dispatch_fields(buf, offset: int = 0) -> tuple[int, int, int, int, int, str, bytes]:
    """(TOTALSIZE, QUEUEID, QUEUEOFFSET, SYSFLAG, STORETIMESTAMP, topic, raw properties)
    of the V1 record at `offset`, read where `encode` put them: what the broker's
    leader placing records and its dispatcher need, once per message on every
    replica, where `decode` would cost too much. Only the magic is checked, as the
    records read this way are ones the broker itself encoded; MessageFormatError for
    anything but a V1 message."""
    total, magic, _crc, queue_id, _flag, queue_offset, _phys, sysflag = _DISPATCH_HEAD.unpack_from(
        buf, offset
    )
    if magic != MESSAGE_MAGIC_CODE:
        raise MessageFormatError(f"not a V1 message at offset {offset}")
    timestamp_pos = offset + store_timestamp_position(sysflag)
    (store_timestamp,) = _LONG.unpack_from(buf, timestamp_pos)
    # STORETIMESTAMP, STOREHOST, RECONSUMETIMES, PREPARED_TX_OFFSET, then bodyLen
    body_len_pos = timestamp_pos + 8 + _host_widths(sysflag)[1] + 4 + 4 + 8
    (body_len,) = _INT.unpack_from(buf, body_len_pos)
    topic_pos = body_len_pos + 4 + body_len
    topic_end = topic_pos + 1 + buf[topic_pos]
    topic = str(buf[topic_pos + 1 : topic_end], "utf-8")
    (properties_len,) = _SHORT.unpack_from(buf, topic_end)
    properties = bytes(buf[topic_end + 2 : topic_end + 2 + properties_len])
    return total, queue_id, queue_offset, sysflag, store_timestamp, topic, properties


# `read_dispatch_fields`, compiled where the build allows (raftmq.hotpath).
READ_DISPATCH_FIELDS = compiled_or("read_dispatch_fields", read_dispatch_fields)

_TAGS_PREFIX = (MessageConst.PROPERTY_TAGS + NAME_VALUE_SEPARATOR).encode()


def properties_tags_code(properties: bytes) -> int:
    """The ConsumeQueue tagsCode of raw PROPERTIES bytes: hashCode of the TAGS value, or
    0 without one; found in the bytes, without parsing every property."""
    at = properties.find(_TAGS_PREFIX)
    while at > 0 and properties[at - 1 : at] != _PROPERTY_SEPARATOR_BYTES:
        at = properties.find(_TAGS_PREFIX, at + 1)  # the end of another name ("XTAGS")
    if at < 0:
        return 0
    start = at + len(_TAGS_PREFIX)
    end = properties.find(_PROPERTY_SEPARATOR_BYTES, start)
    return tags_code(properties[start : end if end >= 0 else None].decode())


_UNIQ_KEY_NAME = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_KEYS_NAME = MessageConst.PROPERTY_KEYS.encode()
_NAME_VALUE_SEPARATOR_BYTES = NAME_VALUE_SEPARATOR.encode()


def properties_index_keys(properties: bytes) -> tuple[str, str]:
    """(UNIQ_KEY, KEYS) of raw PROPERTIES bytes, "" for one absent: what the key index
    takes from a message (RocketMQ's DispatchRequest uniqKey and keys), read as
    `string_to_properties` reads them (a later non-empty value wins, a malformed UTF-8
    byte decodes to U+FFFD as in Java) without decoding the other properties."""
    uniq = keys = b""
    if b"KEY" in properties:  # in both names
        for item in properties.split(_PROPERTY_SEPARATOR_BYTES):
            name, _sep, value = item.partition(_NAME_VALUE_SEPARATOR_BYTES)
            if value and name == _UNIQ_KEY_NAME:
                uniq = value
            elif value and name == _KEYS_NAME:
                keys = value
    return uniq.decode("utf-8", "replace"), keys.decode("utf-8", "replace")


# `properties_index_keys`, compiled where the build allows (raftmq.hotpath).
PROPERTIES_INDEX_KEYS = compiled_or("properties_index_keys", properties_index_keys)
