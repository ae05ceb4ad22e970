"""`QueueOffsets`: a queue's consumed offset when messages finish out of order.

RocketMQ commits, per queue, the offset below which everything is consumed
(`ProcessQueue.removeMessage`: the smallest offset still being consumed, or one past
the last pulled message when none is). A later message finishing first must not move
the offset past an earlier one still in the handler, or a crash would lose it; the
offset a restarted consumer resumes from may only repeat messages, never skip them.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["QueueOffsets"]


class QueueOffsets:
    """Offsets handed to the handler and not yet done, and where the next pull starts."""

    def __init__(self, start: int) -> None:
        self._in_flight: set[int] = set()
        self._next_pull = start

    @property
    def next_pull(self) -> int:
        return self._next_pull

    @property
    def in_flight(self) -> frozenset[int]:
        """The offsets handed to the handler and not yet done."""
        return frozenset(self._in_flight)

    @property
    def consumed(self) -> int:
        """The offset to commit: every message below it is done."""
        return min(self._in_flight) if self._in_flight else self._next_pull

    def pulled(self, offsets: Iterable[int], next_begin_offset: int) -> None:
        """A pull handed out `offsets` (filtered messages are not among them: they
        count as done) and the next pull starts at `next_begin_offset`."""
        # The push consumer hands a queue's messages out one pull at a time, so the
        # offset it commits covers one pull's worth of messages finishing out of order.
        assert not self._in_flight, f"pulled again with {sorted(self._in_flight)} in the handler"
        self._in_flight.update(offsets)
        self._next_pull = next_begin_offset

    def done(self, offsets: Iterable[int]) -> None:
        self._in_flight.difference_update(offsets)

    def reset(self, offset: int) -> None:
        """Start over at `offset` (the broker said the old one is out of range)."""
        self._in_flight.clear()
        self._next_pull = offset
