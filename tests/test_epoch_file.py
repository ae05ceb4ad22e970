"""The epoch file (RocketMQ 5's epochFileCheckpoint) and the truncation rule built on
it: Java's bytes both ways, the `.bak` fallback, the list's rules, RocketMQ's own
test vectors (EpochFileCacheTest) and, for random failover histories, the cut
point against the real common prefix of two replicas' logs."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from raftmq.broker.store.epoch_file import (
    NO_CONSISTENT_POINT,
    EpochEntry,
    EpochFile,
    EpochFileCorrupt,
    EpochOrderError,
    Unreplicable,
    decode,
    encode,
    find_consistent_point,
    truncation_point,
)
from raftmq.dledger.sim.disk import SimFileSystem

E = EpochEntry
# CheckpointFile's javadoc example, the CRC as java.util.zip.CRC32 & 0x7FFFFFFF gives it
JAVA_FILE = b"2\n773307083\n7-7000\n8-8000\n"


def test_java_example_is_written_byte_for_byte():
    assert zlib.crc32(b"7-7000\n8-8000\n") & 0x7FFFFFFF == 773307083
    assert encode([E(7, 7000), E(8, 8000)]) == JAVA_FILE


def test_reads_what_java_writes(tmp_path):
    (tmp_path / "epochFileCheckpoint").write_bytes(JAVA_FILE)
    assert EpochFile(tmp_path / "epochFileCheckpoint").entries == [E(7, 7000), E(8, 8000)]


def test_a_crc_of_zero_is_not_checked():
    assert decode("1\n0\n3-4096\n") == [E(3, 4096)]


@pytest.mark.parametrize(
    "text, why",
    [
        ("2\n773307083\n7-7000\n", "expected 2 entries, found 1"),
        ("2\n773307084\n7-7000\n8-8000\n", "CRC 773307083, the file says 773307084"),
        ("2\n\n7-7000\n8-8000\n", "not a number"),
        ("2\n", "no count and CRC"),
    ],
)
def test_a_file_that_does_not_add_up_is_refused(text, why):
    with pytest.raises(EpochFileCorrupt, match=why):
        decode(text)


@pytest.mark.parametrize(
    "main",
    [
        b"2\n773307084\n7-7000\n8-8000\n",  # a bit flipped in the CRC
        b"3\n773307083\n7-7000\n8-8000\n",  # the count
        b"0\n0\n",  # no entries: CheckpointFile.read tries the backup
        b"\xff\xfe",
    ],
)
def test_the_backup_is_read_when_the_file_is_unusable(tmp_path, main):
    path = tmp_path / "epochFileCheckpoint"
    path.write_bytes(main)
    path.with_name(path.name + ".bak").write_bytes(JAVA_FILE)
    assert EpochFile(path).entries == [E(7, 7000), E(8, 8000)]


def test_each_write_keeps_the_previous_content_as_java_does(tmp_path):
    path = tmp_path / "epochFileCheckpoint"
    epochs = EpochFile(path)
    epochs.append(E(7, 7000))
    epochs.append(E(8, 8000))
    assert path.read_bytes() == JAVA_FILE
    assert path.with_name(path.name + ".bak").read_bytes() == encode([E(7, 7000)])
    assert not list(tmp_path.glob("*.tmp"))  # replaced by rename, nothing left over
    assert EpochFile(path).entries == [E(7, 7000), E(8, 8000)]


def test_appends_raise_the_epoch_and_the_start_offset(tmp_path):
    epochs = EpochFile(tmp_path / "epochFileCheckpoint")
    epochs.append(E(2, 100))
    for bad in (E(2, 200), E(1, 200), E(3, 100), E(3, 50)):
        with pytest.raises(EpochOrderError):
            epochs.append(bad)
    assert EpochFile(epochs.path).entries == [E(2, 100)]


def test_truncation_drops_the_epochs_from_a_point_on(tmp_path):
    """EpochFileCacheTest.testTruncate, and a cut at an epoch's very start."""
    epochs = EpochFile(tmp_path / "epochFileCheckpoint")
    for entry in (E(1, 100), E(2, 300), E(3, 500)):
        epochs.append(entry)
    epochs.truncate_from(300)
    assert epochs.entries == [E(1, 100)]
    epochs.truncate_from(150)
    assert EpochFile(epochs.path).entries == [E(1, 100)]


def test_an_emptied_file_stays_empty(tmp_path):
    """RocketMQ does not write an empty list, so every entry comes back at the next start."""
    epochs = EpochFile(tmp_path / "epochFileCheckpoint")
    epochs.append(E(1, 100))
    epochs.append(E(2, 300))
    epochs.truncate_from(0)
    assert EpochFile(epochs.path).entries == []


def test_retention_drops_the_epochs_that_end_before_the_new_first_byte(tmp_path):
    epochs = EpochFile(tmp_path / "epochFileCheckpoint")
    for entry in (E(1, 0), E(2, 300), E(3, 500)):
        epochs.append(entry)
    epochs.retain_from(299)
    assert epochs.entries == [E(1, 0), E(2, 300), E(3, 500)]
    epochs.retain_from(300)
    assert epochs.entries == [E(2, 300), E(3, 500)]
    epochs.retain_from(4096)  # the last epoch holds the log's end: it stays
    assert EpochFile(epochs.path).entries == [E(3, 500)]


def test_a_new_master_epoch_replaces_later_and_empty_ones(tmp_path):
    epochs = EpochFile(tmp_path / "epochFileCheckpoint")
    epochs.begin_epoch(1, 0)
    epochs.begin_epoch(2, 300)
    epochs.begin_epoch(4, 300)  # epoch 2 holds no byte: 4 takes its place
    assert epochs.entries == [E(1, 0), E(4, 300)]
    with pytest.raises(EpochOrderError, match="older"):
        epochs.begin_epoch(3, 400)
    epochs.begin_epoch(4, 500)  # re-elected in the same epoch: the entry moves
    assert epochs.entries == [E(1, 0), E(4, 500)]
    assert epochs.entry_at(299, 600) == E(1, 0)
    assert epochs.entry_at(500, 600) == E(4, 500)
    assert epochs.entry_at(600, 600) is None


# ---------------------------------------------------------------------- the rule
SETUP = [E(1, 100), E(2, 300), E(3, 500)]  # EpochFileCacheTest.setup
BIG = 10_000  # the tests' last epochs end at Long.MAX_VALUE unless set


@pytest.mark.parametrize(
    "local, local_max, master, master_max, point",
    [
        (SETUP, BIG, [E(1, 100), E(2, 300), E(3, 450)], BIG, 450),  # Sample1
        (SETUP, 700, SETUP, 600, 600),  # Sample2
        (SETUP, BIG, [E(1, 200), E(2, 500)], BIG, NO_CONSISTENT_POINT),  # Sample3
        ([*SETUP, E(4, 800)], BIG, SETUP, 700, 700),  # Sample4
    ],
)
def test_rocketmq_vectors(local, local_max, master, master_max, point):
    assert find_consistent_point(local, local_max, master, master_max) == point


def test_no_epoch_in_common_is_an_error_that_says_what_to_do():
    with pytest.raises(Unreplicable, match=r"no epoch in common.*wipe this store"):
        truncation_point(SETUP, BIG, [E(1, 200), E(2, 500)], BIG)


def test_histories_that_differ_from_their_first_byte_share_nothing():
    """A master elected without any of this store's bytes (RocketMQ: -1, retried
    forever); a last epoch holding no byte does not count."""
    assert truncation_point([E(1, 0)], 1, [E(2, 0)], 0) == 0
    assert truncation_point([E(1, 0), E(3, 100)], 100, [E(1, 0), E(2, 50)], 80) == 50


def test_a_slave_without_epochs_keeps_only_a_log_the_master_vouches_for():
    """RocketMQ copies on after whatever such a slave holds."""
    assert truncation_point([], 0, SETUP, BIG) == 0
    assert truncation_point([], 100, SETUP, BIG) == 100  # in step when controller mode began
    with pytest.raises(Unreplicable, match="no epochs but 4096 bytes"):
        truncation_point([], 4096, SETUP, BIG)
    with pytest.raises(Unreplicable):
        truncation_point([], 50, SETUP, BIG)


def test_a_history_ending_before_its_last_epoch_is_refused():
    with pytest.raises(EpochOrderError):
        truncation_point(SETUP, BIG, SETUP, 400)


class Replica:
    """A replica of the model: its log as one epoch label per offset (the bytes of an
    offset are equal on two replicas exactly when their labels are: one master writes
    an epoch, the others copy it) and its epoch file."""

    def __init__(self, fs: SimFileSystem, name: str) -> None:
        self.log: list[int] = []
        self.epochs = EpochFile(Path(name) / "epochFileCheckpoint", fs)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


STEP = st.one_of(
    st.tuples(st.just("elect"), st.integers(0, 2)),
    st.tuples(st.just("write"), st.integers(1, 5)),
    st.tuples(st.just("copy"), st.integers(0, 2), st.integers(0, 8)),
)


@given(st.lists(STEP, max_size=40))
def test_the_cut_is_the_end_of_the_common_prefix(steps):
    """Random failovers among three replicas, each elected with whatever it holds:
    a slave about to copy cuts its log exactly at the end of what it shares with
    the master, which is never beyond either log, and is then a prefix of it."""
    fs = SimFileSystem()
    replicas = [Replica(fs, f"r{i}") for i in range(3)]
    master, epoch = None, 0
    for step in steps:
        if step[0] == "elect":
            epoch += 1
            master = replicas[step[1]]
            master.epochs.begin_epoch(epoch, len(master.log))
        elif step[0] == "write" and master is not None:
            master.log += [epoch] * step[1]
        elif step[0] == "copy" and master is not None and replicas[step[1]] is not master:
            slave = replicas[step[1]]
            point = truncation_point(
                slave.epochs.entries, len(slave.log), master.epochs.entries, len(master.log)
            )
            assert point == common_prefix(slave.log, master.log)
            del slave.log[point:]
            slave.epochs.truncate_from(point)
            for _ in range(step[2]):
                offset = len(slave.log)
                if offset == len(master.log):
                    break
                entry = master.epochs.entry_at(offset, len(master.log))
                if slave.epochs.last != entry:
                    slave.epochs.append(entry)
                slave.log.append(master.log[offset])
            assert slave.log == master.log[: len(slave.log)]
