"""What both replication protocols of a classic CommitLog do alike: classic HA
(`ha`, RocketMQ 4.x) and AutoSwitch HA (`autoswitch`, RocketMQ 5's controller mode)
differ in their frames, not in how a link is kept or what a batch is.

- the timing keys (`haSendHeartbeatInterval`, `haHousekeepingInterval`,
  `haTransferBatchSize`) and the rate meter behind `transferredByteInSecond`;
- housekeeping: a peer that has sent nothing for `haHousekeepingInterval` is
  dropped, on both sides (RocketMQ 4.9's slave looks at its own last write);
- where a transfer starts (`start_offset`) and what one batch is (`read_batch`):
  the bytes from an offset to the end of its file's written part, at most a batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

from raftmq.config.address import parse_address

if TYPE_CHECKING:
    from raftmq.broker.store.classic_log import ClassicLog

log = logging.getLogger(__name__)

READ_BYTES = 1 << 20
IDLE_POLL_S = 0.1  # WriteSocketService waits up to 100 ms for new data
CONNECT_TIMEOUT_S = 3.0
RECONNECT_S = 1.0  # between attempts to connect to a master (RocketMQ: 5 s)


class HAProtocolError(Exception):
    """A peer's bytes make no sense for this replication; the connection ends."""


CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, HAProtocolError)
CONNECT_FAILED = (OSError, ValueError, trio.TooSlowError)  # what `connect` raises


@attrs.define
class HAConfig:
    heartbeat_interval_s: float = 5.0  # haSendHeartbeatInterval
    housekeeping_interval_s: float = 20.0  # haHousekeepingInterval
    transfer_batch_bytes: int = 32 * 1024  # haTransferBatchSize
    fallbehind_max_bytes: int = 256 * 1024 * 1024  # haSlaveFallbehindMax


class RateMeter:
    """Bytes per second over the last whole second (RocketMQ's transferredByteInSecond)."""

    def __init__(self) -> None:
        self._window_start = time.monotonic()
        self._bytes = 0
        self.per_second = 0

    def add(self, count: int) -> None:
        self._roll()
        self._bytes += count

    def current(self) -> int:
        self._roll()
        return self.per_second

    def _roll(self) -> None:
        now_s = time.monotonic()
        elapsed = now_s - self._window_start
        if elapsed >= 1.0:
            self.per_second = int(self._bytes / elapsed) if elapsed < 2.0 else 0
            self._bytes = 0
            self._window_start = now_s


def slave_runtime_info(client, master_flush_offset: int) -> dict:
    """RocketMQ 5's HARuntimeInfo of a slave (GET_BROKER_HA_STATUS), from either
    protocol's client (its address, rate, log and timestamps)."""
    return {
        "master": False,
        "masterCommitLogMaxOffset": 0,
        "inSyncSlaveNums": 0,
        "haConnectionInfo": [],
        "haClientRuntimeInfo": {
            "masterAddr": client.connected_to or client.master_address() or "",
            "transferredByteInSecond": client.rate.current(),
            "maxOffset": client.log.write_pos,
            "lastReadTimestamp": client.last_read_ms,
            "lastWriteTimestamp": client.last_write_ms,
            "masterFlushOffset": master_flush_offset,
            "isActivated": client.connected_to is not None,
        },
    }


async def serve_links(
    host: str | None,
    port: int,
    handle: Callable[[trio.SocketStream], Awaitable[None]],
    task_status,
    also: Callable[[trio.Nursery], None] = lambda nursery: None,
) -> None:
    """Accept slaves on (host, port) and `handle` each, until cancelled; `also(nursery)`
    starts the service's own tasks beside them; `task_status.started(bound port)`."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("HA service listening on port %d", bound)
    async with trio.open_nursery() as nursery:
        also(nursery)
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        task_status.started(bound)


async def connect(address: str) -> trio.SocketStream:
    """A link to the master at `address` ("host:port"); CONNECT_FAILED if there is none
    within CONNECT_TIMEOUT_S."""
    host, port = parse_address(address)
    with trio.fail_after(CONNECT_TIMEOUT_S):
        return await trio.open_tcp_stream(host, port)


async def receive(stream: trio.SocketStream, idle_s: float, peer: str) -> bytes:
    """The next bytes from `peer` (the slave, the master); HAProtocolError when it has
    sent nothing for `idle_s` (haHousekeepingInterval) or closed the connection."""
    with trio.move_on_after(idle_s) as waited:
        data = await stream.receive_some(READ_BYTES)
    if waited.cancelled_caught:
        raise HAProtocolError(f"nothing from the {peer} for {idle_s:.0f} s")
    if not data:
        raise HAProtocolError(f"the {peer} closed the connection")
    return data


def start_offset(log: ClassicLog, requested: int, from_last_file: bool) -> int:
    """Where a master starts sending to a slave that asks for `requested`: there, or,
    for an empty slave (0), at the log's first byte or the start of its last file;
    HAProtocolError when the slave is ahead of this log or needs deleted bytes."""
    if requested > log.write_pos:
        raise HAProtocolError(
            f"the slave reports offset {requested}, beyond this master's max offset"
            f" {log.write_pos}: its commitlog is not a copy of this one (wipe it)"
        )
    if requested == 0:
        if not from_last_file:
            return log.min_offset
        return max(log.write_pos - log.write_pos % log.file_size, log.min_offset)
    if requested < log.min_offset:
        raise HAProtocolError(
            f"the slave needs offset {requested}, below this master's first file"
            f" {log.min_offset}: those bytes are gone (wipe the slave's store)"
        )
    return requested


def keep_for_slaves(log: ClassicLog, connections) -> int:
    """The retention limit of a master's log (an index, `add_retention_limit`): keep
    what a connected slave has yet to receive (RocketMQ deletes it and leaves the
    slave stuck on heartbeats, #3388)."""
    needed = [c.sent_offset for c in connections if c.start_offset is not None]
    if not needed:
        return log.end_index + 1
    return log.first_index_at(min(needed))


def read_batch(log: ClassicLog, offset: int, max_bytes: int) -> bytes:
    """The next batch for a slave at `offset` (RocketMQ's `CommitLog.getData`, capped at
    `max_bytes`): empty when the log holds nothing after it yet; HAProtocolError when
    the bytes were deleted meanwhile."""
    data = log.read_file_data(offset, max_bytes)
    if data is None and offset < log.min_offset:
        raise HAProtocolError(
            f"the slave needs offset {offset}, deleted here meanwhile (wipe its store)"
        )
    return data or b""
