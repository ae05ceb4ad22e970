"""ClassicCommitLog: the message store's CommitLog over the classic files (`classic_log`).

It has the DLedger CommitLog's interface (`put`, `put_nowait`, `read`, `read_message`,
`scan`, `reset_offsets`), so the message store, its dispatcher and the send path
work unchanged on either. A put is answered as RocketMQ's `CommitLog.asyncPutMessage`
answers it, combining two waits that run at once:

- flush (`flushDiskType`): SYNC_FLUSH waits for the group commit that fsyncs the
  record (FLUSH_DISK_TIMEOUT after `syncFlushTimeout`); ASYNC_FLUSH does not wait,
  and a background flush runs every `flushIntervalCommitLog`.
- replication (`brokerRole=SYNC_MASTER`): SLAVE_NOT_AVAILABLE at once when no slave
  is connected or the nearest is more than `haSlaveFallbehindMax` bytes behind;
  otherwise wait until a slave has acknowledged the record's end offset, or
  FLUSH_SLAVE_TIMEOUT after `slaveTimeout` (RocketMQ 4.9.3's per-request deadline).

The answer carries the worse of the two (the replication status first, as in
RocketMQ). A message whose WAIT property is false is answered at once, as RocketMQ
answers it. All of these statuses mean "stored here": the send is answered with the
status's response code and the usual msgId and offsets, and clients count it as sent.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import attrs
import trio
from raftmq.broker.store.commitlog import (
    PLACE_RECORD,
    RecordReads,
    dispatch_fields,
)
from raftmq.dledger.codes import Code
from raftmq.dledger.server import DLedgerError

from raftmq.disk.durable import durably
from raftmq.protocol import message as codec
from raftmq.transport.awaited import Awaited

if TYPE_CHECKING:
    from raftmq.broker.store.classic_log import ClassicLog

log = logging.getLogger(__name__)

SCAN_ROWS = 256  # messages per list `scan_rows` yields
_WAIT = (codec.MessageConst.PROPERTY_WAIT_STORE_MSG_OK + codec.NAME_VALUE_SEPARATOR).encode()


def waits_for_store(record: bytes) -> bool:
    """`Message.isWaitStoreMsgOK` of a record: true unless its WAIT property says not."""
    properties = codec.READ_DISPATCH_FIELDS(record)[6]
    if _WAIT not in properties:
        return True
    value = codec.string_to_properties(properties.decode("utf-8")).get("WAIT", "true")
    return value.lower() == "true"


class PutStatus(enum.IntEnum):
    """A put stored here but not as the producer asked, or (MESSAGE_ILLEGAL) not
    stored; the value is RocketMQ's response code for it
    (SendMessageProcessor.handlePutMessageResult)."""

    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13  # MESSAGE_SIZE_EXCEEDED: a record larger than a CommitLog file
    # controller mode, refused before storing (the replication's `refusal`):
    IN_SYNC_REPLICAS_NOT_ENOUGH = 1  # SYSTEM_ERROR: a SyncStateSet below minInSyncReplicas
    FENCED = 14  # SERVICE_NOT_AVAILABLE: this master's epoch is over


@attrs.define
class PutPolicy:
    """When a put is answered: the broker's flush and replication keys."""

    sync_flush: bool  # flushDiskType=SYNC_FLUSH
    sync_flush_timeout_s: float  # syncFlushTimeout
    flush_interval_s: float  # flushIntervalCommitLog: the background flush
    slave_timeout_s: float = 3.0  # slaveTimeout: a SYNC_MASTER's wait for a slave


class Replication(Protocol):
    """What the put path asks of a SYNC_MASTER's HA service (`ha.HAService`)."""

    def slave_ok(self, offset: int) -> bool:
        """A slave is connected and at most haSlaveFallbehindMax behind `offset`."""

    @property
    def acked_offset(self) -> int:
        """The highest offset a slave acknowledged (push2SlaveMaxOffset)."""

    def refusal(self) -> PutStatus | None:
        """Why puts are refused before they are stored, or None."""


class OffsetWaiters:
    """Callbacks waiting for an offset to be reached (flushed, or acknowledged by a
    slave), each with a deadline (trio clock). Waiters come in the order of their
    offsets and of their deadlines (one timeout per list), so both release and
    expiry take from the front."""

    def __init__(self) -> None:
        self._waiting: collections.deque[tuple[int, float, Callable[[bool], None]]] = (
            collections.deque()
        )
        self._first_added = trio.Event()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, offset: int, deadline: float, callback: Callable[[bool], None]) -> None:
        waiting = self._waiting
        assert not waiting or (offset >= waiting[-1][0] and deadline >= waiting[-1][1])
        waiting.append((offset, deadline, callback))
        if len(waiting) == 1:
            self._first_added.set()

    def release(self, reached: int) -> None:
        """Call back (True) everyone waiting for an offset up to `reached`."""
        waiting = self._waiting
        while waiting and waiting[0][0] <= reached:
            waiting.popleft()[2](True)

    def expire(self, now_s: float) -> None:
        """Call back (False) everyone whose deadline has passed."""
        waiting = self._waiting
        while waiting and waiting[0][1] <= now_s:
            waiting.popleft()[2](False)

    async def run_expiry(self) -> None:
        """Time out waiters at their deadlines, forever."""
        while True:
            if not self._waiting:
                self._first_added = trio.Event()
                await self._first_added.wait()
            await trio.sleep_until(self._waiting[0][1] if self._waiting else 0)
            self.expire(trio.current_time())


class ClassicCommitLog(RecordReads):
    """The broker's view of a classic CommitLog; `next_offsets` is the master's
    topic-queue offset table, rebuilt from the ConsumeQueues at start."""

    def __init__(
        self, log: ClassicLog, policy: PutPolicy, replication: Replication | None = None
    ) -> None:
        self.server = self.store = self.log = log
        self.policy = policy
        self.replication = replication  # None unless SYNC_MASTER
        self.disk_full = False  # over diskSpaceWarningLevelRatio: sends are refused
        self.next_offsets: dict[tuple[str, int], int] = {}
        self._flushes = OffsetWaiters()
        self._acks = OffsetWaiters()
        self._flush_wanted = trio.Event()

    def reset_offsets(self, table: dict[tuple[str, int], int]) -> None:
        self.next_offsets = dict(table)

    # ------------------------------------------------------------------ writes
    def put_nowait(self, records: list[bytes], done: Callable[[Code | PutStatus, list], None]):
        """Append `records` now; `done(status, [(physical offset, queue offset)])` once
        the flush and replication rules are met (Code.SUCCESS) or not (a PutStatus);
        `done(MESSAGE_ILLEGAL, None)` at once, storing none, if one cannot fit a file,
        `done(Code.DISK_FULL, None)` while `disk_full` is set (ClassicReplica's disk
        check, as DLedger refuses appends on a full disk), and `done(status, None)`
        while the replication refuses puts (a controller-mode master: `refusal`)."""
        if self.disk_full:
            done(Code.DISK_FULL, None)
            return
        if any(not self.log.fits(len(record)) for record in records):
            done(PutStatus.MESSAGE_ILLEGAL, None)
            return
        refused = self.replication.refusal() if self.replication is not None else None
        if refused is not None:
            done(refused, None)
            return
        queue_offsets: list[int] = []
        next_offsets = self.next_offsets

        def place(body: bytes, pos: int) -> bytes:
            record, queue_offset = PLACE_RECORD(body, pos, next_offsets)
            queue_offsets.append(queue_offset)
            return record

        positions = self.log.append(records, place)
        placed = list(zip(positions, queue_offsets, strict=True))
        end = positions[-1] + len(records[-1])
        statuses: list[PutStatus | None] = [None, None]  # flush, replication; None: fine
        pending = [2]

        def finish(which: int, status: PutStatus | None) -> None:
            statuses[which] = status
            pending[0] -= 1
            if not pending[0]:
                # the replication status wins over the flush status, as in RocketMQ
                done(statuses[1] or statuses[0] or Code.SUCCESS, placed)

        now_s = trio.current_time()
        replication = self.replication
        wait = (self.policy.sync_flush or replication is not None) and any(
            waits_for_store(record) for record in records
        )
        if not wait:  # WAIT=false: answered at once (RocketMQ only wakes the flusher)
            self._flush_wanted.set()
            done(Code.SUCCESS, placed)
            return
        if self.policy.sync_flush:
            deadline = now_s + self.policy.sync_flush_timeout_s
            self._flushes.add(
                end, deadline, lambda ok: finish(0, None if ok else PutStatus.FLUSH_DISK_TIMEOUT)
            )
            self._flush_wanted.set()
        else:
            finish(0, None)
        if replication is None or replication.acked_offset >= end:
            finish(1, None)
        elif not replication.slave_ok(end):
            finish(1, PutStatus.SLAVE_NOT_AVAILABLE)
        else:
            self._acks.add(
                end,
                now_s + self.policy.slave_timeout_s,
                lambda ok: finish(1, None if ok else PutStatus.FLUSH_SLAVE_TIMEOUT),
            )

    async def put(self, records: list[bytes]) -> list[tuple[int, int]]:
        """`put_nowait`, awaited: the (physical offset, queue offset) of each record,
        whatever the status of a stored put (10, 11, 12 all mean stored); a refused one
        (a full disk, a record larger than a file) raises DLedgerError, as the DLedger
        CommitLog's does, storing nothing."""
        awaited = Awaited()
        self.put_nowait(records, awaited)
        status, placed = await awaited.result()
        if placed is None:
            code = status if isinstance(status, Code) else Code.UNEXPECTED_ARGUMENT
            raise DLedgerError(code, status.name)
        return placed

    def on_slave_ack(self, offset: int) -> None:
        """A slave acknowledged everything before `offset` (GroupTransferService)."""
        self._acks.release(offset)

    # ------------------------------------------------------------------ reads
    def scan_rows(self, first: int, last: int) -> Iterator[list[tuple[int, tuple | None]]]:
        """(index, DispatchRequest fields) for the messages first..last, SCAN_ROWS at a
        time; None for a record the dispatcher cannot read (a RocketMQ 5 master's V2
        record, for a topic longer than 127 bytes, copied by a slave), which is logged
        and left out."""
        log_ = self.log
        for chunk in range(first, last + 1, SCAN_ROWS):
            rows = []
            for index in range(chunk, min(last + 1, chunk + SCAN_ROWS)):
                pos = log_.pos_at(index)
                buffer, offset = log_.locate(pos)
                try:
                    fields = dispatch_fields(buffer, offset, pos)
                except codec.MessageFormatError as exc:
                    log.error("not dispatched: %s", exc)
                    fields = None
                rows.append((index, fields))
            yield rows

    # ------------------------------------------------------------------ running
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush (group commit on demand, and every interval) and time out waiters."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flushes.run_expiry)
            nursery.start_soon(self._acks.run_expiry)
            task_status.started()
            await self._flush_loop()

    async def _flush_loop(self) -> None:
        log = self.log
        while True:
            with trio.move_on_after(self.policy.flush_interval_s):
                await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            if log.write_pos == log.flushed_pos and not len(self._flushes):
                continue
            target, work = log.flush_plan()
            await durably(work)
            log.flushed_pos = max(log.flushed_pos, target)
            self._flushes.release(log.flushed_pos)
