"""What the client peers run as processes of their own (tests/cpp_client/peer.py,
tests/python5/peer.py) share: one JSON line per event on stdout, and stopping when the
test closes their stdin. Standard library only: each peer runs with its own client's
interpreter and imports this by path."""

from __future__ import annotations

import json
import sys
import threading

_print_lock = threading.Lock()  # clients call back on threads of their own


def emit(**event) -> None:
    """One event as a line of JSON, flushed at once (the test reads as it comes)."""
    line = json.dumps(event)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def stop_at_end_of_stdin() -> threading.Event:
    """An event set once stdin closes: the test's cue to stop."""
    stop = threading.Event()

    def wait() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait, daemon=True).start()
    return stop
