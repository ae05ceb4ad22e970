"""An upgrade in place from a classic store to DLedger, as RocketMQ's DLedgerCommitLog does it.

A broker started with `enableDLegerCommitLog=true` on a store that holds classic
CommitLog files (`storePathCommitLog`, `classic_log`) keeps them, read-only, below the
DLedger log:

- at the first such start (no DLedger log yet) the classic files are recovered, what
  the classic broker had not dispatched to its ConsumeQueues is dispatched, and the
  last file is sealed with a BLANK record; the divide (RocketMQ's
  `dividedCommitlogOffset`) is the end of that file, the old end rounded up to a
  file boundary. The DLedger log then begins there: entry 0 sits at the divide,
  so a message's physical offset is its entry's position + 48 as in any DLedger
  log, and offsets continue above every old one. DLedger entries keep their format;
  only the first entry's chainCrc is seeded with a digest of the old log (the
  divide and its last record) instead of 0.
- every start then reads offsets below the divide from the old files
  (`UpgradedCommitLog`); ConsumeQueues, the dispatch checkpoint and the metadata
  snapshot (topics, subscription groups, consumer offsets: the META_TOPIC records,
  themselves in the old files) are the classic broker's and carry on, so queue
  offsets continue and old msgIds still name their messages.
- the old files expire by age (`fileReservedTime`) like any CommitLog file; the
  ConsumeQueues are trimmed to what is left.

Raft replicates only new entries, so every node must start from the same old files.
A node whose divide or digest differs from the leader's refuses the leader's first
entry (`dledger.store.file.ForeignLog`) and stops, rather than build a log whose
offsets mean other messages than on its peers (RocketMQ's followers loop on
failed appends instead).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path

import trio
from crc32c import crc32c
from raftmq.broker.store.classic_commitlog import ClassicCommitLog, PutPolicy
from raftmq.broker.store.classic_log import ClassicLog
from raftmq.broker.store.commitlog import DLedgerCommitLog
from raftmq.broker.store.replicated_log import LogEntries, ReplicatedLog
from raftmq.dledger.store.file import ForeignLog
from raftmq.dledger.store.meta import BEGIN_FILE, begin_after

from raftmq.disk.filesystem import OsFileSystem
from raftmq.disk.segments import list_segments

log = logging.getLogger(__name__)

_DIVIDE = struct.Struct(">q")
# The old log is only read (and dispatched once): its put policy is never used.
_READ_ONLY = PutPolicy(sync_flush=False, sync_flush_timeout_s=0.0, flush_interval_s=1.0)


def old_log_digest(old: ClassicLog, divide: int) -> int:
    """What a node's DLedger log is chained to: crc32c of its last old record, seeded
    with the divide (nodes with equal old files agree; a missing, extra or different
    last file, or another last message, changes it)."""
    seed = crc32c(_DIVIDE.pack(divide))
    if old.empty:
        return seed
    pos = old.pos_at(old.end_index)
    (size,) = struct.unpack(">i", old.read_at(pos, 4))
    return crc32c(old.read_at(pos, size), seed)


def _dledger_log_exists(dledger_dir: Path) -> bool:
    data = dledger_dir / "data"
    return (dledger_dir / BEGIN_FILE).exists() or (data.exists() and any(data.iterdir()))


def open_old_log(
    directory: Path,
    abort_path: Path,
    file_size_bytes: int,
    dledger_dir: Path,
    dispatch_rest: Callable[[ClassicLog, ClassicCommitLog], None],
) -> ClassicLog | None:
    """The classic CommitLog files in `directory` (`storePathCommitLog`) that the DLedger
    log in `dledger_dir` continues, opened; None when there are none. At the first start
    the upgrade happens here: `dispatch_rest(log, commitlog)` dispatches what the classic
    broker left, the last file is sealed and the DLedger log set to begin at the divide."""
    if not directory.is_dir() or not list_segments(OsFileSystem(), directory, file_size_bytes):
        return None
    old = ClassicLog(directory, file_size_bytes, abort_path)
    if not _dledger_log_exists(dledger_dir):
        dispatch_rest(old, ClassicCommitLog(old, _READ_ONLY))
        end = old.write_pos
        divide = old.seal()
        seed = old_log_digest(old, divide)
        old.close()
        begin_after(dledger_dir, divide, seed)
        log.warning(
            "upgrade to DLedger: the classic commitlog ends at %d; the DLedger log begins "
            "at the divide %d (digest %08x); older offsets are read from the old files",
            end,
            divide,
            seed,
        )
        old = ClassicLog(directory, file_size_bytes, abort_path)
    return old


class UpgradedCommitLog(DLedgerCommitLog):
    """The DLedger CommitLog of an upgraded store: offsets below the divide are read
    from the old classic files, the rest from the DLedger log."""

    def __init__(self, server: ReplicatedLog, old: ClassicLog) -> None:
        super().__init__(server)
        self.old_log = old
        self.divide = old.write_pos
        store = server.store
        begin = store.end_pos if store.empty else store.pos_at(store.begin_index)
        if begin < self.divide:
            raise ForeignLog(
                f"the DLedger log begins at offset {begin}, inside the classic commitlog "
                f"files (which end at {self.divide}): remove one of them"
            )

    def holder(self, physical_offset: int) -> LogEntries:
        return self.old_log if physical_offset < self.divide else self.store

    async def expire_old_files(self, reserved_s: float, interval_s: float) -> None:
        """Delete old files older than `reserved_s` (RocketMQ deletes them by
        fileReservedTime too, the last one included), every `interval_s`
        (cleanResourceInterval), until none is left."""
        old = self.old_log
        while old.min_offset < old.write_pos:
            await trio.sleep(interval_s)
            old.delete_expired(reserved_s)
