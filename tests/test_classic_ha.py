"""RocketMQ's HA protocol in one process, over loopback sockets: a slave written from
the protocol's description (as a Java slave behaves) against our master, and our slave
against a master written the same way; every mismatch ends in a clear state."""

from __future__ import annotations

import os
import struct
import time

import pytest
import trio
from raftmq.broker.store.classic_commitlog import ClassicCommitLog, PutPolicy
from raftmq.broker.store.classic_log import ClassicLog
from raftmq.broker.store.ha import RECONNECT_S, HAClient, HAConfig, HAService
from raftmq.dledger.codes import Code

from raftmq.protocol import message as codec
from tests.helpers import wait_for

FILE_BYTES = 4096
HEADER = struct.Struct(">qi")
REPORT = struct.Struct(">q")
FAST = HAConfig(heartbeat_interval_s=0.2, housekeeping_interval_s=1.0, transfer_batch_bytes=1000)


def record(n: int) -> bytes:
    return codec.encode(codec.MessageExt(topic="T", body=b"%05d" % n + b"." * 100))


def open_log(path) -> ClassicLog:
    return ClassicLog(path / "commitlog", FILE_BYTES, path / "abort")


async def fill(log: ClassicLog, count: int) -> None:
    await ClassicCommitLog(log, PutPolicy(False, 5.0, 1.0)).put([record(n) for n in range(count)])


async def read_frame(stream: trio.SocketStream, buffer: bytearray) -> tuple[int, bytes]:
    while True:
        if len(buffer) >= HEADER.size:
            offset, size = HEADER.unpack_from(buffer)
            if len(buffer) >= HEADER.size + size:
                body = bytes(buffer[HEADER.size : HEADER.size + size])
                del buffer[: HEADER.size + size]
                return offset, body
        data = await stream.receive_some(1 << 16)
        assert data, "the master closed the connection"
        buffer += data


async def closed_by_peer(stream: trio.SocketStream) -> bool:
    with trio.move_on_after(3):
        while await stream.receive_some(1 << 16):
            pass
        return True
    return False


async def serve_master(nursery, path, messages: int) -> tuple[ClassicLog, HAService, int]:
    log = open_log(path)
    await fill(log, messages)
    service = HAService(log, FAST)
    port = await nursery.start(service.serve, "127.0.0.1", 0)
    return log, service, port


async def test_a_java_like_slave_is_served_from_its_first_report(tmp_path):
    async with trio.open_nursery() as nursery:
        log, service, port = await serve_master(nursery, tmp_path, 100)  # several files
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        # a Java slave reports only after haSendHeartbeatInterval: the master waits
        await trio.sleep(0.5)
        assert len(service.connections) == 1
        await stream.send_all(REPORT.pack(0))  # an empty slave
        buffer = bytearray()
        start = log.write_pos - log.write_pos % FILE_BYTES
        copied = bytearray()
        offset = start
        while offset + len(copied) < log.write_pos:
            at, body = await read_frame(stream, buffer)
            assert at == offset + len(copied)  # contiguous, from the last file's start
            assert len(body) <= FAST.transfer_batch_bytes
            assert (at - start) // FILE_BYTES == (at + len(body) - 1 - start) // FILE_BYTES
            copied += body
        assert bytes(copied) == log.read_file_data(start, FILE_BYTES)
        # nothing acknowledged yet: a report is an ack only once the bytes were sent
        assert service.acked_offset == 0
        await stream.send_all(REPORT.pack(log.write_pos))
        await wait_for(lambda: service.acked_offset == log.write_pos)
        # idle: heartbeats, a header with no body at the next offset
        assert await read_frame(stream, buffer) == (log.write_pos, b"")
        nursery.cancel_scope.cancel()


async def test_a_peer_claiming_an_offset_acknowledges_nothing(tmp_path):
    """RocketMQ #3015: any TCP client could send 8 bytes and count as the slave's ack."""
    async with trio.open_nursery() as nursery:
        log, service, port = await serve_master(nursery, tmp_path, 10)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(REPORT.pack(log.write_pos))  # "I have everything"
        await trio.sleep(0.3)
        assert service.acked_offset == 0
        # the claim counts for availability (a put would wait, then answer 12), not as an ack
        assert service.slave_ok(log.write_pos + 1)
        # and a later claim beyond what it was sent ends the connection
        await stream.send_all(REPORT.pack(log.write_pos + 1))
        assert await closed_by_peer(stream)
        await wait_for(lambda: not service.connections)
        nursery.cancel_scope.cancel()


async def test_a_slave_ahead_or_below_the_masters_files_is_turned_away(tmp_path):
    async with trio.open_nursery() as nursery:
        log, service, port = await serve_master(nursery, tmp_path, 10)
        for offset in (log.write_pos + 100, -5):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(REPORT.pack(offset))
            assert await closed_by_peer(stream), offset
        await wait_for(lambda: not service.connections)
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_silent_slave_is_dropped_after_housekeeping(tmp_path):
    async with trio.open_nursery() as nursery:
        _log, service, port = await serve_master(nursery, tmp_path, 1)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(REPORT.pack(0))
        await wait_for(lambda: len(service.connections) == 1)
        await wait_for(lambda: not service.connections, timeout_s=FAST.housekeeping_interval_s + 1)
        nursery.cancel_scope.cancel()


async def test_our_slave_copies_our_master_and_follows_it(tmp_path):
    async with trio.open_nursery() as nursery:
        master, service, port = await serve_master(nursery, tmp_path / "m", 25)
        slave = open_log(tmp_path / "s")
        client = HAClient(slave, FAST, lambda: f"127.0.0.1:{port}")
        nursery.start_soon(client.run)
        await wait_for(lambda: slave.write_pos == master.write_pos)
        start = master.write_pos - master.write_pos % FILE_BYTES
        assert slave.min_offset == start
        await fill(master, 40)
        await wait_for(lambda: slave.write_pos == master.write_pos)
        for pos in range(start, master.write_pos, FILE_BYTES):
            assert slave.read_file_data(pos, FILE_BYTES) == master.read_file_data(pos, FILE_BYTES)
        # the slave parsed the whole records it was sent: its messages are the master's
        assert [slave.pos_at(i) for i in range(slave.end_index + 1)] == [
            p for p in (master.pos_at(i) for i in range(master.end_index + 1)) if p >= start
        ]
        await wait_for(lambda: service.acked_offset == master.write_pos)
        nursery.cancel_scope.cancel()


async def test_our_slave_tries_a_given_master_at_once_and_reports_losing_it(tmp_path):
    """An address given while the slave waits to retry is tried at once, not RECONNECT_S
    later (a slave started before its master hears of it from the name server); the end
    of the connection is reported (the broker then asks the name servers again)."""
    slave = open_log(tmp_path / "s")
    address = None
    lost = trio.Event()
    client = HAClient(slave, FAST, lambda: address, on_lost=lost.set)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.run)
        async with trio.open_nursery() as masters:
            _master, service, port = await serve_master(masters, tmp_path / "m", 5)
            await trio.sleep(RECONNECT_S / 10)  # the slave waits for an address
            address = f"127.0.0.1:{port}"
            given = trio.current_time()
            client.master_given()
            await wait_for(lambda: len(service.connections) == 1, timeout_s=RECONNECT_S * 2)
            assert trio.current_time() - given < RECONNECT_S / 2
            assert client.connected_to == address and not lost.is_set()
            masters.cancel_scope.cancel()  # the master goes away
        with trio.fail_after(FAST.housekeeping_interval_s / 2):  # its close, not a timeout
            await lost.wait()
        nursery.cancel_scope.cancel()


async def spec_master(task_status=trio.TASK_STATUS_IGNORED, *, frames) -> None:
    """A master that accepts one slave, reads its first report, sends `frames(report)`
    and then stays silent."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    connections = []

    async def handle(stream: trio.SocketStream) -> None:
        connections.append(stream)
        report = REPORT.unpack(await stream.receive_some(8))[0]
        for offset, body in frames(report):
            await stream.send_all(HEADER.pack(offset, len(body)) + body)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)


async def test_our_slave_drops_a_master_pushing_the_wrong_offset(tmp_path):
    """Dropped, reconnected at once, and its loss not reported: the slave never took a
    frame from it (else the broker would re-register at every attempt)."""
    master = open_log(tmp_path / "m")
    await fill(master, 3)
    slave = open_log(tmp_path / "s")
    await fill(slave, 1)  # the slave ends after one message
    sessions = []

    def frames(report: int):
        sessions.append(report)
        assert report == slave.write_pos
        return [(report + 7, b"garbage")]  # not where the slave's log ends

    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: spec_master(task_status, frames=frames))
        lost = trio.Event()
        client = HAClient(slave, FAST, lambda: f"127.0.0.1:{port}", on_lost=lost.set)
        nursery.start_soon(client.run)
        await wait_for(lambda: len(sessions) >= 2)  # dropped, then reconnected
        assert slave.end_index == 0  # nothing appended
        assert not lost.is_set()
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_our_slave_detects_a_silent_master(tmp_path):
    """RocketMQ 4.9's slave compares its own last write and never notices."""
    sessions = []

    def frames(report: int):
        sessions.append(trio.current_time())
        return []  # not even heartbeats

    slave = open_log(tmp_path)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: spec_master(task_status, frames=frames))
        client = HAClient(slave, FAST, lambda: f"127.0.0.1:{port}")
        nursery.start_soon(client.run)
        await wait_for(lambda: len(sessions) >= 2, timeout_s=5)
        gap = sessions[1] - sessions[0]
        assert FAST.housekeeping_interval_s <= gap < FAST.housekeeping_interval_s + 1
        nursery.cancel_scope.cancel()


async def test_sync_master_puts_are_released_by_the_slaves_acks(tmp_path):
    async with trio.open_nursery() as nursery:
        master, service, port = await serve_master(nursery, tmp_path / "m", 5)
        cl = ClassicCommitLog(master, PutPolicy(False, 5.0, 1.0, slave_timeout_s=3.0), service)
        service.on_ack = cl.on_slave_ack
        await nursery.start(cl.run)
        slave = open_log(tmp_path / "s")
        nursery.start_soon(HAClient(slave, FAST, lambda: f"127.0.0.1:{port}").run)
        await wait_for(lambda: slave.write_pos == master.write_pos)
        outcome = []
        cl.put_nowait(
            [record(99)], lambda status, placed: outcome.append((status, slave.write_pos))
        )
        await wait_for(lambda: bool(outcome))
        [(status, slave_end)] = outcome
        assert status is Code.SUCCESS
        assert slave_end == master.write_pos  # answered once the slave had the record
        nursery.cancel_scope.cancel()


async def test_our_slave_keeps_only_whole_records_of_a_master_sending_garbage(tmp_path):
    master = open_log(tmp_path / "m")
    await fill(master, 3)
    good = master.read_file_data(0, FILE_BYTES)
    sessions = []

    def frames(report: int):
        sessions.append(report)
        return [(report, (good + b"\x07" * 64)[report:])]  # three records, then junk

    slave = open_log(tmp_path / "s")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: spec_master(task_status, frames=frames))
        nursery.start_soon(HAClient(slave, FAST, lambda: f"127.0.0.1:{port}").run)
        await wait_for(lambda: len(sessions) >= 2)  # dropped, then reconnected
        assert sessions[1] == len(good)  # the slave kept the three records and nothing else
        assert slave.end_index == 2
        assert slave.read_file_data(0, FILE_BYTES) == good
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_retention_keeps_what_a_connected_slave_still_needs(tmp_path):
    """A slave that stops reading: the master's sends stall once the socket buffers are
    full, and retention keeps every file from the first byte not yet sent to it."""
    size = 4 << 20
    master = ClassicLog(tmp_path / "commitlog", size, tmp_path / "abort")
    record_1k = codec.encode(codec.MessageExt(topic="T", body=b"x" * 1024))
    await ClassicCommitLog(master, PutPolicy(False, 5.0, 1.0)).put([record_1k] * 24_000)
    last = master.write_pos - master.write_pos % size
    service = HAService(master, FAST)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(service.serve, "127.0.0.1", 0)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(REPORT.pack(size))  # a slave at the second file, reading nothing
        await wait_for(lambda: any(c.start_offset for c in service.connections))
        connection = next(iter(service.connections))
        await trio.sleep(0.5)  # until the stalled sends stop moving
        old = time.time() - 7200
        for path in (tmp_path / "commitlog").iterdir():
            os.utime(path, (old, old))
        needed = connection.sent_offset
        assert needed < last, "the socket buffers took everything: no stall to test"
        master.delete_expired(3600.0)
        assert master.min_offset == needed - needed % size
        await stream.aclose()
        await wait_for(lambda: not service.connections)
        master.delete_expired(3600.0)
        assert master.min_offset == last  # the slave gone, so is the hold
        nursery.cancel_scope.cancel()
