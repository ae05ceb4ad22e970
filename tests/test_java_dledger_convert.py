"""`store.java_dledger.convert`: a raftmq DLedger log rewritten for RocketMQ's DLedger
0.3.1.2, on a log written by raftmq's own file store (tests/test_java_stores.py has
Apache RocketMQ's Java brokers serve a converted group)."""

from __future__ import annotations

import fcntl
import time

import pytest
from raftmq.broker import cli as broker_cli
from raftmq.broker.store.java_dledger import (
    JAVA_INDEX_FILE_BYTES,
    PAD_PROPERTY,
    ConvertError,
    begin_index,
    convert,
)
from raftmq.dledger.codes import EntryType
from raftmq.dledger.core.membership import MEMBERS_PREFIX
from raftmq.dledger.store.entry import HEADER, HEADER_SIZE, INDEX_ENTRY, places
from raftmq.dledger.store.file import FileLogStore
from raftmq.dledger.store.meta import Checkpoint

from raftmq.protocol.message import MessageExt, decode, encode
from raftmq.protocol.msgid import create_message_id

SEGMENT = 4096  # small data files, so that one begins with a NOOP
HOST = ("127.0.0.1", 10911)


def record(n: int, pos: int, spaces: int = 0) -> bytes:
    """Message n as the broker stores it at entry position `pos` (its body the number,
    then `spaces`)."""
    properties = {"KEYS": f"key-{n}"}
    body = b"%d" % n + b" " * spaces
    msg = MessageExt(topic="T", body=body, properties=properties, queue_offset=n)
    msg.store_host = HOST
    msg.physical_offset = pos + HEADER_SIZE
    return encode(msg)


def write_log(path, plan: list[tuple[int, str]]) -> list[tuple[str, int, int, int]]:
    """Append `plan` ((term, "noop" | "members" | "message" | "fill")) to a raftmq store
    at `path`, an append each ("fill": messages until a NOOP would begin the next
    data file); returns (kind, index, pos, n) per entry
    (n: the message's number, else -1)."""
    store = FileLogStore(path, segment_size=SEGMENT, index_segment_size=32 * 64)
    written, n = [], 0

    def append(term: int, kind: str, spaces: int = 0) -> None:
        nonlocal n
        if kind == "noop":
            item = (EntryType.NOOP, b"")
        elif kind == "members":
            item = (EntryType.NOOP, MEMBERS_PREFIX + b"n0-127.0.0.1:1")
        else:
            size = HEADER_SIZE + len(record(n, 0, spaces))
            at = places(store.end_pos, [size], SEGMENT)[0]
            item = (EntryType.NORMAL, record(n, at, spaces))
        [(index, pos)] = store.append_leader(term, [item])
        written.append((kind, index, pos, n if kind == "message" else -1))
        n += kind == "message"

    for term, kind in plan:
        if kind != "fill":
            append(term, kind)
            continue
        while (left := SEGMENT - store.end_pos % SEGMENT) > 500:
            append(term, "message")
        # leave fewer bytes than a NOOP and DLedger's end-of-file filler after it need
        append(term, "message", left - HEADER_SIZE - len(record(n, 0)) - 24)
        assert places(store.end_pos, [HEADER_SIZE], SEGMENT)[0] % SEGMENT == 0
    store.sync_plan().run()
    store.close()
    return written


def read_entries(path) -> list[tuple[int, int, int, int, bytes]]:
    """(magic, index, term, pos, body) of every entry of the converted data files."""
    entries = []
    for data_file in sorted((path / "data").iterdir(), key=lambda p: int(p.name)):
        blob, offset = data_file.read_bytes(), 0
        while offset + HEADER_SIZE <= len(blob):
            magic, size, index, term, pos, _ch, chain, crc, body_len = HEADER.unpack_from(
                blob, offset
            )
            if magic in (0, -1):
                break
            assert (chain, crc) == (0, 0), "both CRCs zero, as DLedger writes them"
            assert size == HEADER_SIZE + body_len
            entries.append((magic, index, term, pos, blob[offset + HEADER_SIZE : offset + size]))
            offset += size
    return entries


def test_messages_keep_their_places_and_the_rest_becomes_padding(tmp_path):
    base = tmp_path / "dledger-n0"
    plan = [(1, "noop"), (1, "message"), (1, "message"), (2, "noop"), (2, "members")]
    plan += [(2, "message")] * 12 + [(3, "noop"), (3, "message"), (4, "noop")]
    written = write_log(base, plan)
    Checkpoint(base / "checkpoint").save(written[-2][1])  # all but the last NOOP
    report = convert(base, 0)

    entries = read_entries(base)
    assert {magic for magic, *_ in entries} == {int(EntryType.NORMAL)}
    assert [index for _m, index, *_ in entries] == list(range(len(entries)))
    messages = [w for w in written if w[0] == "message"]
    assert report.messages == len(entries) == len(messages) == 15
    assert report.absorbed == len(written) - len(messages)
    by_n = {}
    for _magic, _index, _term, pos, body in entries:
        msg, size = decode(body, check_crc=True)
        assert size == len(body) and msg.physical_offset == pos + HEADER_SIZE
        by_n[int(msg.body)] = (pos, msg)
    # every message where it was but the log's first, which moved back over the NOOP
    assert [by_n[n][0] for _k, _i, _p, n in messages[1:]] == [p for _k, _i, p, _n in messages[1:]]
    assert by_n[0][0] == 0
    first = messages[0][2]
    assert [(m.queue, m.queue_offset) for m in report.moved] == [(("T", 0), 0)]
    assert report.moved[0].old_msg_id == create_message_id(HOST, first + HEADER_SIZE)
    assert report.moved[0].new_msg_id == create_message_id(HOST, HEADER_SIZE)
    # the messages before the second leader's NOOP and members entry, and before the
    # last two NOOPs, carry their bytes as a padding property; the rest are as sent
    padded = {n for n, (_pos, msg) in by_n.items() if PAD_PROPERTY in msg.properties}
    assert padded == {0, 1, 13, 14}
    for n, (_pos, msg) in by_n.items():
        assert msg.properties["KEYS"] == f"key-{n}" and msg.queue_offset == n
    # the index: a 32-byte row per entry, in DLedger 0.3.1.2's file size
    [index_file] = (base / "index").iterdir()
    assert index_file.stat().st_size == JAVA_INDEX_FILE_BYTES
    rows = index_file.read_bytes()[: 32 * len(entries)]
    for (magic, index, term, pos, body), k in zip(entries, range(len(entries)), strict=True):
        assert INDEX_ENTRY.unpack_from(rows, 32 * k) == (
            magic,
            pos,
            HEADER_SIZE + len(body),
            index,
            term,
        )
    # the committed index follows: the last NOOP was not committed, the message before it was
    assert report.committed_index == Checkpoint(base / "checkpoint").load() == 14
    # raftmq opens it too (entries with zero CRCs are read unchecked)
    store = FileLogStore(base, segment_size=SEGMENT, index_segment_size=JAVA_INDEX_FILE_BYTES)
    assert store.end_index == 14 and store.get(14).body == entries[-1][4]
    store.close()


def test_a_data_file_that_begins_with_a_noop_moves_its_first_message_back(tmp_path):
    base = tmp_path / "dledger-n0"
    plan = [(1, "noop"), (1, "fill"), (2, "noop"), (2, "message"), (3, "fill")]
    written = write_log(base, [*plan, (4, "noop"), (4, "message")])
    noops = [pos for kind, _i, pos, _n in written if kind == "noop"]
    assert noops == [0, SEGMENT, 2 * SEGMENT]  # the plan did what it says
    report = convert(base, 0)
    entries = read_entries(base)
    # the message after each file's leading NOOP moved onto it
    assert {0, SEGMENT, 2 * SEGMENT} <= {pos for *_x, pos, _body in entries}
    moved_to = sorted(int(m.new_msg_id[-16:], 16) - HEADER_SIZE for m in report.moved)
    assert moved_to == [0, SEGMENT, 2 * SEGMENT]
    assert report.messages == len(entries) == sum(kind == "message" for kind, *_ in written)
    for _magic, _index, _term, pos, body in entries:
        assert decode(body)[0].physical_offset == pos + HEADER_SIZE


def data_bytes(base) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (base / "data").iterdir()}


def test_a_torn_entry_is_refused_before_anything_is_written(tmp_path):
    """raftmq's recovery would cut a torn tail; zeroing its CRCs would make it valid."""
    base = tmp_path / "dledger-n0"
    written = write_log(base, [(1, "noop"), (1, "message"), (1, "message"), (2, "noop")])
    [data] = (base / "data").iterdir()
    torn = bytearray(data.read_bytes())
    last_message = written[2][2]
    torn[last_message + HEADER_SIZE + 10 : last_message + HEADER_SIZE + 60] = bytes(50)
    data.write_bytes(torn)
    before = data_bytes(base)
    with pytest.raises(ConvertError, match=f"offset {last_message}: bodyCrc mismatch"):
        convert(base, 0)
    assert data_bytes(base) == before


def trimmed_copy(tmp_path, name: str, plan, segments: int):
    """A member's store holding `plan`, its first `segments` data files deleted by
    raftmq's retention; its beginning index."""
    base = tmp_path / name
    write_log(base, plan)
    store = FileLogStore(base, segment_size=SEGMENT, index_segment_size=32 * 64)
    Checkpoint(base / "checkpoint").save(store.end_index)  # retention deletes committed ones
    if segments:
        keep_from = store.first_index_from(segments * SEGMENT)
        assert store.delete_expired(keep_from, 0, now_s=time.time() + 60) == segments
    begin = store.begin_index
    store.close()
    return base, begin


TRIMMED_PLAN = [(1, "noop"), (1, "fill"), (2, "noop"), (2, "members"), (2, "fill")]
TRIMMED_PLAN += [(3, "noop"), (3, "message"), (3, "fill"), (4, "noop")] + [(4, "message")] * 5


def test_members_trimmed_at_different_places_number_alike_from_one_anchor(tmp_path):
    """Retention deleted one member's first data file and another's first two: given
    the same anchor (the larger beginning), the messages both hold get the same
    numbers, each log numbered without gaps, its index rows where DLedger looks."""
    one, begin_one = trimmed_copy(tmp_path, "dledger-n1", TRIMMED_PLAN, 1)
    two, begin_two = trimmed_copy(tmp_path, "dledger-n2", TRIMMED_PLAN, 2)
    whole, _ = trimmed_copy(tmp_path, "dledger-n0", TRIMMED_PLAN, 0)
    assert 0 < begin_one < begin_two
    assert [begin_index(b) for b in (whole, one, two)] == [0, begin_one, begin_two]
    with pytest.raises(ConvertError, match="below this log's beginning"):
        convert(two, begin_one)
    with pytest.raises(ConvertError, match="does not reach the anchor index 10000"):
        convert(two, 10_000)
    numbers = {}
    for base in (whole, one, two):
        report = convert(base, begin_two)
        entries = read_entries(base)
        assert [e[1] for e in entries] == list(
            range(report.first_index, report.first_index + len(entries))
        )
        for _magic, index, term, pos, body in entries:
            assert numbers.setdefault(pos, (index, term, body)) == (index, term, body)
        # DLedger finds each entry's row at index * 32 in the file that covers it
        for _magic, index, term, pos, body in entries:
            offset = index * INDEX_ENTRY.size
            start = offset - offset % JAVA_INDEX_FILE_BYTES
            with open(base / "index" / f"{start:020d}", "rb") as f:
                f.seek(offset - start)
                row = INDEX_ENTRY.unpack(f.read(INDEX_ENTRY.size))
            assert row == (int(EntryType.NORMAL), pos, HEADER_SIZE + len(body), index, term)
        # raftmq opens it too, beginning where the conversion says
        store = FileLogStore(base, segment_size=SEGMENT, index_segment_size=JAVA_INDEX_FILE_BYTES)
        assert store.begin_index == report.first_index
        assert store.get(store.end_index).body == entries[-1][4]
        store.close()
    # the first message at or after the anchor kept its number
    first_held = min(pos for pos in numbers if pos >= 2 * SEGMENT)
    assert numbers[first_held][0] == begin_two


def test_a_log_that_continues_a_classic_commitlog_is_refused(tmp_path):
    base = tmp_path / "dledger-n0"
    write_log(base, [(1, "noop"), (1, "message")])
    (base / "begin").write_text("beginIndex=0\nbeginPos=4096\nbeforeTerm=-1\n")
    with pytest.raises(ConvertError, match="continues a classic CommitLog"):
        convert(base, 0)


def test_a_store_with_no_log_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ConvertError, match="no data files"):
        convert(tmp_path / "dledger-n0", 0)


def conf(tmp_path, **keys: str):
    path = tmp_path / "broker.conf"
    keys = {"brokerName": "b", "storePathRootDir": str(tmp_path / "store"), **keys}
    path.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    return str(path)


DLEDGER = {
    "enableDLegerCommitLog": "true",
    "dLegerGroup": "b",
    "dLegerPeers": "n0-127.0.0.1:40911",
    "dLegerSelfId": "n0",
}


def test_the_command_converts_a_members_store_and_removes_its_consume_queues(tmp_path, capsys):
    written = write_log(tmp_path / "store" / "dledger-n0", [(1, "noop"), (1, "message")])
    for derived in ("consumequeue/T/0", "index"):
        (tmp_path / "store" / derived).mkdir(parents=True)
    (tmp_path / "store" / "dispatch_checkpoint").write_text("0")
    command = ["-c", conf(tmp_path, **DLEDGER), "--convertForJava", "--convertAnchorIndex", "0"]
    assert broker_cli.main(command) == 0
    out = capsys.readouterr().out.splitlines()
    old = create_message_id(HOST, written[1][2] + HEADER_SIZE)
    new = create_message_id(HOST, HEADER_SIZE)
    assert out == [
        f"moved: T queue 0 offset 0: msgId {old} is now {new}",
        "converted: 1 messages from index 0, 1 entries that were not messages absorbed, 1 msgIds"
        " changed, committed index -1; consumequeue and index removed",
    ]
    for derived in ("consumequeue", "index", "dispatch_checkpoint"):
        assert not (tmp_path / "store" / derived).exists()


@pytest.mark.parametrize(
    ("keys", "extra", "status", "says"),
    [
        ({}, ["--convertAnchorIndex", "0"], 2, "enableDLegerCommitLog is not true"),
        (DLEDGER, [], 2, "needs --convertAnchorIndex N"),
        (DLEDGER, ["--convertAnchorIndex", "0"], 4, "no data files"),
    ],
)
def test_the_command_refuses_in_one_line_with_its_status(
    tmp_path, capsys, keys, extra, status, says
):
    command = ["-c", conf(tmp_path, **keys), "--convertForJava", *extra]
    assert broker_cli.main(command) == status
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("mqbroker: --convertForJava") and says in line


def test_the_command_refuses_a_store_a_broker_holds(tmp_path, capsys):
    (tmp_path / "store").mkdir()
    with open(tmp_path / "store" / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # another open file description of the lock, as another process would have
        command = ["-c", conf(tmp_path, **DLEDGER), "--convertForJava", "--convertAnchorIndex", "0"]
        assert broker_cli.main(command) == 3
    assert "in use by another process" in capsys.readouterr().err


def test_the_command_names_a_trimmed_logs_beginning_and_converts_it_given_an_anchor(
    tmp_path, capsys
):
    base, begin = trimmed_copy(tmp_path / "store", "dledger-n0", TRIMMED_PLAN, 1)
    before = data_bytes(base)
    command = ["-c", conf(tmp_path, **DLEDGER), "--convertForJava"]
    assert broker_cli.main(command) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(f"(this member's begins at {begin})")
    assert data_bytes(base) == before
    assert broker_cli.main([*command, "--convertAnchorIndex", str(begin)]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert f"messages from index {begin}," in summary


def test_a_trimmed_logs_committed_index_on_its_leading_noops_stays_below_its_first(tmp_path):
    """The first file held by the trimmed log begins with a NOOP and a member list; a
    checkpoint that ends on them commits the message before the log's first."""
    base, begin = trimmed_copy(tmp_path, "dledger-n0", TRIMMED_PLAN, 1)
    Checkpoint(base / "checkpoint").save(begin + 1)  # the NOOP and the member list
    report = convert(base, begin)
    assert report.first_index == begin
    assert report.committed_index == Checkpoint(base / "checkpoint").load() == begin - 1


def test_a_member_that_does_not_reach_the_anchor_is_refused(tmp_path):
    """Past what its checkpoint says is committed, its entries may not be the others'."""
    base, _begin = trimmed_copy(tmp_path, "dledger-n0", TRIMMED_PLAN, 0)
    Checkpoint(base / "checkpoint").save(10)
    before = data_bytes(base)
    with pytest.raises(ConvertError, match="committed to 10 by its checkpoint"):
        convert(base, 12)
    assert data_bytes(base) == before
    convert(base, 11)  # the entry after the last committed one: every member has those


def test_a_first_data_file_without_a_message_is_refused(tmp_path):
    """DLedger 0.3.1.2 reads a log's beginning from its first file's first entry."""
    base = tmp_path / "dledger-n0"
    write_log(base, [(1, "noop")] * 90 + [(2, "message")])
    assert len(list((base / "data").iterdir())) == 2  # the NOOPs fill the first file
    with pytest.raises(ConvertError, match="the log's first, holds no message"):
        convert(base, 0)


def test_an_anchor_without_the_conversion_is_a_usage_error(tmp_path, capsys):
    command = ["-c", conf(tmp_path, **DLEDGER), "--convertAnchorIndex", "7"]
    assert broker_cli.main(command) == 2
    assert capsys.readouterr().err.splitlines() == [
        "mqbroker: --convertAnchorIndex goes with --convertForJava"
    ]
