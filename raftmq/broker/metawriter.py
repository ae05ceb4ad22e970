"""The master's writers of replicated metadata (see broker.store.metadata).

`MetaWriter.write` appends one META_TOPIC record and returns once every replica
could apply it (committed) and this node has (dispatched). `OffsetWriter`
coalesces consumer offset commits: commits arriving while a record is in flight
go out together in the next one, so a thousand consumers committing every few
seconds cost a few log entries, not thousands.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from raftmq.broker.store.metadata import META_TOPIC, encode_record
from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageExt

if TYPE_CHECKING:
    from raftmq.broker.controller import BrokerController

log = logging.getLogger(__name__)


def meta_message(op: str, now_ms: int, host: tuple[str, int], **fields) -> bytes:
    """The CommitLog record of one metadata change, written by the master at `host`."""
    msg = MessageExt(
        topic=META_TOPIC,
        body=encode_record(op, **fields),
        store_timestamp=now_ms,
        born_timestamp=now_ms,
        born_host=host,
        store_host=host,
    )
    return codec.encode(msg)


class MetaWriter:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    async def write(self, op: str, **fields) -> None:
        """Append a metadata record; raises dledger's DLedgerError when not committed."""
        broker = self.broker
        record = meta_message(op, broker.store.now_ms(), broker.store_host, **fields)
        [(_phys, meta_offset)] = await broker.store.commitlog.put([record])
        await broker.store.wait_applied(meta_offset)


class OffsetWriter:
    """Consumer offsets on the master: committed through the log in coalesced records."""

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self._dirty: dict[tuple[str, str, int], int] = {}
        self._in_flight: dict[tuple[str, str, int], int] = {}
        self._wake = trio.Event()
        self._flushed = trio.Event()

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = (group, topic, queue_id)
        if offset < 0 or self.query(group, topic, queue_id) == offset:
            return
        self._dirty[key] = offset
        self._wake.set()

    async def commit_and_wait(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.commit(group, topic, queue_id, offset)
        key = (group, topic, queue_id)
        while key in self._dirty or key in self._in_flight:
            await self._flushed.wait()

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        key = (group, topic, queue_id)
        for table in (self._dirty, self._in_flight, self.broker.store.metadata.offsets):
            if key in table:
                return table[key]
        return None

    def forget_pending(self) -> None:
        """A master stepping down drops what it had not committed (the client resends)."""
        self._dirty.clear()
        self._in_flight.clear()
        self._flushed.set()
        self._flushed = trio.Event()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if not self._dirty or not self.broker.is_master:
                continue
            self._in_flight, self._dirty = self._dirty, {}
            entries = [[g, t, q, o] for (g, t, q), o in self._in_flight.items()]
            try:
                await MetaWriter(self.broker).write("offsets", entries=entries)
            except Exception as exc:  # any failure: keep them for a retry
                log.warning("consumer offsets not committed (%s); will retry", exc)
                for key, offset in self._in_flight.items():
                    self._dirty.setdefault(key, offset)
                await trio.sleep(0.2)
                self._wake.set()
            self._in_flight = {}
            self._flushed.set()
            self._flushed = trio.Event()
