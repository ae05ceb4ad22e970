"""The term/vote file: DLedger's `currterm` text, replaced atomically."""

from __future__ import annotations

import os

import pytest
from raftmq.dledger.store.meta import MemoryTermVote, TermVoteFile, parse_properties

from raftmq.disk.filesystem import atomic_write


def test_a_node_that_never_saved_starts_at_term_zero_without_a_vote(tmp_path):
    assert TermVoteFile(tmp_path / "currterm").load() == (0, None)


def test_save_then_load_round_trips(tmp_path):
    file = TermVoteFile(tmp_path / "currterm")
    file.save(5, "n1")
    assert file.load() == (5, "n1")
    assert TermVoteFile(tmp_path / "currterm").load() == (5, "n1")  # a fresh reader
    file.save(7, "n2")
    assert file.load() == (7, "n2")


def test_the_file_is_dledgers_properties_text(tmp_path):
    path = tmp_path / "currterm"
    TermVoteFile(path).save(5, "n1")
    assert sorted(path.read_text().splitlines()) == ["currTerm=5", "voteLeader=n1"]


def test_no_vote_is_saved_as_an_empty_value(tmp_path):
    path = tmp_path / "currterm"
    file = TermVoteFile(path)
    file.save(3, "n0")
    file.save(4, None)
    assert "voteLeader=\n" in path.read_text()
    assert file.load() == (4, None)


def test_a_file_written_by_javas_properties_store_loads(tmp_path):
    path = tmp_path / "currterm"
    path.write_text("#Tue Sep 10 10:00:00 CST 2024\nvoteLeader=n2\ncurrTerm=12\n")
    assert TermVoteFile(path).load() == (12, "n2")


def test_a_leftover_tmp_from_a_crashed_save_is_ignored_and_replaced(tmp_path):
    path = tmp_path / "currterm"
    file = TermVoteFile(path)
    file.save(5, "n1")
    (tmp_path / "currterm.tmp").write_text("currTerm=9\nvoteLeader=n3\ngarbage")
    assert file.load() == (5, "n1")
    file.save(6, "n3")
    assert file.load() == (6, "n3")
    assert not (tmp_path / "currterm.tmp").exists()


def test_save_leaves_no_partial_file_behind(tmp_path):
    path = tmp_path / "f"
    atomic_write(path, b"one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["f"]


def test_a_damaged_term_is_an_error_not_term_zero(tmp_path):
    path = tmp_path / "currterm"
    path.write_text("currTerm=five\nvoteLeader=\n")
    with pytest.raises(ValueError, match="currTerm"):
        TermVoteFile(path).load()


def test_bad_values_are_refused(tmp_path):
    file = TermVoteFile(tmp_path / "currterm")
    with pytest.raises(ValueError):
        file.save(-1, None)
    with pytest.raises(ValueError):
        file.save(1, "n1\ncurrTerm=99")
    assert file.load() == (0, None)


def test_ids_with_separators_survive_escaping(tmp_path):
    file = TermVoteFile(tmp_path / "currterm")
    file.save(2, "n=1:a#b")
    assert file.load() == (2, "n=1:a#b")
    assert parse_properties("a\\=b = c\\:d\n  ! comment\nempty") == {"a=b": "c:d", "empty": ""}


def test_memory_term_vote_has_the_same_interface():
    store = MemoryTermVote()
    assert store.load() == (0, None)
    store.save(3, "n1")
    assert store.load() == (3, "n1")
    store.save(4, None)
    assert (store.term, store.vote) == (4, None)
