"""Message ids: the broker's offset msgId and the client's UNIQ_KEY.

RocketMQ gives a message two ids, and both are upper-case hex of a few big-endian
fields, so they cannot be told apart by their look (both are 32 characters with IPv4):

* The **offset msgId** (`MessageDecoder.createMessageId` / `decodeMessageId`) is made
  by the broker: store host ip (4 bytes, or 16 for IPv6) + port (4) + the message's
  physical offset in the CommitLog (8). 32 characters, or 56 with an IPv6 store host.
  VIEW_MESSAGE_BY_ID, CONSUMER_SEND_MSG_BACK and END_TRANSACTION resolve it by
  physical offset, so it only works if the physical offset is the same on every
  replica; with DLedger it is the entry position + 48, chosen by the leader and
  written at the same position everywhere, so the id survives failover.
* The **UNIQ_KEY** (`MessageClientIDSetter`) is made by the producer and travels in
  the `UNIQ_KEY` property: ip (4 or 16) + pid (2) + class-loader hash (4) + milliseconds
  since the start of the month (4) + counter (2). The Java client reports it as
  `SendResult.msgId`; the broker only keeps it (and makes one for messages it
  produces itself, with the same layout, so tools that parse it keep working).

Hosts are `(ip, port)` tuples, the shape of a socket address. An IPv4-mapped IPv6
address (`::ffff:a.b.c.d`) packs as 4 bytes, as Java's `InetAddress` turns such an
address into an `Inet4Address`.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import itertools
import os
import random
import socket
import struct
import time
from collections.abc import Callable

import attrs

Host = tuple[str, int]

_V4_MAPPED_PREFIX = b"\x00" * 10 + b"\xff\xff"
_PORT = struct.Struct(">i")
_OFFSET = struct.Struct(">q")


@functools.lru_cache(maxsize=4096)
def pack_ip(ip: str) -> bytes:
    """The address bytes Java's `InetAddress.getAddress()` gives: 4 for IPv4, else 16.

    Raises ValueError for text that is not an IP address literal. Cached: the same
    few addresses (the store host, the clients') are packed for every message.
    """
    try:
        return socket.inet_pton(socket.AF_INET, ip)
    except (OSError, TypeError, ValueError):
        pass
    try:
        packed = socket.inet_pton(socket.AF_INET6, ip)
    except (OSError, TypeError, ValueError):
        raise ValueError(f"not an IP address: {ip!r}") from None
    if packed.startswith(_V4_MAPPED_PREFIX):
        return packed[12:]
    return packed


def unpack_ip(packed: bytes) -> str:
    """Text of a 4- or 16-byte address (IPv6 in `ipaddress`'s canonical RFC 5952 form,
    which, unlike inet_ntop, does not write IPv4-compatible addresses dotted)."""
    if len(packed) == 4:
        return socket.inet_ntop(socket.AF_INET, packed)
    if len(packed) == 16:
        return str(ipaddress.IPv6Address(packed))
    raise ValueError(f"an IP address is 4 or 16 bytes, not {len(packed)}")


def pack_host(host: Host) -> bytes:
    """ip bytes + 4-byte port: `MessageExt.getStoreHostBytes()` (8 or 20 bytes)."""
    ip, port = host
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} out of range")
    return pack_ip(ip) + _PORT.pack(port)


# --- the offset msgId --------------------------------------------------------------


@attrs.frozen(slots=True)
class MessageId:
    """A decoded offset msgId: the store host and the CommitLog physical offset."""

    host: Host
    offset: int


def create_message_id(store_host: Host, physical_offset: int) -> str:
    """The offset msgId of the message at `physical_offset` stored by `store_host`.

    `MessageDecoder.createMessageId`: hex of ip + port(int) + offset(long), upper case.
    """
    return message_id_from_bytes(pack_host(store_host), physical_offset)


def message_id_from_bytes(store_host_bytes: bytes, physical_offset: int) -> str:
    """The offset msgId from raw store-host bytes (ip + port, 8 or 20 bytes), as read
    straight out of a stored record."""
    if len(store_host_bytes) not in (8, 20):
        raise ValueError(f"a store host is 8 or 20 bytes, not {len(store_host_bytes)}")
    return (bytes(store_host_bytes) + _OFFSET.pack(physical_offset)).hex().upper()


def decode_message_id(msg_id: str) -> MessageId:
    """Parse an offset msgId (`MessageDecoder.decodeMessageId`).

    32 hex characters mean an IPv4 store host, 56 an IPv6 one; anything else raises
    ValueError. Lower-case hex is accepted (Java upper-cases before parsing).
    """
    raw = _unhex(msg_id, (32, 56), "offset msgId")
    ip_len = 4 if len(raw) == 16 else 16
    ip = unpack_ip(raw[:ip_len])
    (port,) = _PORT.unpack_from(raw, ip_len)
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"offset msgId {msg_id!r}: port {port} out of range")
    (offset,) = _OFFSET.unpack_from(raw, ip_len + 4)
    return MessageId((ip, port), offset)


def _unhex(text: str, lengths: tuple[int, ...], what: str) -> bytes:
    if not isinstance(text, str) or len(text) not in lengths:
        raise ValueError(f"{what} must be {' or '.join(map(str, lengths))} hex characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not hex") from None


# --- the client's UNIQ_KEY -----------------------------------------------------------


@attrs.frozen(slots=True)
class UniqId:
    """The fields of a UNIQ_KEY, as `MessageClientIDSetter` lays them out."""

    ip: str
    pid: int  # the low 16 bits of the producer's pid
    class_loader_hash: int  # a Java int
    millis_since_month_start: int  # unsigned 32 bits: wraps after ~49.7 days, never does
    counter: int  # unsigned 16 bits, wraps


def parse_uniq_id(uniq_id: str) -> UniqId:
    """Split a UNIQ_KEY into its fields; ValueError if it is not 32 or 56 hex characters."""
    raw = _unhex(uniq_id, (32, 56), "UNIQ_KEY")
    ip_len = len(raw) - 12
    pid, class_loader_hash, millis, counter = struct.unpack_from(">HiIH", raw, ip_len)
    return UniqId(unpack_ip(raw[:ip_len]), pid, class_loader_hash, millis, counter)


def month_start_ms(now_ms: int, tz: datetime.tzinfo | None = None) -> int:
    """Midnight on the first of `now_ms`'s month in `tz` (None: local time, as Java's
    `Calendar.getInstance()`), in epoch milliseconds."""
    moment = datetime.datetime.fromtimestamp(now_ms / 1000, tz)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return round(start.timestamp() * 1000)


def _next_month_start_ms(start_ms: int, tz: datetime.tzinfo | None) -> int:
    start = datetime.datetime.fromtimestamp(start_ms / 1000, tz)
    if start.month == 12:
        following = start.replace(year=start.year + 1, month=1)
    else:
        following = start.replace(month=start.month + 1)
    return round(following.timestamp() * 1000)


def uniq_id_nearly_time(
    uniq_id: str, now_ms: int | None = None, tz: datetime.tzinfo | None = None
) -> int:
    """When a UNIQ_KEY was made, in epoch ms (`MessageClientIDSetter.getNearlyTimeFromID`).

    The id holds only milliseconds since a month's start; like Java, assume the
    current month unless that would be in the future, then the previous one.
    """
    span = parse_uniq_id(uniq_id).millis_since_month_start
    now = int(time.time() * 1000) if now_ms is None else now_ms
    start = month_start_ms(now, tz)
    if start + span >= now:
        previous = datetime.datetime.fromtimestamp(start / 1000, tz)
        if previous.month == 1:
            previous = previous.replace(year=previous.year - 1, month=12)
        else:
            previous = previous.replace(month=previous.month - 1)
        start = round(previous.timestamp() * 1000)
    return start + span


def fake_ip(now_ms: int) -> bytes:
    """`MessageClientIDSetter.createFakeIP`: the low 4 bytes of the current time, used
    when the host has no usable address."""
    return struct.pack(">q", now_ms)[4:]


class UniqIdGenerator:
    """Makes UNIQ_KEYs the way `MessageClientIDSetter.createUniqID` does.

    The fixed prefix (ip + pid + class-loader hash) is computed once; each id adds the
    milliseconds since the start of the current month (recomputed when a month ends)
    and a 16-bit counter. `clock_ms` and `tz` are injectable so tests are exact.
    Not thread-safe; a broker calls it from its event loop.
    """

    def __init__(
        self,
        ip: str | None = None,
        pid: int | None = None,
        class_loader_hash: int | None = None,
        clock_ms: Callable[[], int] | None = None,
        tz: datetime.tzinfo | None = None,
    ) -> None:
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._tz = tz
        ip_bytes = pack_ip(ip) if ip is not None else fake_ip(self._clock_ms())
        pid = os.getpid() if pid is None else pid
        if class_loader_hash is None:  # Java: an identity hash code, any int
            class_loader_hash = random.getrandbits(32) - (1 << 31)
        self._prefix = ip_bytes + struct.pack(">Hi", pid & 0xFFFF, class_loader_hash)
        self._counter = itertools.count()
        self._start_ms = 0
        self._next_start_ms = 0

    def next_id(self) -> str:
        now = self._clock_ms()
        if now >= self._next_start_ms or now < self._start_ms:
            self._start_ms = month_start_ms(now, self._tz)
            self._next_start_ms = _next_month_start_ms(self._start_ms, self._tz)
        tail = struct.pack(">IH", (now - self._start_ms) & 0xFFFFFFFF, next(self._counter) & 0xFFFF)
        return (self._prefix + tail).hex().upper()
