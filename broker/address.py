"""Where this broker is reached: its address for clients and name servers, and the
store host written into every message it stores (what an offset msgId names)."""

from __future__ import annotations

from raftmq.protocol.msgid import pack_host


class BrokerAddress:
    """brokerIP1 and the listen port; the port is known once the remoting server listens
    (a configured port 0 picks a free one)."""

    def __init__(self, ip: str, port: int, group_address: str | None = None) -> None:
        self.ip = ip
        self.port = port
        self.group_address = group_address  # groupAddress (broker.group_address)
        self.group_bound = False  # whether this broker listens on the group address now

    @property
    def port(self) -> int:
        return self._port

    @port.setter
    def port(self, port: int) -> None:
        self._port = port
        # The store host as a record and a msgId hold it (ip bytes + 4-byte port): read
        # once per send batch, so made once, when the port is known.
        self.store_host_bytes = pack_host((self.ip, port))

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def registered(self, is_master: bool) -> str:
        """The address the name servers are given: the group address while master and
        listening there; else the broker's own. A new master that cannot bind the group
        address yet (a paused predecessor still holds it: alive, answering nothing)
        registers its own, so that clients which ask the name server reach it rather
        than the paused one. The store host stays the broker's own (a message's offset
        msgId names the member that wrote it, as in RocketMQ)."""
        if is_master and self.group_address is not None and self.group_bound:
            return self.group_address
        return self.address

    @property
    def store_host(self) -> tuple[str, int]:
        return (self.ip, self.port)
