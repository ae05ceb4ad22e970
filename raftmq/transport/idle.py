"""Closing connections that stopped sending, and refusing connections past a cap.

What a server buffers for a connection is bounded per connection (a frame's declared
length is checked before it is buffered), but a client that opens many connections
and sends each half a frame, or nothing, holds that memory and a descriptor for as
long as it keeps them open. Two limits bound it: a connection that has received
nothing for `idle_s` is closed (RocketMQ's `serverChannelMaxIdleTimeSeconds`, whose
Netty IdleStateHandler does the same), and past `max_connections` a new connection
is closed at once. Together: at most `max_connections` partial frames, each held
for at most `idle_s` without progress.

`ReceiveClock` notes when a stream last received bytes at the cost of one clock read
per `receive_some` (one per chunk, not per frame), so the read path keeps its shape;
`close_when_idle` is the watchdog task that reads it.

The idle limit does not stop a peer that sends a frame's header and then trickles the
rest a byte a minute: it is never idle for long. So a frame must also complete within
a deadline once its first byte has arrived: the frame readers note when the frame they
hold a part of began (`transport.frames.FrameReader.frame_began_s`, one clock read per
chunk that leaves a new partial frame behind), and `close_when_stalled` closes the
connection past the deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

__all__ = ["ConnectionCap", "ReceiveClock", "close_when_idle", "close_when_stalled"]

log = logging.getLogger(__name__)


class ReceiveClock:
    """`stream`, recording in `last_receive_s` when it last received (trio's clock)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.last_receive_s = trio.current_time()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self._stream.receive_some(max_bytes)
        self.last_receive_s = trio.current_time()
        return data

    @property
    def wrapped_stream(self):
        """The stream received from (a writer may send on it directly)."""
        return self._stream

    def __getattr__(self, name: str):
        return getattr(self._stream, name)  # send_all, aclose, socket, ...


async def close_when_idle(clock: ReceiveClock, idle_s: float, close: Callable[[], None]) -> None:
    """Call `close()` once `clock` has received nothing for `idle_s`; run it as a task
    beside the connection and cancel it when the connection ends."""
    while True:
        due = clock.last_receive_s + idle_s
        if trio.current_time() >= due:
            close()
            return
        await trio.sleep_until(due)


async def close_when_stalled(reader, deadline_s: float, close: Callable[[], None]):
    """Call `close()` once a frame `reader` (a transport.frames.FrameReader) holds part
    of has been incomplete for `deadline_s` after its first byte arrived; run it as a
    task beside the connection and cancel it when the connection ends. Looks every
    `deadline_s / 2` while no frame is under way."""
    while True:
        began = reader.frame_began_s
        if began is None:
            await trio.sleep(deadline_s / 2)
            continue
        due = began + deadline_s
        if trio.current_time() >= due:
            close()
            return
        await trio.sleep_until(due)


class ConnectionCap:
    """Counts a server's open connections; `admit()` is False past `max_connections`.

    A refusal is logged once per run of refusals, so a storm costs one log line.
    """

    def __init__(self, name: str, max_connections: int) -> None:
        assert max_connections > 0, max_connections
        self.name = name
        self.max_connections = max_connections
        self.open = 0
        self._refusing = False

    def admit(self) -> bool:
        if self.open >= self.max_connections:
            if not self._refusing:
                self._refusing = True
                refusal = "%s: refusing new connections: %d are open, the most allowed"
                log.warning(refusal, self.name, self.open)
            return False
        self._refusing = False
        self.open += 1
        return True

    def release(self) -> None:
        assert self.open > 0
        self.open -= 1
