"""Addresses as RocketMQ and DLedger configs write them: `host:port`, or `[v6]:port`."""


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) to (host, port); ValueError naming the bad text."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
