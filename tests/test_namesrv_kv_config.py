"""The name server's KV config kept in `kvConfigPath`, in Java's kvConfig.json format."""

import json

import pytest
from raftmq.namesrv.kv_config import KVConfigManager


def test_a_restarted_name_server_keeps_its_kv_config(tmp_path):
    path = tmp_path / "namesrv" / "kvConfig.json"
    kv = KVConfigManager(str(path))
    kv.put("ORDER_TOPIC_CONFIG", "T", "broker-a:4")
    kv.put("NS", "K", "V")
    kv.delete("NS", "K")
    kv.delete("NS", "absent")  # deleting nothing is no error, as in Java
    # KVConfigSerializeWrapper's shape, which a Java name server reads too
    assert json.loads(path.read_text()) == {
        "configTable": {"ORDER_TOPIC_CONFIG": {"T": "broker-a:4"}}
    }
    again = KVConfigManager(str(path))
    assert again.get("ORDER_TOPIC_CONFIG", "T") == "broker-a:4"
    assert again.namespace("NS") == {}


def test_a_kv_file_that_is_not_one_is_refused_naming_it(tmp_path):
    path = tmp_path / "kvConfig.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"kvConfig\.json: not a kvConfig\.json"):
        KVConfigManager(str(path))
