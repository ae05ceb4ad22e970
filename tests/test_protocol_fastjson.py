"""fastjson's JSON, as Java's admin reads it: maps keyed by objects (202, 208, 222) and
by bare integers (a Java name server's brokerAddrs)."""

import json

import pytest

from raftmq.protocol.fastjson import loads, queue_map_body


def test_a_map_keyed_by_message_queues_reads_as_pairs():
    body = queue_map_body([("T", "b", 0, {"maxOffset": 5}), ("T", "b", 1, 7)], consumeTps=0.5)
    assert body.startswith(b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:')
    assert loads(body.decode()) == {
        "offsetTable": [
            ({"brokerName": "b", "queueId": 0, "topic": "T"}, {"maxOffset": 5}),
            ({"brokerName": "b", "queueId": 1, "topic": "T"}, 7),
        ],
        "consumeTps": 0.5,
    }
    assert loads(queue_map_body([]).decode()) == {"offsetTable": {}}


def test_bare_integer_keys_read_as_if_quoted():
    text = '{"brokerAddrs": {0: "h:1", 2 : "h:3"}, "list": [1, {"a": null}], "t": true}'
    assert loads(text) == {
        "brokerAddrs": {"0": "h:1", "2": "h:3"},
        "list": [1, {"a": None}],
        "t": True,
    }


@pytest.mark.parametrize(
    "text", ['{"a": 1, "b": [1, 2.5, "x"], "c": {}}', "[]", '"s"', "3", '{"k": {"n": [[]]}}']
)
def test_standard_json_reads_as_json_loads_reads_it(text):
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"a" 1}', "expected ':' at character 5"),
        ('{"a": 1', "expected ',' at character 7"),
        ("[1 2]", "expected ',' at character 3"),
        ('{"a": 1} x', "extra data at character 8"),
    ],
)
def test_malformed_text_names_the_position(text, problem):
    with pytest.raises(ValueError, match=problem):
        loads(text)
