"""RocketMQ's white-list address patterns (`RemoteAddressStrategyFactory`).

A pattern is one of:

- blank: matches nothing (an account without a white address);
- `*`, `*.*.*.*` or `*:*:*:*:*:*:*:*`: matches everything;
- `192.168.1.{1,2,3}`: the listed values of the last part;
- `192.168.1.1,192.168.1.2`: a list of addresses;
- `192.168.1.*`, `192.168.1-3.*`, `192.168.*.*`: IPv4 with parts that are a number,
  `*` (0-255) or a range `a-b`;
- one IPv4 or IPv6 address.

RocketMQ matches a range pattern only up to its first `*` or range part and ignores
the parts after it (`192.168.1-3.5` also admits 192.168.2.99); here every part counts.
IPv6 ranges are not supported (a list or `{...}` is). A pattern that does not parse is
a ValueError naming it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

Matcher = Callable[[str], bool]


def _nothing(_host: str) -> bool:
    return False


def _anything(_host: str) -> bool:
    return True


def _address(text: str, pattern: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(
            f"address pattern {pattern!r}: {text.strip()!r} is not an IP address"
        ) from None


def _one_of(addresses: set) -> Matcher:
    def match(host: str) -> bool:
        try:
            return ipaddress.ip_address(host) in addresses
        except ValueError:
            return False

    return match


def _part_range(part: str, pattern: str) -> range:
    part = part.strip()
    if part == "*":
        return range(256)
    low, dash, high = part.partition("-")
    try:
        bounds = (int(low), int(high)) if dash else (int(part), int(part))
    except ValueError:
        raise ValueError(f"address pattern {pattern!r}: bad part {part!r}") from None
    if not 0 <= bounds[0] <= bounds[1] <= 255:
        raise ValueError(f"address pattern {pattern!r}: part {part!r} is not within 0-255")
    return range(bounds[0], bounds[1] + 1)


def _ipv4_ranges(pattern: str) -> Matcher:
    parts = pattern.split(".")
    if len(parts) != 4:
        raise ValueError(f"address pattern {pattern!r}: expected four parts like 192.168.1.*")
    ranges = [_part_range(part, pattern) for part in parts]

    def match(host: str) -> bool:
        numbers = host.split(".")
        if len(numbers) != 4:
            return False
        try:
            return all(int(n) in r for n, r in zip(numbers, ranges, strict=True))
        except ValueError:
            return False

    return match


def address_matcher(pattern: str | None) -> Matcher:
    """A function of a host address (no port) that says whether `pattern` admits it."""
    if pattern is None or not str(pattern).strip():
        return _nothing
    pattern = str(pattern).strip()
    if pattern in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return _anything
    if pattern.endswith("}"):
        head, brace, last = pattern.rpartition("{")
        if not brace or not head or head[-1] not in ".:":
            raise ValueError(f"address pattern {pattern!r}: expected a.b.c.{{1,2}}")
        values = last[:-1].split(",")
        return _one_of({_address(head + value, pattern) for value in values})
    if "," in pattern:
        return _one_of({_address(text, pattern) for text in pattern.split(",")})
    if "*" in pattern or "-" in pattern:
        if ":" in pattern:
            raise ValueError(f"address pattern {pattern!r}: IPv6 ranges are not supported")
        return _ipv4_ranges(pattern)
    return _one_of({_address(pattern, pattern)})


def remote_host(remote_address: str) -> str:
    """The host of a connection's `host:port` or `[v6 host]:port` (RocketMQ strips the
    port the same way, at the last colon)."""
    host = remote_address.rpartition(":")[0] if ":" in remote_address else remote_address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
