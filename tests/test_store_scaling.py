"""What a dispatch step and a dispatch checkpoint cost as queues multiply: a step starts
a bounded number of new ConsumeQueues before it yields and writes no file; a checkpoint
writes and fsyncs only the queues dispatched to since the last, a bounded batch per worker
hop while dispatch goes on, and checkpoints back off when their fsyncs take long."""

from __future__ import annotations

import itertools
import os

import pytest
import trio
from raftmq.broker.store import consumequeue
from raftmq.broker.store.messagestore import (
    CHECKPOINT_DISK_SHARE,
    CHECKPOINT_INTERVAL_S,
    CHECKPOINT_MAX_INTERVAL_S,
    DISPATCH_CHUNK,
    NEW_QUEUES_PER_STEP,
    MessageStore,
    checkpoint_interval_s,
    checkpoint_position,
    parse_delay_levels,
)
from raftmq.broker.store.metadata import builtin_topics
from raftmq.dledger.store.file import FileLogStore

from raftmq.disk.durable import DiskFailure
from raftmq.protocol import message as codec
from tests.helpers import OneReplicaLog


def _store(tmp_path) -> MessageStore:
    log = OneReplicaLog(FileLogStore(tmp_path / "log", segment_size=4 << 20))
    return MessageStore(log, tmp_path / "b", builtin_topics("C", "b", 4), parse_delay_levels(""))


def _put(store: MessageStore, topic: str, queue_id: int = 0, sysflag: int = 0) -> None:
    msg = codec.MessageExt(topic=topic, body=b"m", queue_id=queue_id, sysflag=sysflag)
    store.commitlog.put_nowait([codec.encode(msg)], lambda code, placed: None)


def test_a_dispatch_step_starts_a_bounded_number_of_new_queues(tmp_path):
    """Each new queue is a directory and a file made on the event loop: a step stops
    after NEW_QUEUES_PER_STEP of them, and the next steps go on from there; messages
    to queues that exist are not held back."""
    store = _store(tmp_path)
    new_queues = 3 * NEW_QUEUES_PER_STEP + 5
    for k in range(new_queues):
        _put(store, f"T{k}")
    steps = []
    while taken := store.dispatch_some(10_000):
        steps.append(taken)
    assert steps == [NEW_QUEUES_PER_STEP] * 3 + [5]
    assert store.dispatched_index == store.dispatch_target
    for k in range(new_queues):
        assert store.queues.find(f"T{k}", 0).max_offset == 1
        assert (tmp_path / "b" / "consumequeue" / f"T{k}" / "0").is_dir()
    for k in range(new_queues):  # every queue exists now: one step takes them all
        _put(store, f"T{k}")
    assert store.dispatch_some(10_000) == new_queues


def test_a_checkpoint_writes_and_fsyncs_only_the_queues_dispatched_to_since_the_last(
    tmp_path,
):
    """With many idle queues a checkpoint's cost is that of the queues messages went to
    since the last; a dispatch step writes none (reads come from memory); a message
    that takes no queue offset (a prepared transaction) makes no queue busy."""
    store = _store(tmp_path)
    for k in range(200):
        _put(store, f"T{k}")
    while store.dispatch_some(10_000):
        pass
    store.checkpoint_work()()
    assert store.queues.unsynced == set()
    _put(store, "T7")
    _put(store, "Half", sysflag=codec.MessageSysFlag.TRANSACTION_PREPARED_TYPE)
    assert store.dispatch_some(10_000) == 2
    assert store.max_offset("T7", 0) == 2  # readable before it is written
    queue_file = next((tmp_path / "b" / "consumequeue" / "T7" / "0").iterdir())
    assert queue_file.stat().st_size == consumequeue.ENTRY_SIZE
    assert store.queues.unsynced == {("T7", 0), ("Half", 0)}
    assert [key for key, q in store.queues.queues.items() if not q.durable] == [("T7", 0)]
    store.checkpoint_work()()
    assert queue_file.stat().st_size == 2 * consumequeue.ENTRY_SIZE
    assert store.queues.find("Half", 0) is None
    assert store.queues.unsynced == set()


@pytest.mark.parametrize(
    ("took_s", "interval_s"),
    [
        (0.0, CHECKPOINT_INTERVAL_S),
        (0.2, CHECKPOINT_INTERVAL_S),
        (2.0, 2.0 / CHECKPOINT_DISK_SHARE),
        (30.0, CHECKPOINT_MAX_INTERVAL_S),
    ],
)
def test_checkpoints_back_off_while_their_fsyncs_take_long(took_s, interval_s):
    """Quick checkpoints come every CHECKPOINT_INTERVAL_S; one whose fsyncs (one per
    busy queue) took long puts the next off, so they hold the disk at most
    CHECKPOINT_DISK_SHARE of the time, up to CHECKPOINT_MAX_INTERVAL_S."""
    assert checkpoint_interval_s(took_s) == pytest.approx(interval_s)


def test_a_checkpoint_records_how_long_its_work_took(tmp_path):
    store = _store(tmp_path)
    _put(store, "T")
    store.dispatch_some(100)
    store.checkpoint_work()()
    assert 0 < store.checkpoint_took_s < 10
    assert store.checkpointed_index == store.dispatched_index + 1


QUEUES_AT_SCALE = 10_000  # the 2013 design's "more than 10,000 persistent queues"
LOAD_PER_TICK = 100  # messages every LOAD_TICK_S: 5,000/s, each queue twice in 4 s
LOAD_TICK_S = 0.02


@pytest.mark.slow
async def test_a_checkpoint_over_ten_thousand_busy_queues_completes_while_dispatch_goes_on(
    tmp_path, nursery
):
    """A load that reaches every one of 10,000 queues between two checkpoints: the
    checkpoint writes and fsyncs each (a bounded batch per worker hop, one file open at
    a time) and is recorded, while dispatch keeps up with the load meanwhile. Before,
    it took every queue in one step, each queue holding a descriptor and the step a
    second one per queue (EMFILE at this machine's limit of 20,000), and dispatch
    waited for its fsyncs. After it, every entry before the position it recorded is in
    the files."""
    store = _store(tmp_path)
    records = [
        codec.encode(codec.MessageExt(topic=f"T{k // 4}", body=b"m", queue_id=k % 4))
        for k in range(QUEUES_AT_SCALE)
    ]
    await nursery.start(store.run)
    for start in range(0, QUEUES_AT_SCALE, 1000):  # every queue made, with its file
        store.commitlog.put_nowait(records[start : start + 1000], lambda code, placed: None)
        await trio.sleep(0)
    while store.dispatch_behind():
        await trio.sleep(0.05)
    load_from = store.dispatched_index + 1
    worst = {"behind": 0, "fds": 0}

    async def load_and_watch() -> None:
        for tick in itertools.count():
            start = tick * LOAD_PER_TICK % QUEUES_AT_SCALE
            store.commitlog.put_nowait(
                records[start : start + LOAD_PER_TICK], lambda code, placed: None
            )
            await trio.sleep(LOAD_TICK_S)
            worst["behind"] = max(worst["behind"], store.dispatch_behind())
            worst["fds"] = max(worst["fds"], len(os.listdir("/proc/self/fd")))

    nursery.start_soon(load_and_watch)
    with trio.fail_after(CHECKPOINT_MAX_INTERVAL_S):
        while store.checkpointed_index <= load_from:  # one begun under the load
            await trio.sleep(0.1)
    position = checkpoint_position(tmp_path / "b")  # what a restart resumes from
    assert worst["fds"] < 1000, worst
    assert worst["behind"] < 2 * DISPATCH_CHUNK, worst  # not a checkpoint's worth
    for (topic, queue_id), queue in store.queues.queues.items():
        (path,) = (tmp_path / "b" / "consumequeue" / topic / str(queue_id)).iterdir()
        vouched = consumequeue.entries_ending_by(queue.entry_bytes(0, len(queue)), position)
        assert path.stat().st_size >= vouched * consumequeue.ENTRY_SIZE, (topic, queue_id)


async def test_checkpoints_taken_at_once_follow_one_another(tmp_path):
    """A checkpoint asked for while the periodic one runs (a test, an admin) waits for
    it: two at once wrote the same temporary file, and the second rename found it gone
    (a DiskFailure), or recorded an older position after a newer one."""
    store = _store(tmp_path)
    recorded = []

    async def checkpoint() -> None:
        await store.checkpoint()
        recorded.append(store.checkpointed_index)

    for round_ in range(10):
        for k in range(300):
            _put(store, f"T{k}")
        while store.dispatch_some(10_000):
            pass
        recorded.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(checkpoint)
            nursery.start_soon(checkpoint)
        assert recorded == [store.dispatched_index + 1] * 2, round_


async def test_no_checkpoint_is_recorded_after_a_queue_fsync_failed(tmp_path, monkeypatch):
    """After a failed fsync the kernel may have dropped the queue's dirty pages, and an
    fsync through a new descriptor would then succeed without them: a later checkpoint
    (the one at shutdown, say) must not record a position that counts on them."""
    store = _store(tmp_path)
    _put(store, "T")
    store.dispatch_some(100)
    store.checkpoint_work()()
    recorded = checkpoint_position(tmp_path / "b")
    _put(store, "T")
    store.dispatch_some(100)
    real_fsync, failures = os.fsync, [OSError(5, "Input/output error")]

    def fsync_failing_once(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_fsync(fd)

    monkeypatch.setattr(consumequeue.os, "fsync", fsync_failing_once)
    with pytest.raises(ExceptionGroup) as failed:  # from the checkpoint's worker hops
        await store.checkpoint()
    assert failed.group_contains(DiskFailure, match="fsync failed")
    with pytest.raises(DiskFailure, match="fsync failed earlier"):
        store.checkpoint_work()()
    assert checkpoint_position(tmp_path / "b") == recorded
