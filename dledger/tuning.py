"""Interpreter settings for a server process (`mqbroker`, `dledger server`).

A replica moves small objects at a high rate — a request, a message, a closure per
append — nearly all of which die young, while its long-lived state stays put.
CPython's default collector runs a young-generation pass every 700 allocations
and, now and then, a full pass over everything alive; both pause the event loop,
which shows as tail latency on every request it holds. Objects alive after start-up
are frozen out of collection and the young generation is allowed to grow larger.

The GIL switch interval is lowered from 5 ms so that a worker thread returning from
an fsync gets the interpreter back quickly from a busy event loop: acknowledgments
wait on that fsync.
"""

from __future__ import annotations

import gc
import sys

GC_THRESHOLDS = (20_000, 50, 1_000)
SWITCH_INTERVAL_S = 0.0005


def tune_for_serving() -> None:
    """Call once, after imports and configuration, before the server starts."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
