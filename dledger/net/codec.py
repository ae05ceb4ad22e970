"""Wire encoding of peer messages and client RPCs (msgpack).

Peer messages travel as a msgpack array `[KIND, field values in attrs field order]`
rather than a map: field names would roughly double the size of a heartbeat and the
per-key work would dominate decoding at tens of thousands of messages per second.
Positional order is the schema, so a field is only ever added at the end of its
message, with a default: during a rolling upgrade a member drops the fields a newer
peer appends and gives the ones an older peer leaves off their defaults.

Everything a peer or a client sends is untrusted, so decoding checks the shape and
the type of every field and reports any problem as one exception type, `FrameError`:
the transport then drops that connection instead of handing the core a message whose
`term` is a string. Anything else escaping a decoder is a bug (the tests fuzz this).

Client RPCs are plain maps, `{"code", "opaque", "group", ...}` for requests and
`{"code", "opaque", "remark", ...}` for responses, the shape of DLedger's
`RemotingCommand` + JSON body, so a CLI or a load generator can build them by hand.
"""

from __future__ import annotations

import threading
import types
from enum import IntEnum
from operator import attrgetter

import attrs
import msgpack
from raftmq.dledger.codes import RequestCode
from raftmq.dledger.core.messages import MESSAGE_TYPES

__all__ = [
    "INT_LIMIT",
    "FrameError",
    "RpcCode",
    "decode_message",
    "decode_rpc",
    "encode_message",
    "encode_rpc",
]


class FrameError(ValueError):
    """Bytes from the network that are not a valid frame, peer message or RPC."""


class RpcCode(IntEnum):
    """Request codes of the client-facing RPCs.

    The first three and LEADERSHIP_TRANSFER are DLedger's (`DLedgerRequestCode`);
    STATUS and MEMBERS are ours (an admin snapshot of a replica, a change of its
    group's members), numbered well away from
    DLedger's range so a future DLedger code cannot collide with it.
    """

    METADATA = RequestCode.METADATA
    APPEND = RequestCode.APPEND
    GET = RequestCode.GET
    LEADERSHIP_TRANSFER = RequestCode.LEADERSHIP_TRANSFER
    STATUS = 59000
    MEMBERS = 59001  # ours: add a learner, promote it, remove a member (core.membership)


_unpackb = msgpack.unpackb
_NoneType = type(None)
# Every int field (terms, indexes, positions, seqs) must lie within this bound. Real
# values never come near it, and it keeps the arithmetic on them (term + 1, index + 1)
# inside the signed 64 bits the store writes: a forged term of 2**63 would otherwise be
# adopted by the group and fail the first entry written in it.
INT_LIMIT = 2**62


def _term_runs(value: tuple) -> list[tuple[int, int]]:
    """Validate `[[first_index, term], ...]` (decoded as tuples) into a list of pairs."""
    for run in value:
        if (
            type(run) is not tuple
            or len(run) != 2
            or type(run[0]) is not int
            or type(run[1]) is not int
            or not -INT_LIMIT <= run[0] <= INT_LIMIT
            or not -INT_LIMIT <= run[1] <= INT_LIMIT
        ):
            raise FrameError(f"term_runs must be [first_index, term] int pairs, got {run!r:.80}")
    return list(value)


def _enum_converter(enum_cls: type[IntEnum]):
    members = {int(m): m for m in enum_cls}
    name = enum_cls.__name__

    def convert(value: int) -> IntEnum:
        member = members.get(value)
        if member is None:
            raise FrameError(f"{value} is not a valid {name}")
        return member

    return convert


def _field_rule(cls: type, field: attrs.Attribute) -> tuple[tuple[type, ...], object]:
    """(accepted exact types, converter or None) for one message field.

    Exact types (`type(v) in allowed`) rather than isinstance so a msgpack boolean is
    not accepted as an int. An unknown annotation fails at import time, which forces
    whoever adds a field of a new type to teach the codec about it.
    """
    tp = field.type
    if field.name == "term_runs":
        return (tuple,), _term_runs
    if isinstance(tp, type) and issubclass(tp, IntEnum):
        return (int,), _enum_converter(tp)
    if tp in (str, int, bytes):
        return (tp,), None
    if isinstance(tp, types.UnionType) and set(tp.__args__) == {str, _NoneType}:
        return (str, _NoneType), None
    raise TypeError(f"codec cannot encode {cls.__name__}.{field.name}: {tp!r}")


@attrs.frozen
class _Spec:
    cls: type
    kind: int
    names: tuple[str, ...]
    getter: attrgetter
    allowed: tuple[tuple[type, ...], ...]
    converters: tuple[tuple[int, object], ...]  # (position, converter)
    defaults: tuple[object, ...]  # per field, attrs.NOTHING where a sender may not omit it
    fast_decode: object = None


def _compile_fast_decoder(spec: _Spec):
    """Generate `decode(obj)` for one class: unpack, type-check, convert, construct.

    A generated straight-line function (the technique attrs uses for `__init__`)
    runs about twice as fast as a loop over per-field rules, and decoding is on the
    path of every message a replica receives. It returns None when a field has the
    wrong type, and `_decode_slowly` then names the culprit.
    """
    env: dict[str, object] = {"cls": spec.cls, "NoneType": _NoneType, "L": INT_LIMIT}
    checks, args = [], []
    converters = dict(spec.converters)
    for i, allowed in enumerate(spec.allowed):
        if len(allowed) == 1:
            env[f"t{i}"] = allowed[0]
            checks.append(f"type(v{i}) is not t{i}")
            if allowed[0] is int and i not in converters:
                checks.append(f"not -L <= v{i} <= L")
        else:
            env[f"a{i}"] = allowed
            checks.append(f"type(v{i}) not in a{i}")
        if i in converters:
            env[f"c{i}"] = converters[i]
            args.append(f"c{i}(v{i})")
        else:
            args.append(f"v{i}")
    variables = ", ".join(f"v{i}" for i in range(len(spec.allowed)))
    source = (
        f"def decode(obj):\n"
        f"    _, {variables} = obj\n"
        f"    if {' or '.join(checks)}:\n"
        f"        return None\n"
        f"    return cls({', '.join(args)})\n"
    )
    exec(compile(source, f"<codec decoder for {spec.cls.__name__}>", "exec"), env)
    return env["decode"]


def _build_specs() -> tuple[dict[type, _Spec], dict[int, _Spec]]:
    by_class: dict[type, _Spec] = {}
    by_kind: dict[int, _Spec] = {}
    for cls in MESSAGE_TYPES:
        attrs.resolve_types(cls)
        fields = attrs.fields(cls)
        rules = [_field_rule(cls, f) for f in fields]
        names = tuple(f.name for f in fields)
        spec = _Spec(
            cls=cls,
            kind=int(cls.KIND),
            names=names,
            getter=attrgetter(*names),
            allowed=tuple(allowed for allowed, _ in rules),
            converters=tuple((i, conv) for i, (_, conv) in enumerate(rules) if conv is not None),
            # a field with a factory default (a list) cannot be left off: none is last
            defaults=tuple(
                attrs.NOTHING if isinstance(f.default, attrs.Factory) else f.default for f in fields
            ),
        )
        spec = attrs.evolve(spec, fast_decode=_compile_fast_decoder(spec))
        if spec.kind in by_kind:
            raise TypeError(f"duplicate message KIND {spec.kind}")
        by_class[cls] = spec
        by_kind[spec.kind] = spec
    return by_class, by_kind


_BY_CLASS, _BY_KIND = _build_specs()
_packers = threading.local()


def _packer() -> msgpack.Packer:
    """A Packer per thread: reusing one saves ~1 us a message over `packb`, which builds
    a new Packer per call; per thread because a Packer's buffer is not thread-safe."""
    packer = _packers.__dict__.get("packer")
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer


def encode_message(msg) -> bytes:
    """`[KIND, *fields]` as msgpack; IntEnums pack as plain ints, tuples as arrays."""
    spec = _BY_CLASS.get(type(msg))
    if spec is None:
        raise TypeError(f"not a peer message: {type(msg).__name__}")
    return _packer().pack((spec.kind, *spec.getter(msg)))


def decode_message(data):
    """Rebuild a message from `encode_message` output; any defect raises FrameError."""
    try:
        obj = _unpackb(data, raw=False, use_list=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types; a peer's bytes
        raise FrameError(f"undecodable peer message: {exc}") from None
    if type(obj) is not tuple or not obj or type(obj[0]) is not int:
        raise FrameError("peer message must be an array starting with an int KIND")
    spec = _BY_KIND.get(obj[0])
    if spec is None:
        raise FrameError(f"unknown peer message KIND {obj[0]}")
    if len(obj) != len(spec.names) + 1:
        obj = _fitted(spec, obj)
    msg = spec.fast_decode(obj)
    if msg is None:
        _decode_slowly(spec, obj)
    return msg


def _fitted(spec: _Spec, obj: tuple) -> tuple:
    """A message of a peer of another version: the fields a newer one appended are
    dropped, those an older one did not have yet take their defaults; FrameError if
    one of those has no default (the peers cannot understand each other)."""
    known, given = len(spec.names), len(obj) - 1
    if given > known:
        return obj[: known + 1]
    missing = spec.defaults[given:]
    if attrs.NOTHING in missing:
        raise FrameError(f"{spec.cls.__name__} needs {known} fields, got {given}")
    return obj + missing


def _decode_slowly(spec: _Spec, obj: tuple) -> None:
    """Find the field the fast decoder rejected and raise FrameError naming it."""
    for value, allowed, name in zip(obj[1:], spec.allowed, spec.names, strict=True):
        if type(value) not in allowed:
            raise FrameError(
                f"{spec.cls.__name__}.{name}: unexpected {type(value).__name__} {value!r:.80}"
            )
        if type(value) is int and not -INT_LIMIT <= value <= INT_LIMIT:
            raise FrameError(f"{spec.cls.__name__}.{name}: {value} is out of range")
    raise AssertionError("fast decoder rejected a well-typed message")  # pragma: no cover


def encode_rpc(obj: dict) -> bytes:
    """A client RPC request or response map as msgpack (enums pack as ints)."""
    return _packer().pack(obj)


def decode_rpc(data) -> dict:
    """A client RPC map; it must carry int `code` and `opaque`, else FrameError."""
    try:
        obj = _unpackb(data, raw=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types; a peer's bytes
        raise FrameError(f"undecodable RPC: {exc}") from None
    if type(obj) is not dict:
        raise FrameError(f"RPC must be a map, got {type(obj).__name__}")
    if type(obj.get("code")) is not int or type(obj.get("opaque")) is not int:
        raise FrameError("RPC needs int 'code' and 'opaque'")
    return obj
