"""Addresses as RocketMQ and DLedger configs write them, read in one place.

- one address: `host:port`, or `[v6]:port`;
- a list of them, RocketMQ's `namesrvAddr`: addresses joined by `;`;
- DLedger's peers string, `dLegerPeers` and `--peers`: `n0-host:port;n1-host:port`.

A bad address is a ValueError naming the text, never a default host or port.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["parse_address", "parse_address_list", "parse_peers"]


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) to (host, port); ValueError naming the bad text."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 0xFFFF:
        raise ValueError(f"bad address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def parse_address_list(addresses: str | Iterable[str]) -> tuple[str, ...]:
    """RocketMQ's `a:1;b:2` (or the addresses one by one): blanks dropped, each checked."""
    items = addresses.split(";") if isinstance(addresses, str) else addresses
    checked = tuple(filter(None, (item.strip() for item in items)))
    for address in checked:
        parse_address(address)
    return checked


def parse_peers(text: str) -> dict[str, str]:
    """DLedger's peers string `n0-host:port;n1-host:port` to an ordered {id: address}."""
    peers: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        node_id, sep, address = item.partition("-")
        try:
            if not sep or not node_id:
                raise ValueError("no id")
            parse_address(address)
        except ValueError:
            raise ValueError(f"bad peer {item!r}: expected id-host:port") from None
        if node_id in peers:
            raise ValueError(f"peer id {node_id!r} appears twice")
        peers[node_id] = address
    if not peers:
        raise ValueError("no peers given")
    return peers
