"""Dispatch takes the messages that only add an entry to an existing queue a run per
queue at a time (`commitlog.QUEUE_RUNS`), the rest one by one: the queues it builds are
the ones a message-at-a-time dispatch builds, whatever the steps, across file rolls, and
when a replay after a restart goes over what is dispatched already."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st
from raftmq.broker.config import DEFAULT_DELAY_LEVELS
from raftmq.broker.store.consumequeue import ENTRY, ConsumeQueue
from raftmq.broker.store.indexfile import IndexService
from raftmq.broker.store.messagestore import MessageStore, parse_delay_levels
from raftmq.broker.store.metadata import SCHEDULE_TOPIC, builtin_topics
from raftmq.dledger.store.file import FileLogStore

from raftmq.protocol import message as codec
from tests.helpers import OneReplicaLog

PREPARED = codec.MessageSysFlag.TRANSACTION_PREPARED_TYPE
COMMITTED = codec.MessageSysFlag.TRANSACTION_COMMIT_TYPE

# (topic, queue id, sysflag, TAGS, UNIQ_KEY): a schedule-topic message, half
# transactions and keyed messages among the plain ones
message_parts = st.tuples(
    st.sampled_from(["A", "A", "B", "C", SCHEDULE_TOPIC]),
    st.integers(0, 2),
    st.sampled_from([0, 0, 0, PREPARED, COMMITTED]),
    st.sampled_from(["", "", "t1", "t2"]),
    st.sampled_from(["", "", "", "U"]),
)


def _store(root: Path, indexed: bool) -> MessageStore:
    log = OneReplicaLog(FileLogStore(root / "log", segment_size=1 << 20))
    return MessageStore(
        log,
        root / "b",
        builtin_topics("C", "b", 4),
        parse_delay_levels(DEFAULT_DELAY_LEVELS),
        queue_file_entries=3,  # a roll every three entries: runs cross files
        index=IndexService(root / "index", slot_num=11, index_num=1000),  # small files
        message_index_enable=indexed,
    )


@given(
    st.lists(st.lists(message_parts, min_size=1, max_size=12), max_size=6),
    st.lists(st.integers(1, 40), min_size=1, max_size=5),
    st.booleans(),
    st.integers(0, 30),
    st.integers(0, 10),
)
@example(  # a replay whose run starts among entries the queue kept and goes on past them
    batches=[[("A", 0, 0, "", "")] * 8], limits=[8], indexed=False, replay=6, cut=2
)
def test_runs_build_the_queues_a_message_at_a_time_dispatch_builds(
    batches, limits, indexed, replay, cut
):
    with tempfile.TemporaryDirectory(prefix="runs-") as root:
        _check_runs(_store(Path(root), indexed), batches, limits, replay, cut)


def _check_runs(store: MessageStore, batches, limits, replay: int, cut: int) -> None:
    expected: dict[tuple[str, int], bytearray] = {}
    keyed: dict[tuple[str, str], list[int]] = {}  # (topic, UNIQ_KEY): physical offsets
    messages = message_bytes = 0
    ends = []  # where each entry's message ends in the CommitLog, by log index
    for batch in batches:
        records, keys = [], []
        for topic, queue_id, sysflag, tags, uniq in batch:
            uniq = uniq and f"{uniq}{len(keyed)}.{len(records)}"
            properties = {
                name: value for name, value in (("TAGS", tags), ("UNIQ_KEY", uniq)) if value
            }
            msg = codec.MessageExt(
                topic=topic,
                body=b"m" * len(records),
                queue_id=queue_id,
                sysflag=sysflag,
                properties=properties,
            )
            records.append(codec.encode(msg))
            keys.append((topic, queue_id, sysflag, tags, uniq))
        placed = []
        store.commitlog.put_nowait(
            records, lambda _code, results, into=placed: into.extend(results)
        )
        for record, (topic, queue_id, sysflag, tags, uniq), (physical, _queue_offset) in zip(
            records, keys, placed, strict=True
        ):
            ends.append(physical + len(record))
            if uniq:  # indexed, half messages too
                keyed[topic, uniq] = [physical]
            if sysflag == PREPARED:
                continue  # a half message has no ConsumeQueue entry
            code = codec.tags_code(tags) if tags else 0
            if topic == SCHEDULE_TOPIC:  # a delayed message's entry holds its due time
                level = min(queue_id, len(store.delay_levels_ms) - 1)
                code = codec.read_store_timestamp(record) + store.delay_levels_ms[level]
            expected.setdefault((topic, queue_id), bytearray()).extend(
                ENTRY.pack(physical, len(record), code)
            )
            messages += 1
            message_bytes += len(record)
        for limit in limits:  # dispatch steps of several sizes, some of it per batch
            store.dispatch_some(limit)
    while store.dispatch_some(limits[0]):
        pass
    assert store.dispatched_index == store.dispatch_target
    _check_dispatched(store, expected, keyed, messages, message_bytes)
    # A replay from an earlier position (after a restart) adds only what a queue lost:
    # the first queue cut back to the messages that end `cut` entries after its start
    store.dispatched_index = max(-1, store.dispatched_index - replay)
    if expected and store.dispatched_index >= 0:
        queue = store.queues.queues[min(expected)]
        before = bytes(queue.entry_bytes(queue.min_offset, 1 << 20))
        queue.truncate_physical(ends[min(len(ends) - 1, store.dispatched_index + cut)])
        cut = before[len(queue.entry_bytes(queue.min_offset, 1 << 20)) :]
        messages += len(cut) // ENTRY.size
        message_bytes += sum(size for _p, size, _t in ENTRY.iter_unpack(cut))
    while store.dispatch_some(limits[-1]):
        pass
    _check_dispatched(store, expected, keyed, messages, message_bytes)
    store.checkpoint_work()()  # the entries to the files, three a file
    for key, queue in store.queues.queues.items():
        again = ConsumeQueue(queue.directory, *key, file_entries=3)
        assert again.entry_bytes(again.min_offset, 1 << 20) == expected[key]
        assert all(f.stat().st_size <= 3 * ENTRY.size for f in queue.directory.iterdir())


def _check_dispatched(store: MessageStore, expected, keyed, messages, message_bytes) -> None:
    queues = {
        key: bytes(queue.entry_bytes(queue.min_offset, 1 << 20))
        for key, queue in store.queues.queues.items()
    }
    assert queues == expected
    assert (store.dispatched_messages, store.dispatched_message_bytes) == (
        messages,
        message_bytes,
    )
    if store.index is not None:
        found = {key: store.index.query(*key, 10, 0, 1 << 62)[0] for key in keyed}
        assert found == keyed
