"""Timeouts for many pipelined calls, enforced by one task over a heap of deadlines.

A trio cancel scope per call costs well over 10 us once thousands are live, more
than the rest of a call's client-side work; a heap of `(deadline, key)` and one
sleeping task cost a push per call. Answered calls are not removed from the heap
(lazy deletion): their entries are skipped when they come due, and the heap is
rebuilt from the live ones when stale entries dominate, so memory follows what is
in flight rather than the call rate.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable

import trio

__all__ = ["DeadlineReaper"]


class DeadlineReaper:
    """Calls `expire(key)` for each live key whose deadline (trio time) has passed.

    `is_live(key)` says whether the call behind `key` still awaits its answer; keys
    that are not live when their deadline comes are skipped, so completing a call
    needs no bookkeeping here. Keys must be orderable (e.g. ints). The owner runs
    `run()` in a nursery for as long as calls may be added.
    """

    def __init__(
        self, expire: Callable[[Hashable], object], is_live: Callable[[Hashable], bool]
    ) -> None:
        self._expire = expire
        self._is_live = is_live
        self._heap: list[tuple[float, Hashable]] = []
        self._compact_at = 1024
        self._wake = trio.Event()

    def __len__(self) -> int:
        """Entries in the heap, stale ones included."""
        return len(self._heap)

    def add(self, deadline: float, key) -> None:
        heap = self._heap
        if len(heap) > self._compact_at:
            is_live = self._is_live
            heap[:] = [entry for entry in heap if is_live(entry[1])]
            heapq.heapify(heap)
            self._compact_at = 2 * len(heap) + 1024
        entry = (deadline, key)
        heapq.heappush(heap, entry)
        if heap[0] is entry:
            self._wake.set()  # a new earliest deadline

    async def run(self) -> None:
        heap = self._heap
        is_live = self._is_live
        expire = self._expire
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, key = heapq.heappop(heap)
                if is_live(key):
                    expire(key)
            self._wake = trio.Event()
            with trio.move_on_at(heap[0][0] if heap else math.inf):
                await self._wake.wait()
