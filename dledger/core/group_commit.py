"""When a replica fsyncs what it appended, and on which thread: group commit's decisions,
with no I/O, clock or thread of their own.

Both drivers run these decisions, the trio server with fsync durations it measures and
the simulator with durations its virtual disk draws, so the schedule the simulator
checks is the one production keeps. A driver feeds three events — the core wants an
fsync (`wanted`), an fsync finished (`finished`), time passed (`next` at
`deadline_ms`) — and learns what to start: an `Fsync` covering the log up to its end,
on the loop's own thread or on a worker, or nothing yet. `wanted` answers that at
once, and `finished` says whether `next` has one to start, so a driver asks no more
than it must on a send's path.

The rules:

- One fsync at a time. A request made while one runs is remembered, and the next
  starts once it ends, covering everything appended meanwhile: that is the group.
- Inline on an idle log. A single send finds every entry before its own committed and
  few new entries to cover; nothing else waits for the loop then, and the two thread
  hand-offs (a worker to wake, then the loop to wake from it) cost 100-400 µs on a busy
  two-core machine against an fsync of ~100-400 µs, so the fsync runs on the loop.
- A leader's on a worker under load. Pipelined appends each found the log "idle" behind the
  previous inline fsync when idleness was judged by the plan's size alone, and a group
  commit then covered one entry each (3.8k appends/s against 51k with 256 in flight):
  an entry before the new ones that is not yet committed means other appends are under
  way, and the loop must keep reading and pushing while a worker fsyncs.
- Inline on a follower, under load too. It has nothing to do while its fsync runs but
  read pushes, whose entries would wait for the next fsync anyway: those that arrive
  meanwhile are read together after it and covered by one group commit (the driver
  asks once per chunk read, not once per push). The worker's hand-offs (a wake-up to
  start it, another to report) cost a follower more CPU than the wait: at the bench's
  load (3 brokers and the generator on two cores, four connections) each follower
  spent about 0.8 µs less CPU per message, and the group sent 40,600 acks/s against
  37,100 at 128 B (eight pairs). The price is a first stalled fsync holding the loop.
- On a worker while the disk is slow. An fsync that took INLINE_FSYNC_MAX_S or more
  keeps the next ones off the loop, so heartbeats and votes are answered while one is
  stuck; a quick one (an fsync that had something to sync) brings them back.
- Page-cache mode (DLedger's ASYNC_FLUSH): acknowledgments wait for no fsync, so the
  core asks for none; the log is flushed on a worker every flushFileInterval, counted
  from the end of the previous flush.
"""

from __future__ import annotations

import attrs

# A group commit runs on the loop's own thread while the last fsync took less than this
# and it covers at most INLINE_FSYNC_MAX_ENTRIES new entries.
INLINE_FSYNC_MAX_S = 0.010
INLINE_FSYNC_MAX_ENTRIES = 4


@attrs.frozen
class Fsync:
    """Start one group commit now: its plan covers the log up to `end_index`, and runs
    on the loop's own thread, blocking it (`inline`), or on a worker."""

    end_index: int
    inline: bool


class GroupCommitSchedule:
    """The group-commit decisions of one replica (see the module docstring)."""

    __slots__ = (
        "_ack_after_fsync",
        "_flush_interval_ms",
        "_in_flight",
        "_last_fsync_s",
        "_last_plan_end",
        "_next_flush_ms",
        "_wanted",
    )

    def __init__(self, ack_after_fsync: bool, flush_interval_ms: float, now_ms: float) -> None:
        self._ack_after_fsync = ack_after_fsync
        self._flush_interval_ms = flush_interval_ms
        self._wanted = False  # an fsync was asked for and not yet started
        self._in_flight = False
        self._last_fsync_s = 0.0  # how long the last fsync that synced something took
        self._last_plan_end = -1  # the end index the last fsync covered
        self._next_flush_ms = now_ms + flush_interval_ms  # page-cache mode only

    @property
    def in_flight(self) -> bool:
        """A group commit that acknowledgments wait for runs (a page-cache flush is not
        one): appends made meanwhile will be covered together by the next."""
        return self._in_flight and self._ack_after_fsync

    @property
    def deadline_ms(self) -> float:
        """When `next` starts an fsync nobody asked for: page-cache mode's next flush."""
        if self._ack_after_fsync or self._in_flight:
            return float("inf")
        return self._next_flush_ms

    def wanted(
        self, end_index: int, committed_index: int, now_ms: float, *, following: bool
    ) -> Fsync | None:
        """The core appended entries and waits for them to be durable: what to start now
        (`next`); while one runs, the next starts once it has `finished`."""
        assert self._ack_after_fsync, "in page-cache mode the core waits for no fsync"
        self._wanted = True
        return self.next(end_index, committed_index, now_ms, following=following)

    def next(
        self, end_index: int, committed_index: int, now_ms: float, *, following: bool
    ) -> Fsync | None:
        """What to start now, given the log's end and commit index and whether the
        replica follows a leader: an `Fsync`, which counts as running until `finished`,
        or None (one runs, or none is due)."""
        if self._in_flight:
            return None
        if self._ack_after_fsync:
            if not self._wanted:
                return None
            self._wanted = False
            new_entries = end_index - self._last_plan_end
            inline = self._last_fsync_s < INLINE_FSYNC_MAX_S and (
                following
                or (
                    new_entries <= INLINE_FSYNC_MAX_ENTRIES
                    and committed_index >= end_index - new_entries
                )
            )
        elif now_ms < self._next_flush_ms:
            return None
        else:
            inline = False
        self._last_plan_end = end_index
        self._in_flight = True
        return Fsync(end_index, inline)

    def finished(self, took_s: float, synced: bool, now_ms: float) -> bool:
        """The fsync `next` started has completed in `took_s` seconds; `synced` is
        False when its plan found nothing dirty (its duration says nothing of the disk).
        A failed fsync is not reported: it stops the replica. Returns whether one was
        wanted meanwhile, which `next` now starts."""
        assert self._in_flight, "no fsync in flight"
        self._in_flight = False
        if synced:
            self._last_fsync_s = took_s
        self._next_flush_ms = now_ms + self._flush_interval_ms
        return self._wanted
