"""Consumer offsets on the master (RocketMQ's ConsumerOffsetManager), committed
through the log in coalesced records.

Commits arriving while a record is in flight go out together in the next one, so a
thousand consumers committing every few seconds cost a few log entries, not
thousands. A query sees a commit at once, before it is replicated; every replica
applies the records to `Metadata.offsets`, so a new master starts from them.

How far each commit moves a group on a topic is counted per minute for a day
(`stats.MinuteCounts`): the group's consumption rate, which `mqadmin statsAll` shows.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio
from raftmq.broker.stats import MinuteCounts
from raftmq.dledger.server import DLedgerError

if TYPE_CHECKING:
    from raftmq.broker.metawriter import MetaWriter
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.store.metadata import Metadata

log = logging.getLogger(__name__)

RETRY_DELAY_S = 0.2  # after a record that did not commit


class ConsumerOffsetManager:
    def __init__(self, metadata: Metadata, meta: MetaWriter, role: BrokerRole) -> None:
        self.metadata = metadata
        self.meta = meta
        self.role = role
        self._dirty: dict[tuple[str, str, int], int] = {}
        self._in_flight: dict[tuple[str, str, int], int] = {}
        self._wake = trio.Event()
        self._flushed = trio.Event()
        self._stepped_down = 0  # times this broker stopped being master (`forget_pending`)
        # (topic, group) -> messages consumed per minute: how far the commits moved them
        self.consumed = MinuteCounts()

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = (group, topic, queue_id)
        previous = self.query(group, topic, queue_id)
        if offset < 0 or previous == offset:
            return
        if previous is not None and offset > previous:
            self.consumed.add((topic, group), offset - previous, int(time.time() * 1000))
        self._dirty[key] = offset
        self._wake.set()

    async def commit_and_wait(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Commit and wait for the record; False when this master stepped down first
        (`forget_pending`), or is no master now: the commit may never have committed,
        so it is not to be acknowledged. (A commit made while not master would wait for
        a record nobody writes: RESET_CONSUMER's second queue, after a step-down during
        the first's wait, hung so.)"""
        if not self.role.is_master:
            return False
        stepped_down = self._stepped_down
        self.commit(group, topic, queue_id, offset)
        key = (group, topic, queue_id)
        while key in self._dirty or key in self._in_flight:
            await self._flushed.wait()
        return self._stepped_down == stepped_down

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        key = (group, topic, queue_id)
        for table in (self._dirty, self._in_flight, self.metadata.offsets):
            if key in table:
                return table[key]
        return None

    def groups_of_topic(self, topic: str) -> set[str]:
        """Every group that has committed an offset on `topic`, as replicated."""
        return {g for (g, t, _q) in self.metadata.offsets if t == topic}

    def offsets_of_group(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, queueId) -> offset of every queue `group` committed, as replicated."""
        return self.metadata.offsets_of_group(group)

    def forget_pending(self) -> None:
        """A master stepping down drops what it had not committed; the commits waiting
        for it are answered as by a slave, and the client commits again to the next."""
        self._stepped_down += 1
        self._dirty.clear()
        self._in_flight.clear()
        self._flushed.set()
        self._flushed = trio.Event()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if not self._dirty or not self.role.is_master:
                continue
            self._in_flight, self._dirty = self._dirty, {}
            entries = [[g, t, q, o] for (g, t, q), o in self._in_flight.items()]
            try:
                await self.meta.write("offsets", entries=entries)
            except DLedgerError as exc:  # not committed: kept for a retry (a bug stops the broker)
                log.warning("consumer offsets not committed (%s); will retry", exc)
                for key, offset in self._in_flight.items():
                    self._dirty.setdefault(key, offset)
                await trio.sleep(RETRY_DELAY_S)
                self._wake.set()
            self._in_flight = {}
            self._flushed.set()
            self._flushed = trio.Event()
