"""Classic master/slave replication, byte-compatible with RocketMQ's HAService.

Plain TCP on `haListenPort`, no handshake (RocketMQ 4.x has none):

- slave -> master: 8 bytes, int64 big-endian, the slave's max physical offset. The
  first report on a connection says where to start; later ones acknowledge. Sent
  on connecting (a Java slave waits 5 s), after every append that moved it, and
  every `haSendHeartbeatInterval`.
- master -> slave: a 12-byte header (int64 physical offset, int32 body size) and that
  many raw CommitLog bytes, at most `haTransferBatchSize`, never across a file end;
  a header with size 0 is the heartbeat, every `haSendHeartbeatInterval` when idle.

An empty slave (first report 0) starts at the start of the master's last file, as
RocketMQ's does; any other slave exactly where it reported. The slave appends the
bytes where its log ends, so its files are byte-identical copies of the master's
from its start point, and its store dispatches the whole records among them.

Differences from RocketMQ 4.9 (each a failure it lets pass silently):

- A report counts as an acknowledgement (for SYNC_MASTER) only if it is within the
  bytes this master sent on that connection: a peer that merely connects and
  claims an offset (RocketMQ #3015) acknowledges nothing. A first report beyond the
  master's max offset (a slave ahead: diverged history), or below its first file
  (the bytes the slave needs are gone), closes the connection with an error saying
  so; RocketMQ accepts the first and serves the second heartbeats forever (#3388).
  Later reports beyond what was sent close the connection too.
- The slave drops a master it has read nothing from for `haHousekeepingInterval`
  (RocketMQ 4.9 compares its own last write, so a silent master goes unnoticed) and
  reconnects; the master drops a slave silent that long, as RocketMQ's does.
- A slave that cannot connect tries again after RECONNECT_S, or at once when it is
  given a master's address (RocketMQ waits 5 s); the loss of a connection that
  carried the master's frames is reported (`on_lost`), so that the broker asks the
  name servers where the master is now. One that never did (a master refusing this
  slave, or sending nothing it can take) is not: reconnecting at once to such a
  master must not make the broker re-register ten times a second.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
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

HEADER = struct.Struct(">qi")  # phyOffset, bodySize
REPORT = struct.Struct(">q")  # the slave's max physical offset


class HAService:
    """The master's side: accepts slaves, streams the log to each, and keeps the
    highest acknowledged offset over all of them (push2SlaveMaxOffset)."""

    def __init__(
        self,
        log_: ClassicLog,
        config: HAConfig,
        on_ack: Callable[[int], None] = lambda offset: None,
    ) -> None:
        self.log = log_
        self.config = config
        self.on_ack = on_ack
        self.connections: set[HAConnection] = set()
        self.acked_offset = 0
        log_.add_retention_limit(lambda: keep_for_slaves(log_, self.connections))

    def slave_ok(self, offset: int) -> bool:
        """HAService.isSlaveOK: a slave is connected and not too far behind `offset`.
        A slave's own report counts here, checked or not: trusting a false one only
        turns the put's SLAVE_NOT_AVAILABLE into FLUSH_SLAVE_TIMEOUT, never into an
        acknowledgement (only verified reports release puts: `acked`)."""
        limit = self.config.fallbehind_max_bytes
        return any(
            c.start_offset is not None and offset - max(c.acked_offset, 0) < limit
            for c in self.connections
        )

    def refusal(self) -> None:
        """A classic master refuses no put before storing it (`Replication`)."""
        return None

    def acked(self, offset: int) -> None:
        if offset > self.acked_offset:
            self.acked_offset = offset
            self.on_ack(offset)

    def runtime_info(self) -> dict:
        """RocketMQ 5's HARuntimeInfo of a master (GET_BROKER_HA_STATUS)."""
        end = self.log.write_pos
        connections = [
            c.runtime_info(end, self.config.fallbehind_max_bytes) for c in self.connections
        ]
        return {
            "master": True,
            "masterCommitLogMaxOffset": end,
            "inSyncSlaveNums": sum(1 for c in connections if c["inSync"]),
            "haConnectionInfo": connections,
        }

    @property
    def slave_lag_bytes(self) -> int:
        """ "Slave fall behind master": the master's max offset minus the best ack."""
        return max(0, self.log.write_pos - self.acked_offset) if self.connections else -1

    async def serve(self, host: str | None, port: int, task_status=trio.TASK_STATUS_IGNORED):
        """Listen on (host, port) until cancelled; `task_status.started(bound port)`."""
        await serve_links(host, port, self._handle, task_status)

    async def _handle(self, stream: trio.SocketStream) -> None:
        connection = HAConnection(self, stream)
        self.connections.add(connection)
        try:
            await connection.run()
        except* CLOSED as group:
            log.warning(
                "HA connection from slave %s closed: %s", connection.peer, first_leaf(group)
            )
        finally:
            self.connections.discard(connection)
            await trio.aclose_forcefully(stream)


class HAConnection:
    """One slave's connection (RocketMQ's HAConnection: a read and a write service)."""

    def __init__(self, service: HAService, stream: trio.SocketStream) -> None:
        self.service = service
        self.stream = stream
        self.peer = peer_name(stream)
        self.start_offset: int | None = None  # where this connection's transfer began
        self.sent_offset = -1  # the end of the bytes sent on this connection
        self.acked_offset = -1  # the slave's last report
        self.rate = RateMeter()
        self._started = trio.Event()

    def runtime_info(self, end: int, fallbehind_max_bytes: int) -> dict:
        """HARuntimeInfo.HAConnectionRuntimeInfo."""
        acked = max(self.acked_offset, 0)
        return {
            "addr": self.peer,
            "slaveAckOffset": acked,
            "diff": end - acked,
            "inSync": self.start_offset is not None and end - acked < fallbehind_max_bytes,
            "transferredByteInSecond": self.rate.current(),
            "transferFromWhere": self.sent_offset,
        }

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_loop)
            nursery.start_soon(self._write_loop)

    async def _read_loop(self) -> None:
        pending = bytearray()
        idle = self.service.config.housekeeping_interval_s
        while True:
            pending += await receive(self.stream, idle, "slave")
            whole = len(pending) - len(pending) % REPORT.size
            if whole:
                # only the newest complete report matters (ReadSocketService)
                (offset,) = REPORT.unpack_from(pending, whole - REPORT.size)
                del pending[:whole]
                self._report(offset)

    def _report(self, offset: int) -> None:
        log_ = self.service.log
        if self.start_offset is None:
            self._begin(offset)
            return
        if offset > self.sent_offset:
            raise HAProtocolError(
                f"the slave reports offset {offset}, beyond the {self.sent_offset} sent to it"
            )
        self.acked_offset = offset
        if offset > self.start_offset:
            self.service.acked(offset)
        assert offset <= log_.write_pos

    def _begin(self, requested: int) -> None:
        """The first report: where the transfer starts (the start of the last file for
        an empty slave, as RocketMQ 4.x does)."""
        start = start_offset(self.service.log, requested, from_last_file=True)
        self.start_offset = self.sent_offset = start
        self.acked_offset = requested
        log.warning("HA: slave %s connected, transfer starts at offset %d", self.peer, start)
        self._started.set()

    async def _write_loop(self) -> None:
        await self._started.wait()
        config, log_, stream = self.service.config, self.service.log, self.stream
        last_write = time.monotonic()
        while True:
            offset = self.sent_offset
            data = read_batch(log_, offset, config.transfer_batch_bytes)
            if data:
                # counted as sent before the send returns: the slave may already answer
                self.sent_offset = offset + len(data)
                self.rate.add(len(data))
                await stream.send_all(HEADER.pack(offset, len(data)) + data)
                last_write = time.monotonic()
                continue
            if time.monotonic() - last_write > config.heartbeat_interval_s:
                await stream.send_all(HEADER.pack(offset, 0))
                last_write = time.monotonic()
            with trio.move_on_after(IDLE_POLL_S):
                await log_.written.wait()


class HAClient:
    """The slave's side: connect to the master's HA address, report, append what comes."""

    def __init__(
        self,
        log_: ClassicLog,
        config: HAConfig,
        master_address: Callable[[], str | None],
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        """`master_address()` is read before each attempt to connect; `on_lost()` is
        called when a connection to the master ends after carrying a frame."""
        self.log = log_
        self.config = config
        self.master_address = master_address
        self.on_lost = on_lost
        self._master_given = trio.Event()
        self.connected_to: str | None = None
        self.rate = RateMeter()
        self.last_read_ms = 0  # wall clock, as HARuntimeInfo reports it
        self.last_write_ms = 0
        # the end of the master's log as of its last frame (a heartbeat's offset is its
        # max offset when it has nothing more to send): all a slave knows of the master
        self.master_offset = 0
        self._streamed = False  # a frame of the master's taken on this connection
        self._send_lock = trio.Lock()
        self._reported = -1

    def runtime_info(self) -> dict:
        """RocketMQ 5's HARuntimeInfo of a slave (GET_BROKER_HA_STATUS); masterFlushOffset
        is controller mode's, 0 here."""
        return slave_runtime_info(self, master_flush_offset=0)

    def master_given(self) -> None:
        """A master's address was (re)confirmed: a slave without a connection tries it
        now instead of at its next RECONNECT_S attempt."""
        self._master_given.set()

    async def _until_retry(self) -> None:
        with trio.move_on_after(RECONNECT_S):
            await self._master_given.wait()

    async def run(self) -> None:
        failures = 0
        while True:
            self._master_given = trio.Event()  # an address given from now on is news
            address = self.master_address()
            if address is None:
                await self._until_retry()
                continue
            try:
                stream = await connect(address)
            except CONNECT_FAILED as exc:
                level = logging.WARNING if failures == 0 else logging.DEBUG
                log.log(level, "HA: cannot connect to master %s: %s", address, exc)
                failures += 1
                await self._until_retry()
                continue
            failures = 0
            self.connected_to = address
            try:
                await self._session(stream)
            except* (*CLOSED, ValueError) as group:
                log.warning("HA: connection to master %s closed: %s", address, first_leaf(group))
            finally:
                self.connected_to = None
                await trio.aclose_forcefully(stream)
            if self._streamed:
                self.on_lost()
            await trio.sleep(0.1)  # RocketMQ reconnects at once; this only avoids a busy loop

    async def _report(self, stream: trio.SocketStream, force: bool = False) -> None:
        offset = self.log.write_pos
        if force or offset > self._reported:
            async with self._send_lock:
                await stream.send_all(REPORT.pack(offset))
            self._reported = offset
            self.last_write_ms = int(time.time() * 1000)

    async def _heartbeats(self, stream: trio.SocketStream) -> None:
        while True:
            await self._report(stream, force=True)
            await trio.sleep(self.config.heartbeat_interval_s)

    async def _session(self, stream: trio.SocketStream) -> None:
        self._reported = -1
        self._streamed = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats, stream)  # the first report, at once
            await self._receive(stream)
            nursery.cancel_scope.cancel()

    async def _receive(self, stream: trio.SocketStream) -> None:
        pending = bytearray()
        idle = self.config.housekeeping_interval_s
        log_ = self.log
        while True:
            data = await receive(stream, idle, "master")
            self.last_read_ms = int(time.time() * 1000)
            self.rate.add(len(data))
            pending += data
            while len(pending) >= HEADER.size:
                offset, size = HEADER.unpack_from(pending)
                if size < 0 or size > max(self.config.transfer_batch_bytes, log_.file_size):
                    raise HAProtocolError(f"a frame of {size} bytes")
                if len(pending) < HEADER.size + size:
                    break
                if log_.write_pos != 0 and offset != log_.write_pos:
                    raise HAProtocolError(
                        f"master pushed offset {offset}, not this slave's max offset"
                        f" {log_.write_pos}"
                    )
                body = bytes(pending[HEADER.size : HEADER.size + size])
                del pending[: HEADER.size + size]
                log_.append_data(offset, body)
                self.master_offset = offset + size
                self._streamed = True
            await self._report(stream)
