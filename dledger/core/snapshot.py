"""Snapshots of the application's state, for a follower the log alone cannot restore.

Retention deletes the head of the log, so a follower whose next entry is gone from
the leader's log (down while retention ran, a wiped log, a new member) can only be
restarted at the leader's first entry, and what the application built from the
entries it never saw would be missing. As etcd-raft's `MsgSnap`, the leader then
first sends a snapshot of the application's state as of an entry at or after the
one before its first (`Replica.snapshot_source`, the application's hook: the broker's
metadata), in chunks of `maxBatchPushSize` over the peer connection, one chunk out
at a time, each answered with the bytes the follower holds (a lost chunk or a
restarted follower resumes where it stands). The follower hands the whole snapshot
to its driver to install (`Output.snapshot`; the application replaces its state
atomically, or keeps the old; the trio server lets it take its time in a task, off the
replica's path, so heartbeats are still answered) and answers once the driver reports it
installed (`Replica.snapshot_installed`). Only then does the leader reset the follower's log
to its first entry (a TRUNCATE with reset), and the application continues from it,
skipping what the snapshot covers. Without a hook the leader resets at once, as
DLedger does. Either way the reset carries the configuration in force at the entry
before the leader's first when retention deleted the entry that set it (core.membership
travels in the log, and those entries never arrive). The log's entries and their
format are untouched: a snapshot is never written into the log.
"""

from __future__ import annotations

import attrs
from raftmq.dledger.codes import Code
from raftmq.dledger.core.messages import InstallSnapshotRequest, InstallSnapshotResponse

# What an application's install raises for a snapshot it could not take (no room, or
# bytes that are no snapshot): it kept its old state.
INSTALL_ERRORS = (OSError, ValueError)

# The largest snapshot a follower accepts: it holds one whole in memory while it
# arrives, so a peer's `total_bytes` must not make it allocate without bound.
MAX_SNAPSHOT_BYTES = 1 << 30


@attrs.define(slots=True)
class SnapshotSend:
    """A snapshot on its way from the leader to one follower: `data` as of entry
    `index`, of which the follower acknowledged the first `acked_bytes`."""

    index: int
    data: bytes
    acked_bytes: int = 0

    def chunk(self, max_bytes: int) -> bytes:
        return self.data[self.acked_bytes : self.acked_bytes + max_bytes]


class SnapshotReceiver:
    """The follower's side: the chunks of one snapshot gathered in order, handed to the
    driver whole, and the answer to the last chunk once the driver installed it."""

    def __init__(self, replica) -> None:
        self._r = replica
        self._from: tuple[str, int, int, int] | None = None  # (leader, term, index, total)
        self._data = bytearray()
        self._installing: InstallSnapshotRequest | None = None  # answered once installed
        self._installed_index = -1  # the last snapshot installed: a resent chunk of it is done

    def on_request(self, req: InstallSnapshotRequest, now_ms: float) -> None:
        r = self._r
        code = r.heartbeats.accept_leader(req.leader_id, req.term, now_ms)
        if code is not Code.SUCCESS:
            self._answer(req, code, 0)
            return
        if (
            not 0 <= req.total_bytes <= MAX_SNAPSHOT_BYTES
            or req.offset < 0
            or req.offset + len(req.data) > req.total_bytes
            or req.index < 0
        ):
            self._answer(req, Code.UNEXPECTED_ARGUMENT, 0)
            return
        if self._installing is not None:
            if req.index == self._installing.index:  # resent: the driver has it, answer that
                self._installing = req
            return
        if req.index <= max(r.committed_index, self._installed_index):
            # installed already, or we hold and will apply every entry it covers
            self._answer(req, Code.SUCCESS, req.total_bytes)
            return
        source = (req.leader_id, req.term, req.index, req.total_bytes)
        if req.offset == 0 and source != self._from:
            self._from, self._data = source, bytearray()
        if source != self._from or req.offset != len(self._data):
            held = len(self._data) if source == self._from else 0
            self._answer(req, Code.INCONSISTENT_STATE, held)
            return
        self._data += req.data
        if len(self._data) < req.total_bytes:
            self._answer(req, Code.SUCCESS, len(self._data))
            return
        self._installing = req
        r.install_snapshot(req.index, bytes(self._data))
        self._from, self._data = None, bytearray()

    def installed(self, index: int, ok: bool) -> None:
        """The driver installed snapshot `index` (or could not: the old state stays)."""
        req, self._installing = self._installing, None
        assert req is not None and req.index == index, (req, index)
        if ok:
            self._installed_index = index
            self._answer(req, Code.SUCCESS, req.total_bytes)
        else:
            self._answer(req, Code.DISK_ERROR, 0)

    def _answer(self, req: InstallSnapshotRequest, code: Code, offset: int) -> None:
        r = self._r
        r.send(
            InstallSnapshotResponse(
                *r.answer_header(req.local_id), code, req.index, offset, seq=req.seq
            )
        )
