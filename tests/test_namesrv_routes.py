"""RouteInfoManager, sans-IO: registrations, master change, expiry, unregister."""

from __future__ import annotations

import pytest
from raftmq.namesrv.config import load_config
from raftmq.namesrv.routes import RouteInfoManager

CLUSTER = "DefaultCluster"
A0, A1, A2 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"
TOPICS = {
    "T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0},
    "TBW102": {"topicName": "TBW102", "readQueueNums": 8, "writeQueueNums": 8, "perm": 7},
}
V1 = {"timestamp": 1, "counter": 1}


def group(now_ms: int = 0) -> RouteInfoManager:
    """broker-a: master A0 (HA port 10912) and slave A1."""
    routes = RouteInfoManager()
    routes.register_broker(CLUSTER, A0, "broker-a", 0, "10.0.0.1:10912", TOPICS, V1, now_ms)
    result = routes.register_broker(
        CLUSTER, A1, "broker-a", 1, "10.0.0.2:10912", TOPICS, V1, now_ms
    )
    assert (result.master_addr, result.ha_server_addr) == (A0, "10.0.0.1:10912")
    return routes


def test_route_data_shape_and_values():
    route = group().pickup_topic_route_data("T")
    assert route == {
        "brokerDatas": [
            {"cluster": CLUSTER, "brokerName": "broker-a", "brokerAddrs": {"0": A0, "1": A1}}
        ],
        "queueDatas": [
            {
                "brokerName": "broker-a",
                "readQueueNums": 4,
                "writeQueueNums": 4,
                "perm": 6,
                "topicSysFlag": 0,
            }
        ],
        "filterServerTable": {},
    }
    assert group().pickup_topic_route_data("nope") is None


def test_master_registers_without_master_learns_nothing():
    routes = RouteInfoManager()
    result = routes.register_broker(CLUSTER, A1, "broker-a", 1, None, TOPICS, V1, 0)
    assert result.master_addr is None
    # Slaves do not contribute queue data: no route until a master registers.
    assert routes.pickup_topic_route_data("T") is None


def test_master_change_is_reflected_at_once():
    routes = group()
    # DLedger elected A1: it registers as master, the old master comes back as slave 2.
    routes.register_broker(CLUSTER, A1, "broker-a", 0, "10.0.0.2:10912", TOPICS, V1, 10)
    addrs = routes.pickup_topic_route_data("T")["brokerDatas"][0]["brokerAddrs"]
    assert addrs == {"0": A1}
    result = routes.register_broker(CLUSTER, A0, "broker-a", 2, "10.0.0.1:10912", TOPICS, V1, 20)
    assert (result.master_addr, result.ha_server_addr) == (A1, "10.0.0.2:10912")
    addrs = routes.pickup_topic_route_data("T")["brokerDatas"][0]["brokerAddrs"]
    assert addrs == {"0": A1, "2": A0}


def test_a_deposed_masters_late_claim_does_not_hide_the_new_master():
    """Found by a jepsen run: a master paused past an election registered as master once
    more on waking (its periodic registration was due), then as a slave; the second
    removed the master entry, and clients saw no master until the next period."""
    routes = RouteInfoManager()
    routes.register_broker(CLUSTER, A0, "broker-a", 0, None, TOPICS, V1, 0, term=2)
    routes.register_broker(CLUSTER, A1, "broker-a", 2, None, TOPICS, V1, 0, term=2)
    routes.register_broker(CLUSTER, A1, "broker-a", 0, None, TOPICS, V1, 10, term=3)
    result = routes.register_broker(CLUSTER, A0, "broker-a", 0, None, TOPICS, V1, 20, term=2)
    assert result.master_addr == A1
    routes.register_broker(CLUSTER, A0, "broker-a", 1, None, TOPICS, V1, 21, term=3)
    addrs = routes.pickup_topic_route_data("T")["brokerDatas"][0]["brokerAddrs"]
    assert addrs == {"0": A1, "1": A0}


def test_a_group_rebuilt_under_the_same_name_starts_its_terms_over():
    routes = RouteInfoManager()
    routes.register_broker(CLUSTER, A0, "broker-a", 0, None, TOPICS, V1, 0, term=9)
    routes.unregister_broker(CLUSTER, A0, "broker-a", 0)
    routes.register_broker(CLUSTER, A1, "broker-a", 0, None, TOPICS, V1, 10, term=1)
    addrs = routes.pickup_topic_route_data("T")["brokerDatas"][0]["brokerAddrs"]
    assert addrs == {"0": A1}


def test_new_master_topics_update_queue_data():
    routes = group()
    changed = {"T": {**TOPICS["T"], "writeQueueNums": 8, "readQueueNums": 8}}
    routes.register_broker(CLUSTER, A2, "broker-a", 0, None, changed, V1, 10)
    (queue_data,) = routes.pickup_topic_route_data("T")["queueDatas"]
    assert queue_data["writeQueueNums"] == 8


def test_expiry_removes_broker_and_its_queue_data():
    routes = group(now_ms=0)
    routes.register_broker(CLUSTER, A2, "broker-b", 0, None, {"T": TOPICS["T"]}, V1, 0)
    assert routes.scan_not_active_brokers(now_ms=1000, expiry_ms=1000) == []
    # broker-a keeps heartbeating; broker-b falls silent.
    routes.register_broker(CLUSTER, A0, "broker-a", 0, None, TOPICS, V1, 900)
    routes.register_broker(CLUSTER, A1, "broker-a", 1, None, TOPICS, V1, 900)
    assert routes.scan_not_active_brokers(now_ms=1500, expiry_ms=1000) == [A2]
    route = routes.pickup_topic_route_data("T")
    assert [q["brokerName"] for q in route["queueDatas"]] == ["broker-a"]
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-a"]
    assert routes.get_all_cluster_info()["clusterAddrTable"] == {CLUSTER: ["broker-a"]}
    assert sorted(routes.scan_not_active_brokers(now_ms=5000, expiry_ms=1000)) == [A0, A1]
    assert routes.pickup_topic_route_data("T") is None
    assert routes.get_all_topic_list() == []
    assert routes.get_all_cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_expired_master_leaves_slave_serving_reads():
    routes = group(now_ms=0)
    routes.register_broker(CLUSTER, A1, "broker-a", 1, None, TOPICS, V1, 2000)
    assert routes.scan_not_active_brokers(now_ms=2500, expiry_ms=1000) == [A0]
    route = routes.pickup_topic_route_data("T")
    assert route["brokerDatas"][0]["brokerAddrs"] == {"1": A1}


def test_unregister():
    routes = group()
    routes.unregister_broker(CLUSTER, A1, "broker-a", 1)
    assert routes.pickup_topic_route_data("T")["brokerDatas"][0]["brokerAddrs"] == {"0": A0}
    routes.unregister_broker(CLUSTER, A0, "broker-a", 0)
    assert routes.pickup_topic_route_data("T") is None
    assert routes.get_all_topic_list() == []
    assert routes.broker_live_table == {}


def test_channel_destroy_removes_brokers_of_that_channel():
    routes = RouteInfoManager()
    routes.register_broker(CLUSTER, A0, "broker-a", 0, None, TOPICS, V1, 0, channel="c1")
    routes.register_broker(CLUSTER, A2, "broker-b", 0, None, TOPICS, V1, 0, channel="c2")
    assert routes.on_channel_destroy("c1") == [A0]
    assert [b["brokerName"] for b in routes.pickup_topic_route_data("T")["brokerDatas"]] == [
        "broker-b"
    ]


def test_cluster_info_topic_list_and_order_conf():
    routes = group()
    ordered = {"O": {"readQueueNums": 2, "writeQueueNums": 2, "perm": 6, "order": True}}
    routes.register_broker(CLUSTER, A2, "broker-b", 0, None, ordered, V1, 0)
    assert routes.get_all_topic_list() == ["O", "T", "TBW102"]
    # Absent or null TopicConfig fields take Java's defaults (16 queues, perm 6).
    assert routes.pickup_topic_route_data("TBW102")["queueDatas"][0]["topicSysFlag"] == 0
    assert routes.pickup_topic_route_data("O")["orderTopicConf"] == "broker-b:2"
    assert "orderTopicConf" not in routes.pickup_topic_route_data("T")
    info = routes.get_all_cluster_info()
    assert info["clusterAddrTable"] == {CLUSTER: ["broker-a", "broker-b"]}
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": A0, "1": A1}


def test_config_keys(tmp_path):
    path = tmp_path / "namesrv.conf"
    path.write_text("# comment\nlistenPort = 9877\nbrokerChannelExpiredTime=1000\nrocketmqHome=/x")
    config, warnings = load_config(str(path))
    assert (config.listen_port, config.broker_channel_expired_time_ms) == (9877, 1000)
    assert warnings == [f"{path}: rocketmqHome: accepted, not used by raftmq"]
    for text, problem in [
        ("listenport=1", "listenport='1': unknown key (did you mean listenPort?)"),
        ("listenPort=x", "listenPort='x': not an integer"),
        ("listenPort=70000", "listenPort='70000': out of range 0..65535"),
        ("scanNotActiveBrokerInterval=0", "scanNotActiveBrokerInterval='0': must be at least 1"),
        ("listenPort\n", "listenPort='': not an integer"),  # a key alone has the empty value
    ]:
        path.write_text(text)
        with pytest.raises(ValueError) as info:
            load_config(str(path))
        assert str(info.value) == f"{path}: {problem}"
