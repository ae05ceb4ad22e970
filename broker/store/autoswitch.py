"""Controller-mode replication of a classic CommitLog, RocketMQ 5's AutoSwitchHAService
(frames: `autoswitch_wire`; epochs and the truncation rule: `epoch_file`).

A slave connects to its master's HA port and sends a handshake (its brokerId); the
master answers with its max offset and its epoch list; the slave cuts its log where
it stops agreeing with the master's (`truncation_point`), acknowledges where it now
ends, and the master streams the log from there: batches of at most
`haTransferBatchSize`, never across a file end or an epoch's end, each saying its
epoch and the master's confirmOffset; a batch of size 0 is the heartbeat, after
`haSendHeartbeatInterval` with nothing sent. The slave appends an epoch entry when a
batch brings a new epoch, appends the bytes, takes min(confirmOffset, its max) as
its own, and acknowledges when its max grew (and every heartbeat interval). Either
side drops a peer silent for `haHousekeepingInterval`.

The master keeps the SyncStateSet (`SyncStateSet`): the brokerIds caught up with it.
With `allAckInSyncStateSet` a put is acknowledged once every member holds it, and
the confirmOffset, the end of what every member holds, is where dispatch to the
consume queues may go.

Differences from RocketMQ 5.3.3:

- The slave acknowledges right after it cut its log; RocketMQ's acks only when its
  max grew past the cut, which it has not, so its transfer starts at the first
  5 s heartbeat report.
- A slave whose log the master's epochs do not vouch for stops and says so
  (`refusal`, `runtime_info`, the log) until it is given a master again, instead of
  retrying every 2 s; one with no epochs but data is refused too (`epoch_file`).
- `inSyncReplicas=N` counts distinct brokerIds, not connections: a slave connected
  twice is one copy.
- A master told that its epoch is over (`fence`) refuses puts at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio
from raftmq.broker.store.autoswitch_wire import (
    Ack,
    Handshake,
    HandshakeReply,
    MasterReader,
    OldHandshake,
    SlaveReader,
    Transfer,
    WireError,
)
from raftmq.broker.store.classic_commitlog import PutStatus
from raftmq.broker.store.epoch_file import EpochEntry, EpochFile, Unreplicable, truncation_point
from raftmq.broker.store.ha_link import (
    CLOSED,
    CONNECT_FAILED,
    IDLE_POLL_S,
    RECONNECT_S,
    HAConfig,
    HAProtocolError,
    RateMeter,
    connect,
    keep_for_slaves,
    read_batch,
    receive,
    serve_links,
    slave_runtime_info,
    start_offset,
)

from raftmq.process.errors import first_leaf
from raftmq.remoting.server import peer_name

if TYPE_CHECKING:
    from raftmq.broker.store.classic_log import ClassicLog

log = logging.getLogger(__name__)

SHRINK_CHECK_S = 5.0  # checkSyncStateSetPeriod


@attrs.define
class AutoSwitchConfig:
    link: HAConfig = attrs.Factory(HAConfig)
    max_not_caught_up_s: float = 15.0  # haMaxTimeSlaveNotCatchup
    all_ack_in_sync_state_set: bool = False  # allAckInSyncStateSet
    in_sync_replicas: int = 1  # inSyncReplicas: copies (master included) a put waits for
    min_in_sync_replicas: int = 1  # minInSyncReplicas
    sync_from_last_file: bool = False  # syncFromLastFile: an empty slave copies the last file
    async_learner: bool = False  # asyncLearner: never joins the SyncStateSet


class AlterRefused(Exception):
    """The controller answered that it did not take a proposed SyncStateSet (a fenced
    epoch, a member it does not know alive...)."""


class AlterUnknown(Exception):
    """No answer to a proposed SyncStateSet: the controller may have taken it."""


# alter_sync_state_set(new set, masterEpoch, syncStateSetEpoch) -> (set, syncStateSetEpoch)
AlterSyncStateSet = Callable[[frozenset[int], int, int], Awaitable[tuple[frozenset[int], int]]]


@attrs.frozen
class Change:
    """A change to the SyncStateSet: a slave to add (if still connected when it is
    proposed), members to remove."""

    add: int | None = None
    remove: frozenset[int] = frozenset()


class SyncStateSet:
    """The master's SyncStateSet (RocketMQ's `AutoSwitchHAService` bookkeeping): the
    members the controller accepted, and the sets proposed to it whose outcome is not
    known yet: acks are counted against the union of all of them (#5663: a proposal
    the controller took whose reply was lost must not leave an acknowledged put on
    the master alone). RocketMQ counts the union only while its request is out, so
    a lost reply ends it; here it lasts until the controller's set is known again
    (a later proposal taken, or `known`)."""

    def __init__(self, master_id: int, members: frozenset[int], epoch: int) -> None:
        assert master_id in members, (master_id, members)
        self.master_id = master_id
        self.members = members
        self.epoch = epoch  # syncStateSetEpoch
        self.uncertain: frozenset[int] = frozenset()  # proposed, outcome unknown

    @property
    def effective(self) -> frozenset[int]:
        """The set acks are counted against (isSynchronizingSyncStateSet's union)."""
        return self.members | self.uncertain

    def known(self, members: frozenset[int], epoch: int) -> None:
        """The controller's set, as it answered or as it was read from it."""
        assert self.master_id in members, (self.master_id, members)
        self.members, self.epoch, self.uncertain = frozenset(members), epoch, frozenset()


class SlaveConnection:
    """One slave's link to the master (RocketMQ's AutoSwitchHAConnection)."""

    def __init__(self, master: AutoSwitchMaster, stream: trio.SocketStream) -> None:
        self.master = master
        self.stream = stream
        self.peer = peer_name(stream)
        self.slave_id: int | None = None  # from the handshake
        self.learner = False
        self.from_last_file = False
        self.start_offset: int | None = None  # from the slave's first ack
        self.sent_offset = -1
        self.acked_offset = -1
        self.max_at_last_transfer = 0  # the master's max offset when it last sent bytes
        self.rate = RateMeter()
        self._started = trio.Event()
        self._send_lock = trio.Lock()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_loop)
            nursery.start_soon(self._write_loop)

    async def _send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def _read_loop(self) -> None:
        reader = MasterReader()
        idle = self.master.config.link.housekeeping_interval_s
        while True:
            for frame in reader.feed(await receive(self.stream, idle, "slave")):
                if isinstance(frame, Handshake):
                    await self._handshake(frame)
                else:
                    self._ack(frame)

    async def _handshake(self, frame: Handshake) -> None:
        master = self.master
        self.slave_id, self.learner = frame.broker_id, frame.async_learner
        self.from_last_file = frame.sync_from_last_file
        log.info("AutoSwitch HA: slave %d at %s shook hands", frame.broker_id, self.peer)
        reply = HandshakeReply(master.log.write_pos, tuple(master.epochs.entries))
        await self._send(reply.encode())

    def _ack(self, frame: Ack) -> None:
        master, offset = self.master, frame.offset
        if self.start_offset is None:
            start = start_offset(master.log, offset, self.from_last_file)
            if start < master.log.write_pos and master.epochs.entry_at(start, start + 1) is None:
                raise HAProtocolError(f"the slave's offset {start} is in no epoch of this master")
            self.start_offset = self.sent_offset = start
            log.info("AutoSwitch HA: slave %s starts at offset %d", self.slave_id, start)
            self._started.set()
        elif offset > self.sent_offset:
            raise HAProtocolError(f"the slave acks {offset}, beyond the {self.sent_offset} sent")
        self.acked_offset = offset
        master.acked(self)

    async def _write_loop(self) -> None:
        await self._started.wait()
        master = self.master
        config, log_, epochs = master.config.link, master.log, master.epochs
        last_write = time.monotonic()
        while True:
            offset, end = self.sent_offset, log_.write_pos
            entry = epochs.entry_at(offset, end) or epochs.last
            assert entry is not None, "a master has an epoch"
            batch_bytes = config.transfer_batch_bytes
            following = epochs.next_after(entry.epoch)
            if following is not None:  # a batch stays within its epoch
                batch_bytes = min(batch_bytes, following.start_offset - offset)
            data = read_batch(log_, offset, batch_bytes) if offset < end else b""
            idle = time.monotonic() - last_write > config.heartbeat_interval_s
            if data or idle:
                confirm = master.confirm_offset
                frame = Transfer(offset, entry.epoch, entry.start_offset, confirm, data)
                self.sent_offset = offset + len(data)  # before the send: the ack may come first
                self.max_at_last_transfer = end
                self.rate.add(len(data))
                await self._send(frame.encode())
                last_write = time.monotonic()
                if data:
                    continue
            if self.sent_offset == log_.write_pos:
                master.caught_up(self)  # nothing left to send (RocketMQ counts it caught up)
            with trio.move_on_after(IDLE_POLL_S):
                await log_.written.wait()


class AutoSwitchMaster:
    """The master's side: serves slaves, keeps the SyncStateSet and the confirmOffset.
    `alter_sync_state_set` proposes a new set to the controller (AlterRefused if it
    does not take it); `on_ack(offset)` is told when puts up to `offset` have the
    acknowledgements they wait for (`acked_offset`). The controller answers a proposal
    with the set and its syncStateSetEpoch, or raises AlterRefused or AlterUnknown."""

    def __init__(
        self,
        log_: ClassicLog,
        epochs: EpochFile,
        config: AutoSwitchConfig,
        broker_id: int,
        alter_sync_state_set: AlterSyncStateSet,
        on_ack: Callable[[int], None] = lambda offset: None,
        sync_state_set: SyncStateSet | None = None,
    ) -> None:
        self.log = log_
        self.epochs = epochs
        self.config = config
        self.broker_id = broker_id
        self.alter_sync_state_set = alter_sync_state_set
        self.on_ack = on_ack
        self.sync_state = sync_state_set or SyncStateSet(broker_id, frozenset({broker_id}), 0)
        self.connections: set[SlaveConnection] = set()
        self.master_epoch = epochs.last_epoch
        self.fenced: str | None = None
        # whether the controller may not yet have elected another master (a broker's
        # lease: broker.replicas_manager); always, for a master without one
        self.lease: Callable[[], bool] = lambda: True
        self.last_caught_up_s: dict[int, float] = {}
        self._confirm = log_.checkpointed_confirm()  # what the set was last known to hold
        self._proposing: set[frozenset[int]] = set()
        log_.confirmed = lambda: self.confirm_offset  # dispatch stops there
        log_.add_retention_limit(lambda: keep_for_slaves(log_, self.connections))
        log_.add_deletion_handler(epochs.retain_from)
        self._acked = 0
        self._alter_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ role
    def begin(self, master_epoch: int) -> EpochEntry:
        """Become master in `master_epoch` (changeToMaster): a torn tail is cut off and
        the epoch begins where the whole records end."""
        self.log.truncate(self.log.parsed_pos)
        entry = self.epochs.begin_epoch(master_epoch, self.log.write_pos)
        self.master_epoch = master_epoch
        self.fenced = None
        self.log.confirmed = lambda: self.confirm_offset  # a slave's store too, until now
        self._confirm = self.confirm_offset_now()
        self.log.confirm_moved()  # what it copied as a slave may be dispatched now
        return entry

    def fence(self, why: str) -> None:
        """This master's epoch is over (a newer master was elected): puts are refused."""
        log.warning("AutoSwitch HA: master epoch %d fenced: %s", self.master_epoch, why)
        self.fenced = why

    def refusal(self) -> PutStatus | None:
        """Why a put is refused before it is stored, or None: this master's epoch is
        over (RocketMQ's keeps taking puts until its role changes), or the SyncStateSet
        is smaller than minInSyncReplicas."""
        if self.fenced is not None or not self.lease():
            return PutStatus.FENCED
        if len(self.sync_state.effective) < self.config.min_in_sync_replicas:
            return PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
        return None

    # ------------------------------------------------------------------ acks
    @property
    def confirm_offset(self) -> int:
        """The end of what the SyncStateSet holds (CommitLog.getConfirmOffset): the
        master's max offset when it is the set's only member or acks are not awaited
        from every member."""
        if not self.config.all_ack_in_sync_state_set or self.sync_state.effective == {
            self.broker_id
        }:
            return self.log.write_pos
        return self._confirm

    def confirm_offset_now(self) -> int:
        """computeConfirmOffset: the least ack of the members other than this one,
        unchanged while one of them has no connection (#6662: an isolated master must
        not confirm alone)."""
        acks = [self.log.write_pos]
        for member in self.sync_state.effective - {self.broker_id}:
            held = [c.acked_offset for c in self.connections if c.slave_id == member]
            if not held or max(held) < 0:
                return self._confirm
            acks.append(max(held))
        return min(acks)

    @property
    def acked_offset(self) -> int:
        """How far puts have the acknowledgements they wait for (the `Replication`
        protocol of ClassicCommitLog)."""
        if self.config.all_ack_in_sync_state_set:
            return self.confirm_offset
        copies = self.config.in_sync_replicas - 1
        if copies <= 0:
            return self.log.write_pos
        best: dict[int, int] = {}
        for c in self.connections:
            if c.slave_id is not None and c.start_offset is not None:
                best[c.slave_id] = max(best.get(c.slave_id, -1), c.acked_offset)
        if len(best) < copies:
            return 0
        return sorted(best.values(), reverse=True)[copies - 1]

    def slave_ok(self, offset: int) -> bool:
        """Puts wait for acks (there is no SLAVE_NOT_AVAILABLE in controller mode)."""
        return True

    def acked(self, connection: SlaveConnection) -> None:
        slave, offset = connection.slave_id, connection.acked_offset
        assert slave is not None
        if offset >= connection.max_at_last_transfer:
            self.caught_up(connection)
        if slave in self.sync_state.effective:
            self._confirm = max(self._confirm, self.confirm_offset_now())
        elif (
            not connection.learner
            and offset >= connection.max_at_last_transfer
            and offset >= self.confirm_offset
            and offset >= (self.epochs.last.start_offset if self.epochs.last else 0)
        ):
            self._propose(Change(add=slave))
        self._release()

    def caught_up(self, connection: SlaveConnection) -> None:
        if connection.slave_id is not None:
            self.last_caught_up_s[connection.slave_id] = trio.current_time()

    def _release(self) -> None:
        acked = self.acked_offset
        if acked > self._acked:
            self._acked = acked
            self.on_ack(acked)
        self.log.confirm_moved()

    # ------------------------------------------------------------------ the set
    def _propose(self, change: Change) -> None:
        """Propose `change` in the background, once while it is out."""
        if self._nursery is not None and change not in self._proposing:
            self._proposing.add(change)
            self._nursery.start_soon(self._propose_once, change)

    async def _propose_once(self, change: Change) -> None:
        try:
            await self.propose(change)
        finally:
            self._proposing.discard(change)

    def known(self, members: frozenset[int], sync_state_set_epoch: int) -> None:
        """The controller's SyncStateSet as read from it (GET_REPLICA_INFO): it ends the
        doubt a proposal left unanswered leaves."""
        self.sync_state.known(members, sync_state_set_epoch)
        self._confirm = max(self._confirm, self.confirm_offset_now())
        self._release()

    async def propose(self, change: Change) -> None:
        """Ask the controller for the set `change` makes of the current one, made when
        the previous proposal is done (one made earlier would undo it); apply it only
        once it is taken. While the request is out the union of both sets counts."""
        async with self._alter_lock:
            state = self.sync_state
            connected = {c.slave_id for c in self.connections if c.start_offset is not None}
            joining = {change.add} & connected if change.add is not None else set()
            new_set = (state.members | joining) - change.remove
            if new_set == state.members:
                return
            before = state.uncertain
            state.uncertain = before | new_set
            self._confirm = max(self._confirm, self.confirm_offset_now())
            try:
                members, epoch = await self.alter_sync_state_set(
                    new_set, self.master_epoch, state.epoch
                )
            except AlterRefused as exc:
                state.uncertain = before
                log.warning("AutoSwitch HA: SyncStateSet %s refused: %s", sorted(new_set), exc)
                return
            except AlterUnknown as exc:
                log.warning(
                    "AutoSwitch HA: SyncStateSet %s may or may not be taken (%s): acks are"
                    " counted against %s until it is known",
                    sorted(new_set),
                    exc,
                    sorted(state.effective),
                )
                return
            log.info("AutoSwitch HA: SyncStateSet %s (epoch %d)", sorted(members), epoch)
            self.known(members, epoch)

    def lagging(self, now_s: float) -> frozenset[int]:
        """The members to drop: no connection, or not caught up for
        haMaxTimeSlaveNotCatchup."""
        connected = {c.slave_id for c in self.connections if c.start_offset is not None}
        limit = self.config.max_not_caught_up_s
        return frozenset(
            member
            for member in self.sync_state.members - {self.broker_id}
            if member not in connected or now_s - self.last_caught_up_s.get(member, 0) > limit
        )

    async def _shrink_loop(self) -> None:
        while True:
            await trio.sleep(SHRINK_CHECK_S)
            lagging = self.lagging(trio.current_time())
            if lagging:
                await self.propose(Change(remove=lagging))

    # ------------------------------------------------------------------ serving
    async def serve(self, host: str | None, port: int, task_status=trio.TASK_STATUS_IGNORED):
        """Listen on (host, port) until cancelled; `task_status.started(bound port)`."""

        def also(nursery: trio.Nursery) -> None:
            self._nursery = nursery
            nursery.start_soon(self._shrink_loop)

        await serve_links(host, port, self._handle, task_status, also)

    async def _handle(self, stream: trio.SocketStream) -> None:
        if self.fenced is not None:  # not master (any more): a slave must look elsewhere
            log.warning("AutoSwitch HA: %s refused: %s", peer_name(stream), self.fenced)
            await trio.aclose_forcefully(stream)
            return
        connection = SlaveConnection(self, stream)
        self.connections.add(connection)
        try:
            await connection.run()
        except* OldHandshake as group:
            log.error("AutoSwitch HA: %s refused: %s", connection.peer, first_leaf(group))
        except* (*CLOSED, WireError) as group:
            log.warning(
                "AutoSwitch HA: slave %s (%s) closed: %s",
                connection.slave_id,
                connection.peer,
                first_leaf(group),
            )
        finally:
            self.connections.discard(connection)
            await trio.aclose_forcefully(stream)
            slave = connection.slave_id
            if slave in self.sync_state.members and not any(
                c.slave_id == slave for c in self.connections
            ):
                self._propose(Change(remove=frozenset({slave})))

    def runtime_info(self) -> dict:
        """HARuntimeInfo of a controller-mode master (GET_BROKER_HA_STATUS)."""
        end = self.log.write_pos
        return {
            "master": True,
            "masterCommitLogMaxOffset": end,
            "inSyncSlaveNums": len(self.sync_state.effective) - 1,
            "haConnectionInfo": [
                {
                    "addr": c.peer,
                    "slaveAckOffset": max(c.acked_offset, 0),
                    "diff": end - max(c.acked_offset, 0),
                    "inSync": c.slave_id in self.sync_state.effective,
                    "transferredByteInSecond": c.rate.current(),
                    "transferFromWhere": c.sent_offset,
                }
                for c in self.connections
            ],
        }


class AutoSwitchSlave:
    """The slave's side (RocketMQ's AutoSwitchHAClient)."""

    def __init__(
        self,
        log_: ClassicLog,
        epochs: EpochFile,
        config: AutoSwitchConfig,
        broker_id: int,
        master_address: Callable[[], str | None],
    ) -> None:
        self.log = log_
        self.epochs = epochs
        self.config = config
        self.broker_id = broker_id
        self.master_address = master_address
        # what the set was last known to hold (a restarted slave serves it before its
        # master speaks); RocketMQ's slave starts from the StoreCheckpoint's as well
        self.confirm_offset = log_.checkpointed_confirm()
        log_.confirmed = lambda: self.confirm_offset  # dispatch stops there
        log_.add_deletion_handler(epochs.retain_from)
        self.refusal: str | None = None  # why this store cannot copy its master's log
        self.refusals = 0  # a counter for the metrics
        self.connected_to: str | None = None
        self.rate = RateMeter()
        self.last_read_ms = 0
        self.last_write_ms = 0
        self._master_given = trio.Event()
        self._send_lock = trio.Lock()
        self._reported = -1

    def master_given(self) -> None:
        """A master's address was (re)given: try it now, a refused store included."""
        self.refusal = None
        self._master_given.set()

    async def run(self) -> None:
        while True:
            self._master_given = trio.Event()
            address = self.master_address()
            if address is None or self.refusal is not None:
                await self._until_given(None if self.refusal else RECONNECT_S)
                continue
            try:
                stream = await connect(address)
            except CONNECT_FAILED as exc:
                log.warning("AutoSwitch HA: cannot connect to master %s: %s", address, exc)
                await self._until_given(RECONNECT_S)
                continue
            self.connected_to = address
            try:
                await self._session(stream)
            except* Unreplicable as group:
                self.refusal = str(first_leaf(group))
                self.refusals += 1
                log.error("AutoSwitch HA: not replicating from %s: %s", address, self.refusal)
            except* (*CLOSED, WireError, ValueError) as group:
                why = first_leaf(group)
                log.warning("AutoSwitch HA: connection to %s closed: %s", address, why)
            finally:
                self.connected_to = None
                await trio.aclose_forcefully(stream)
            await trio.sleep(0.1)  # RocketMQ reconnects at once; this only avoids a busy loop

    async def _until_given(self, timeout_s: float | None) -> None:
        with trio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
            await self._master_given.wait()

    async def _send(self, stream: trio.SocketStream, data: bytes) -> None:
        async with self._send_lock:
            await stream.send_all(data)
        self.last_write_ms = int(time.time() * 1000)

    async def _ack(self, stream: trio.SocketStream, force: bool = False) -> None:
        offset = self.log.write_pos
        if force or offset > self._reported:
            self._reported = offset
            await self._send(stream, Ack(offset).encode())

    async def _session(self, stream: trio.SocketStream) -> None:
        config = self.config
        reader = SlaveReader(max(config.link.transfer_batch_bytes, self.log.file_size))
        self._reported = -1
        handshake = Handshake(config.sync_from_last_file, config.async_learner, self.broker_id)
        await self._send(stream, handshake.encode())
        async with trio.open_nursery() as nursery:
            idle = config.link.housekeeping_interval_s
            while True:
                data = await receive(stream, idle, "master")
                self.last_read_ms = int(time.time() * 1000)
                self.rate.add(len(data))
                for frame in reader.feed(data):
                    if isinstance(frame, HandshakeReply):
                        self._truncate(frame)
                        await self._ack(stream, force=True)  # at once (RocketMQ: after 5 s)
                        nursery.start_soon(self._heartbeats, stream)
                    else:
                        self._append(frame)
                await self._ack(stream)

    async def _heartbeats(self, stream: trio.SocketStream) -> None:
        while True:
            await trio.sleep(self.config.link.heartbeat_interval_s)
            await self._ack(stream, force=True)

    def _truncate(self, reply: HandshakeReply) -> None:
        log_, epochs = self.log, self.epochs
        point = truncation_point(
            epochs.entries, log_.write_pos, list(reply.epochs), reply.max_offset
        )
        if point < log_.write_pos:
            log.warning(
                "AutoSwitch HA: cutting the log from %d to %d, where it stops agreeing"
                " with the master's",
                log_.write_pos,
                point,
            )
            try:
                log_.truncate(point, not self.config.all_ack_in_sync_state_set)
            except ValueError as exc:  # below what was dispatched here
                raise Unreplicable(f"{exc} (wipe this store)") from None
        epochs.truncate_from(point)
        self.confirm_offset = min(self.confirm_offset, log_.write_pos)

    def _append(self, frame: Transfer) -> None:
        log_, epochs = self.log, self.epochs
        if log_.write_pos != 0 and frame.offset != log_.write_pos:
            raise HAProtocolError(
                f"master pushed offset {frame.offset}, not this slave's max offset {log_.write_pos}"
            )
        last = epochs.last
        if last is None or frame.epoch != last.epoch:
            epochs.append(EpochEntry(frame.epoch, frame.epoch_start))
        elif frame.epoch_start != last.start_offset:
            raise HAProtocolError(f"epoch {frame.epoch} from {frame.epoch_start}, here {last}")
        log_.append_data(frame.offset, frame.body)
        self.confirm_offset = max(self.confirm_offset, min(frame.confirm_offset, log_.write_pos))
        log_.confirm_moved()

    def runtime_info(self) -> dict:
        """HARuntimeInfo of a controller-mode slave; `refusal` says why it is not copying."""
        info = slave_runtime_info(self, master_flush_offset=self.confirm_offset)
        info["haClientRuntimeInfo"]["refusal"] = self.refusal or ""
        return info
