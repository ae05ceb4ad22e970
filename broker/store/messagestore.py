"""The broker's message store: the DLedger CommitLog, its ConsumeQueues, metadata.

The dispatcher follows the commit index on every replica: each newly committed
entry is scanned and appended to its ConsumeQueue (and, for META_TOPIC records,
applied to the metadata), so consumers — on the master or on a slave — only ever
see committed messages. Pulls are answered from the ConsumeQueues with RocketMQ's
status rules, and a pull that finds nothing can wait for the next arrival on its
queue (long polling).

DLedger retention deletes the head of the log without telling anyone; the store
notices the log's moved beginning (`trim_queues`) at each dispatch step, on every
replica, and before any read of a queue, and trims every ConsumeQueue's head to
it as RocketMQ's CleanConsumeQueueService does. A pull below a queue's head then
gets OFFSET_TOO_SMALL with the new head, never an entry whose message is gone.

Retention never deletes what this replica has not dispatched (its limit is the
dispatch checkpoint), but a follower silent for longer than the leader's retention
has its whole log reset to the leader's first entry: the beginning then jumps past
the dispatcher, which continues from it, and the queues are trimmed as after
retention (the entries in between were never here to dispatch).
"""

from __future__ import annotations

import functools
import json
import logging
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio
from raftmq.broker.store.commitlog import (
    QUEUE_RUNS,
    TRANSACTIONS_WITHOUT_QUEUE_OFFSET,
    DLedgerCommitLog,
)
from raftmq.broker.store.consumequeue import (
    DEFAULT_FILE_ENTRIES,
    ENTRY,
    ENTRY_SIZE,
    ConsumeQueue,
    ConsumeQueueTable,
)
from raftmq.broker.store.indexfile import IndexService
from raftmq.broker.store.metadata import META_TOPIC, SCHEDULE_TOPIC, Metadata, TopicConfig
from raftmq.broker.store.replicated_log import CommitLog, ReplicatedLog
from raftmq.broker.store.timerwheel import TIMER_TOPIC, TimerWheel, fired

from raftmq.disk.durable import NO_ROOM, NO_ROOM_RETRY_S, DiskFailure, until_room
from raftmq.disk.filesystem import atomic_write
from raftmq.protocol import message as codec

log = logging.getLogger(__name__)

DISPATCH_CHUNK = 2048  # entries per dispatch step before yielding to other tasks
# ConsumeQueues a dispatch step may start before it yields: each is a directory and a
# file created on the event loop, and a load spread over thousands of new queues
# otherwise held the loop for seconds (a follower's then missed heartbeats: an election).
NEW_QUEUES_PER_STEP = 32
CHECKPOINT_INTERVAL_S = 5.0
# Queues a dispatch checkpoint writes and fsyncs in one worker hop: between hops the
# event loop takes their results, so a checkpoint over 10,000 busy queues is many short
# steps (RocketMQ flushes ConsumeQueues a few pages at a time), never one long one.
CHECKPOINT_QUEUES_PER_STEP = 256
# Worker hops of a checkpoint under way at once: fsyncs that arrive together share a
# journal commit (ext4 here: 10,000 busy queues in 1.7-2.2 s against 3.4-4.5 one at a
# time, in process under a load of 5,000 messages/s).
CHECKPOINT_HOPS_AT_ONCE = 4
CHECKPOINT_MAX_INTERVAL_S = 60.0  # RocketMQ's flushConsumeQueueThoroughInterval
CHECKPOINT_DISK_SHARE = 0.1  # of the time, at most, that checkpoints spend in fsync
DISPATCH_CHECKPOINT = "dispatch_checkpoint"  # the log position queues are durable to
MAX_PULL_MESSAGES = 32  # RocketMQ's maxTransferCountOnMessageInMemory
MAX_PULL_BYTES = 256 * 1024  # maxTransferBytesOnMessageInMemory
# TOTALSIZE, MAGICCODE, then PHYSICALOFFSET at 28: enough to tell a record's start
_RECORD_HEAD = struct.Struct(">ii20xq")
_TRANSACTION_MASK = codec.MessageSysFlag.TRANSACTION_ROLLBACK_TYPE  # both transaction bits
# Topics whose messages `_dispatch` treats on their own, never in a queue run
_SPECIAL_TOPICS = frozenset((TIMER_TOPIC, SCHEDULE_TOPIC, META_TOPIC))


def checkpoint_interval_s(took_s: float) -> float:
    """Seconds from a dispatch checkpoint whose work took `took_s` to the next one.

    A checkpoint fsyncs every queue dispatched to since the last, one fsync each: with
    thousands of busy queues that is seconds of fsyncs, which hold the disk the log's
    own fsyncs wait for. Every CHECKPOINT_INTERVAL_S then, but no more often than keeps
    checkpoints within CHECKPOINT_DISK_SHARE of the time (and at least once in
    CHECKPOINT_MAX_INTERVAL_S, as RocketMQ's thorough ConsumeQueue flush): the fsyncs
    per message stay level as queues multiply; a restart dispatches again a longer
    stretch of log, and retention keeps it a little longer."""
    return min(
        CHECKPOINT_MAX_INTERVAL_S, max(CHECKPOINT_INTERVAL_S, took_s / CHECKPOINT_DISK_SHARE)
    )


def checkpoint_position(root: Path) -> int:
    """The log position the dispatch checkpoint under store root `root` vouches for:
    every message before it is durable in the ConsumeQueues. 0 (rebuild them all)
    when there is none or it does not parse."""
    path = root / DISPATCH_CHECKPOINT
    try:
        return int(json.loads(path.read_bytes())["position"])
    except FileNotFoundError:
        return 0
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("%s unreadable (%s): rebuilding the ConsumeQueues", path, exc)
        return 0


class GetStatus:
    """DefaultMessageStore's GetMessageStatus, mapped to pull response codes by the processor."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"


@attrs.define
class GetResult:
    status: str
    next_begin_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""  # the records found, concatenated: the pull response's body
    count: int = 0  # how many records `body` holds
    last_physical_offset: int = -1  # the last record's (-1 when none)

    @property
    def records(self) -> list[bytes]:
        """The records of `body`, one by one (each begins with its total size)."""
        records = []
        view = memoryview(self.body)
        offset = 0
        while offset < len(view):
            size, _magic, _physical_offset = _RECORD_HEAD.unpack_from(view, offset)
            records.append(bytes(view[offset : offset + size]))
            offset += size
        assert len(records) == self.count, (len(records), self.count)
        return records


def parse_delay_levels(text: str) -> list[int]:
    """`messageDelayLevel` ("1s 5s ... 2h") to milliseconds, level 1 first."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    levels = []
    for item in text.split():
        if item[-1] not in units or not item[:-1].isdigit():
            raise ValueError(f"bad delay level {item!r} (expected e.g. 1s, 5m, 2h)")
        levels.append(int(item[:-1]) * units[item[-1]])
    return levels


class MessageStore:
    """The CommitLog, ConsumeQueues and metadata over `server`, the replicated log (a
    DLedgerServer, or anything else that speaks `replicated_log.ReplicatedLog`).

    `commitlog` is the CommitLog over it: by default the DLedger one; a classic
    broker passes its `ClassicCommitLog` (with `server` its `ClassicLog`). The store
    uses either through the same methods. `index` is the key index (by default one
    under `root/index`); with `message_index_enable` false there is none: no index
    file is written or read, and `query_message` finds nothing."""

    def __init__(
        self,
        server: ReplicatedLog,
        root: Path,
        builtin_topics: dict[str, TopicConfig],
        delay_levels_ms: list[int],
        queue_file_entries: int = DEFAULT_FILE_ENTRIES,
        index: IndexService | None = None,
        commitlog: CommitLog | None = None,
        message_index_enable: bool = True,
    ) -> None:
        self.server = server
        self.root = root
        self.commitlog = DLedgerCommitLog(server) if commitlog is None else commitlog
        self.queues = ConsumeQueueTable(root / "consumequeue", queue_file_entries)
        self.index: IndexService | None = None
        if message_index_enable:
            self.index = IndexService(root / "index") if index is None else index
        self.metadata = Metadata(builtin_topics)
        self.timers = TimerWheel(root / "timerwheel")
        self.delay_levels_ms = delay_levels_ms
        self.dispatched_index = -1
        # messages (but the metadata records) dispatched since start, and their bytes:
        # RocketMQ's putMessageAverageSize (broker.metrics)
        self.dispatched_messages = self.dispatched_message_bytes = 0
        self._trimmed_begin: object = None  # the log's beginning the queues trimmed to
        self.checkpointed_index = 0  # the first entry the last dispatch checkpoint left out
        self.checkpoint_took_s = 0.0  # the last checkpoint's worker hops, seconds of wall time
        self._snapshot_path = root / "config" / "metadata.json"
        self._metadata_installs = 0  # leader's snapshots taken in memory since start
        # held while a worker thread writes metadata.json (a checkpoint's or an install's)
        self._metadata_file = threading.Lock()
        self._checkpoint_path = root / DISPATCH_CHECKPOINT
        self._commit_moved = trio.Event()
        self._arrivals: dict[tuple[str, int], trio.Event] = {}
        self._meta_applied = trio.Event()
        self._dispatch_moved = trio.Event()
        # One checkpoint at a time: two would write the same temporary files, and the
        # later one to finish could record the older position.
        self._checkpointing = trio.Lock()
        # A queue fsync failed: the kernel may have dropped those pages, and a later fsync
        # of the same files (through a new descriptor) would succeed without them, so no
        # checkpoint may be recorded after it (PostgreSQL's "fsyncgate").
        self.fsync_failed = False
        self._recover()
        server.add_commit_handler(lambda _index: self._commit_moved.set())
        server.add_retention_limit(lambda: self.checkpointed_index)

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """Cut the ConsumeQueues back to the dispatch checkpoint (and to the recovered
        log), trim their heads to the log's beginning, replay metadata, and dispatch
        again from there.

        The queue files are fsynced only for a checkpoint, so after a power cut each
        may have lost a different part of what came after it; the highest position a
        queue still points at says nothing about the others. Without a checkpoint
        (a new store, or one from before checkpoints) every queue is rebuilt."""
        store = self.server.store
        resume = min(checkpoint_position(self.root), store.end_pos)
        for queue in self.queues.queues.values():
            queue.truncate_physical(resume)
        if self.index is not None:
            self.index.recover(resume)
        self.trim_queues()
        if self._snapshot_path.exists():
            self.metadata.load(self._snapshot_path)
        elif taken := self.metadata.load_rocketmq(self._snapshot_path.parent):
            # a store Apache RocketMQ's broker wrote: its tables, under what the log
            # replays next
            log.info("took Apache RocketMQ's tables from %s", ", ".join(taken))
        self._replay_meta()
        if store.empty:
            self.dispatched_index = store.end_index
        else:
            self.dispatched_index = self.first_index_at(resume) - 1
        self.checkpointed_index = self.dispatched_index + 1
        self._recover_timers(resume)
        log.info("store recovered: dispatch resumes after index %d", self.dispatched_index)

    def cut_back(self, pos: int) -> None:
        """The log was cut at `pos` (a controller-mode slave giving up a tail its new
        master does not hold, which with `allAckInSyncStateSet=false` it may have
        confirmed and dispatched): the ConsumeQueues, the key index, the timer wheel,
        the metadata and dispatch go back with it, so no queue offset names a message
        that is gone, and the master's messages take those offsets again."""
        for queue in self.queues.queues.values():
            queue.truncate_physical(pos)
        if self.index is not None:
            self.index.cut(pos)
        self.dispatched_index = min(self.dispatched_index, self.server.store.end_index)
        self.checkpointed_index = min(self.checkpointed_index, self.dispatched_index + 1)
        if self.timers.position > pos:
            self._rebuild_timers()
        self._rewind_metadata()
        log.warning("log cut at %d: dispatch resumes after index %d", pos, self.dispatched_index)

    def _rewind_metadata(self) -> None:
        """The metadata as of the end of the (cut) META_TOPIC queue: the snapshot on disk
        if it is not past that end, else the queue replayed from its start; when
        neither can be had (retention deleted the start), the records cut stay applied,
        which is logged."""
        meta = self.queues.find(META_TOPIC, 0)
        end = 0 if meta is None else meta.max_offset
        if self.metadata.applied_meta_offset <= end:
            return
        rewound = Metadata(self.metadata.builtin)
        try:
            saved = Metadata.from_snapshot(self.metadata.builtin, self._snapshot_path.read_bytes())
        except (OSError, ValueError):
            saved = None  # none yet, or unreadable: the replay from the start decides
        if saved is not None and saved.applied_meta_offset <= end:
            rewound = saved
        start = rewound.applied_meta_offset
        if meta is not None and start < meta.min_offset:
            log.error(
                "metadata records %d..%d were cut with the log but stay applied: the"
                " META_TOPIC queue no longer starts at %d",
                end,
                self.metadata.applied_meta_offset - 1,
                start,
            )
            self.metadata.applied_meta_offset = end
            return
        self.metadata.replace_with(rewound)
        self._replay_meta()
        self._metadata_moved()

    def _replay_meta(self) -> None:
        """Apply the META_TOPIC queue's records the metadata has not applied yet."""
        meta = self.queues.find(META_TOPIC, 0)
        if meta is not None:
            for offset in range(
                max(self.metadata.applied_meta_offset, meta.min_offset), meta.max_offset
            ):
                phys, size, _tags = meta.get(offset)
                self._apply_meta(self.commitlog.read(phys, size), offset)

    def _recover_timers(self, resume: int) -> None:
        """Keep the timer wheel if its checkpoint is within the recovered log (records
        after `resume` are dispatched again: loading drops the duplicates); otherwise
        (none, unreadable, or past a log truncated below it) rebuild it from the log,
        leaving out what the replicated firing progress covers."""
        wheel = self.timers
        position = wheel.checkpoint_position()
        store = self.server.store
        if position is not None and position <= store.end_pos:
            wheel.position = min(position, resume)
            return
        if position is not None or wheel.counts:
            log.warning(
                "timer wheel %s (checkpoint %s, log end %d): rebuilding it from the log",
                wheel.directory,
                position,
                store.end_pos,
            )
        self._rebuild_timers()

    def _rebuild_timers(self) -> None:
        """The timer wheel from the log dispatched so far, leaving out what the
        replicated firing progress covers."""
        wheel, store = self.timers, self.server.store
        wheel.clear()
        if store.empty or self.dispatched_index < store.begin_index:
            return
        progress = self.metadata.timer_progress
        for rows in self.commitlog.scan_rows(store.begin_index, self.dispatched_index):
            for _index, fields in rows:
                if fields is not None and fields[0] == TIMER_TOPIC:
                    physical_offset, size = fields[3], fields[4]
                    due_ms = self._timer_due(physical_offset, size)
                    if due_ms is not None and not fired((due_ms, physical_offset, size), progress):
                        wheel.add(due_ms, physical_offset, size)
        wheel.flush()

    def _timer_due(self, physical_offset: int, size: int) -> int | None:
        """A timer message's TIMER_OUT_MS; None (logged) for one without a valid one."""
        try:
            properties = codec.read_dispatch_fields(self.commitlog.read(physical_offset, size))[6]
            due = codec.string_to_properties(properties.decode("utf-8", "replace")).get(
                codec.MessageConst.PROPERTY_TIMER_OUT_MS, ""
            )
            return int(due)
        except ValueError as exc:  # not a number, or no V1 record (MessageFormatError)
            log.error("timer message at %d not scheduled: %s", physical_offset, exc)
            return None

    async def checkpoint(self) -> None:
        """The dispatch checkpoint, taken while dispatch goes on: write and fsync the
        queues dispatched to since the last one, CHECKPOINT_QUEUES_PER_STEP a worker
        hop (CHECKPOINT_HOPS_AT_ONCE hops at a time), then write the metadata snapshot
        and record the log position of the first entry that was not dispatched when it
        began.

        Why that position is safe to resume from: every entry before it went to a queue
        that was then in `queues.unsynced` (listed here) or was durable, and the hops
        write and fsync each of those queues up to at least where it stood when its hop
        began, which is past that position; the position is recorded only after the
        last hop. A queue leaves `unsynced` only once durable, so a checkpoint that
        fails or is cancelled, or one that runs beside this, leaves out no queue.
        Entries dispatched meanwhile may reach the files too, or not: a restart cuts
        every queue back to the recorded position and dispatches again from there. The
        snapshot is captured with the position, so it never runs ahead of the queues;
        retention may delete up to the position (`checkpointed_index`), as a restart
        must find the log from there."""
        async with self._checkpointing:
            await self._checkpoint()

    async def _checkpoint(self) -> None:
        record = self._checkpoint_record()
        keys = list(self.queues.unsynced)
        batches = iter(range(0, len(keys), CHECKPOINT_QUEUES_PER_STEP))
        started = time.monotonic()

        async def hops() -> None:
            for start in batches:  # shared: each batch goes to one of them
                batch = keys[start : start + CHECKPOINT_QUEUES_PER_STEP]
                try:
                    done = await until_room(
                        functools.partial(self.queues.sync_plan, batch),
                        what="in the dispatch checkpoint",
                    )
                except DiskFailure:
                    self.fsync_failed = True
                    raise
                done()

        async with trio.open_nursery() as nursery:
            for _ in range(CHECKPOINT_HOPS_AT_ONCE):
                nursery.start_soon(hops)
        await until_room(lambda: record, what="in the dispatch checkpoint")
        self.checkpoint_took_s = time.monotonic() - started

    def checkpoint_work(self) -> Callable[[], None]:
        """The whole dispatch checkpoint (`checkpoint`) as one blocking function, for
        when dispatch stands still and no other checkpoint runs: at shutdown, and for
        `drain`."""
        assert not self._checkpointing.locked(), "a checkpoint runs already"
        if self.fsync_failed:
            raise DiskFailure("a ConsumeQueue fsync failed earlier; no checkpoint after it")
        record = self._checkpoint_record()
        sync_queues = self.queues.sync_plan(self.queues.unsynced)

        def run() -> None:
            started = time.monotonic()
            try:
                sync_queues()()
            except DiskFailure:
                self.fsync_failed = True
                raise
            record()
            self.checkpoint_took_s = time.monotonic() - started

        return run

    def _checkpoint_record(self) -> Callable[[], None]:
        """The end of a dispatch checkpoint, captured as it begins: blocking work that
        syncs the key index, writes the metadata snapshot and records the log position
        of the first entry not dispatched now; run once the queues are durable."""
        store = self.server.store
        first = self.dispatched_index + 1
        position = store.pos_at(first) if first <= store.end_index else store.end_pos
        sync_index = self.index.sync_plan() if self.index is not None else None
        sync_timers = self.timers.sync_plan()
        snapshot = self.metadata.snapshot_bytes()
        installs = self._metadata_installs
        record = json.dumps({"position": position}).encode()

        def run() -> None:
            try:
                if sync_index is not None:
                    sync_index()
            except OSError as exc:  # no room for the index's own checkpoint file: retried
                if exc.errno not in NO_ROOM:
                    raise DiskFailure(f"fsync failed ({exc}); stopping") from exc
                raise
            sync_timers()
            self._write_metadata(snapshot, installs)
            atomic_write(self._checkpoint_path, record)
            self.checkpointed_index = first

        return run

    def metadata_snapshot(self) -> tuple[int, bytes]:
        """The metadata as of the last entry dispatched here, (index, snapshot): what the
        leader sends a follower before it restarts the follower's log at its first
        entry (dledger.core.snapshot). Retention keeps every entry after the dispatch
        checkpoint, so the index is never below the entry before the log's first."""
        return self.dispatched_index, self.metadata.snapshot_bytes()

    async def install_metadata_snapshot(self, index: int, body: bytes) -> None:
        """Replace the metadata with the leader's snapshot as of entry `index`, unless
        dispatch here reached that entry already: parsed in a worker thread (a quarter
        second for 4.7 MB; ValueError for bytes that are no snapshot, and the old state
        stays), taken in memory, then written to `config/metadata.json`
        (`atomic_write`: a crash leaves the old file or the new one, never a mix). The
        records it covers are skipped as dispatch meets them (by their META_TOPIC
        offset). The leader resets this replica's log only once the file is written; if
        writing fails (OSError), memory holds the newer state, committed all the same,
        and the leader sends the snapshot again. A checkpoint that captured the metadata
        before it never writes that older state over it."""
        if index <= self.dispatched_index:
            return
        installed = await trio.to_thread.run_sync(
            Metadata.from_snapshot, self.metadata.builtin, body
        )
        if index <= self.dispatched_index:  # dispatch got there meanwhile
            return
        self.metadata.replace_with(installed)
        self._metadata_installs += 1
        self._metadata_moved()
        await trio.to_thread.run_sync(self._write_metadata, body, self._metadata_installs)
        log.warning(
            "metadata replaced by the leader's snapshot as of index %d (META_TOPIC offset %d)",
            index,
            installed.applied_meta_offset,
        )

    def _write_metadata(self, body: bytes, installs: int) -> None:
        """Write `config/metadata.json` (any thread), unless a leader's snapshot was
        installed in memory since `body` was captured (after `installs` installs)."""
        self._snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        with self._metadata_file:
            if installs == self._metadata_installs:
                atomic_write(self._snapshot_path, body)

    def write_rocketmq_tables(self) -> None:
        """Leave the tables as Apache RocketMQ's broker keeps them (`config/topics.json`
        and its kin, `Metadata.rocketmq_tables`), at a clean stop: RocketMQ's broker
        started on this store then knows its topics, groups and offsets. raftmq itself
        reads them only from a store without its own snapshot (one RocketMQ wrote)."""
        for name, body in self.metadata.rocketmq_tables().items():
            atomic_write(self._snapshot_path.parent / name, body)

    def trim_queues(self) -> None:
        """Drop from every queue the entries for messages retention deleted from the
        log, once per move of the log's beginning (a comparison when it did not move),
        and move the dispatcher up to a beginning that a reset moved past it.

        After a restart the same rule gives the same heads again, as the log's new
        beginning is saved before its files are deleted."""
        store = self.server.store
        old = self.commitlog.old_log  # files below an upgraded log: they begin the log
        begin = store.begin_index if old is None else (store.begin_index, old.min_offset)
        if begin == self._trimmed_begin:
            return
        if self.dispatched_index < store.begin_index - 1:
            log.warning(
                "log reset to begin at index %d: dispatch skips %d..%d, which this replica"
                " never held",
                store.begin_index,
                self.dispatched_index + 1,
                store.begin_index - 1,
            )
            self.dispatched_index = store.begin_index - 1
        begin_pos = store.end_pos if store.empty else store.pos_at(store.begin_index)
        if old is not None and old.min_offset < old.write_pos:
            begin_pos = old.min_offset
        self.queues.trim_head(begin_pos)
        if self.index is not None:
            self.index.trim(begin_pos)
        self._trimmed_begin = begin

    def first_index_at(self, position: int) -> int:
        """The first entry placed at or after byte `position` of the log (the entry of
        a message at physical offset P is the one at P - 48)."""
        store = self.server.store
        low, high = store.begin_index, store.end_index + 1
        while low < high:
            mid = (low + high) // 2
            if store.pos_at(mid) < position:
                low = mid + 1
            else:
                high = mid
        return low

    def _apply_meta(self, record: bytes, meta_offset: int) -> str | None:
        """Apply a metadata record; the topic it deleted, if any."""
        msg, _size = codec.decode(record)
        try:
            return self.metadata.apply(msg.body, meta_offset)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("skipping a malformed metadata record at offset %d: %s", meta_offset, exc)
            return None

    def drop_topic(self, topic: str) -> None:
        """Delete `topic`'s ConsumeQueues (RocketMQ's cleanUnusedTopic, for one topic),
        keeping each queue's next offset (`Metadata.dropped_queue_offsets`): messages
        of the topic created again continue from there, on this master and on any
        later one, so a consumer's committed offset never points into new messages
        as if it had consumed them. The key index is shared by all topics and stays."""
        if topic in (META_TOPIC, SCHEDULE_TOPIC):
            return  # the broker's own: never deleted (AdminRequests refuses it too)
        for queue_id, next_offset in self.queues.drop_topic(topic).items():
            key = (topic, queue_id)
            floors = self.metadata.dropped_queue_offsets
            floors[key] = max(floors.get(key, 0), next_offset)
            log.info("topic %s deleted: queue %d dropped at %d", topic, queue_id, next_offset)

    def unused_topics(self) -> list[str]:
        """Topics with ConsumeQueues here that the topic table does not have."""
        return sorted(self.queues.topics() - set(self.metadata.topics) - {SCHEDULE_TOPIC})

    # ------------------------------------------------------------------ dispatch
    @property
    def dispatch_target(self) -> int:
        """The last index that may be dispatched: committed and present here."""
        return min(self.server.replica.committed_index, self.server.store.end_index)

    def caught_up(self) -> bool:
        """Every entry this replica holds is committed and dispatched. For a new leader
        (its NOOP among them) the ConsumeQueues are then final: it may become master."""
        end = self.server.store.end_index
        return self.server.replica.committed_index >= end and self.dispatched_index >= end

    def take_over_offsets(self) -> None:
        """A new master's queue offset table, rebuilt from its ConsumeQueues and the
        offsets its dropped queues had reached."""
        table = dict(self.metadata.dropped_queue_offsets)
        for key, next_offset in self.queues.max_offsets().items():
            table[key] = max(table.get(key, 0), next_offset)
        self.commitlog.reset_offsets(table)

    def dispatch_behind(self) -> int:
        return self.dispatch_target - self.dispatched_index

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch forever; take a dispatch checkpoint now and then beside it."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._checkpoints)
                task_status.started()
                await self._dispatch_forever()
        finally:
            # Skipping is safe: the next start dispatches again from the last checkpoint.
            # The log is closed when the DLedger server stopped first (a disk failure
            # stops it, and the broker with it); it can no longer say where the first
            # undispatched entry is, and the failure, not this, is why we stop.
            if self.server.store.closed:
                log.warning("no dispatch checkpoint at shutdown: the log is closed")
            else:
                try:
                    self.checkpoint_work()()
                    self.write_rocketmq_tables()
                except (OSError, DiskFailure) as exc:
                    log.warning("no dispatch checkpoint at shutdown: %s", exc)
            if self.index is not None:
                self.index.close()

    async def _dispatch_forever(self) -> None:
        while True:
            if self.dispatched_index >= self.dispatch_target:
                with trio.move_on_after(CHECKPOINT_INTERVAL_S):  # trims the queues when idle
                    await self._commit_moved.wait()
                self._commit_moved = trio.Event()
            self.trim_queues()
            try:
                self.dispatch_some(DISPATCH_CHUNK)
            except OSError as exc:  # a ConsumeQueue or index file had no room
                if exc.errno not in NO_ROOM:
                    raise
                log.warning("dispatch waits for room on the disk: %s", exc)
                await trio.sleep(NO_ROOM_RETRY_S)
                continue
            await trio.sleep(0)

    async def _checkpoints(self) -> None:
        """A dispatch checkpoint every CHECKPOINT_INTERVAL_S, or less often after one
        that took long (`checkpoint_interval_s`)."""
        while True:
            await trio.sleep(checkpoint_interval_s(self.checkpoint_took_s))
            await self.checkpoint()

    def drain(self) -> None:
        """Dispatch everything committed, take the dispatch checkpoint and close the
        index: for a store opened once over a log it then leaves (an upgrade in place
        dispatches what the classic broker had not before its files become read-only)."""
        while self.dispatch_some(DISPATCH_CHUNK):
            pass
        self.checkpoint_work()()
        if self.index is not None:
            self.index.close()

    def dispatch_some(self, limit: int) -> int:
        """Dispatch up to `limit` committed entries; returns how many."""
        self.trim_queues()  # a reset may have moved the log's beginning past `first`
        first = self.dispatched_index + 1
        last = min(self.dispatch_target, first + limit - 1)
        if last < first:
            return 0
        touched = set()
        queues = self.queues.queues
        known = len(queues)
        indexed = self.index is not None
        try:
            for rows in self.commitlog.scan_rows(first, last):
                pos = 0
                while pos < len(rows):
                    # the rows that only add entries to existing queues, a run per queue
                    runs, end = QUEUE_RUNS(rows, pos, queues, _SPECIAL_TOPICS, indexed)
                    for key, (queue_offset, _next, entries, size) in runs.items():
                        self._add_entries(queues[key], queue_offset, entries, size)
                    touched.update(runs)
                    if end > pos:
                        self.dispatched_index = rows[end - 1][0]
                    pos = end
                    if pos < len(rows):  # a row for the general path
                        index, fields = rows[pos]
                        if fields is not None:  # an OSError (a full disk): the next call's
                            self._dispatch(*fields)
                            touched.add(fields[:2])  # (topic, queue id)
                        self.dispatched_index = index
                        pos += 1
                    if len(queues) - known >= NEW_QUEUES_PER_STEP:
                        return self.dispatched_index - first + 1  # the rest once others ran
        finally:
            self.queues.unsynced |= touched
            self.timers.flush()
            self._wake(touched)
        return self.dispatched_index - first + 1

    def _wake(self, touched: set[tuple[str, int]]) -> None:
        """Wake what waits for dispatch to move, and for messages on `touched` queues."""
        self._dispatch_moved.set()
        self._dispatch_moved = trio.Event()
        for key in touched:
            event = self._arrivals.pop(key, None)
            if event is not None:
                event.set()

    def _add_entries(
        self, queue: ConsumeQueue, queue_offset: int, entries: bytearray, size: int
    ) -> int:
        """Entries (ENTRY each, a run from `QUEUE_RUNS` or `_dispatch`'s one) into `queue`
        from `queue_offset` on, for messages of `size` bytes in all, skipping those
        dispatched before a restart; returns how many went in (none if the queue
        refused them, which is logged). Metadata records are not counted as messages."""
        if queue_offset < queue.max_offset and len(queue):
            skip = min(queue.max_offset - queue_offset, len(entries) // ENTRY_SIZE)
            size -= sum(s for _p, s, _t in ENTRY.iter_unpack(entries[: skip * ENTRY_SIZE]))
            del entries[: skip * ENTRY_SIZE]
            queue_offset += skip
            if not entries:
                return 0
        try:
            queue.append_run(queue_offset, entries, size)
        except ValueError as exc:
            log.error("dispatch: %s", exc)
            return 0
        added = len(entries) // ENTRY_SIZE
        if queue.topic != META_TOPIC:
            self.dispatched_messages += added
            self.dispatched_message_bytes += size
        return added

    def _dispatch(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        physical_offset: int,
        size: int,
        sysflag: int,
        tags_code: int,
        store_timestamp: int,
        uniq_key: str,
        keys: str,
    ) -> None:
        """One committed message (a DispatchRequest's fields, passed as arguments: no
        object per message) into its ConsumeQueue and the key index."""
        transaction = sysflag & _TRANSACTION_MASK
        index = self.index
        if (
            index is not None
            and (uniq_key or keys)
            and transaction != codec.MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
        ):
            index.dispatch(topic, physical_offset, store_timestamp, [uniq_key, *keys.split(" ")])
        if transaction in TRANSACTIONS_WITHOUT_QUEUE_OFFSET:
            return
        if topic == TIMER_TOPIC:  # into the timer wheel, not a ConsumeQueue: see timerwheel
            due_ms = self._timer_due(physical_offset, size)
            if due_ms is not None:
                self.timers.add(due_ms, physical_offset, size)
            return
        queue = self.queues.queues.get((topic, queue_id))
        if queue is None:
            queue = self.queues.find_or_create(topic, queue_id)
        if topic == SCHEDULE_TOPIC:
            level = min(queue_id, len(self.delay_levels_ms) - 1)
            tags_code = store_timestamp + self.delay_levels_ms[level]
        entry = bytearray(ENTRY.pack(physical_offset, size, tags_code))
        if not self._add_entries(queue, queue_offset, entry, size) or topic != META_TOPIC:
            return  # dispatched before a restart, refused, or not metadata
        deleted = self._apply_meta(self.commitlog.read(physical_offset, size), queue_offset)
        if deleted is not None:  # here, in log order: the same point on every replica
            self.drop_topic(deleted)
        self._metadata_moved()

    def _metadata_moved(self) -> None:
        """Wake what waits for a metadata record to be applied (`wait_applied`)."""
        self._meta_applied.set()
        self._meta_applied = trio.Event()

    async def wait_applied(self, meta_offset: int) -> None:
        """Until the metadata record at META_TOPIC offset `meta_offset` is applied here."""
        while self.metadata.applied_meta_offset <= meta_offset:
            await self._meta_applied.wait()

    async def wait_dispatch(self, timeout_s: float) -> None:
        """Until the next dispatch step (or `timeout_s`): a new master waiting for its
        backlog to be dispatched rechecks its state after each."""
        with trio.move_on_after(timeout_s):
            await self._dispatch_moved.wait()

    async def dispatch_caught_up(self, timeout_s: float) -> bool:
        """Whether every entry now in this node's log is dispatched (committed, in its
        queue and the key index), waiting up to `timeout_s` for it: on the master, that
        includes whatever an earlier request appended."""
        target = self.server.store.end_index
        with trio.move_on_after(timeout_s):
            while self.dispatched_index < target:
                await self.wait_dispatch(0.05)
        return self.dispatched_index >= target

    # ------------------------------------------------------------------ reads
    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """A queue to read from, trimmed first: every entry it then holds points at a
        message the log still has."""
        self.trim_queues()
        return self.queues.find(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.find(topic, queue_id)
        return 0 if queue is None else queue.max_offset

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queue(topic, queue_id)
        return 0 if queue is None else queue.min_offset

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        tags_codes: frozenset[int] | None = None,
        matches: Callable[[bytes], bool] | None = None,
    ) -> GetResult:
        """RocketMQ's getMessage: the status table of the pull protocol, tag filtering by
        hash when `tags_codes` is given (clients re-check the tag itself), and by
        `matches(properties)` when given (an SQL92 filter over a record's raw PROPERTIES
        bytes). An offset below the trimmed head is OFFSET_TOO_SMALL with the head as the
        next offset, which the pull processor answers PULL_OFFSET_MOVED: the consumer
        jumps past everything retention deleted in one round trip."""
        queue = self.queue(topic, queue_id)
        if queue is None or not len(queue):
            lo = hi = 0 if queue is None else queue.max_offset
            if offset == hi:
                return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, offset, lo, hi)
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        lo, hi = queue.min_offset, queue.max_offset
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        max_nums = max(1, min(max_nums, MAX_PULL_MESSAGES))
        body, count, scanned, last = self.commitlog.read_pulled(
            queue.entry_bytes(offset, max_nums * 4), tags_codes, max_nums, MAX_PULL_BYTES, matches
        )
        status = GetStatus.FOUND if count else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, offset + scanned, lo, hi, body, count, last)

    async def wait_arrival(self, topic: str, queue_id: int, deadline: float) -> None:
        """Until a message is dispatched to the queue or `deadline` (trio clock)."""
        event = self._arrivals.get((topic, queue_id))
        if event is None:
            event = self._arrivals[(topic, queue_id)] = trio.Event()
        with trio.move_on_at(deadline):
            await event.wait()

    def store_time(self, physical_offset: int) -> int:
        return codec.read_store_timestamp(self.commitlog.read_message(physical_offset))

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is >= timestamp (the max offset if none)."""
        queue = self.queue(topic, queue_id)
        if queue is None or not len(queue):
            return 0 if queue is None else queue.max_offset
        low, high = queue.min_offset, queue.max_offset
        while low < high:
            mid = (low + high) // 2
            if self.store_time(queue.get(mid)[0]) < timestamp_ms:
                low = mid + 1
            else:
                high = mid
        return low

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        queue = self.queue(topic, queue_id)
        return -1 if queue is None else self.store_time_at(topic, queue_id, queue.min_offset)

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        """The store time of the message at queue offset `offset` (RocketMQ's
        getMessageStoreTimeStamp); -1 when the queue does not hold it."""
        queue = self.queue(topic, queue_id)
        if queue is None or not queue.min_offset <= offset < queue.max_offset:
            return -1
        return self.store_time(queue.get(offset)[0])

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> tuple[list[bytes], int, int]:
        """`DefaultMessageStore.queryMessage`: the stored records the index finds for
        the key (hash collisions included), oldest first, with the index's end
        timestamp and end physical offset. Records retention deleted are left out;
        nothing without a key index."""
        if self.index is None:
            return [], 0, 0
        self.trim_queues()
        offsets, end_ms_indexed, end_phy = self.index.query(topic, key, max_num, begin_ms, end_ms)
        records = []
        for offset in sorted(set(offsets)):
            try:
                records.append(self.commitlog.read_message(offset))
            except (IndexError, ValueError):
                continue
        return records, end_ms_indexed, end_phy

    def message_at(self, physical_offset: int) -> bytes:
        """The record at a physical offset (what an offset msgId names): IndexError when
        the log does not hold it, MessageFormatError when no record starts there (a
        record carries its own physical offset). RocketMQ returns whatever bytes an
        offset inside a record points at."""
        total, magic, recorded = _RECORD_HEAD.unpack(
            self.commitlog.read(physical_offset, _RECORD_HEAD.size)
        )
        if (
            magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2)
            or recorded != physical_offset
            or total < codec.MIN_RECORD_SIZE
        ):
            raise codec.MessageFormatError(
                f"no message starts at physical offset {physical_offset}"
            )
        return self.commitlog.read(physical_offset, total)

    @property
    def physical_max(self) -> int:
        """commitLogMaxOffset: the end of the committed, dispatched log."""
        end = self.queues.physical_end()
        return max(end, 0)

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)


__all__ = ["GetResult", "GetStatus", "MessageStore", "parse_delay_levels"]
