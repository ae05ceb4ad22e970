"""mqproxy renews the receipt handles of `auto_renew` receives (the PushConsumer's)
while the client works: the message stays invisible past its invisible time, and an
ack with the handle the client was given, long since replaced, still acknowledges it.
In process: a DLedger group, mqproxy with short renewal times, grpcio's client."""

from __future__ import annotations

import time

import grpc
import trio

from raftmq.proxy.apis import definition, service, service_grpc
from raftmq.proxy.config import ProxyConfig
from raftmq.proxy.server import serve_proxy
from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import group

Code = definition.Code
TOPIC, GROUP = "Renewed", "renew_group"
INVISIBLE_MS = 2000


def _metadata(client: str) -> tuple:
    return (("x-mq-client-id", client),)


def _scenario(port: int) -> dict:
    """Send one message; client A receives it with auto_renew; after twice its invisible
    time client B receives nothing; A acks with its first handle; B still gets nothing."""
    found = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        topic = definition.Resource(name=TOPIC)
        for _ in range(100):  # until the brokers have registered the topic
            route = stub.QueryRoute(
                service.QueryRouteRequest(topic=topic), metadata=_metadata("a"), timeout=10
            )
            if route.status.code == Code.OK:
                break
            time.sleep(0.1)
        message = definition.Message(topic=topic, body=b"work")
        message.system_properties.message_id = "01RENEWED"
        sent = stub.SendMessage(
            service.SendMessageRequest(messages=[message]), metadata=_metadata("a"), timeout=10
        )
        assert sent.status.code == Code.OK, sent.status

        def receive(client: str) -> list:
            request = service.ReceiveMessageRequest(
                group=definition.Resource(name=GROUP),
                message_queue=route.message_queues[0],
                batch_size=1,
                auto_renew=True,
            )
            request.long_polling_timeout.FromSeconds(1)
            return list(stub.ReceiveMessage(request, metadata=_metadata(client), timeout=10))

        first = [i.message for i in receive("a") if i.HasField("message")]
        found["first"] = first
        time.sleep(2 * INVISIBLE_MS / 1000)
        found["meanwhile"] = receive("b")
        ack = service.AckMessageRequest(
            group=definition.Resource(name=GROUP),
            topic=topic,
            entries=[
                service.AckMessageEntry(
                    message_id=first[0].system_properties.message_id,
                    receipt_handle=first[0].system_properties.receipt_handle,
                )
            ],
        )
        found["ack"] = stub.AckMessage(ack, metadata=_metadata("a"), timeout=10)
        time.sleep(2 * INVISIBLE_MS / 1000)
        found["after"] = receive("b")
    return found


async def test_auto_renew_keeps_a_message_invisible_and_the_first_handle_acks_it(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    master = await g.wait_master()
    ext = {"topic": TOPIC, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
    created = await g.call(master, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    assert created.code == ResponseCode.SUCCESS
    config = ProxyConfig(
        namesrv_addr=g.namesrv_addr,
        grpc_port=0,
        grpc_host="127.0.0.1",
        default_invisible_ms=INVISIBLE_MS,
        renew_ahead_ms=1500,
        renew_period_ms=200,
    )
    port, _ = await nursery.start(serve_proxy, config)
    found = await trio.to_thread.run_sync(_scenario, port)
    assert [m.body for m in found["first"]] == [b"work"]
    assert [i.status.code for i in found["meanwhile"] if i.HasField("status")] == [
        Code.MESSAGE_NOT_FOUND
    ], "the message became visible while its consumer was working on it"
    assert found["ack"].status.code == Code.OK, found["ack"].status
    assert [i.status.code for i in found["after"] if i.HasField("status")] == [
        Code.MESSAGE_NOT_FOUND
    ], "an acknowledged message came back"
