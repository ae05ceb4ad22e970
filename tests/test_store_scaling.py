"""What a dispatch step and a dispatch checkpoint cost as queues multiply: a step starts
a bounded number of new ConsumeQueues before it yields, writes only the queues it
touched (per write interval, not per step), and checkpoints back off when their fsyncs take long."""

from __future__ import annotations

import pytest

from raftmq.broker.store import consumequeue
from raftmq.broker.store.messagestore import (
    CHECKPOINT_DISK_SHARE,
    CHECKPOINT_INTERVAL_S,
    CHECKPOINT_MAX_INTERVAL_S,
    NEW_QUEUES_PER_STEP,
    MessageStore,
    checkpoint_interval_s,
    parse_delay_levels,
)
from raftmq.broker.store.metadata import builtin_topics
from raftmq.dledger.store.file import FileLogStore
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


def test_queue_files_are_written_per_interval_and_only_the_queues_touched(tmp_path, monkeypatch):
    """With many idle queues the periodic write's cost is that of the queues messages
    went to since the last; a dispatch step writes none (reads come from memory); a
    message that takes no queue offset (a prepared transaction) touches none."""
    store = _store(tmp_path)
    for k in range(200):
        _put(store, f"T{k}")
    while store.dispatch_some(10_000):
        pass
    store.write_queues()
    flushed = []
    real_flush = consumequeue.ConsumeQueue.flush

    def counted(queue) -> None:
        flushed.append((queue.topic, queue.queue_id))
        real_flush(queue)

    monkeypatch.setattr(consumequeue.ConsumeQueue, "flush", counted)
    _put(store, "T7")
    _put(store, "Half", sysflag=codec.MessageSysFlag.TRANSACTION_PREPARED_TYPE)
    assert store.dispatch_some(10_000) == 2
    assert flushed == []
    assert store.max_offset("T7", 0) == 2  # readable before it is written
    store.write_queues()
    assert flushed == [("T7", 0)]
    queue_file = next((tmp_path / "b" / "consumequeue" / "T7" / "0").iterdir())
    assert queue_file.stat().st_size == 2 * consumequeue.ENTRY_SIZE
    assert store.queues.find("Half", 0) is None
    flushed.clear()
    store.write_queues()
    assert flushed == []  # nothing touched since


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
