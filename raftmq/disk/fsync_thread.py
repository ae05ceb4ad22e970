"""One thread that fsyncs batches of file descriptors for an event loop.

A group commit under load hands its fsync to another thread so that the event loop
keeps reading and replicating meanwhile. Handing it to a thread of trio's cache costs
the loop a wake-up of that thread, which must then take the GIL to run Python before
it can call fdatasync, and take it again to hand the outcome back: on two shared cores
those GIL hand-offs were about half of a follower's futex calls and delayed the start
of the fsync behind the loop's next system call.

`FsyncThread` is a thread that waits for a batch on an eventfd, fsyncs it and reports
on another eventfd (`done_fd`), which the loop waits on like a socket. The compiled one
(`raftmq.hotpath`, FSYNC_THREAD) is a plain POSIX thread that never holds the GIL; this
one is its pure-Python twin, with the same results and errors (tests/test_hotpath.py).
One batch at a time: `submit`, wait until `done_fd` is readable, `result`.
"""

from __future__ import annotations

import os
import threading
import time

from raftmq.hotpath import compiled_or

__all__ = ["FSYNC_THREAD", "FsyncThread"]


class FsyncThread:
    """fsyncs each batch `submit` gives it, on a thread of its own (see the module doc)."""

    def __init__(self) -> None:
        self._requests = os.eventfd(0, os.EFD_CLOEXEC)
        self._done = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._batch: list[tuple[int, bool]] = []
        self._outcome = (0, 0.0)
        self._busy = False
        self._stop = False
        threading.Thread(target=self._run, name="raftmq fsync", daemon=True).start()

    @property
    def done_fd(self) -> int:
        """Readable once the batch is done (an eventfd the thread closes when closed)."""
        if self._stop:
            raise RuntimeError("the fsync thread is closed")
        return self._done

    def submit(self, fds: list[int], data_only: list[bool]) -> None:
        """Start fsyncing `fds`, each with fdatasync where `data_only` says so (a data
        file's contents) and fsync otherwise (a directory's entries)."""
        if self._busy:
            raise RuntimeError("a batch is being synced: wait for its result first")
        if self._stop:
            raise RuntimeError("the fsync thread is closed")
        if len(fds) != len(data_only):
            raise ValueError("one data_only flag per file descriptor")
        self._batch = [(int(fd), bool(flag)) for fd, flag in zip(fds, data_only, strict=True)]
        self._busy = True
        os.eventfd_write(self._requests, 1)

    def result(self) -> tuple[int, float] | None:
        """The finished batch's first error number (0 if every fsync succeeded) and its
        seconds; None while it runs (or when none was submitted)."""
        if self._stop:
            return None
        try:
            os.eventfd_read(self._done)
        except BlockingIOError:
            return None
        self._busy = False
        return self._outcome

    def close(self) -> None:
        """Stop the thread once the batch it syncs, if any, is done; it closes the
        eventfds itself, so a batch stuck on a dead disk never blocks the caller."""
        if not self._stop:
            self._stop = True
            os.eventfd_write(self._requests, 1)

    def _run(self) -> None:
        try:
            while True:
                os.eventfd_read(self._requests)
                if self._stop:
                    return
                started = time.monotonic()
                error = 0
                for fd, data_only in self._batch:
                    try:
                        os.fdatasync(fd) if data_only else os.fsync(fd)
                    except OSError as exc:
                        error = error or exc.errno
                self._outcome = (error, time.monotonic() - started)
                os.eventfd_write(self._done, 1)
        finally:
            os.close(self._requests)
            os.close(self._done)


FSYNC_THREAD = compiled_or("FsyncThread", FsyncThread)
