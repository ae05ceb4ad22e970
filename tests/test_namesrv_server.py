"""The name server over real TCP on 127.0.0.1: a broker registers as a Java broker does,
clients ask for routes; and the `mqnamesrv` process itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import zlib

import pytest
import trio
from raftmq.namesrv import NamesrvConfig, NamesrvServer

from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.tools.dledger_local import free_ports

pytestmark = pytest.mark.untimed

MASTER, SLAVE = "127.0.0.1:10911", "127.0.0.1:10921"

# What a 4.9 Java broker's fastjson writes for RegisterBrokerBody.
JAVA_BODY = (
    b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
    b'{"counter":3,"timestamp":1700000000000},"topicConfigTable":{"TopicTest":'
    b'{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
    b'"topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4}}}}'
)


def register(addr: str, broker_id: int, body: bytes = JAVA_BODY, **extra) -> RemotingCommand:
    fields = {
        "brokerName": "broker-a",
        "brokerAddr": addr,
        "clusterName": "DefaultCluster",
        "haServerAddr": addr[:-1] + "2",
        "brokerId": broker_id,
        "compressed": False,
        "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF,
        **extra,
    }
    return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=fields, body=body)


def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})


async def start(nursery, **config) -> NamesrvServer:
    server = NamesrvServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1", **config))
    await nursery.start(server.serve)
    return server


async def test_register_then_route_cluster_info_and_topic_list(nursery):
    server = await start(nursery)
    with trio.fail_after(10):
        async with RemotingClient(f"127.0.0.1:{server.port}") as broker:
            response = await broker.invoke(register(MASTER, 0))
            assert response.code == ResponseCode.SUCCESS, response.remark
            response = await broker.invoke(register(SLAVE, 1))
            assert response.code == ResponseCode.SUCCESS
            assert response.ext_fields["masterAddr"] == MASTER
            assert response.ext_fields["haServerAddr"] == "127.0.0.1:10912"

            async with RemotingClient(f"127.0.0.1:{server.port}") as client:
                response = await client.invoke(route_request("TopicTest"))
                assert response.code == ResponseCode.SUCCESS
                # Standard JSON, sorted keys, broker ids quoted.
                assert b'"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10921"}' in (
                    response.body
                )
                route = json.loads(response.body)
                assert list(route) == ["brokerDatas", "filterServerTable", "queueDatas"]
                assert route["brokerDatas"] == [
                    {
                        "brokerAddrs": {"0": MASTER, "1": SLAVE},
                        "brokerName": "broker-a",
                        "cluster": "DefaultCluster",
                    }
                ]
                assert route["queueDatas"] == [
                    {
                        "brokerName": "broker-a",
                        "perm": 6,
                        "readQueueNums": 4,
                        "topicSysFlag": 0,
                        "writeQueueNums": 4,
                    }
                ]
                info = await client.invoke(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))
                assert json.loads(info.body)["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
                topics = await client.invoke(
                    RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
                )
                assert json.loads(topics.body) == {"topicList": ["TopicTest"]}
                other = await client.invoke(RemotingCommand(RequestCode.SEND_MESSAGE))
                assert other.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

        # The broker's connection closed: the broker is gone (BrokerHousekeepingService).
        async with RemotingClient(f"127.0.0.1:{server.port}") as client:
            while (await client.invoke(route_request("TopicTest"))).code == 0:
                await trio.sleep(0.01)


async def test_delete_topic_drops_its_route_until_a_broker_registers_it_again(nursery):
    server = await start(nursery)
    with trio.fail_after(10):
        async with RemotingClient(f"127.0.0.1:{server.port}") as broker:
            assert (await broker.invoke(register(MASTER, 0))).code == ResponseCode.SUCCESS
            delete = RemotingCommand(
                RequestCode.DELETE_TOPIC_IN_NAMESRV, ext_fields={"topic": "TopicTest"}
            )
            assert (await broker.invoke(delete)).code == ResponseCode.SUCCESS
            gone = await broker.invoke(route_request("TopicTest"))
            assert gone.code == ResponseCode.TOPIC_NOT_EXIST
            topics = await broker.invoke(
                RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            )
            assert json.loads(topics.body) == {"topicList": []}
            missing = RemotingCommand(RequestCode.DELETE_TOPIC_IN_NAMESRV)
            assert (await broker.invoke(missing)).code == ResponseCode.SYSTEM_ERROR
            # A broker that still has the topic brings it back (its dataVersion moved on).
            newer = JAVA_BODY.replace(b'"counter":3', b'"counter":4')
            assert (await broker.invoke(register(MASTER, 0, newer))).code == ResponseCode.SUCCESS
            assert (await broker.invoke(route_request("TopicTest"))).code == ResponseCode.SUCCESS


async def test_unknown_topic_and_bad_input_get_error_codes(nursery):
    server = await start(nursery)
    with trio.fail_after(10):
        async with RemotingClient(f"127.0.0.1:{server.port}") as client:
            response = await client.invoke(route_request("nope"))
            assert response.code == ResponseCode.TOPIC_NOT_EXIST
            assert response.remark == "No topic route info in name server for the topic: nope"

            bad_json = await client.invoke(register(MASTER, 0, body=b'{"topicConfig'))
            assert bad_json.code == ResponseCode.SYSTEM_ERROR
            assert "not JSON" in bad_json.remark
            bad_shape = b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"x"}}}}'
            response = await client.invoke(register(MASTER, 0, body=bad_shape))
            assert response.code == ResponseCode.SYSTEM_ERROR
            assert "perm is not an integer" in response.remark
            missing = register(MASTER, 0)
            del missing.ext_fields["brokerName"]
            response = await client.invoke(missing)
            assert (response.code, response.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "missing header field 'brokerName'",
            )
            response = await client.invoke(register(MASTER, 0, bodyCrc32=12345))
            assert (response.code, response.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "crc32 not match",
            )

            # Still serving, and nothing half-registered.
            assert (await client.invoke(route_request("TopicTest"))).code == 17
            assert (await client.invoke(register(MASTER, 0))).code == ResponseCode.SUCCESS
            assert (await client.invoke(route_request("TopicTest"))).code == ResponseCode.SUCCESS


async def test_silent_broker_expires(nursery, autojump_clock):
    server = await start(
        nursery, broker_channel_expired_time_ms=1000, scan_not_active_broker_interval_ms=200
    )
    async with RemotingClient(f"127.0.0.1:{server.port}") as broker:
        assert (await broker.invoke(register(MASTER, 0))).code == ResponseCode.SUCCESS
        await trio.sleep(0.9)
        assert (await broker.invoke(route_request("TopicTest"))).code == ResponseCode.SUCCESS
        await trio.sleep(1.5)
        response = await broker.invoke(route_request("TopicTest"))
        assert response.code == ResponseCode.TOPIC_NOT_EXIST


@pytest.mark.processes
async def test_mqnamesrv_process(tmp_path):
    port = free_ports(1)[0]
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"listenPort={port}\nbrokerChannelExpiredTime=1000\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq.namesrv.cli", "-c", str(conf)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        assert f"listenPort={port}" in line, line + proc.stderr.read()
        with trio.fail_after(10):
            async with RemotingClient(f"127.0.0.1:{port}") as client:
                assert (await client.invoke(register(MASTER, 0))).code == ResponseCode.SUCCESS
                route = await client.invoke(route_request("TopicTest"))
                assert json.loads(route.body)["brokerDatas"][0]["brokerAddrs"] == {"0": MASTER}
        proc.send_signal(signal.SIGTERM)
        assert await trio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.processes
def test_mqnamesrv_refuses_unknown_key(tmp_path):
    conf = tmp_path / "namesrv.conf"
    conf.write_text("listenPort=0\nbrokerChanelExpiredTime=1000\n")
    result = subprocess.run(
        [sys.executable, "-m", "raftmq.namesrv.cli", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert f"{conf}: brokerChanelExpiredTime='1000': unknown key" in result.stderr
    assert "(did you mean brokerChannelExpiredTime?)" in result.stderr
