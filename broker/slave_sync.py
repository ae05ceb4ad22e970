"""SlaveSynchronize: a classic slave copies its master's topics, subscription groups,
consumer offsets and delay offsets, as RocketMQ's does: first 3 s after start, then
every 10 s, four requests with empty headers and a 3 s timeout each —
GET_ALL_TOPIC_CONFIG (21), GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45),
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) — to the `masterAddr` of the slave's last
REGISTER_BROKER answer (none while its group has no live master: no sync).

A slave of a raftmq master also gets all of this as the metadata records in the
CommitLog bytes it copies, but only from where its copy starts (an empty slave
starts at the master's last file) and never from a Java master, which keeps its
tables in files. RocketMQ's slave sends 21 to the master's VIP port (listenPort - 2),
which a raftmq master serves only with `fastListenPort` (for Java slaves); a Java
master answers 21 on its main port as well, so every request here goes there.
Bodies may be fastjson's (integer keys unquoted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio
from raftmq.broker.store.metadata import Metadata, consumer_offsets, delay_offsets, loads

from raftmq.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingError,
    RequestCode,
    ResponseCode,
)
from raftmq.transport.tls import ClientTls

log = logging.getLogger(__name__)

FIRST_SYNC_S = 3.0
SYNC_PERIOD_S = 10.0
REQUEST_TIMEOUT_S = 3.0


@attrs.define
class SlaveSynchronize:
    metadata: Metadata
    master_addr: Callable[[], str | None]  # None while the group has no live master
    own_addr: Callable[[], str]
    tls: ClientTls
    _failing: bool = attrs.field(default=False, init=False)  # said once per outage

    async def run(self) -> None:
        await trio.sleep(FIRST_SYNC_S)
        while True:
            address = self.master_addr()
            if address is not None and address != self.own_addr():
                await self.sync_all(address)
            await trio.sleep(SYNC_PERIOD_S)

    async def sync_all(self, address: str) -> None:
        """Each table on its own, as RocketMQ's syncAll: one the master cannot give
        (a Java master without delay offsets answers SYSTEM_ERROR) leaves the others."""
        tables: dict[str, dict] = {}
        try:
            async with RemotingClient(address, tls=self.tls) as client:
                for name, code in _TABLES:
                    try:
                        tables[name] = await _get(client, code)
                    except (RemotingError, ValueError) as exc:
                        log.debug("slave sync of %s from %s failed: %s", name, address, exc)
        except (RemotingError, OSError) as exc:
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(level, "slave sync from master %s failed: %s", address, exc)
            self._failing = True
            return
        self._failing = False
        try:
            offsets = tables.get("offsets")
            delay = tables.get("delay")
            self.metadata.synchronize(
                tables.get("topics"),
                tables.get("groups"),
                None if offsets is None else consumer_offsets(offsets),
                None if delay is None else delay_offsets(delay),
            )
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("slave sync from master %s: a table does not parse: %s", address, exc)


_TABLES = (
    ("topics", RequestCode.GET_ALL_TOPIC_CONFIG),
    ("offsets", RequestCode.GET_ALL_CONSUMER_OFFSET),
    ("delay", RequestCode.GET_ALL_DELAY_OFFSET),
    ("groups", RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
)


async def _get(client: RemotingClient, code: int) -> dict:
    response = await client.invoke(RemotingCommand(code=code), REQUEST_TIMEOUT_S)
    if response.code != ResponseCode.SUCCESS:
        raise RemotingError(f"request {code} answered {response.code}: {response.remark}")
    doc = loads(response.body)
    if not isinstance(doc, dict):
        raise ValueError(f"request {code}: the answer is not a JSON object")
    return doc
