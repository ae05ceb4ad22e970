"""The controller's log entries: RocketMQ's five events, as RocketMQ writes them.

An entry is a big-endian int16 event type followed by the event's fields as JSON, with
RocketMQ's field names (`EventSerializer`): 1 AlterSyncStateSet, 2 ApplyBrokerId,
3 ElectMaster, 5 CleanBrokerData, 6 UpdateBrokerAddress (4, Read, is never written).
An entry that is not one of these (a new leader's empty entry, or bytes from a newer
version) decodes to None and changes nothing.
"""

from __future__ import annotations

import json
import struct

import attrs

__all__ = [
    "AlterSyncStateSet",
    "ApplyBrokerId",
    "CleanBrokerData",
    "ElectMaster",
    "Event",
    "UpdateBrokerAddress",
    "decode",
    "encode",
]

_TYPE = struct.Struct(">h")


@attrs.frozen
class AlterSyncStateSet:
    broker_name: str
    new_sync_state_set: frozenset[int]


@attrs.frozen
class ApplyBrokerId:
    cluster_name: str
    broker_name: str
    broker_address: str
    register_check_code: str
    new_broker_id: int


@attrs.frozen
class ElectMaster:
    """`new_master_elected=False`: the master is gone and no one replaced it."""

    new_master_elected: bool
    broker_name: str
    new_master_broker_id: int | None = None


@attrs.frozen
class CleanBrokerData:
    """`broker_id_set_to_clean` None: the whole group."""

    broker_name: str
    broker_id_set_to_clean: frozenset[int] | None = None


@attrs.frozen
class UpdateBrokerAddress:
    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int


Event = AlterSyncStateSet | ApplyBrokerId | ElectMaster | CleanBrokerData | UpdateBrokerAddress

# event type -> (class, (JSON field, attribute, kind)); kind "ids" is a set of brokerIds
_FIELDS: dict[int, tuple[type, tuple[tuple[str, str, str], ...]]] = {
    1: (
        AlterSyncStateSet,
        (("brokerName", "broker_name", "str"), ("newSyncStateSet", "new_sync_state_set", "ids")),
    ),
    2: (
        ApplyBrokerId,
        (
            ("clusterName", "cluster_name", "str"),
            ("brokerName", "broker_name", "str"),
            ("brokerAddress", "broker_address", "str"),
            ("registerCheckCode", "register_check_code", "str"),
            ("newBrokerId", "new_broker_id", "int"),
        ),
    ),
    3: (
        ElectMaster,
        (
            ("newMasterElected", "new_master_elected", "bool"),
            ("brokerName", "broker_name", "str"),
            ("newMasterBrokerId", "new_master_broker_id", "int?"),
        ),
    ),
    5: (
        CleanBrokerData,
        (
            ("brokerName", "broker_name", "str"),
            ("brokerIdSetToClean", "broker_id_set_to_clean", "ids?"),
        ),
    ),
    6: (
        UpdateBrokerAddress,
        (
            ("clusterName", "cluster_name", "str"),
            ("brokerName", "broker_name", "str"),
            ("brokerAddress", "broker_address", "str"),
            ("brokerId", "broker_id", "int"),
        ),
    ),
}
_TYPE_OF = {cls: code for code, (cls, _) in _FIELDS.items()}


def encode(event: Event) -> bytes:
    code = _TYPE_OF[type(event)]
    fields = {}
    for name, attr, kind in _FIELDS[code][1]:
        value = getattr(event, attr)
        fields[name] = sorted(value) if kind.startswith("ids") and value is not None else value
    return _TYPE.pack(code) + json.dumps(fields, separators=(",", ":")).encode()


def _field(fields: dict, name: str, kind: str):
    value = fields.get(name)
    if value is None and kind.endswith("?"):
        return None
    kind = kind.rstrip("?")
    if kind == "ids":
        if not isinstance(value, list) or not all(type(i) is int for i in value):
            raise ValueError(f"{name} is not a list of brokerIds")
        return frozenset(value)
    expected = {"str": str, "int": int, "bool": bool}[kind]
    if type(value) is not expected:
        raise ValueError(f"{name} is not a {kind}")
    return value


def decode(entry: bytes) -> Event | None:
    """The event in a log entry; None for an entry that holds none (see the module)."""
    if len(entry) < _TYPE.size:
        return None
    (code,) = _TYPE.unpack_from(entry)
    known = _FIELDS.get(code)
    if known is None:
        return None
    cls, spec = known
    fields = json.loads(entry[_TYPE.size :])
    if not isinstance(fields, dict):
        raise ValueError(f"event {code} is not a JSON object")
    return cls(**{attr: _field(fields, name, kind) for name, attr, kind in spec})
