"""An upgrade in place from a classic store to DLedger, in one process: the divide,
reads on both sides of it, queue offsets continuing, old files expiring, and the
refusal of a leader whose log continues other old files."""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import pytest
import trio
from raftmq.broker.store.classic_commitlog import ClassicCommitLog, PutPolicy
from raftmq.broker.store.classic_log import BLANK_MAGIC_CODE, ClassicLog
from raftmq.broker.store.commitlog import BODY_OFFSET
from raftmq.broker.store.messagestore import GetStatus, MessageStore
from raftmq.broker.store.upgrade import UpgradedCommitLog, open_old_log
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store.base import InconsistentAppend
from raftmq.dledger.store.entry import CorruptEntry
from raftmq.dledger.store.file import FOREIGN_STRIKES, FileLogStore, ForeignLog

from raftmq.disk.segments import segment_path
from raftmq.protocol import message as codec
from tests.helpers import OneReplicaLog

FILE_BYTES = 1024
INDEX_BYTES = 32 * 64


def record(queue_id: int, n: int) -> bytes:
    body = f"message {n}".encode()
    return codec.encode(
        codec.MessageExt(topic="T", queue_id=queue_id, body=body, store_timestamp=1)
    )


def message_store(log, root: Path, commitlog) -> MessageStore:
    return MessageStore(log, root, {}, [1000], commitlog=commitlog)


async def write_classic(root: Path, dispatched: int, more: int) -> list[tuple[int, bytes]]:
    """A classic broker's store: `dispatched` messages in its ConsumeQueues (then a
    checkpoint), `more` after them written but not dispatched, as after a crash.
    Returns (physical offset, record as stored) of each, in order."""
    log = ClassicLog(root / "commitlog", FILE_BYTES, root / "abort")
    cl = ClassicCommitLog(log, PutPolicy(False, 5.0, 1.0))
    store = message_store(log, root, cl)
    written = []
    for n in range(dispatched + more):
        [(phys, _queue_offset)] = await cl.put([record(n % 2, n)])
        written.append(phys)
        if n == dispatched - 1:
            store.dispatch_some(10_000)
            store.checkpoint_work()()
    store.index.close()
    stored = [(phys, cl.read_message(phys)) for phys in written]
    log.close()
    return stored


def upgrade(root: Path) -> ClassicLog | None:
    return open_old_log(
        root / "commitlog",
        root / "abort",
        FILE_BYTES,
        root / "dledger-n0",
        lambda log, commitlog: message_store(log, root, commitlog).drain(),
    )


def dledger_store(root: Path) -> FileLogStore:
    return FileLogStore(root / "dledger-n0", FILE_BYTES, INDEX_BYTES)


async def test_the_divide_mixed_reads_and_continuing_offsets(tmp_path, autojump_clock):
    old_messages = await write_classic(tmp_path, dispatched=20, more=5)
    last_phys, last_record = old_messages[-1]
    old_end = last_phys + len(last_record)
    assert old_end % FILE_BYTES, "the test wants an end inside a file"
    divide = old_end - old_end % FILE_BYTES + FILE_BYTES

    old = upgrade(tmp_path)
    assert old is not None and old.write_pos == divide
    # the rest of the last old file is one BLANK record, as RocketMQ seals it
    assert old.read_at(old_end, 8) == struct.pack(">ii", divide - old_end, BLANK_MAGIC_CODE)
    dstore = dledger_store(tmp_path)
    assert (dstore.begin_index, dstore.end_pos) == (0, divide)

    log = OneReplicaLog(dstore)
    commitlog = UpgradedCommitLog(log, old)
    store = message_store(log, tmp_path, commitlog)
    # every old message, the undispatched five included, is in its queue
    assert store.max_offset("T", 0) + store.max_offset("T", 1) == 25
    for phys, stored in old_messages:
        assert store.message_at(phys) == stored
    store.take_over_offsets()
    placed = await commitlog.put([record(0, 25), record(1, 26), record(0, 27)])
    # new entries start at the divide: entry 0 at `divide`, its message 48 bytes on
    assert placed[0] == (divide + BODY_OFFSET, 13)
    assert [queue_offset for _p, queue_offset in placed] == [13, 12, 14]
    assert segment_path(tmp_path / "dledger-n0" / "data", divide).exists()
    store.dispatch_some(100)
    got = store.get_message("T", 0, 0, 32)
    assert got.status == GetStatus.FOUND and got.max_offset == 15
    bodies = [codec.decode(r)[0].body for r in got.records]
    assert bodies == [f"message {n}".encode() for n in [*range(0, 25, 2), 25, 27]]
    assert codec.decode(store.message_at(placed[1][0]))[0].queue_offset == 12

    # retention: once the old files are old enough they go, the queues follow
    past = time.time() - 3600
    for path in (tmp_path / "commitlog").iterdir():
        os.utime(path, (past, past))
    with trio.fail_after(60):  # the broker's expiry loop, on trio's clock: ends with them
        await commitlog.expire_old_files(60, 10.0)
    assert not list((tmp_path / "commitlog").iterdir())
    got = store.get_message("T", 0, 0, 32)
    assert (got.status, got.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, 13)
    assert store.get_message("T", 0, 13, 32).status == GetStatus.FOUND


async def test_a_restart_keeps_the_divide_and_seals_nothing_again(tmp_path):
    await write_classic(tmp_path, dispatched=7, more=0)
    old = upgrade(tmp_path)
    divide = old.write_pos
    old.close()
    dstore = dledger_store(tmp_path)
    commitlog = UpgradedCommitLog(
        OneReplicaLog(dstore), ClassicLog(tmp_path / "commitlog", FILE_BYTES, tmp_path / "abort")
    )
    [(phys, _q)] = await commitlog.put([record(0, 7)])
    dstore.close()
    commitlog.old_log.close()
    again = upgrade(tmp_path)
    assert again.write_pos == divide
    reopened = dledger_store(tmp_path)
    assert reopened.pos_at(0) + BODY_OFFSET == phys == divide + BODY_OFFSET


async def test_a_store_without_classic_files_is_not_upgraded(tmp_path):
    assert upgrade(tmp_path) is None
    assert not (tmp_path / "dledger-n0").exists()


@pytest.mark.parametrize("case", ["another last message", "one file less", "no old files"])
async def test_a_follower_refuses_a_leader_over_other_old_files(tmp_path, case):
    stored = await write_classic(tmp_path / "source", dispatched=12, more=0)
    shutil.copytree(tmp_path / "source", tmp_path / "leader")
    shutil.copytree(tmp_path / "source", tmp_path / "twin")
    upgrade(tmp_path / "leader").close()
    leader = dledger_store(tmp_path / "leader")
    leader.append_leader(1, [(EntryType.NOOP, b"")])
    blob, _count = leader.read_encoded(0, 1 << 20)

    follower = tmp_path / "follower"
    if case != "no old files":
        shutil.copytree(tmp_path / "source", follower)
        files = sorted((follower / "commitlog").iterdir())
        if case == "one file less":
            files[-1].unlink()
        else:  # the last message's last byte
            last_phys, last_record = stored[-1]
            with open(files[-1], "r+b") as f:
                f.seek(last_phys % FILE_BYTES + len(last_record) - 1)
                f.write(b"?")
        upgrade(follower).close()
    store = dledger_store(follower)
    for _refusal in range(FOREIGN_STRIKES - 1):  # one damaged or forged push stops nothing
        with pytest.raises((InconsistentAppend, CorruptEntry)):
            store.append_encoded(blob)
    with pytest.raises(ForeignLog, match="old commitlog files differ from the leader's"):
        store.append_encoded(blob)
    assert store.empty

    # the same old files: the same beginning and seed, the entry is taken
    upgrade(tmp_path / "twin").close()
    assert dledger_store(tmp_path / "twin").append_encoded(blob) == 1
