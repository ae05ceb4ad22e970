"""The shared byte-stream pieces: the batching writer and the deadline reaper."""

from __future__ import annotations

import contextlib
import socket

import pytest
import trio
import trio.testing

from raftmq.transport.deadlines import DeadlineReaper
from raftmq.transport.idle import ReceiveClock
from raftmq.transport.writer import BatchWriter


class RecordingStream(trio.abc.SendStream):
    def __init__(self, fail: bool = False):
        self.sends: list[bytes] = []
        self.fail = fail
        self.closed = False

    async def send_all(self, data):
        if self.fail:
            raise trio.BrokenResourceError("peer went away")
        self.sends.append(bytes(data))
        await trio.sleep(0.01)

    async def wait_send_all_might_not_block(self):
        pass

    async def aclose(self):
        self.closed = True


async def test_writes_while_idle_leave_in_one_send():
    stream = RecordingStream()
    w = BatchWriter(stream)
    for i in range(100):
        w.queue(b"h%d:" % i, b"body")
    assert w.pending_bytes == len(b"".join(b"h%d:body" % i for i in range(100)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        await trio.sleep(0.001)  # the first batch is in flight
        w.queue(b"late1")
        w.queue(b"late2")
        w.close()
    assert stream.sends == [b"".join(b"h%d:body" % i for i in range(100)), b"late1late2"]
    assert w.pending_bytes == 0


async def test_close_flushes_then_run_returns():
    stream = RecordingStream()
    w = BatchWriter(stream)
    w.queue(b"a")
    w.close()
    assert w.closed
    with pytest.raises(trio.ClosedResourceError):
        w.queue(b"b")
    await w.run()  # returns on its own after sending what was queued
    assert stream.sends == [b"a"]
    assert not stream.closed  # close() leaves the stream to its owner


async def test_abort_drops_the_queue():
    stream = RecordingStream()
    w = BatchWriter(stream)
    w.queue(b"dropped")
    w.abort()
    assert w.pending_bytes == 0
    await w.run()
    assert stream.sends == []
    with pytest.raises(trio.ClosedResourceError):
        w.queue(b"x")


async def test_stream_error_marks_writer_closed():
    w = BatchWriter(RecordingStream(fail=True))
    w.queue(b"doomed")
    with pytest.raises(trio.BrokenResourceError):
        await w.run()
    assert w.closed
    assert w.pending_bytes == 0
    with pytest.raises(trio.ClosedResourceError):
        w.queue(b"after")


async def _socket_pair():
    """A trio SocketStream on one end of a connected pair, a blocking socket on the other."""
    ours, theirs = socket.socketpair()
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs


def _received(sock: socket.socket) -> bytes:
    """What `sock` can read now, without waiting."""
    sock.setblocking(False)
    data = bytearray()
    with contextlib.suppress(BlockingIOError):
        while chunk := sock.recv(1 << 20):
            data += chunk
    return bytes(data)


async def test_write_to_an_idle_socket_leaves_at_once():
    stream, peer = await _socket_pair()
    w = BatchWriter(stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        await trio.testing.wait_all_tasks_blocked()
        w.queue(b"head:", b"body")
        # no checkpoint since the write: only `write` itself can have sent it
        assert _received(peer) == b"head:body"
        assert w.pending_bytes == 0
        w.close()
    await stream.aclose()
    peer.close()


async def test_a_wrapped_socket_stream_is_written_through():
    stream, peer = await _socket_pair()
    w = BatchWriter(ReceiveClock(stream))  # as a remoting server's connection wraps it
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        await trio.testing.wait_all_tasks_blocked()
        w.queue(b"answer")
        assert _received(peer) == b"answer"
        w.close()
    await stream.aclose()
    peer.close()


async def test_what_the_socket_does_not_take_follows_in_order():
    stream, peer = await _socket_pair()
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    w = BatchWriter(stream)
    big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket buffers hold
    received = bytearray()

    def drain() -> None:
        peer.setblocking(True)
        while chunk := peer.recv(1 << 16):
            received.extend(chunk)

    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as writing:
            writing.start_soon(w.run)
            await trio.testing.wait_all_tasks_blocked()
            w.queue(b"first", big)
            assert w.pending_bytes > 0  # queued for the task behind what the kernel took
            w.queue(b"second")  # never overtakes the queued rest of the first write
            nursery.start_soon(trio.to_thread.run_sync, drain)
            w.close()  # run() sends the rest, then returns
        await stream.aclose()  # the owner's: the drain sees the end
    assert bytes(received) == b"first" + big + b"second"
    peer.close()


async def test_no_write_through_after_the_stream_closed():
    stream, peer = await _socket_pair()
    w = BatchWriter(stream)
    ended = []

    async def run() -> None:
        with pytest.raises(trio.ClosedResourceError):
            await w.run()  # the task meets the closed stream with the queued bytes
        ended.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        await stream.aclose()  # its descriptor number may now belong to another file
        spare = socket.socketpair()  # likely given the freed number
        w.queue(b"must not reach anyone")
    assert ended
    assert _received(spare[1]) == b""
    for sock in (peer, *spare):
        sock.close()


async def test_run_twice_is_an_error():
    w = BatchWriter(RecordingStream())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError):
            await w.run()
        w.close()


async def test_reaper_fires_in_deadline_order_and_skips_completed(autojump_clock):
    live = {1, 2, 3, 4}
    fired: list[tuple[int, float]] = []

    def expire(key):
        live.discard(key)
        fired.append((key, trio.current_time()))

    reaper = DeadlineReaper(expire, live.__contains__)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reaper.run)
        start = trio.current_time()
        reaper.add(start + 3, 3)
        reaper.add(start + 1, 1)
        reaper.add(start + 4, 4)
        reaper.add(start + 2, 2)
        live.discard(2)  # answered before its deadline
        await trio.sleep(1.5)
        reaper.add(start + 1.6, 5)  # a new earliest deadline wakes the reaper
        live.add(5)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert [key for key, _ in fired] == [1, 5, 3, 4]
    for key, at in fired:
        assert at - start == pytest.approx({1: 1, 5: 1.6, 3: 3, 4: 4}[key])
    assert len(reaper) == 0


async def test_reaper_compacts_stale_entries():
    reaper = DeadlineReaper(lambda key: None, lambda key: key % 100 == 0)
    now = trio.current_time()
    for key in range(10_000):
        reaper.add(now + 60, key)
    assert len(reaper) < 2_000  # answered calls do not pile up
