"""The classic CommitLog in one process: RocketMQ's file layout byte by byte, recovery
after a clean stop and after a crash, group commit, and the message store over it."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest
import trio
from raftmq.broker.store.classic_commitlog import ClassicCommitLog, PutPolicy, PutStatus
from raftmq.broker.store.classic_log import BLANK_MAGIC_CODE, ClassicLog
from raftmq.broker.store.messagestore import GetStatus, MessageStore
from raftmq.broker.store.metadata import Metadata, consumer_offsets, delay_offsets, loads
from raftmq.dledger.codes import Code

from raftmq.disk.segments import StoreCorruption
from raftmq.protocol import message as codec

FILE_BYTES = 1024


def record(topic: str = "T", queue_id: int = 0, body: bytes = b"x" * 50) -> bytes:
    msg = codec.MessageExt(topic=topic, queue_id=queue_id, body=body, store_timestamp=1)
    return codec.encode(msg)


def open_log(root: Path, file_bytes: int = FILE_BYTES) -> ClassicLog:
    return ClassicLog(root / "commitlog", file_bytes, root / "abort")


def commitlog(log: ClassicLog, sync: bool = False, replication=None) -> ClassicCommitLog:
    return ClassicCommitLog(log, PutPolicy(sync, 5.0, 0.05, slave_timeout_s=0.2), replication)


async def put(cl: ClassicCommitLog, records: list[bytes]) -> tuple[object, list]:
    outcome: list = []
    finished = trio.Event()

    def done(status, placed) -> None:
        outcome[:] = [status, placed]
        finished.set()

    cl.put_nowait(records, done)
    await finished.wait()
    return outcome[0], outcome[1]


def files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "commitlog").iterdir())


async def test_layout_offsets_and_blank_at_file_end(tmp_path):
    log = open_log(tmp_path)
    cl = commitlog(log)
    size = len(record())
    per_file = (FILE_BYTES - 8) // size  # a record must leave 8 bytes for the blank
    status, placed = await put(cl, [record() for _ in range(per_file + 1)])
    assert status is Code.SUCCESS
    # physical offset = file offset; queue offsets 0, 1, 2, ...
    assert placed[:per_file] == [(i * size, i) for i in range(per_file)]
    assert placed[per_file] == (FILE_BYTES, per_file)
    assert files(tmp_path) == [f"{0:020d}", f"{FILE_BYTES:020d}"]
    first = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
    assert len(first) == FILE_BYTES
    blank_at = per_file * size
    assert struct.unpack_from(">ii", first, blank_at) == (FILE_BYTES - blank_at, BLANK_MAGIC_CODE)
    # the record carries its own physical and queue offsets (msgIds depend on them)
    msg, _ = codec.decode(cl.read_message(FILE_BYTES))
    assert (msg.physical_offset, msg.queue_offset) == (FILE_BYTES, per_file)
    assert log.write_pos == FILE_BYTES + size
    log.close()
    assert not (tmp_path / "abort").exists()


async def test_a_slave_log_is_cut_where_its_master_log_differs(tmp_path):
    """Controller mode's truncation: at a record's start or end (before a BLANK), durably."""
    log = open_log(tmp_path)
    cl = commitlog(log)
    size = len(record())
    per_file = (FILE_BYTES - 8) // size
    await put(cl, [record() for _ in range(per_file + 3)])
    assert files(tmp_path) == [f"{0:020d}", f"{FILE_BYTES:020d}"]
    for bad in (size + 1, -1):
        with pytest.raises(ValueError, match="cannot cut"):
            log.truncate(bad)
    log.truncate(per_file * size)  # where the BLANK of the first file starts
    assert (log.write_pos, log.end_index) == (per_file * size, per_file - 1)
    assert files(tmp_path) == [f"{0:020d}"]
    log.truncate(2 * size)
    log.close()
    log = open_log(tmp_path)
    assert (log.write_pos, log.end_index) == (2 * size, 1)
    first = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
    assert first[2 * size :] == bytes(FILE_BYTES - 2 * size)
    log.close()


async def test_normal_restart_keeps_everything(tmp_path):
    log = open_log(tmp_path)
    await put(commitlog(log), [record() for _ in range(40)])
    end, positions = log.write_pos, [log.pos_at(i) for i in range(40)]
    log.close()
    again = open_log(tmp_path)
    assert not again.aborted
    assert again.write_pos == end
    assert [again.pos_at(i) for i in range(40)] == positions


async def test_crash_recovery_truncates_a_torn_tail(tmp_path):
    log = open_log(tmp_path)
    cl = commitlog(log)
    _status, placed = await put(cl, [record() for _ in range(5)])
    good_end = log.write_pos
    last = placed[-1][0]
    # a torn write: the last record's second half never reached the disk
    buffer, offset = log.locate(last)
    size = len(record())
    buffer[offset + size // 2 : offset + size] = bytes(size - size // 2)
    buffer.flush()
    # and a crash: no close, so the abort file stays
    assert (tmp_path / "abort").exists()
    again = open_log(tmp_path)
    assert again.aborted  # the body CRCs were checked
    assert again.write_pos == last < good_end
    assert again.end_index == 3
    raw = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
    assert raw[last:] == bytes(FILE_BYTES - last)  # the torn bytes are gone
    # the log goes on from there
    _status, placed = await put(commitlog(again), [record()])
    assert placed[0][0] == last


async def test_crash_recovery_checks_the_crcs_after_the_checkpoint_only(tmp_path):
    log = open_log(tmp_path)
    cl = commitlog(log)
    size = len(record())
    _status, placed = await put(cl, [record() for _ in range(3)])
    _target, work = log.flush_plan()
    work()  # durable, and the checkpoint says so
    assert json.loads((tmp_path / "commitlog_checkpoint").read_bytes()) == {"flushed": 3 * size}
    _status, later = await put(cl, [record() for _ in range(3)])
    for pos in (placed[0][0], later[1][0]):  # a bad body byte before and after it
        buffer, offset = log.locate(pos)
        buffer[offset + size - 20] ^= 0xFF  # in the body
    again = open_log(tmp_path)  # a crash: no close
    assert again.aborted
    assert again.write_pos == later[1][0]  # cut at the bad record after the checkpoint
    assert again.end_index == 3  # the one before it was not read again (trusted as durable)
    # a damaged header below the checkpoint: the log ends below what it vouched for, and
    # from then on it vouches for nothing (what is written next is not durable yet)
    buffer, offset = again.locate(placed[1][0])
    buffer[offset + 4 : offset + 8] = b"\0\0\0\1"
    third = open_log(tmp_path)
    assert third.write_pos == placed[1][0]
    assert json.loads((tmp_path / "commitlog_checkpoint").read_bytes()) == {"flushed": 0}


async def test_crash_recovery_drops_files_after_the_end(tmp_path):
    log = open_log(tmp_path)
    await put(commitlog(log), [record() for _ in range(30)])  # two files
    second = tmp_path / "commitlog" / f"{FILE_BYTES:020d}"
    assert second.exists()
    buffer, _ = log.locate(0)
    buffer[0:8] = b"\xff" * 8  # a damaged first header: nothing after it can be trusted
    buffer.flush()
    again = open_log(tmp_path)
    assert again.write_pos == 0 and again.empty
    assert not second.exists()


async def test_sync_flush_acknowledges_after_a_group_commit(tmp_path):
    log = open_log(tmp_path)
    cl = commitlog(log, sync=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(cl.run)
        results = []

        async def one() -> None:
            results.append(await put(cl, [record()]))

        async with trio.open_nursery() as senders:
            for _ in range(10):
                senders.start_soon(one)
        assert all(status is Code.SUCCESS for status, _ in results)
        assert log.flushed_pos == log.write_pos
        nursery.cancel_scope.cancel()


class _NoSlave:
    acked_offset = 0

    def slave_ok(self, offset: int) -> bool:
        return False

    def refusal(self) -> None:
        return None


class _SilentSlave(_NoSlave):
    def slave_ok(self, offset: int) -> bool:
        return True


@pytest.mark.parametrize(
    ("replication", "expected"),
    [(_NoSlave(), PutStatus.SLAVE_NOT_AVAILABLE), (_SilentSlave(), PutStatus.FLUSH_SLAVE_TIMEOUT)],
)
async def test_sync_master_statuses(tmp_path, replication, expected):
    log = open_log(tmp_path)
    cl = commitlog(log, replication=replication)
    async with trio.open_nursery() as nursery:
        await nursery.start(cl.run)
        started = trio.current_time()
        status, placed = await put(cl, [record()])
        assert status is expected and placed == [(0, 0)]  # stored all the same
        waited = trio.current_time() - started
        if expected is PutStatus.FLUSH_SLAVE_TIMEOUT:
            assert 0.2 <= waited < 1.0  # slaveTimeout
        else:
            assert waited < 0.1  # at once
        nursery.cancel_scope.cancel()


async def test_wait_false_is_answered_at_once(tmp_path):
    log = open_log(tmp_path)
    cl = commitlog(log, sync=True, replication=_SilentSlave())
    msg = codec.MessageExt(topic="T", body=b"x", properties={"WAIT": "false"})
    outcome = []
    cl.put_nowait([codec.encode(msg)], lambda status, placed: outcome.append((status, placed)))
    assert outcome == [(Code.SUCCESS, [(0, 0)])]


async def test_sync_master_waits_for_the_ack(tmp_path):
    log = open_log(tmp_path)
    slave = _SilentSlave()
    cl = commitlog(log, replication=slave)
    async with trio.open_nursery() as nursery:
        await nursery.start(cl.run)
        outcome = []
        cl.put_nowait([record()], lambda status, placed: outcome.append(status))
        await trio.sleep(0.05)
        assert outcome == []
        cl.on_slave_ack(log.write_pos)
        assert outcome == [Code.SUCCESS]
        nursery.cancel_scope.cancel()


async def test_message_store_dispatches_from_the_classic_log(tmp_path):
    log = open_log(tmp_path, 4096)
    cl = commitlog(log)
    store = MessageStore(log, tmp_path, {}, [1000], commitlog=cl)
    async with trio.open_nursery() as nursery:
        await nursery.start(cl.run)
        await nursery.start(store.run)
        await put(cl, [record("T", q % 2, f"m{q}".encode()) for q in range(100)])
        await store.wait_dispatch(1.0)
        while store.dispatch_behind():
            await store.wait_dispatch(1.0)
        result = store.get_message("T", 1, 0, 32)
        assert result.status == GetStatus.FOUND
        assert [codec.decode(r)[0].body for r in result.records[:3]] == [b"m1", b"m3", b"m5"]
        assert store.max_offset("T", 0) == 50
        nursery.cancel_scope.cancel()
    log.close()
    # a restart dispatches nothing twice and loses nothing
    log = open_log(tmp_path, 4096)
    store = MessageStore(log, tmp_path, {}, [1000], commitlog=commitlog(log))
    store.take_over_offsets()
    assert store.max_offset("T", 0) == 50 and store.max_offset("T", 1) == 50


async def test_a_record_larger_than_a_file_is_refused_whole(tmp_path):
    log = open_log(tmp_path)
    status, placed = await put(commitlog(log), [record(), record(body=b"x" * FILE_BYTES)])
    assert (status, placed) == (PutStatus.MESSAGE_ILLEGAL, None)
    assert log.write_pos == 0 and log.empty  # the small one was not stored either


def test_slave_sync_takes_a_java_masters_tables():
    """The bodies as a Java master's fastjson writes them (integer keys unquoted)."""
    metadata = Metadata({})
    metadata.offsets[("G", "T", 0)] = 3
    metadata.offsets[("Old", "T", 0)] = 9
    topics = loads(
        b'{"dataVersion":{"counter":2,"timestamp":5},"topicConfigTable":{"T":{"topicName":"T",'
        b'"readQueueNums":4,"writeQueueNums":4,"perm":6}}}'
    )
    offsets = consumer_offsets(loads(b'{"offsetTable":{"T@G":{0:5,1:7}}}'))
    delays = delay_offsets(loads(b'{"offsetTable":{1:0,2:17}}'))
    groups = loads(b'{"subscriptionGroupTable":{"G":{"groupName":"G","brokerId":1}}}')
    metadata.synchronize(topics, groups, offsets, delays)
    assert metadata.topics["T"].write_queue_nums == 4
    assert metadata.data_version == {"counter": 2, "timestamp": 5}
    assert metadata.groups["G"].broker_id == 1
    # RocketMQ's putAll: added and overwritten, never removed
    assert metadata.offsets == {("G", "T", 0): 5, ("G", "T", 1): 7, ("Old", "T", 0): 9}
    assert metadata.delay_offsets == {1: 0, 2: 17}


def test_a_store_rocketmq_wrote_brings_its_topics_groups_and_offsets(tmp_path):
    """The tables Apache RocketMQ's broker keeps in `config/` (fastjson, integer keys
    unquoted; a `.bak` where the file is gone) are what a store it wrote starts with:
    its messages are of no use without their topics and consumers' offsets."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json").write_bytes(
        b'{"dataVersion":{"counter":2,"timestamp":5},"topicConfigTable":{"T":{"topicName":"T",'
        b'"readQueueNums":2,"writeQueueNums":2,"perm":6}}}'
    )
    (config / "consumerOffset.json.bak").write_bytes(b'{"offsetTable":{"T@G":{0:5,1:7}}}')
    (config / "subscriptionGroup.json").write_bytes(
        b'{"subscriptionGroupTable":{"G":{"groupName":"G","brokerId":0}}}'
    )
    (config / "delayOffset.json").write_bytes(b'{"offsetTable":{3:11}}')
    log = open_log(tmp_path)
    store = MessageStore(log, tmp_path, {}, [1000], commitlog=commitlog(log))
    assert store.metadata.topics["T"].read_queue_nums == 2
    assert store.metadata.offsets_of_group("G") == {("T", 0): 5, ("T", 1): 7}
    assert set(store.metadata.groups) == {"G"}
    assert store.metadata.delay_offsets == {3: 11}


def test_the_tables_left_for_rocketmq_read_back_as_they_were(tmp_path):
    """What a clean stop leaves in `config/` for RocketMQ's broker is what a store
    without raftmq's snapshot starts with: the same topics, groups and offsets."""
    metadata = Metadata({})
    metadata.apply(json.dumps({"op": "topic", "config": {"topicName": "T"}}).encode(), 0)
    group = {"op": "group", "config": {"groupName": "G", "retryMaxTimes": 3}}
    metadata.apply(json.dumps(group).encode(), 1)
    metadata.apply(json.dumps({"op": "offsets", "entries": [["G", "T", 1, 42]]}).encode(), 2)
    metadata.apply(json.dumps({"op": "delay", "entries": {"2": 5}}).encode(), 3)
    for name, body in metadata.rocketmq_tables().items():
        (tmp_path / name).write_bytes(body)
    again = Metadata({})
    assert sorted(again.load_rocketmq(tmp_path)) == sorted(metadata.rocketmq_tables())
    assert again.topics == metadata.topics and again.groups == metadata.groups
    assert again.offsets == {("G", "T", 1): 42} and again.delay_offsets == {2: 5}


async def test_a_missing_file_in_the_middle_is_refused(tmp_path):
    log = open_log(tmp_path)
    await put(commitlog(log), [record() for _ in range(50)])  # three files
    log.close()
    (tmp_path / "commitlog" / f"{FILE_BYTES:020d}").unlink()
    with pytest.raises(StoreCorruption, match=f"{FILE_BYTES:020d} at offset 0: missing"):
        open_log(tmp_path)


async def test_expired_files_go_but_not_past_the_retention_limit(tmp_path):
    log = open_log(tmp_path)
    await put(commitlog(log), [record() for _ in range(50)])  # several files
    last = log.write_pos - log.write_pos % FILE_BYTES
    assert last >= 2 * FILE_BYTES
    old = time.time() - 7200
    for path in (tmp_path / "commitlog").iterdir():
        os.utime(path, (old, old))
    first_kept = log.end_index  # a dispatch checkpoint at the last message
    log.add_retention_limit(lambda: first_kept)
    assert log.delete_expired(3600.0) == last // FILE_BYTES
    assert files(tmp_path) == [f"{last:020d}"]  # never the file the log ends in
    assert log.min_offset == last
    assert log.pos_at(log.begin_index) == last
    assert log.end_index == first_kept  # indexes do not move
    with pytest.raises(IndexError):
        log.read_at(0, 8)
    # a limit in the first file keeps everything; young files stay too
    log = open_log(tmp_path / "again")
    await put(commitlog(log), [record() for _ in range(50)])
    log.add_retention_limit(lambda: 3)
    assert log.delete_expired(0.0) == 0
    assert log.delete_expired(3600.0) == 0


async def test_queues_follow_the_logs_new_beginning(tmp_path):
    log = open_log(tmp_path)
    cl = commitlog(log)
    store = MessageStore(log, tmp_path, {}, [1000], commitlog=cl)
    await put(cl, [record("T", 0) for _ in range(60)])
    store.dispatch_some(1000)
    store.checkpoint_work()()  # the ConsumeQueues are durable: retention may pass them
    old = time.time() - 7200
    for path in (tmp_path / "commitlog").iterdir():
        os.utime(path, (old, old))
    assert log.delete_expired(3600.0) > 0
    first = log.pos_at(log.begin_index)
    result = store.get_message("T", 0, 0, 32)
    assert result.status == GetStatus.OFFSET_TOO_SMALL
    assert result.next_begin_offset == log.begin_index  # one message per queue offset here
    kept = store.get_message("T", 0, result.next_begin_offset, 1)
    assert codec.decode(kept.records[0])[0].physical_offset == first


async def test_a_full_disk_refuses_puts_until_there_is_room(tmp_path):
    """While the disk check marks the disk full, a put is refused whole (DLedger's
    DISK_FULL, which the send path answers as RocketMQ's disk-full
    SERVICE_NOT_AVAILABLE) and nothing is written; once there is room it is stored."""
    log = open_log(tmp_path)
    cl = commitlog(log)
    cl.disk_full = True
    assert await put(cl, [record()]) == (Code.DISK_FULL, None)
    assert log.write_pos == 0 and log.empty
    cl.disk_full = False
    status, placed = await put(cl, [record()])
    assert status == Code.SUCCESS and placed == [(0, 0)]
