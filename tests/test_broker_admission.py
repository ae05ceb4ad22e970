"""What the broker lets in: topic names, the topics clients may not send to, read
permission, a slave that is behind, and subscription groups (their configs through
the log, consumeEnable, auto-creation)."""

from __future__ import annotations

import json

import trio
from raftmq.broker.store.metadata import META_TOPIC, SCHEDULE_TOPIC

from raftmq.protocol import message as codec
from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import create_topic, group, status, wait_for
from tests.inprocess_broker import InProcessGroup


async def test_a_slave_behind_keeps_the_consumer_where_it_is(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    await create_topic(g, "T", 1)
    master = g.master()
    for i in range(3):
        await g.send(master, "T", b"m%d" % i)
    end = master.dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))
    slave = g.slaves()[0]
    # Offset 5 was never written: the master moves the consumer back to its end, a
    # slave cannot tell that from lagging behind, so it leaves the offset alone.
    assert status(await g.pull(master, "T", 0, 5)) == (ResponseCode.PULL_OFFSET_MOVED, "3")
    assert status(await g.pull(slave, "T", 0, 5)) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "5")
    # Held like an idle pull, it is answered once the slave has dispatched the offset.
    result = {}

    async def held_pull():
        result["response"] = await g.pull(slave, "T", 0, 4, sysFlag=2, suspendTimeoutMillis=5000)

    async with trio.open_nursery() as inner:
        inner.start_soon(held_pull)
        await trio.sleep(0.2)
        assert "response" not in result
        for i in range(3, 5):
            await g.send(master, "T", b"m%d" % i)
    response = result["response"]
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in codec.decode_all(response.body)] == [b"m4"]
    start = trio.current_time()
    timed_out = await g.pull(slave, "T", 0, 9, sysFlag=2, suspendTimeoutMillis=300)
    assert status(timed_out) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "9")
    assert trio.current_time() - start >= 0.25


async def test_the_metadata_topic_and_unreadable_topics_refuse_pulls(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1)
    b = g.master()
    ext = {"topic": "W", "readQueueNums": 1, "writeQueueNums": 1, "perm": 2}  # write only
    assert (await g.call(b, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)).code == ResponseCode.SUCCESS
    for topic in (META_TOPIC, "W"):
        refused = await g.pull(b, topic, 0, 0)
        assert refused.code == ResponseCode.NO_PERMISSION
        assert f"topic[{topic}] pulling message is forbidden" in refused.remark


async def test_subscription_groups_go_through_the_log_and_can_be_disabled(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    await create_topic(g, "T", 1)
    master = g.master()
    body = json.dumps({"groupName": "off", "consumeEnable": False, "retryMaxTimes": 3}).encode()
    created = await g.call(master, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
    assert created.code == ResponseCode.SUCCESS, created.remark
    await wait_for(lambda: all("off" in b.store.metadata.groups for b in g.brokers.values()))
    for broker in g.brokers.values():
        refused = await g.pull(broker, "T", 0, 0, consumerGroup="off")
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.remark == "subscription group no permission, off"
    assert master.groups.max_reconsume_times("%RETRY%off") == 3
    listed = await g.call(master, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    table = json.loads(listed.body)["subscriptionGroupTable"]
    assert table["off"]["consumeEnable"] is False and table["off"]["retryMaxTimes"] == 3
    topics = await g.call(master, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert topics.code == ResponseCode.SUCCESS
    assert "T" in json.loads(topics.body)["topicConfigTable"]
    bad = await g.call(master, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b"{}")
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL
    assert bad.remark == "bad subscription group body: no groupName"


async def test_a_heartbeat_creates_its_group_unless_auto_creation_is_off(nursery, tmp_path):
    g = await group(nursery, tmp_path / "auto")
    master = g.master()
    beat = json.dumps({"clientID": "c1", "consumerDataSet": [{"groupName": "CG1"}]}).encode()
    assert (await g.call(master, RequestCode.HEART_BEAT, body=beat)).code == ResponseCode.SUCCESS
    await wait_for(lambda: all("CG1" in b.store.metadata.groups for b in g.brokers.values()))

    strict = await InProcessGroup(
        nursery, tmp_path / "strict", nodes=1, autoCreateSubscriptionGroup="false"
    ).start()
    await create_topic(strict, "T", 1)
    b = strict.master()
    assert (await strict.call(b, RequestCode.HEART_BEAT, body=beat)).code == ResponseCode.SUCCESS
    assert "CG1" not in b.store.metadata.groups
    unknown = await strict.pull(b, "T", 0, 0, consumerGroup="CG1")
    assert unknown.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert "subscription group [CG1] does not exist" in unknown.remark
    body = json.dumps({"groupName": "CG1"}).encode()
    await strict.call(b, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
    assert status(await strict.pull(b, "T", 0, 0, consumerGroup="CG1")) == (
        ResponseCode.PULL_NOT_FOUND,
        "0",
    )


async def test_topic_names_are_checked_wherever_a_topic_comes_to_exist(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1)
    b = g.master()
    illegal = "allowing only ^[%|a-zA-Z0-9_-]+$"
    cases = {"../x": illegal, "a/b": illegal, "a.b": illegal, "x" * 128: "max length 127"}
    for topic, why in cases.items():
        ext = {"topic": topic, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
        created = await g.call(b, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        assert created.code == ResponseCode.SYSTEM_ERROR and why in created.remark, topic
        auto = await g.send(b, topic, b"x")  # auto-creation from TBW102
        assert auto.code == ResponseCode.SYSTEM_ERROR and why in auto.remark, topic
    beat = json.dumps({"clientID": "c1", "consumerDataSet": [{"groupName": "../g"}]}).encode()
    refused = await g.call(b, RequestCode.HEART_BEAT, body=beat)  # its retry topic
    assert refused.code == ResponseCode.SYSTEM_ERROR and illegal in refused.remark
    assert "../g" not in b.store.metadata.groups
    assert not any(p.name in ("x", "g") for p in tmp_path.rglob("*"))
    ok = await g.send(b, "%|ok_-1", b"x")
    assert ok.code == ResponseCode.SUCCESS, ok.remark


async def test_clients_may_not_send_to_the_schedule_topic(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1)
    b = g.master()
    sneaky = "REAL_TOPIC\x01Other\x02REAL_QID\x010\x02"
    refused = await g.send(b, SCHEDULE_TOPIC, b"x", props=sneaky)
    assert refused.code == ResponseCode.NO_PERMISSION
    assert refused.remark == f"Sending message to topic[{SCHEDULE_TOPIC}] is forbidden."
