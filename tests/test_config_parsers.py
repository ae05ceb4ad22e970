"""The one reader of each config format: Java properties as `java.util.Properties.load`
reads them, host:port and DLedger's peers string, and the key table every config loader
uses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from raftmq.dledger.config import DLedgerConfig

from raftmq.config.address import parse_address, parse_address_list, parse_peers
from raftmq.config.keys import Key, KeyTable, integer
from raftmq.config.properties import format_properties, parse_properties


def test_properties_separators_comments_and_blanks_follow_java():
    text = (
        "# a comment\n"
        "  ! another\n"
        "\n"
        "a=1\n"
        "b : 2\n"
        "c 3\n"
        "  d\t=\t4  \n"  # trailing blanks belong to the value
        "e = = 5\n"  # only the first separator separates
        "f\n"  # a key alone has the empty value
        "g=x#not a comment\n"
    )
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "4  ",
        "e": "= 5",
        "f": "",
        "g": "x#not a comment",
    }


def test_an_xml_comment_block_is_skipped():
    """RocketMQ 5's namesrv-n0.conf (controller samples) opens with its licence so."""
    text = (
        "<!--\n  Licensed to the Apache Software Foundation (ASF)\n\n"
        "      http://www.apache.org/licenses/LICENSE-2.0\n  -->\n\n"
        "#Namesrv config\nlistenPort = 9876\n<!-- one line -->\nkey=<!--value\n"
    )
    assert parse_properties(text) == {"listenPort": "9876", "key": "<!--value"}


def test_properties_escapes_and_continuations_follow_java():
    text = (
        "path = /a\\\n"
        "       /b\\\n"
        "  /c\n"
        "a\\=b\\ c = d\\:e\n"
        "\\#k=\\u0041\\t\\q\n"
        "even=ends in a backslash\\\\\n"
        "next=line\r\n"
        "last=runs into the end\\"
    )
    assert parse_properties(text) == {
        "path": "/a/b/c",
        "a=b c": "d:e",
        "#k": "A\tq",
        "even": "ends in a backslash\\",
        "next": "line",
        "last": "runs into the end",
    }


def test_a_malformed_unicode_escape_names_the_source_and_line():
    with pytest.raises(ValueError, match=r"^broker\.conf:2: malformed \\uxxxx escape"):
        parse_properties("a=1\nb=\\u12x4\n", "broker.conf")


@given(st.dictionaries(st.from_regex(r"[a-zA-Z][a-zA-Z0-9]*", fullmatch=True), st.text()))
def test_written_properties_read_back(pairs):
    pairs = {k: v for k, v in pairs.items() if not any(c in v for c in "\r\n")}
    assert parse_properties(format_properties(pairs)) == pairs


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:9876", ("127.0.0.1", 9876)), ("h:0", ("h", 0)), ("[::1]:10911", ("::1", 10911))],
)
def test_addresses(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["localhost", ":9876", "h:", "h:port", "h:65536", "?", ""])
def test_a_bad_address_is_an_error_naming_it(text):
    with pytest.raises(ValueError) as info:
        parse_address(text)
    assert str(info.value) == f"bad address {text!r}: expected host:port"


def test_address_lists():
    assert parse_address_list(" a:1; ;b:2;") == ("a:1", "b:2")
    assert parse_address_list(["a:1", " b:2 "]) == ("a:1", "b:2")
    assert parse_address_list("") == ()
    with pytest.raises(ValueError, match="bad address 'b'"):
        parse_address_list("a:1;b")


def test_peers():
    assert parse_peers("n0-h:1; n1-127.0.0.1:2;") == {"n0": "h:1", "n1": "127.0.0.1:2"}
    for bad in ("n0:h:1", "n0-h", "-h:1", "n0-h:x"):
        with pytest.raises(ValueError) as info:
            parse_peers(bad)
        assert str(info.value) == f"bad peer {bad!r}: expected id-host:port"
    with pytest.raises(ValueError, match="peer id 'n0' appears twice"):
        parse_peers("n0-h:1;n0-h:2")
    with pytest.raises(ValueError, match="no peers given"):
        parse_peers(" ; ")


def test_the_key_table_names_source_key_and_value():
    table = KeyTable(
        [Key("listenPort", "listen_port", integer(0, 65535))],
        unused=frozenset({"rocketmqHome"}),
        aliases={"port": "listenPort"},
    )
    given = {"port": ("-D", " 7 "), "rocketmqHome": ("a.conf", "/x")}
    assert table.read(given) == (
        {"listen_port": 7},
        ["a.conf: rocketmqHome: accepted, not used by raftmq"],
    )
    with pytest.raises(ValueError, match=r"^a\.conf: listenPort='x': not an integer$"):
        table.read_text({"listenPort": "x"}, "a.conf")
    with pytest.raises(ValueError, match=r"^a\.conf: listenport='1': unknown key \(did you mean"):
        table.read_text({"listenport": "1"}, "a.conf")


def test_dledger_keys_are_read_from_their_text():
    config = DLedgerConfig.from_keys(
        {
            "group": "g",
            "selfId": "n1",
            "peers": "n0-h:1;n1-h:2",
            "heartBeatTimeIntervalMs": "50",
            "fileReservedHours": "1.5",
            "recordSyncedLengths": "true",
            "preferredLeaderIds": "n0;n1",
        },
        "command line",
    )
    assert (config.self_id, config.peers) == ("n1", {"n0": "h:1", "n1": "h:2"})
    assert (config.heartbeat_interval_ms, config.file_reserved_hours) == (50, 1.5)
    assert config.record_synced_lengths is True
    assert config.preferred_leader_ids == ("n0", "n1")
    base = {"group": "g", "selfId": "n0", "peers": "n0-h:1"}
    with pytest.raises(ValueError, match=r"^command line: maxHeartBeatLeak='x': not an integer$"):
        DLedgerConfig.from_keys({**base, "maxHeartBeatLeak": "x"}, "command line")
    with pytest.raises(ValueError, match="did you mean heartBeatTimeIntervalMs"):
        DLedgerConfig.from_keys({**base, "heartBeatIntervalMs": "5"}, "command line")
