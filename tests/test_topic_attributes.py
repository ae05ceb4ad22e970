"""RocketMQ 5's topic attributes: `message.type` set with UPDATE_AND_CREATE_TOPIC's
`attributes` (`mqadmin updateTopic -a +message.type=FIFO`), kept in the topic config
every replica applies, read back with GET_TOPIC_CONFIG, and checked by mqproxy
(QueryRoute's accept_message_types, MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)."""

from __future__ import annotations

import json

import grpc
import pytest
import trio
from raftmq.broker.topic_attributes import alter_attributes

from raftmq.proxy.apis import definition, service, service_grpc
from raftmq.proxy.config import ProxyConfig
from raftmq.proxy.server import serve_proxy
from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import group, wait_for

Code = definition.Code
MessageType = definition.MessageType


def test_attribute_changes_follow_apaches_syntax():
    assert alter_attributes({}, "+message.type=FIFO", creating=True) == {"message.type": "FIFO"}
    fifo = {"message.type": "FIFO"}
    assert alter_attributes(fifo, "+message.type=MIXED", creating=False) == {
        "message.type": "MIXED"
    }
    assert alter_attributes(fifo, "-message.type", creating=False) == {}
    assert alter_attributes(fifo, "", creating=False) == fifo
    for spec, reason in (
        ("+queue.kind=x", "unsupported attribute 'queue.kind'"),
        ("+message.type=ORDERED", "expected one of"),
        ("message.type=FIFO", "must start with +"),
        ("+message.type=FIFO,+message.type=NORMAL", "given twice"),
    ):
        with pytest.raises(ValueError, match=reason):
            alter_attributes({}, spec, creating=False)
    with pytest.raises(ValueError, match="cannot be deleted from a topic being created"):
        alter_attributes({}, "-message.type", creating=True)


def _topic_ext(topic: str, attributes: str | None = None) -> dict:
    ext = {"topic": topic, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
    if attributes is not None:
        ext["attributes"] = attributes
    return ext


async def test_message_type_is_replicated_and_read_back(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    master = await g.wait_master()
    created = await g.call(
        master, RequestCode.UPDATE_AND_CREATE_TOPIC, _topic_ext("Typed", "+message.type=FIFO")
    )
    assert created.code == ResponseCode.SUCCESS, created.remark

    def everywhere(expected: dict) -> bool:
        return all(
            b.topics.metadata.topics.get("Typed") is not None
            and b.topics.metadata.topics["Typed"].attributes == expected
            for b in g.brokers.values()
        )

    await wait_for(lambda: everywhere({"message.type": "FIFO"}))
    for member in g.brokers.values():  # any member answers GET_TOPIC_CONFIG
        read = await g.call(member, RequestCode.GET_TOPIC_CONFIG, {"topic": "Typed"})
        assert read.code == ResponseCode.SUCCESS
        assert json.loads(read.body)["attributes"] == {"message.type": "FIFO"}
    # an update without attributes keeps them; "-" removes
    kept = await g.call(master, RequestCode.UPDATE_AND_CREATE_TOPIC, _topic_ext("Typed"))
    assert kept.code == ResponseCode.SUCCESS
    assert master.topics.metadata.topics["Typed"].attributes == {"message.type": "FIFO"}
    removed = await g.call(
        master, RequestCode.UPDATE_AND_CREATE_TOPIC, _topic_ext("Typed", "-message.type")
    )
    assert removed.code == ResponseCode.SUCCESS
    await wait_for(lambda: everywhere({}))
    refused = await g.call(
        master, RequestCode.UPDATE_AND_CREATE_TOPIC, _topic_ext("Other", "+message.type=SOON")
    )
    assert refused.code == ResponseCode.INVALID_PARAMETER
    assert "message.type='SOON'" in refused.remark
    missing = await g.call(master, RequestCode.GET_TOPIC_CONFIG, {"topic": "Nope"})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST


CLIENT = (("x-mq-client-id", "test@1@0@x"),)


def _message(topic: str, group: str | None = None) -> definition.Message:
    made = definition.Message(body=b"x")
    made.topic.name = topic
    made.system_properties.message_id = "01AB"
    if group is not None:
        made.system_properties.message_group = group
    return made


async def test_mqproxy_checks_sends_against_the_topics_message_type(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    master = await g.wait_master()
    for topic, spec in (("Fifo", "+message.type=FIFO"), ("Untyped", None)):
        response = await g.call(
            master, RequestCode.UPDATE_AND_CREATE_TOPIC, _topic_ext(topic, spec)
        )
        assert response.code == ResponseCode.SUCCESS
    config = ProxyConfig(namesrv_addr=g.namesrv_addr, grpc_port=0, grpc_host="127.0.0.1")
    port, _ = await nursery.start(serve_proxy, config)

    def calls():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_grpc.MessagingServiceStub(channel)

            def route(topic):
                request = service.QueryRouteRequest(topic=definition.Resource(name=topic))
                for _ in range(100):  # until the brokers have registered the topic
                    answer = stub.QueryRoute(request, metadata=CLIENT, timeout=10)
                    if answer.status.code == Code.OK:
                        return answer
                return answer

            def send(message):
                request = service.SendMessageRequest(messages=[message])
                return stub.SendMessage(request, metadata=CLIENT, timeout=10)

            return (
                route("Fifo"),
                route("Untyped"),
                send(_message("Fifo")),
                send(_message("Fifo", "g1")),
                send(_message("Untyped", "g1")),
            )

    (
        fifo_route,
        untyped_route,
        normal_to_fifo,
        fifo_to_fifo,
        fifo_to_untyped,
    ) = await trio.to_thread.run_sync(calls)
    assert {tuple(q.accept_message_types) for q in fifo_route.message_queues} == {
        (MessageType.FIFO,)
    }
    assert set(untyped_route.message_queues[0].accept_message_types) == {1, 2, 3, 4}
    assert normal_to_fifo.status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert "accepts FIFO messages, this message is NORMAL" in normal_to_fifo.status.message
    assert fifo_to_fifo.status.code == Code.OK
    assert fifo_to_untyped.status.code == Code.OK
