"""The trio driver: runs one `Replica` against real files, sockets and time.

It feeds the core every event (a peer's message, a deadline, a client append, an
fsync completing, a term and vote saved), then takes the core's `Ready` in one call
and carries it out in the order it lists: messages, fsyncs, role changes, commits,
completions, then the save of a changed term or vote (in a worker thread), which the
messages that depend on it wait for in the core. Entries are fsynced by a
group-commit thread — one fsync covers everything appended since the last — and only
then do the acknowledgments that depend on them go out. The core's request to fsync
hands the plan to that thread at once (no task to wake, no thread to borrow from a
pool), because on a single send every such hop is latency the client waits for. The
simulator takes the same `Ready` from its replicas, so the order it checks is the
order this server keeps.

Client appends that arrive together are appended together: RPC tasks queue them
and one batcher hands them to the core in a single call, so a burst costs one
write, one push per follower and one fsync, not one of each per entry.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.core import snapshot
from raftmq.dledger.core.group_commit import Fsync, GroupCommitSchedule
from raftmq.dledger.core.membership import Change, MemberState
from raftmq.dledger.core.output import Ready
from raftmq.dledger.core.replica import Replica
from raftmq.dledger.metrics import fsync_histogram
from raftmq.dledger.net.codec import RpcCode
from raftmq.dledger.net.rpc_client import RpcClient, RpcTimeout, RpcUnavailable
from raftmq.dledger.net.tcp import PeerTransport
from raftmq.dledger.store.base import LogStore
from raftmq.dledger.store.file import FileLogStore
from raftmq.dledger.store.memory import MemoryLogStore
from raftmq.dledger.store.meta import Checkpoint, MemoryTermVote, TermVoteFile

from raftmq.disk.durable import NO_ROOM, NO_ROOM_RETRY_S, DiskFailure, durably, until_room
from raftmq.disk.filesystem import used_ratio
from raftmq.disk.fsync_thread import FSYNC_THREAD
from raftmq.process import stages
from raftmq.transport.awaited import Awaited

log = logging.getLogger(__name__)

SYNCED_LENGTHS_FILE = "synced.json"  # see _record_synced
CHECKPOINT_INTERVAL_S = 3.0  # DLedger's checkPointInterval
DISK_CHECK_INTERVAL_S = 0.1  # DLedger's CleanSpaceService period
LEADER_POLL_S = 0.05  # how often a request for the leader looks for one being elected
# an operator's change (`change_at_leader`) that moves leadership rather than members;
# the remoting ports carry it as DLEDGER_MEMBERS's `change`
LEAD_CHANGE = "lead"


class DLedgerError(Exception):
    """A request the replica answered with a DLedger response code other than SUCCESS."""

    def __init__(self, code: Code, remark: str = "") -> None:
        super().__init__(f"{code.name} ({int(code)}){': ' + remark if remark else ''}")
        self.code = code


class _SyncThread:
    """Runs group-commit plans off the event loop, one at a time, in the order given.

    `submit` (on the event loop, only while no plan runs) starts a plan at once — no
    task to wake and no capacity limiter to pass, both latency a single send waits
    for — and when it has run, the plan, the error it raised, if any, and the seconds
    it took come back through `report`, which sets `done` for the group-commit task.

    A plan of OS files goes to an `FsyncThread`, whose completion `watch` waits for
    like a socket: compiled, a thread that never takes the GIL, so neither the start
    nor the report waits for the loop to let go of it. Any other plan (a test's disk)
    runs on a thread of trio's cache."""

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.done = trio.Event()
        self.result: tuple[object, BaseException | None, float] | None = None
        self._fsyncer = FSYNC_THREAD()
        self._syncing = None  # the plan the fsync thread syncs

    def submit(self, plan) -> None:
        targets = plan.os_targets()
        if targets is not None:
            assert self._syncing is None, "one plan at a time"
            self._syncing = plan
            self._fsyncer.submit([fd for fd, _ in targets], [data for _, data in targets])
            return
        started = time.perf_counter()
        trio.lowlevel.start_thread_soon(
            plan.run, lambda outcome: self._deliver(plan, outcome, started)
        )

    async def watch(self) -> None:
        """Report each plan the fsync thread has synced; closes the thread when
        cancelled (one still syncing ends once its fsync returns)."""
        fsyncer = self._fsyncer
        try:
            while True:
                await trio.lowlevel.wait_readable(fsyncer.done_fd)
                outcome = fsyncer.result()
                if outcome is not None:
                    error_number, took_s = outcome
                    plan, self._syncing = self._syncing, None
                    self.report(plan, plan.finish(error_number), took_s)
        finally:
            fsyncer.close()

    @staticmethod
    def run_here(plan) -> tuple[BaseException | None, float]:
        """Run `plan` on the loop's own thread, blocking it (`core.group_commit` says
        when): the error it raised, and its seconds."""
        started = time.perf_counter()
        error = _error_of(plan.run)
        return error, time.perf_counter() - started

    def _deliver(self, plan, result, started: float) -> None:  # on the plan's thread
        took_s = time.perf_counter() - started
        error = _error_of(result.unwrap)
        with contextlib.suppress(trio.RunFinishedError):  # the server stopped meanwhile
            self._token.run_sync_soon(self.report, plan, error, took_s)

    def report(self, plan, error, took_s: float) -> None:
        """Hand a plan's outcome to the group-commit task."""
        assert self.result is None, "one plan at a time"
        self.result = (plan, error, took_s)
        self.done.set()


def store_dir(config: DLedgerConfig) -> Path:
    """Where a file store keeps its log: storeBaseDir/dledger-<selfId>."""
    return Path(config.store_base_dir) / f"dledger-{config.self_id}"


def saved_members(config: DLedgerConfig, members_text: str | None) -> MemberState | None:
    """The configuration saved with the term and vote, which is in force over the
    member's dLegerPeers (said in the log when they disagree); None when none was saved."""
    if members_text is None:
        return None
    try:
        members = MemberState.from_text(members_text)
    except ValueError as exc:
        raise ValueError(f"{config.self_id}: unreadable saved configuration: {exc}") from None
    if dict(members.current.addresses) != config.peers:
        log.warning(
            "%s: dLegerPeers %s differ from the configuration in force, %s; following it",
            config.self_id,
            ";".join(f"{p}-{a}" for p, a in config.peers.items()),
            members.current.text(),
        )
    return members


def open_store(config: DLedgerConfig) -> tuple[LogStore, object, Checkpoint | None]:
    """The log store, term/vote file and checkpoint under storeBaseDir/dledger-<selfId>.

    Raises StoreCorruption (naming the file and offset) when recovery finds that data
    the checkpoint vouches for as durable and committed is gone or damaged.
    """
    if config.store_type.upper() == "MEMORY":
        return MemoryLogStore(config.mapped_file_size_for_entry_data), MemoryTermVote(), None
    base = store_dir(config)
    base.mkdir(parents=True, exist_ok=True)
    checkpoint = Checkpoint(base / "checkpoint")
    store = FileLogStore(
        base,
        config.mapped_file_size_for_entry_data,
        config.mapped_file_size_for_entry_index,
        committed_index=checkpoint.load(),
    )
    return store, TermVoteFile(base / "currterm"), checkpoint


async def _succeeded(awaited: Awaited):
    """What a completion `awaited` was called with past its code, or DLedgerError."""
    code, result = await awaited.result()
    if code is not Code.SUCCESS:
        raise DLedgerError(code)
    return result


def _remark(code: Code) -> str:
    return f"{code.name} ({int(code)})"


def _error_of(run) -> BaseException | None:
    """The error `run()` raised, or None: handed to the loop, which stops the replica."""
    try:
        run()
    except BaseException as exc:  # noqa: BLE001 - returned; the loop raises it
        return exc
    return None


class DLedgerServer:
    """One replica: `await server.serve()` runs it until cancelled.

    `client_appends=False` refuses the APPEND RPC (UNSUPPORTED): a broker's log holds
    only what its broker appends, entries it can parse as messages, so bytes from
    anyone who reaches the peer port must not land there. `foreign` serves the
    connections to the peer port that speak another protocol (`PeerTransport`).
    """

    def __init__(
        self,
        config: DLedgerConfig,
        rng: random.Random | None = None,
        *,
        client_appends: bool = True,
        foreign=None,
    ) -> None:
        self.config = config
        self.client_appends = client_appends
        self.store, self.term_vote, self.checkpoint = open_store(config)
        term, vote = self.term_vote.load()
        members = saved_members(config, self.term_vote.members_text)
        self.replica = Replica(
            config, self.store, rng or random.Random(), term, vote, self.now_ms(), members
        )
        self.transport = PeerTransport(
            config.self_id,
            config.peers,
            self._on_message,
            self._on_send_failed,
            None,  # no RPC takes a task of its own: `_on_rpc` answers them all
            self._on_rpc,
            check_peer_hosts=config.check_peer_hosts,
            tls=config.peer_tls,
            foreign=foreign,
            on_chunk_end=self._on_chunk_end,
        )
        # A member restarted with dLegerPeers written before others joined follows its
        # saved configuration (`saved_members`), so it dials those members too: its
        # answers and votes travel on the connections it opens.
        self.transport.set_addresses(dict(self.replica.members.current.addresses))
        self._install_snapshot: Callable[[int, bytes], Awaitable[None]] | None = None
        self._nursery: trio.Nursery | None = None  # while serving: where installs run
        self._role_handlers: list[Callable[[int, Role], None]] = []
        self._commit_handlers: list[Callable[[int], None]] = []
        self._readies: collections.deque[Ready] = collections.deque()  # taken, not carried out
        self._hard_state_to_save = None  # (term, vote, members or None), for _hard_state_loop
        self._hard_state_wanted = trio.Event()
        self._retention_limits: list[Callable[[], int]] = []
        self._callbacks: dict[int, Callable[[Code, list | None], None]] = {}
        self._handles = 0
        self._append_queue: list[tuple[int, list[bytes]]] = []
        # handle -> (where its first entry was placed, where its last ends): the
        # appends placed in advance (`append_nowait`), until the leader takes them
        self._placed_at: dict[int, tuple[int, int]] = {}
        self._append_ready = trio.Event()
        self._processing = False  # carrying out Readies: appends are queued, not made at once
        self._sync_thread: _SyncThread | None = None  # with ackAfterFsync, while serving
        # Handling a chunk of peer messages: an fsync they ask for waits for its end
        # (`_on_chunk_end`), and `_fsync_held` says one was asked for meanwhile.
        self._in_chunk = False
        self._fsync_held = False
        self._group_commit = GroupCommitSchedule(
            config.ack_after_fsync, config.flush_file_interval_ms, self.now_ms()
        )
        self._deadline_moved = trio.Event()
        self._next_deadline_ms = self.replica.next_deadline_ms()  # as of the last Ready
        self._armed_deadline_ms = float("inf")
        self.fsync_seconds_family, self._fsync_seconds = fsync_histogram(config)
        self._retention_due = trio.Event()  # the disk is over diskSpaceRatioToCheckExpired
        self.started = trio.Event()

    # ------------------------------------------------------------------ running
    @staticmethod
    def now_ms() -> float:
        """The replica's clock (trio's, in ms): what its deadlines and lease are in."""
        return trio.current_time() * 1000.0

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # What recovery read may still sit only in the page cache: make it durable
        # before the replica counts it as persisted.
        await durably(self.store.sync_plan().run)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.transport.serve)
                nursery.start_soon(self._timer_loop, name="timers")
                nursery.start_soon(self._append_loop, name="appends")
                nursery.start_soon(self._hard_state_loop, name="term-vote")
                if self.config.ack_after_fsync:
                    self._sync_thread = _SyncThread()
                    nursery.start_soon(self._sync_loop, name="group-commit")
                    nursery.start_soon(self._sync_thread.watch, name="fsync-thread")
                else:
                    nursery.start_soon(self._flush_loop, name="page-cache-flush")
                if isinstance(self.store, FileLogStore):
                    nursery.start_soon(self._retention_loop, name="retention")
                    nursery.start_soon(self._checkpoint_loop, name="checkpoint")
                    nursery.start_soon(self._disk_space_loop, name="disk-space")
                self.started.set()
                task_status.started()
        finally:
            self._sync_thread = None  # a plan still running reports to no one
            if self.checkpoint is not None:
                try:
                    index = self._durable_committed()
                    self.store.index_sync_plan().run()  # what the checkpoint vouches for
                    self.checkpoint.save(index)
                except OSError as exc:  # safe to skip: recovery then verifies more of the log
                    log.warning("no checkpoint at shutdown: %s", exc)
            self.store.close()

    def add_role_change_handler(self, handler: Callable[[int, Role], None]) -> None:
        """Called with (term, role) on every role change, in order (RocketMQ's hook)."""
        self._role_handlers.append(handler)

    def add_commit_handler(self, handler: Callable[[int], None]) -> None:
        """Called with the new committed index whenever it moves."""
        self._commit_handlers.append(handler)

    def set_state_snapshots(
        self,
        take: Callable[[], tuple[int, bytes]],
        install: Callable[[int, bytes], Awaitable[None]],
    ) -> None:
        """The application's snapshots (core.snapshot): `take()` is its state as of an
        entry it applied, (index, bytes), sent to a follower before the leader restarts
        its log at the leader's first entry; `await install(index, data)` replaces its
        state with one, atomically (OSError, or ValueError for bytes that are no
        snapshot: it kept the old state). The replica serves on meanwhile."""
        self.replica.snapshot_source = take
        self._install_snapshot = install

    # ------------------------------------------------------------------ public API
    def add_retention_limit(self, limit: Callable[[], int]) -> None:
        """Retention keeps every entry from `limit()` on: state the application built
        from the log (the broker's ConsumeQueues) is durable only up to there, and a
        restart rebuilds the rest from the log, which must still hold it."""
        self._retention_limits.append(limit)

    def retention_floor(self) -> int:
        """The lowest index retention may not delete past (see Replica.retention_floor)."""
        keep_ms = self.config.file_reserved_hours * 3600_000.0
        before = self.replica.stalled_followers
        floor = self.replica.retention_floor(self.now_ms(), keep_ms)
        for peer in sorted(self.replica.stalled_followers - before):
            log.warning(
                "follower %s stored nothing it lacks for followerStallTimeoutMs=%d: retention "
                "no longer waits for it (it gets a snapshot if it returns past what is deleted)",
                peer,
                self.config.follower_stall_timeout_ms,
            )
        for peer in sorted(before - self.replica.stalled_followers):
            log.info("follower %s makes progress again (or left): retention waits for it", peer)
        return min([floor, *(limit() for limit in self._retention_limits)])

    @property
    def role(self) -> Role:
        return self.replica.role

    def metadata(self) -> dict:
        r = self.replica
        return {
            "selfId": self.config.self_id,
            "group": self.config.group,
            "role": r.role.name,
            "term": r.term,
            "leaderId": r.leader_id,
            "ledgerBeginIndex": self.store.begin_index,
            "ledgerEndIndex": self.store.end_index,
            "ledgerEndTerm": self.store.end_term,
            "committedIndex": r.committed_index,
            "peers": dict(r.members.current.addresses),
            "voters": list(r.members.current.voters),
            "learners": list(r.members.current.learners),
        }

    async def append(self, body: bytes) -> tuple[int, int]:
        """Append one entry; returns (index, pos) once a quorum has it durably."""
        return (await self.append_batch([body]))[0]

    async def append_batch(self, bodies: list[bytes]) -> list[tuple[int, int]]:
        """Append entries as one request; returns their (index, pos) once all are committed.

        Raises DLedgerError: NOT_LEADER, LEADER_TRANSFERRING, LEADER_PENDING_FULL at
        once; TERM_CHANGED when the entries were provably discarded;
        WAIT_QUORUM_ACK_TIMEOUT when the outcome is unknown (they may still commit).
        """
        awaited = Awaited()
        self.append_nowait(list(bodies), awaited)
        return await _succeeded(awaited)

    def append_nowait(
        self, bodies: list[bytes], callback, *, placed: tuple[int, int] | None = None
    ) -> None:
        """`append_batch` without a task: `callback(code, positions)` runs on completion
        (positions are (index, pos) pairs, None on failure). For hot paths where an
        awaiting task per request costs more than the append.

        With `placed` (where the first entry goes, where the last ends), the bodies were
        made for entries at those positions (`entry.places` from the log's end, or from
        where the caller's append before them ends: a broker writes each message's
        physical offset into it), and they are written there or not at all. When their
        turn comes and the log ends elsewhere (a new term's NOOP came first) they are
        refused LEADER_NOT_READY; when the leader refuses an append placed before them,
        it refuses them too (it admits a prefix of what it is handed). Either way
        nothing of them is written (`codes.NOT_APPENDED`)."""
        if stages.ON:
            stages.mark("append queued")
        handle = self._new_handle(callback)
        if placed is not None:
            self._placed_at[handle] = placed
        idle = not (self._append_queue or self._group_commit.in_flight or self._processing)
        if idle and self.started.is_set():
            # An idle log: nothing to batch with (no other append waits, and no fsync
            # runs that a batch would wait behind anyway), so append now instead of
            # after a hop to the append task. Under load a plan is nearly always in
            # flight, and appends from many connections still meet in one batch.
            self._append_now([(handle, bodies)])
            return
        self._append_queue.append((handle, bodies))
        self._append_ready.set()

    def get(self, index: int):
        """The committed entry at `index` (IndexError if absent or not yet committed)."""
        if index > self.replica.committed_index:
            raise IndexError(
                f"index {index} is not committed (committed {self.replica.committed_index})"
            )
        return self.store.get(index)

    async def transfer_leadership(self, transferee: str) -> None:
        """Hand leadership to `transferee`; returns once it leads (DLedgerError if not)."""
        awaited = Awaited()
        self.transfer_leadership_nowait(transferee, awaited)
        await _succeeded(awaited)

    def transfer_leadership_nowait(self, transferee: str, callback) -> None:
        """`transfer_leadership` without a task: `callback(code, None)` once it is done,
        refused or failed (at once when this member is the transferee)."""
        handle = self._new_handle(callback)
        code = self.replica.transfer_leadership(handle, transferee, self.now_ms())
        self._process()
        if code is not Code.SUCCESS or transferee == self.config.self_id:
            self._callbacks.pop(handle, None)
            callback(code, None)

    async def change_members(self, change: Change, member: str, address: str = "") -> None:
        """Add `member` at `address` as a learner, promote it or remove it, as leader;
        returns once the change commits (DLedgerError if refused or not committed,
        ValueError if it does not apply to the configuration)."""
        awaited = Awaited()
        self.change_members_nowait(change, member, address, awaited)
        await _succeeded(awaited)

    def change_members_nowait(self, change: Change, member: str, address: str, callback) -> None:
        """`change_members` without a task: `callback(code, None)` once it committed or
        failed, or at once when refused; ValueError at once if it does not apply."""
        handle = self._new_handle(callback)
        try:
            code = self.replica.change_members(handle, change, member, address, self.now_ms())
        except ValueError:
            self._callbacks.pop(handle, None)
            raise
        self._process()
        if code is not Code.SUCCESS:
            self._callbacks.pop(handle, None)
            callback(code, None)

    async def change_members_at_leader(
        self, change: str, member: str, address: str = "", timeout_s: float = 5.0
    ) -> dict:
        """`change_members` (`change` add, promote or remove) asked of whichever member
        leads, as a broker forwards its admin's request: here when we lead, else over
        the peer port's MEMBERS RPC to the leader we know. The members after it, as the
        leader has them (`members`): ours may lag, and a member that removed itself may
        never hear of it. DLedgerError as answered (NOT_LEADER when no leader is known),
        ValueError for a change that does not apply (NETWORK_ERROR when the leader
        cannot be asked)."""
        if self.replica.role is Role.LEADER:
            await self.change_members(Change(change), member, address)
            return self.members()
        request = {"code": RpcCode.MEMBERS, "change": Change(change).value, "memberId": member}
        answer = await self._ask_leader({**request, "address": address}, timeout_s)
        members = answer.get("members")  # a leader of an older version does not say
        return members if isinstance(members, dict) else self.members()

    async def change_at_leader(self, change: str, member: str, address: str = "") -> dict:
        """An operator's change asked of whichever member leads, as a broker's or a
        controller's remoting port forwards it (DLEDGER_MEMBERS): `lead` hands
        leadership to voter `member`; add, promote or remove change the members.
        Returns once it has taken effect, with the members then (the leader's view of
        a change of members); DLedgerError as answered, ValueError for a change that
        does not apply."""
        if change == LEAD_CHANGE:
            await self.transfer_leadership_at_leader(member)
            return self.members()
        return await self.change_members_at_leader(change, member, address)

    def members(self) -> dict:
        """The configuration in force and its leader, as DLEDGER_MEMBERS answers it:
        `{"voters", "learners", "peers", "leaderId"}`."""
        meta = self.metadata()
        return {k: meta[k] for k in ("voters", "learners", "peers", "leaderId")}

    async def transfer_leadership_at_leader(self, transferee: str, timeout_s: float = 10.0) -> None:
        """`transfer_leadership` to `transferee` asked of whichever member leads (over the
        peer port's LEADERSHIP_TRANSFER when another does); returns once it leads.
        DLedgerError as answered, ValueError for a transferee that is not a voter."""
        try:
            if self.replica.role is Role.LEADER:
                await self.transfer_leadership(transferee)
            else:
                request = {"code": RpcCode.LEADERSHIP_TRANSFER, "transfereeId": transferee}
                await self._ask_leader(request, timeout_s)
        except DLedgerError as exc:
            if exc.code is Code.UNKNOWN_MEMBER:
                raise ValueError(f"{transferee} is not a voter of the group") from None
            raise

    async def _ask_leader(self, request: dict, timeout_s: float) -> dict:
        """Send `request` (an RPC of this group) to the leader we know and return its
        answer: DLedgerError unless SUCCESS (NOT_LEADER when no leader is known within
        `timeout_s`: a group just started, or electing, names one first; NETWORK_ERROR
        when it cannot be asked), ValueError for UNEXPECTED_ARGUMENT (the request does
        not apply)."""
        deadline = trio.current_time() + timeout_s
        r = self.replica
        while True:
            leader_address = r.members.current.address(r.leader_id) if r.leader_id else None
            if leader_address is not None:
                break
            if trio.current_time() >= deadline:
                raise DLedgerError(Code.NOT_LEADER, f"no leader known within {timeout_s:g} s")
            await trio.sleep(LEADER_POLL_S)
        request = {**request, "group": self.config.group}
        try:
            async with RpcClient(
                leader_address, connect_timeout_s=0.5, tls=self.config.peer_tls
            ) as conn:
                resp = await conn.call(request, max(0.0, deadline - trio.current_time()))
        except (RpcUnavailable, RpcTimeout) as exc:
            raise DLedgerError(Code.NETWORK_ERROR, f"leader {r.leader_id}: {exc}") from None
        code = Code(resp["code"])
        if code is Code.UNEXPECTED_ARGUMENT:
            raise ValueError(resp.get("remark", ""))
        if code is not Code.SUCCESS:
            raise DLedgerError(code, f"from {r.leader_id}: {resp.get('remark', '')}")
        return resp

    def _new_handle(self, callback) -> int:
        self._handles += 1
        self._callbacks[self._handles] = callback
        return self._handles

    # ------------------------------------------------------------------ events into the core
    def _on_message(self, msg) -> None:
        if msg.group != self.config.group or msg.remote_id != self.config.self_id:
            log.warning("dropping %s for %s/%s", type(msg).__name__, msg.group, msg.remote_id)
            return
        if stages.ON:
            stages.mark(f"receive {type(msg).__name__}")
        self._in_chunk = True
        self.replica.receive(msg, self.now_ms())
        self._process()

    def _on_chunk_end(self) -> None:
        """The transport handed over every message of a chunk it read: start the fsync
        they asked for, one for all of them. A follower fsyncs on the loop
        (`core.group_commit`), so one per push would sync the pushes a read brings one
        by one, each waiting for the fsync of the one before."""
        self._in_chunk = False
        if self._fsync_held:
            self._fsync_held = False
            self._want_sync()

    def _on_send_failed(self, msg) -> None:
        self.replica.send_failed(msg, self.now_ms())
        self._process()

    async def _append_loop(self) -> None:
        while True:
            await self._append_ready.wait()
            self._append_ready = trio.Event()
            queue, self._append_queue = self._append_queue, []
            self._append_now(queue)

    def _append_now(self, queue: list[tuple[int, list[bytes]]]) -> None:
        if stages.ON:
            stages.mark("append started")
        end_pos = None
        if self._placed_at:
            queue, end_pos = self._where_placed(queue)
        codes = self.replica.append_batch(queue, self.now_ms())
        for (handle, _bodies), code in zip(queue, codes, strict=True):
            if code is not Code.SUCCESS:
                self._complete(handle, code, None)
        if end_pos is not None and codes and codes[-1] is Code.SUCCESS:
            assert self.store.end_pos == end_pos, (
                f"entries placed to end at {end_pos} end at {self.store.end_pos}"
            )
        self._process()

    def _where_placed(self, queue: list[tuple[int, list[bytes]]]):
        """The appends of `queue` that may go to the leader, and where the last of them
        was placed to end (None if unplaced); those placed from a position the log will
        not end at are refused here (see `append_nowait`). Placed appends come in the
        order they were placed, each from where the one before ends, so only the first
        can find the log moved (a new term's NOOP): every one behind it then follows."""
        placed_at = self._placed_at
        end_pos = self.store.end_pos
        kept = []
        for handle, bodies in queue:
            at_pos, placed_end = placed_at.pop(handle, (None, None))
            if at_pos is None:
                end_pos = None  # unplaced: not checked
            elif end_pos is None:
                raise AssertionError("an append placed after an unplaced one in one log")
            elif at_pos != end_pos:
                self._complete(handle, Code.LEADER_NOT_READY, None)
                continue
            else:
                end_pos = placed_end
            kept.append((handle, bodies))
        return kept, end_pos

    async def _timer_loop(self) -> None:
        while True:
            deadline_ms = self._next_deadline_ms
            self._armed_deadline_ms = deadline_ms
            with trio.move_on_at(deadline_ms / 1000.0):
                await self._deadline_moved.wait()
                self._deadline_moved = trio.Event()
                continue
            self.replica.tick(self.now_ms())
            self._process()

    # ------------------------------------------------------------------ effects out of the core
    def _process(self) -> None:
        """Take the core's `Ready` and carry it out. One taken while another is being
        carried out (an effect fed the core: an inline fsync completing, a callback)
        waits until that one is done, so effects leave in the order the core made
        them; an append from inside an effect is queued for the append task."""
        ready = self.replica.ready()
        self._next_deadline_ms = ready.next_deadline_ms
        self._readies.append(ready)
        if self._processing:
            return
        self._processing = True
        try:
            while self._readies:
                self._carry_out(self._readies.popleft())
        finally:
            self._processing = False
        if self._next_deadline_ms < self._armed_deadline_ms:
            self._armed_deadline_ms = float("-inf")
            self._deadline_moved.set()

    def _carry_out(self, ready: Ready) -> None:
        """Do what `ready` lists, in its order (see `Ready`)."""
        for out in ready.outputs:
            for msg in out.messages:
                if stages.ON:
                    stages.mark(f"send {type(msg).__name__}")
                self.transport.send(msg)
            if out.needs_sync:
                self._want_sync()
            for term, role in out.role_changes:
                log.info("%s: %s in term %d", self.config.self_id, role.name, term)
                for handler in self._role_handlers:
                    handler(term, role)
            if out.committed_index is not None:
                if stages.ON:
                    stages.mark("committed")
                for handler in self._commit_handlers:
                    handler(out.committed_index)
            for completion in out.completions:
                self._complete(completion.handle, completion.code, completion.positions)
            if out.snapshot is not None:
                self._install(*out.snapshot)
        if ready.save is not None:
            assert self._hard_state_to_save is None, "the core never overlaps saves"
            self._hard_state_to_save = (*ready.save, ready.members)
            self._hard_state_wanted.set()
            if ready.members is not None:
                self.transport.set_addresses(dict(ready.members.current.addresses))
                log.info("%s: members now %s", self.config.self_id, ready.members.current.text())

    def _install(self, index: int, data: bytes) -> None:
        """Install the leader's snapshot as of entry `index` in a task, then answer the
        leader; without an application there is nothing to install."""
        if self._install_snapshot is None:
            self.replica.snapshot_installed(index, True)
            self._process()
            return
        assert self._nursery is not None, "a snapshot arrives only while serving"
        self._nursery.start_soon(self._install_task, index, data, name="snapshot install")

    async def _install_task(self, index: int, data: bytes) -> None:
        try:
            await self._install_snapshot(index, data)
        except snapshot.INSTALL_ERRORS as exc:
            log.error(
                "%s: snapshot as of index %d not installed: %s", self.config.self_id, index, exc
            )
            self.replica.snapshot_installed(index, False)
        else:
            log.info(
                "%s: installed the leader's snapshot as of index %d (%d bytes)",
                self.config.self_id,
                index,
                len(data),
            )
            self.replica.snapshot_installed(index, True)
        self._process()

    def _complete(self, handle: int, code: Code, positions) -> None:
        callback = self._callbacks.pop(handle, None)
        if callback is not None:
            callback(code, positions)

    async def _hard_state_loop(self) -> None:
        """Persist the term and vote a Ready asks for, then tell the core, whose next
        Ready releases the outputs that waited for them."""
        while True:
            await self._hard_state_wanted.wait()
            self._hard_state_wanted = trio.Event()
            (term, vote, members), self._hard_state_to_save = self._hard_state_to_save, None
            members_text = None if members is None else members.text()
            await until_room(
                functools.partial(functools.partial, self.term_vote.save, term, vote, members_text),
                what="while saving the term and vote",
            )
            self.replica.hard_state_saved()
            self._process()

    def _want_sync(self) -> None:
        """The core waits for what it appended to be durable: group commit."""
        if stages.ON:
            stages.mark("fsync wanted")
        if self._sync_thread is None:  # stopped: a plan still running reports to no one
            return
        if self._in_chunk:
            self._fsync_held = True
            return
        self._start_fsync(
            self._group_commit.wanted(
                self.store.end_index,
                self.replica.committed_index,
                self.now_ms(),
                following=self.replica.following,
            )
        )

    def _start_fsync(self, fsync: Fsync | None) -> None:
        """Start `fsync`, the group commit the schedule says is due, if any: on the loop's
        own thread or on the group-commit thread (see `core.group_commit`)."""
        if fsync is None:
            return
        plan = self.store.sync_plan()
        assert plan.end_index == fsync.end_index, "the plan covers what the schedule decided"
        if stages.ON:
            stages.mark("fsync started")
        if not fsync.inline:
            self._sync_thread.submit(plan)
            return
        error, took_s = self._sync_thread.run_here(plan)
        if error is None and not self.config.record_synced_lengths:
            # Reported here, not by a hop to the group-commit task: an answer that
            # waits for this fsync (a follower's ack, the leader's commit) leaves
            # with the effects of this step. (The Ready this makes waits until the
            # one being carried out is done, so effects keep order.)
            self._synced(plan, took_s)
        else:  # an error stops the replica from its task; synced lengths may wait
            self._sync_thread.report(plan, error, took_s)

    async def _sync_loop(self) -> None:
        """Group commit: reports each plan's completion to the core, and stops the
        replica (DiskFailure) on a failed fsync."""
        thread = self._sync_thread
        assert thread is not None, "serve() starts the thread before this task"
        while True:
            await thread.done.wait()
            thread.done = trio.Event()
            (plan, error, took_s), thread.result = thread.result, None
            if isinstance(error, OSError):
                raise DiskFailure(
                    f"fsync failed ({error}); stopping before anything depends on it"
                ) from error
            if error is not None:
                raise error
            try:
                self._record_synced()
            except OSError as exc:  # nothing is acknowledged on this fsync until it is
                if exc.errno not in NO_ROOM:
                    raise
                await until_room(lambda: self._record_synced, what="while recording synced lengths")
            self._synced(plan, took_s)

    def _synced(self, plan, took_s: float) -> None:
        """A group commit's fsyncs completed: the entries it covers are persisted, and
        the next group commit starts if one was asked for meanwhile."""
        if stages.ON:
            stages.mark("fsync done")
        syncs = plan.syncs
        wanted = self._group_commit.finished(took_s, syncs, self.now_ms())
        took_ms = None
        if syncs:
            self._fsync_seconds.observe(took_s)
            took_ms = took_s * 1000
        self.replica.persisted(plan.end_index, plan.generation, self.now_ms(), took_ms)
        self._process()
        if wanted:  # while this one ran (none is due if the Readies above started it)
            self._start_fsync(
                self._group_commit.next(
                    self.store.end_index,
                    self.replica.committed_index,
                    self.now_ms(),
                    following=self.replica.following,
                )
            )

    async def _flush_loop(self) -> None:
        """Page-cache mode: acks went out already; flush every flushFileInterval."""
        schedule = self._group_commit
        while True:
            await trio.sleep_until(schedule.deadline_ms / 1000.0)
            fsync = schedule.next(
                self.store.end_index,
                self.replica.committed_index,
                self.now_ms(),
                following=self.replica.following,
            )
            assert fsync is not None and not fsync.inline, "a due flush runs on a worker"
            plan = self.store.sync_plan()
            started = time.perf_counter()
            await durably(plan.run)
            took_s = time.perf_counter() - started
            if plan.syncs:
                self._fsync_seconds.observe(took_s)
            self._record_synced()
            schedule.finished(took_s, plan.syncs, self.now_ms())

    def _record_synced(self) -> None:
        """With recordSyncedLengths, write how much of each data file is fsynced.

        A harness that kills this process and then wants a power cut's effect (lose
        what was not fsynced) reads this file. It is written after the fsync and
        before anything is acknowledged because of it, so it never claims less than
        an acknowledgment relied on; it needs no fsync of its own, since a killed
        process's page cache survives and the harness is the only "power cut".
        """
        if not self.config.record_synced_lengths or not isinstance(self.store, FileLogStore):
            return
        path = self.store.base_dir / SYNCED_LENGTHS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.store.synced_lengths_now()))
        os.replace(tmp, path)

    def _durable_committed(self) -> int:
        return min(self.replica.committed_index, self.replica.persisted_index)

    async def _checkpoint_loop(self) -> None:
        """Every CHECKPOINT_INTERVAL_S, the durable committed index, which bounds what
        recovery must scan. Group commits leave the index file out (it is derived from
        the data), so it is fsynced here first: recovery trusts the index entries below
        the checkpoint and rebuilds the rest from the data."""
        saved = -1
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL_S)
            index = self._durable_committed()
            if index != saved:
                plan = self.store.index_sync_plan()
                assert plan.end_index >= index, "entries are written before they are durable"
                await durably(plan.run)
                await until_room(
                    lambda index=index: functools.partial(self.checkpoint.save, index),
                    what="while saving the checkpoint",
                )
                saved = index

    async def _disk_space_loop(self) -> None:
        """DLedger's CleanSpaceService check: how full the store's filesystem is. Over
        diskFullRatio the replica refuses appends (DISK_FULL) until it is under again;
        over diskSpaceRatioToCheckExpired retention runs now, not at its next turn.
        Under the ratio it clears what a new segment that found no room set, so the
        next append tries again (the store checks the free space before it allocates)."""
        config = self.config
        over = False  # at the last check
        while True:
            ratio = await trio.to_thread.run_sync(used_ratio, self.store.base_dir)
            full = ratio > config.disk_full_ratio
            if full != over:
                over = full
                if full:
                    log.warning(
                        "disk full: %.1f%% of the filesystem of %s in use (diskFullRatio %.0f%%);"
                        " refusing appends",
                        ratio * 100,
                        self.store.base_dir,
                        config.disk_full_ratio * 100,
                    )
                else:
                    log.warning("disk space OK: %.1f%% in use; taking appends", ratio * 100)
            if full != self.replica.disk_full:
                self.replica.set_disk_full(full, self.now_ms())
                self._process()
            if ratio > config.disk_space_ratio_to_check_expired:
                self._retention_due.set()
            await trio.sleep(DISK_CHECK_INTERVAL_S)

    async def _retention_loop(self) -> None:
        keep_s = self.config.file_reserved_hours * 3600.0
        while True:
            with trio.move_on_after(self.config.clean_resource_interval_ms / 1000):
                await self._retention_due.wait()
            self._retention_due = trio.Event()
            try:
                deleted = self.store.delete_expired(self.retention_floor(), keep_s)
            except OSError as exc:  # the new beginning's file had no room: next turn
                if exc.errno not in NO_ROOM:
                    raise
                log.warning("retention skipped: %s", exc)
                await trio.sleep(NO_ROOM_RETRY_S)
                continue
            if deleted:
                log.info(
                    "retention deleted %d data files; log now begins at %d",
                    deleted,
                    self.store.begin_index,
                )

    # ------------------------------------------------------------------ client RPCs
    def _on_rpc(self, request: dict, reply: Callable[[dict], None]) -> bool:
        """The peer port's one route: every RPC is checked here once and answered through
        `reply`, at once or on completion (an append once committed, a leadership
        transfer once done), without a task per request. Returns True: it takes them
        all."""
        try:
            self._serve_rpc(request, reply)
        except Exception as exc:  # one bad request must not take the server down
            log.exception("%s: RPC failed on code %s", self.config.self_id, request.get("code"))
            reply(self._answer(Code.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))
        return True

    def _serve_rpc(self, request: dict, reply: Callable[[dict], None]) -> None:
        code = request.get("code")
        if request.get("group", self.config.group) != self.config.group:
            reply(self._answer(Code.UNKNOWN_GROUP, f"this is group {self.config.group}"))
        elif code == RpcCode.APPEND:
            bodies = request.get("bodies")
            if not self.client_appends:
                reply(self._answer(Code.UNSUPPORTED, "this log takes appends from its broker"))
            elif not isinstance(bodies, list) or not all(isinstance(b, bytes) for b in bodies):
                reply(self._answer(Code.UNEXPECTED_ARGUMENT, "bodies must be a list of bytes"))
            else:
                self.append_nowait(bodies, functools.partial(self._appended, reply))
        elif code == RpcCode.GET:
            index = request.get("index")
            if not isinstance(index, int):
                reply(self._answer(Code.UNEXPECTED_ARGUMENT, "index must be an integer"))
                return
            try:
                e = self.get(index)
            except IndexError as exc:
                reply(self._answer(Code.INDEX_OUT_OF_RANGE, str(exc)))
                return
            reply(
                self._answer(
                    Code.SUCCESS,
                    index=e.index,
                    term=e.term,
                    pos=e.pos,
                    type=int(e.type),
                    body=e.body,
                )
            )
        elif code in (RpcCode.METADATA, RpcCode.STATUS):
            reply(self._answer(Code.SUCCESS, **self.metadata()))
        elif code == RpcCode.LEADERSHIP_TRANSFER:
            transferee = request.get("transfereeId")
            if not isinstance(transferee, str):
                reply(self._answer(Code.UNEXPECTED_ARGUMENT, "transfereeId must be a string"))
            else:
                self.transfer_leadership_nowait(
                    transferee, lambda code, _result: reply(self._answer(code, _remark(code)))
                )
        elif code == RpcCode.MEMBERS:
            self._serve_members(request, reply)
        else:
            reply(self._answer(Code.UNSUPPORTED, f"unknown request code {code}"))

    def _serve_members(self, request: dict, reply: Callable[[dict], None]) -> None:
        """MEMBERS: {"change": add | promote | remove, "memberId", "address" (add)},
        answered once committed; a member that does not lead answers NOT_LEADER with
        the leader's id, as every RPC does."""
        change, member = request.get("change"), request.get("memberId")
        address = request.get("address", "")
        if change not in [c.value for c in Change]:
            reply(self._answer(Code.UNEXPECTED_ARGUMENT, "change must be add, promote or remove"))
        elif not isinstance(member, str) or not isinstance(address, str):
            reply(self._answer(Code.UNEXPECTED_ARGUMENT, "memberId and address must be strings"))
        else:
            try:
                self.change_members_nowait(
                    Change(change),
                    member,
                    address,
                    # with the members it leaves, for the member that forwarded it
                    lambda code, _result: reply(
                        self._answer(code, _remark(code), members=self.members())
                    ),
                )
            except ValueError as exc:
                reply(self._answer(Code.UNEXPECTED_ARGUMENT, str(exc)))

    def _appended(self, reply: Callable[[dict], None], code: Code, positions) -> None:
        if code is Code.SUCCESS:  # the hot path: just what the client reads
            reply({"code": Code.SUCCESS, "positions": positions})
        else:
            reply(self._answer(code, _remark(code)))

    def _answer(self, code: Code, remark: str = "", **fields) -> dict:
        r = self.replica
        leader = r.leader_id
        return {
            "code": int(code),
            "remark": remark,
            "leaderId": leader,
            "leaderAddr": r.members.current.address(leader) if leader else None,
            "term": r.term,
            **fields,
        }
