"""Encoding and decoding of one remoting frame, with either header serialization.

The frame is `RemotingCommand.encode()` / `NettyDecoder` + `RemotingCommand.decode()`;
all integers are big-endian:

    +--------------+------------------------------+---------------+------+
    | length (u32) | serialize type (u8) | hlen (u24) | header (hlen) | body |
    +--------------+------------------------------+---------------+------+

`length` counts everything after itself: 4 + hlen + len(body). The body is opaque
bytes. The header is one of:

JSON (type 0, `RemotingSerializable`): fastjson's rendering of the command, keys in
alphabetical order, no spaces, `remark` left out when null::

    {"code":10,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":1,
     "serializeTypeCurrentRPC":"JSON","version":409}

We always write `extFields`, even empty: Java clients call
`response.getExtFields().get(...)` on a send result without a null check.

ROCKETMQ (type 1, `RocketMQSerializable`)::

    short code | byte language | short version | int opaque | int flag
    | int remarkLen | remark | int extLen | { short keyLen | key | int valLen | val }*

A zero remark length means no remark.

Everything a peer sends is untrusted: `decode` and `FrameDecoder` (in frames.py) report
any malformed input as `RemotingError` and nothing else, and every length is checked
against the bytes actually present before anything is allocated, so a hostile length
field can neither exhaust memory nor make a reader wait for bytes that never come.

Where Java is lenient we follow it, because real clients rely on it: text that is
not valid UTF-8 decodes with replacement characters (Java's `new String(bytes,
UTF_8)`); JSON `extFields` values that are numbers, booleans or objects become
strings (`ali-ons` sends `"queueId":1` and `"k":false`), and null values are dropped;
an unknown language decodes as OTHER. Where Java would misbehave we refuse: a
negative or overlong length, trailing bytes inside a ROCKETMQ header, or a JSON
header that is not an object with integer fields.
"""

from __future__ import annotations

import dataclasses
import json
import struct

import orjson

from raftmq.hotpath import compiled_or
from raftmq.remoting.codes import LanguageCode, SerializeType
from raftmq.remoting.command import FLAG_RESPONSE, RemotingCommand
from raftmq.remoting.errors import RemotingError

__all__ = [
    "MAX_FRAME_BYTES",
    "MAX_HEADER_BYTES",
    "RAW_REQUEST",
    "RawRequest",
    "RemotingError",
    "as_command",
    "check_frame_length",
    "decode",
    "decode_payload",
    "encode",
    "encode_header",
    "encode_prefix",
    "java_string",
    "plain_request",
    "raw_command",
]

# Netty's LengthFieldBasedFrameDecoder limit, `com.rocketmq.remoting.frameMaxLength`
# (16 MiB), which counts the 4-byte length field too.
MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 0xFFFFFF  # the header length has 24 bits

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_FRAME_PREFIX = struct.Struct(">II")  # length, serialize type << 24 | header length
_RMQ_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_RMQ_MIN_HEADER = _RMQ_FIXED.size + 8  # + remark length + ext length

_INT16 = (-(1 << 15), (1 << 15) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_MAX_KEY_BYTES = (1 << 15) - 1  # Java writes the key length as a signed short

_LANGUAGES = tuple(LanguageCode)  # index = byte value: the codes are 0..12 without gaps
_LANGUAGE_BY_NAME = LanguageCode.__members__
_JSON = SerializeType.JSON
_ROCKETMQ = SerializeType.ROCKETMQ


# ---------------------------------------------------------------------------- encode


def java_string(value, key: object = "?") -> str | None:
    """A header value as Java's `String.valueOf` spells it; None (dropped) for None.

    bool -> "true"/"false" (not Python's "True"), int -> decimal, str -> itself.
    Floats use Python's repr, which differs from Java's `Double.toString` only in
    exponent style; RocketMQ's own headers carry no floats.
    """
    if type(value) is str:
        return value
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return str(value)
    kind = type(value).__name__
    raise RemotingError(f"ext field {key!r}: cannot send a {kind} as a header value")


def _check_int(value, name: str, bounds: tuple[int, int]) -> int:
    if not isinstance(value, int):
        raise RemotingError(f"{name} must be an int, not {type(value).__name__}")
    low, high = bounds
    if not low <= value <= high:
        raise RemotingError(f"{name} {value} does not fit the header's {low}..{high}")
    return int(value)


def _language(cmd: RemotingCommand) -> LanguageCode:
    try:
        return LanguageCode(cmd.language)
    except ValueError:
        raise RemotingError(f"unknown language {cmd.language!r}") from None


def _remark(cmd: RemotingCommand) -> str | None:
    remark = cmd.remark
    if remark is not None and not isinstance(remark, str):
        raise RemotingError(f"remark must be a str, not {type(remark).__name__}")
    return remark


def _ext_strings(ext_fields) -> dict[str, str]:
    if not ext_fields:
        return {}
    out = {}
    for key, value in ext_fields.items():
        if not isinstance(key, str):
            raise RemotingError(f"ext field name {key!r} is not a str")
        text = value if type(value) is str else java_string(value, key)
        if text is not None:
            out[key] = text
    return out


def _utf8(text: str) -> bytes:
    # Lone surrogates become "?", as Java's String.getBytes(UTF_8) does.
    return text.encode("utf-8", "replace")


def _encode_json(cmd: RemotingCommand) -> bytes:
    header = {
        "code": _check_int(cmd.code, "code", _INT32),
        "extFields": _ext_strings(cmd.ext_fields),
        "flag": _check_int(cmd.flag, "flag", _INT32),
        "language": _language(cmd).name,
        "opaque": _check_int(cmd.opaque, "opaque", _INT32),
    }
    remark = _remark(cmd)
    if remark is not None:
        header["remark"] = remark
    header["serializeTypeCurrentRPC"] = "JSON"
    header["version"] = _check_int(cmd.version, "version", _INT32)
    try:
        return orjson.dumps(header)  # the same bytes as the encoder below, faster
    except orjson.JSONEncodeError:  # a lone surrogate, which Java writes as "?"
        return _utf8(_JSON_ENCODER.encode(header))


def _encode_rocketmq(cmd: RemotingCommand) -> bytes:
    fixed = _RMQ_FIXED.pack(
        _check_int(cmd.code, "code", _INT16),
        _language(cmd),
        _check_int(cmd.version, "version", _INT16),
        _check_int(cmd.opaque, "opaque", _INT32),
        _check_int(cmd.flag, "flag", _INT32),
    )
    remark = _remark(cmd)
    remark_bytes = _utf8(remark) if remark else b""
    parts = []
    for key, value in _ext_strings(cmd.ext_fields).items():
        key_bytes = _utf8(key)
        if len(key_bytes) > _MAX_KEY_BYTES:
            raise RemotingError(f"ext field name of {len(key_bytes)} bytes is too long")
        value_bytes = _utf8(value)
        parts += (_I16.pack(len(key_bytes)), key_bytes, _I32.pack(len(value_bytes)), value_bytes)
    ext = b"".join(parts)
    return b"".join((fixed, _I32.pack(len(remark_bytes)), remark_bytes, _I32.pack(len(ext)), ext))


def encode_header(cmd: RemotingCommand) -> bytes:
    """The header alone, in `cmd.serialize_type`; RemotingError if it cannot be encoded."""
    serialize_type = cmd.serialize_type
    if serialize_type == _JSON:
        return _encode_json(cmd)
    if serialize_type == _ROCKETMQ:
        return _encode_rocketmq(cmd)
    raise RemotingError(f"unknown serialize type {serialize_type!r}")


def encode_prefix(cmd: RemotingCommand, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Everything before the body: length, type + header length, header.

    Like Java's `encodeHeader(bodyLength)`, this lets a writer append the body
    without first concatenating it to the header. Raises RemotingError for a command
    that cannot be encoded or a frame over `max_frame_bytes` (the receiver would only
    drop the connection over it).
    """
    header = encode_header(cmd)
    header_length = len(header)
    if header_length > MAX_HEADER_BYTES:
        raise RemotingError(f"header of {header_length} bytes exceeds the 24-bit length field")
    body = cmd.body
    length = 4 + header_length + (len(body) if body else 0)
    if length + 4 > max_frame_bytes:
        raise RemotingError(
            f"frame of {length + 4} bytes exceeds the {max_frame_bytes}-byte limit "
            f"(code {cmd.code})"
        )
    return _FRAME_PREFIX.pack(length, int(cmd.serialize_type) << 24 | header_length) + header


def encode(cmd: RemotingCommand, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """One whole frame as bytes."""
    prefix = encode_prefix(cmd, max_frame_bytes)
    return prefix + bytes(cmd.body) if cmd.body else prefix


# ---------------------------------------------------------------------------- decode


def check_frame_length(length: int, max_frame_bytes: int) -> None:
    """Validate a frame's length field before waiting for (or allocating) its bytes."""
    if length < 4:
        raise RemotingError(f"frame length {length} leaves no room for the header length")
    if length + 4 > max_frame_bytes:
        raise RemotingError(f"frame of {length + 4} bytes exceeds the {max_frame_bytes}-byte limit")


def decode(frame, max_frame_bytes: int = MAX_FRAME_BYTES) -> RemotingCommand:
    """One whole frame, length field included, to a command; RemotingError if malformed."""
    if not isinstance(frame, bytes | bytearray):
        frame = bytes(memoryview(frame))
    size = len(frame)
    if size < 4:
        raise RemotingError(f"frame of {size} bytes is shorter than its length field")
    (length,) = _U32.unpack_from(frame, 0)
    check_frame_length(length, max_frame_bytes)
    if length != size - 4:
        raise RemotingError(f"frame length field says {length} bytes but {size - 4} follow")
    return decode_payload(frame, 4, size)


def decode_payload(data: bytes | bytearray, start: int = 0, end: int | None = None):
    """Decode `data[start:end]`, a frame without its length field.

    Works on slices of a larger buffer so a reader can decode frames in place; only
    the header and the body are copied out.
    """
    if end is None:
        end = len(data)
    if end - start < 4:
        raise RemotingError(f"frame of {end - start} bytes has no header length")
    (ori,) = _U32.unpack_from(data, start)
    serialize_type = ori >> 24
    header_start = start + 4
    header_end = header_start + (ori & 0xFFFFFF)
    if header_end > end:
        raise RemotingError(
            f"header length {ori & 0xFFFFFF} exceeds the {end - header_start} bytes "
            "left in the frame"
        )
    if serialize_type == _JSON:
        cmd = _decode_json(data, header_start, header_end)
    elif serialize_type == _ROCKETMQ:
        cmd = _decode_rocketmq(data, header_start, header_end)
    else:
        raise RemotingError(f"unknown serialize type {serialize_type}")
    if header_end < end:
        if type(data) is bytes:
            cmd.body = data[header_end:end]
        else:
            with memoryview(data) as view:
                cmd.body = view[header_end:end].tobytes()
    return cmd


def _decode_rocketmq(data, pos: int, end: int) -> RemotingCommand:
    if end - pos < _RMQ_MIN_HEADER:
        raise RemotingError(
            f"ROCKETMQ header of {end - pos} bytes is shorter than its "
            f"{_RMQ_MIN_HEADER}-byte minimum"
        )
    code, language, version, opaque, flag = _RMQ_FIXED.unpack_from(data, pos)
    pos += _RMQ_FIXED.size
    (remark_length,) = _I32.unpack_from(data, pos)
    pos += 4
    if not 0 <= remark_length <= end - pos - 4:
        raise RemotingError(f"remark length {remark_length} does not fit the ROCKETMQ header")
    remark = data[pos : pos + remark_length].decode("utf-8", "replace") if remark_length else None
    pos += remark_length
    (ext_length,) = _I32.unpack_from(data, pos)
    pos += 4
    if ext_length != end - pos:
        raise RemotingError(
            f"extFields length {ext_length} but {end - pos} bytes are left in the ROCKETMQ header"
        )
    ext_fields = {}
    while pos < end:
        if end - pos < 2:
            raise RemotingError("extFields entry truncated inside its key length")
        (key_length,) = _I16.unpack_from(data, pos)
        pos += 2
        if not 0 <= key_length <= end - pos - 4:
            raise RemotingError(f"extFields key length {key_length} does not fit the header")
        key = data[pos : pos + key_length].decode("utf-8", "replace")
        pos += key_length
        (value_length,) = _I32.unpack_from(data, pos)
        pos += 4
        if not 0 <= value_length <= end - pos:
            raise RemotingError(f"extFields value length {value_length} does not fit the header")
        ext_fields[key] = data[pos : pos + value_length].decode("utf-8", "replace")
        pos += value_length
    return RemotingCommand(
        code=code,
        language=_LANGUAGES[language] if language < len(_LANGUAGES) else LanguageCode.OTHER,
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext_fields,
        serialize_type=_ROCKETMQ,
    )


class _JsonNumber(str):
    """A JSON number kept as its literal text, so an ext value reads as the client wrote it."""

    __slots__ = ()


def _reject_constant(name: str):
    raise RemotingError(f"{name} is not JSON")


# Built once: json.loads and json.dumps with options build a new coder on every call.
_JSON_DECODER = json.JSONDecoder(
    parse_int=_JsonNumber, parse_float=_JsonNumber, parse_constant=_reject_constant
)
_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _decode_json(data, start: int, end: int) -> RemotingCommand:
    """A JSON header. What clients send is plain — every ext value a string, the
    integer fields integers — and orjson parses that several times faster than
    `json`; anything else (numbers or nulls among the ext values, invalid UTF-8, a
    float where an int belongs) is parsed again by the exact path below."""
    try:
        header = orjson.loads(data[start:end])
    except orjson.JSONDecodeError:
        header = None
    if type(header) is dict:
        command = _plain_json_command(header)
        if command is not None:
            return command
    return _decode_json_exactly(data, start, end)


def plain_json_fields(header: dict) -> tuple | None:
    """(code, version, opaque, flag, language name, remark, ext fields) of a plain header
    (see _decode_json), or None if it is not plain. Compiled where the build allows
    (PLAIN_JSON_FIELDS): every JSON request goes through it."""
    get = header.get
    ext = get("extFields")
    if ext is None:
        ext = {}
    elif type(ext) is not dict or not all(type(value) is str for value in ext.values()):
        return None
    fields = (get("code", 0), get("version", 0), get("opaque", 0), get("flag", 0))
    for value in fields:
        if type(value) is not int or not _INT32[0] <= value <= _INT32[1]:
            return None
    language = get("language")
    remark = get("remark")
    if type(language) is not str or (remark is not None and type(remark) is not str):
        return None
    return (*fields, language, remark, ext)


PLAIN_JSON_FIELDS = compiled_or("plain_json_fields", plain_json_fields)


def _plain_json_command(header: dict) -> RemotingCommand | None:
    """The command a plain header (see _decode_json) spells, or None if it is not plain."""
    fields = PLAIN_JSON_FIELDS(header)
    if fields is None:
        return None
    code, version, opaque, flag, language, remark, ext = fields
    return RemotingCommand(
        code=code,
        language=_LANGUAGE_BY_NAME.get(language, LanguageCode.OTHER),
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        serialize_type=_JSON,
    )


@dataclasses.dataclass(slots=True, eq=False)
class RawRequest:
    """What a server's hot path needs of a request without the dict and the
    RemotingCommand (`plain_request`): its frame `src[start:end]` (no length field), its
    code, opaque, flag and body, and the values of the ext fields the server named
    (None where absent). `raw_command` decodes it when needed. Where the extension is
    built, RAW_REQUEST is its cdef class of the same fields (tests/test_hotpath.py
    holds the two equal), and every raw request is made of it."""

    src: bytes | bytearray
    start: int
    end: int
    code: int
    opaque: int
    flag: int
    body: bytes
    values: tuple[str | None, ...]

    def fields(self) -> tuple:
        """Its fields, in order: what equality compares."""
        return dataclasses.astuple(self)

    def __eq__(self, other) -> bool:
        fields = getattr(other, "fields", None)
        return NotImplemented if fields is None else self.fields() == fields()


RAW_REQUEST = compiled_or("RawRequest", RawRequest)


def plain_request(src, start: int, end: int, codes, names: tuple[str, ...]) -> RawRequest | None:
    """The frame `src[start:end]` (no length field) as a raw request (RAW_REQUEST), if
    it is a request whose code is in `codes` with a plain JSON header (see
    _decode_json); else None, for `decode_payload`. Never raises: a malformed frame is
    `decode_payload`'s to report. Compiled where the build allows (PLAIN_REQUEST), for
    the compact ASCII headers clients send; anything else it hands to this function."""
    if end - start < 4:
        return None
    (ori,) = _U32.unpack_from(src, start)
    header_end = start + 4 + (ori & 0xFFFFFF)
    if ori >> 24 != _JSON or header_end > end:
        return None
    try:
        header = orjson.loads(src[start + 4 : header_end])
    except orjson.JSONDecodeError:
        return None
    fields = PLAIN_JSON_FIELDS(header) if type(header) is dict else None
    if fields is None:
        return None
    code, _version, opaque, flag, _language, _remark, ext = fields
    if flag & FLAG_RESPONSE or code not in codes:
        return None
    body = bytes(src[header_end:end])
    values = tuple([ext.get(name) for name in names])
    return RAW_REQUEST(src, start, end, code, opaque, flag, body, values)


PLAIN_REQUEST = compiled_or("plain_request", plain_request)


def raw_command(raw: RawRequest) -> RemotingCommand:
    """The command a raw request (`plain_request`) is, decoded as any frame is."""
    return decode_payload(raw.src, raw.start, raw.end)


def as_command(request: RemotingCommand | RawRequest) -> RemotingCommand:
    """`request` as a command: a raw one decoded, a command as it is."""
    return raw_command(request) if type(request) is RAW_REQUEST else request


def _decode_json_exactly(data, start: int, end: int) -> RemotingCommand:
    text = data[start:end].decode("utf-8", "replace")
    try:
        header = _JSON_DECODER.decode(text)
    except RemotingError:
        raise
    except (ValueError, RecursionError) as exc:
        raise RemotingError(f"JSON header does not parse: {exc}") from None
    if not isinstance(header, dict):
        raise RemotingError(f"JSON header is a {_json_kind(header)}, not an object")
    get = header.get
    ext = get("extFields")
    if ext is None:
        ext_fields = {}
    elif isinstance(ext, dict):
        ext_fields = {}
        for key, value in ext.items():
            text = _json_to_string(value)
            if text is not None:
                ext_fields[key] = text
    else:
        raise RemotingError(f"extFields is a {_json_kind(ext)}, not an object")
    return RemotingCommand(
        code=_json_int(get("code"), "code"),
        language=_json_language(get("language")),
        version=_json_int(get("version"), "version"),
        opaque=_json_int(get("opaque"), "opaque"),
        flag=_json_int(get("flag"), "flag"),
        remark=_json_to_string(get("remark")),
        ext_fields=ext_fields,
        serialize_type=_JSON,
    )


def _json_int(value, name: str) -> int:
    """A Java `int` field: absent or null is 0, as for a Java primitive."""
    if value is None:
        return 0
    if type(value) is _JsonNumber:
        try:
            number = int(value)
        except ValueError:
            raise RemotingError(f"JSON header {name} {value} is not an integer") from None
        if _INT32[0] <= number <= _INT32[1]:
            return number
        raise RemotingError(f"JSON header {name} {value} does not fit a Java int")
    raise RemotingError(f"JSON header {name} is a {_json_kind(value)}, not a number")


def _json_language(value) -> LanguageCode:
    if value is None:
        return LanguageCode.JAVA  # Java's default
    if type(value) is str:
        return _LANGUAGE_BY_NAME.get(value, LanguageCode.OTHER)
    if type(value) is _JsonNumber:  # fastjson also reads an enum from its ordinal
        try:
            ordinal = int(value)
        except ValueError:
            return LanguageCode.OTHER
        return _LANGUAGES[ordinal] if 0 <= ordinal < len(_LANGUAGES) else LanguageCode.OTHER
    raise RemotingError(f"JSON header language is a {_json_kind(value)}, not a name")


def _json_to_string(value) -> str | None:
    """A JSON value as the string fastjson would store in a `String` field."""
    if type(value) is str:
        return value
    if value is None:
        return None
    if type(value) is _JsonNumber:
        return str(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    try:
        return _json_text(value)
    except RecursionError:
        raise RemotingError("JSON header value is nested too deeply") from None


def _json_text(value) -> str:
    """Compact JSON text of a parsed value, numbers as they were written."""
    if type(value) is _JsonNumber:
        return str(value)
    if isinstance(value, dict):
        items = (json.dumps(k, ensure_ascii=False) + ":" + _json_text(v) for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _json_kind(value) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "number" if type(value) is _JsonNumber else "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else type(value).__name__
