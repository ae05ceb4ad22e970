"""A broker group with `aclEnable=true`, in the test's trio loop: our clients sign, the
brokers check every request against each member's own `conf/plain_acl.yml`, a
refused send stores nothing, an edited file is reloaded, and ACL changes made on the
master (UPDATE_AND_CREATE_ACL_CONFIG, DELETE_ACL_CONFIG, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG)
reach every member's file through the log and outlive the master."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path

import grpc
import pytest
import trio
import yaml
from raftmq.broker import access_control
from raftmq.broker.acl.plain import with_account
from raftmq.broker.config import load_broker_config
from raftmq.broker.store.metadata import META_TOPIC, Metadata

from raftmq.client import PullConsumer, SendError, SessionCredentials
from raftmq.client.producer import Producer
from raftmq.protocol.headers import send_header_v2
from raftmq.proxy.apis import definition, service, service_grpc
from raftmq.proxy.config import ProxyConfig
from raftmq.proxy.server import serve_proxy
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.remoting.signing import sign
from tests.helpers import create_topic, wait_for
from tests.inprocess_broker import InProcessGroup

ADMIN = SessionCredentials("adminUser", "adminSecret1")
PRODUCER = SessionCredentials("producer1", "producerSecret1")
ACL = {
    "globalWhiteRemoteAddresses": [],
    "accounts": [
        {"accessKey": "adminUser", "secretKey": "adminSecret1", "admin": True},
        {
            "accessKey": "producer1",
            "secretKey": "producerSecret1",
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "SUB",
            "topicPerms": ["Allowed=PUB|SUB", "ReadOnly=SUB"],
        },
    ],
}


def acl_file(g: InProcessGroup, node: str) -> Path:
    return g.base / node / "conf" / "plain_acl.yml"


async def acl_group(nursery, tmp_path: Path, doc: dict = ACL) -> InProcessGroup:
    g = InProcessGroup(nursery, tmp_path, aclEnable="true")
    for node in g.ids:
        acl_file(g, node).parent.mkdir(parents=True)
        acl_file(g, node).write_text(yaml.safe_dump(doc))
    await g.start()
    g.credentials = ADMIN
    for topic in ("Allowed", "ReadOnly"):
        await create_topic(g, topic, queues=1)
    return g


async def send_as(g: InProcessGroup, credentials, topic: str, body: bytes = b"m"):
    ext = send_header_v2("PG", topic, 0, born_timestamp_ms=int(time.time() * 1000))
    g.credentials = credentials
    try:
        return await g.call(g.master(), RequestCode.SEND_MESSAGE_V2, ext, body)
    finally:
        g.credentials = ADMIN


async def test_right_keys_work_and_the_rest_is_refused_naming_what(nursery, tmp_path):
    g = await acl_group(nursery, tmp_path)
    master = g.master()
    created = await g.call(master, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T2"})
    assert created.code == ResponseCode.SUCCESS  # as the admin
    g.credentials = PRODUCER
    refused_admin = await g.call(master, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T3"})
    assert refused_admin.code == ResponseCode.NO_PERMISSION
    assert "Need admin permission for request code=17" in refused_admin.remark
    ok = await send_as(g, PRODUCER, "Allowed")
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    log_end = master.store.physical_max

    wrong = await send_as(g, SessionCredentials("producer1", "notTheSecret"), "Allowed")
    assert wrong.code == ResponseCode.NO_PERMISSION
    assert wrong.remark.startswith("Check signature failed for accessKey=producer1")
    unsigned = await send_as(g, None, "Allowed")
    assert unsigned.code == ResponseCode.NO_PERMISSION
    assert "No accessKey is configured" in unsigned.remark
    denied = await send_as(g, PRODUCER, "ReadOnly")
    assert (denied.code, denied.remark) == (
        ResponseCode.NO_PERMISSION,
        "accessKey=producer1 has no PUB permission on topic:ReadOnly (has SUB; request code 310)",
    )

    # nothing of the refused sends reached the log or a queue
    assert master.store.physical_max == log_end
    assert master.store.max_offset("Allowed", 0) == 1
    assert master.store.max_offset("ReadOnly", 0) == 0


async def test_our_clients_sign_with_their_credentials(nursery, tmp_path):
    g = await acl_group(nursery, tmp_path)
    async with Producer(g.namesrv_addr, "PG", credentials=PRODUCER, send_timeout_s=0.5) as producer:
        result = await producer.send("Allowed", b"signed")
        assert result.queue_offset == 0
        with pytest.raises(SendError, match="no PUB permission on topic:ReadOnly"):
            await producer.send("ReadOnly", b"refused")
    wrong = SessionCredentials("producer1", "wrongSecret1")
    async with Producer(g.namesrv_addr, "PG", credentials=wrong, send_timeout_s=0.5) as producer:
        with pytest.raises(SendError, match="Check signature failed"):
            await producer.send("Allowed", b"refused")
    async with PullConsumer(g.namesrv_addr, "CG", credentials=PRODUCER) as consumer:
        [queue] = await consumer.fetch_queues("Allowed")
        result = await consumer.pull(queue, 0, 32)
        assert [m.body for m in result.messages] == [b"signed"]
    assert g.master().store.max_offset("ReadOnly", 0) == 0


async def test_an_edited_file_is_reloaded_and_a_bad_one_ignored(nursery, tmp_path, monkeypatch):
    monkeypatch.setattr(access_control, "POLL_S", 0.05)
    g = await acl_group(nursery, tmp_path)
    assert (await send_as(g, PRODUCER, "ReadOnly")).code == ResponseCode.NO_PERMISSION
    edited = json.loads(json.dumps(ACL))
    edited["accounts"][1]["topicPerms"] = ["ReadOnly=PUB"]
    master_node = next(n for n, b in g.brokers.items() if b is g.master())
    path = acl_file(g, master_node)
    path.write_text(yaml.safe_dump(edited))
    with trio.fail_after(5):
        while (await send_as(g, PRODUCER, "ReadOnly")).code != ResponseCode.SUCCESS:
            await trio.sleep(0.05)
    path.write_text("accounts: [{accessKey: x}]\n")  # not a valid account: ignored
    await trio.sleep(0.3)
    assert (await send_as(g, PRODUCER, "ReadOnly")).code == ResponseCode.SUCCESS


async def test_changes_through_the_master_reach_every_file_and_survive_it(
    nursery, tmp_path, monkeypatch
):
    monkeypatch.setattr(access_control, "POLL_S", 0.05)
    g = await acl_group(nursery, tmp_path)
    slave = g.slaves()[0]
    update = {
        "accessKey": "newUser1", "secretKey": "newSecret1", "admin": "false",
        "defaultTopicPerm": "DENY", "topicPerms": "Allowed=PUB",
    }  # fmt: skip
    refused = await g.call(slave, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, update)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE  # only the master changes it
    answer = await g.call(g.master(), RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, update)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    bad = await g.call(g.master(), RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, {
        **update, "topicPerms": "Allowed=WRITE"})  # fmt: skip
    assert bad.code == access_control.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
    assert "topicPerms" in bad.remark
    gone = await g.call(g.master(), RequestCode.DELETE_ACL_CONFIG, {"accessKey": "producer1"})
    assert gone.code == ResponseCode.SUCCESS
    again = await g.call(g.master(), RequestCode.DELETE_ACL_CONFIG, {"accessKey": "producer1"})
    assert again.code == access_control.DELETE_ACL_CONFIG_FAILED
    await wait_for(
        lambda: (
            len({acl_file(g, n).read_text() for n in g.ids}) == 1
            and "counter: 2" in acl_file(g, g.ids[0]).read_text()
        )
    )
    doc = yaml.safe_load(acl_file(g, g.ids[0]).read_text())
    assert [a["accessKey"] for a in doc["accounts"]] == ["adminUser", "newUser1"]
    assert doc["dataVersion"][0]["counter"] == 2

    new_user = SessionCredentials("newUser1", "newSecret1")
    assert (await send_as(g, new_user, "Allowed")).code == ResponseCode.SUCCESS
    old_master = next(n for n, b in g.brokers.items() if b is g.master())
    g.crash(old_master)
    await g.wait_master(timeout_s=15)
    assert (await send_as(g, new_user, "Allowed")).code == ResponseCode.SUCCESS
    deleted = await send_as(g, PRODUCER, "Allowed")
    assert deleted.remark == "No acl config for accessKey=producer1"
    version = await g.call(g.master(), RequestCode.GET_BROKER_CLUSTER_ACL_INFO)
    assert json.loads(version.ext_fields["version"])["counter"] == 2
    listed = await g.call(g.master(), RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG)
    configs = json.loads(listed.body)["plainAccessConfigs"]
    assert {c["accessKey"] for c in configs} == {"adminUser", "newUser1"}
    g.credentials = new_user  # the ACL's own requests are admin-only
    secrets = await g.call(g.master(), RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG)
    assert secrets.code == ResponseCode.NO_PERMISSION
    # nor can the replicated record, which holds the secret keys, be read by its offset
    meta = g.master().store.queue(META_TOPIC, 0)
    physical_offset, _size, _tags = meta.get(meta.max_offset - 1)
    record = await g.call(g.master(), RequestCode.VIEW_MESSAGE_BY_ID, {"offset": physical_offset})
    assert record.code == ResponseCode.NO_PERMISSION and "internal" in record.remark


async def test_global_white_addresses_admit_unsigned_requests(nursery, tmp_path):
    g = await acl_group(nursery, tmp_path)
    assert (await send_as(g, None, "Allowed")).code == ResponseCode.NO_PERMISSION
    white = {"globalWhiteAddrs": "127.0.0.*"}
    answer = await g.call(g.master(), RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, white)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert (await send_as(g, None, "ReadOnly")).code == ResponseCode.SUCCESS


async def test_without_acl_enable_signatures_are_ignored_and_acl_requests_refused(
    nursery, tmp_path
):
    g = await InProcessGroup(nursery, tmp_path).start()
    await create_topic(g, "T", queues=1)
    g.credentials = SessionCredentials("whoever1", "whatever1")
    ext = send_header_v2("PG", "T", 0, born_timestamp_ms=int(time.time() * 1000))
    assert (await g.call(g.master(), RequestCode.SEND_MESSAGE_V2, ext, b"x")).code == 0
    answer = await g.call(g.master(), RequestCode.DELETE_ACL_CONFIG, {"accessKey": "whoever1"})
    assert answer.code == ResponseCode.SYSTEM_ERROR and "aclEnable=false" in answer.remark


async def test_refused_and_admitted_sends_in_one_batch_each_get_their_answer(nursery, tmp_path):
    """Requests pipelined on one connection reach the inline send path together."""
    g = await acl_group(nursery, tmp_path)
    wrong = SessionCredentials("producer1", "notTheSecret")
    requests = []
    for n in range(20):
        ext = send_header_v2("PG", "Allowed", 0, born_timestamp_ms=int(time.time() * 1000))
        request = RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=ext, body=b"%d" % n)
        sign(request, PRODUCER if n % 2 else wrong)
        requests.append(request)
    answers = {}
    async with RemotingClient(g.master().address) as client:

        async def invoke(n, request):
            answers[n] = await client.invoke(request, 5.0)

        async with trio.open_nursery() as batch:
            for n, request in enumerate(requests):
                batch.start_soon(invoke, n, request)
    codes = [answers[n].code for n in range(20)]
    assert codes == [ResponseCode.NO_PERMISSION, ResponseCode.SUCCESS] * 10
    assert g.master().store.max_offset("Allowed", 0) == 10


async def test_a_replica_enforces_a_change_once_applied_before_its_file_has_it(
    nursery, tmp_path, monkeypatch
):
    monkeypatch.setattr(access_control, "POLL_S", 3600.0)  # no poll writes a file in this test
    g = await acl_group(nursery, tmp_path)
    update = {"accessKey": "newUser1", "secretKey": "newSecret1", "defaultTopicPerm": "PUB"}
    answer = await g.call(g.master(), RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, update)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    old_master = next(n for n, b in g.brokers.items() if b is g.master())
    await wait_for(lambda: all(b.store.metadata.acl is not None for b in g.brokers.values()))
    g.crash(old_master)
    new_master = await g.wait_master(timeout_s=15)
    new_node = next(n for n, b in g.brokers.items() if b is new_master)
    assert "newUser1" not in acl_file(g, new_node).read_text()
    sent = await send_as(g, SessionCredentials("newUser1", "newSecret1"), "Allowed")
    assert sent.code == ResponseCode.SUCCESS, sent.remark


async def test_a_record_applied_while_the_file_is_written_is_written_next(tmp_path, monkeypatch):
    config, _ = load_broker_config(
        None, overrides={"aclEnable": "true", "rocketmqHome": str(tmp_path)}
    )
    metadata = Metadata({})
    access = access_control.AccessControl(config, metadata, meta=None, role=None)
    first = with_account({}, {"accessKey": "newUser1", "secretKey": "newSecret1"})
    second = with_account(first, {"accessKey": "newUser2", "secretKey": "newSecret2"})
    metadata.acl, metadata.acl_meta_offset = first, 1
    real_write = access_control.write_document

    def write_while_the_next_is_applied(path, doc):
        metadata.acl, metadata.acl_meta_offset = second, 2
        real_write(path, doc)

    monkeypatch.setattr(access_control, "write_document", write_while_the_next_is_applied)
    await access.sync()
    assert "newUser2" not in access.path.read_text()
    monkeypatch.setattr(access_control, "write_document", real_write)
    await access.sync()
    assert yaml.safe_load(access.path.read_text()) == second
    assert set(access.acl.accounts) == {"newUser1", "newUser2"}


async def test_mqproxy_signs_its_remoting_with_its_own_account(nursery, tmp_path):
    """mqproxy in front of a group with aclEnable: with `accessKey`/`secretKey` its
    sends are signed with that account, so the broker lets them through to a topic the
    account may publish to and refuses one it may only read (FORBIDDEN to the gRPC
    client); the gRPC caller's own signature is checked against the same file."""
    g = await acl_group(nursery, tmp_path)
    config = ProxyConfig(
        namesrv_addr=g.namesrv_addr,
        grpc_port=0,
        grpc_host="127.0.0.1",
        acl_enable=True,
        acl_file=str(acl_file(g, "n0")),
        access_key=PRODUCER.access_key,
        secret_key=PRODUCER.secret_key,
    )
    port, _ = await nursery.start(serve_proxy, config)
    date_time = "20261128T021500Z"
    digest = hmac.new(b"producerSecret1", date_time.encode(), hashlib.sha1).hexdigest()
    metadata = (
        ("x-mq-client-id", "c@1"),
        ("x-mq-date-time", date_time),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential=producer1, SignedHeaders=x-mq-date-time, "
            f"Signature={digest}",
        ),
    )

    def send(topic: str):
        message = definition.Message(topic=definition.Resource(name=topic), body=b"m")
        message.system_properties.message_id = f"01{topic}"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_grpc.MessagingServiceStub(channel)
            request = service.SendMessageRequest(messages=[message])
            return stub.SendMessage(request, metadata=metadata, timeout=10)

    allowed = await trio.to_thread.run_sync(send, "Allowed")
    assert allowed.status.code == definition.Code.OK, allowed.status
    read_only = await trio.to_thread.run_sync(send, "ReadOnly")
    assert read_only.status.code == definition.Code.FORBIDDEN
    assert "no PUB permission" in read_only.status.message
