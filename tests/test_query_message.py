"""QUERY_MESSAGE (12) against an in-process broker group: by key, by unique key, with
a time range and maxNum, on every replica, after a restart and after a failover."""

from __future__ import annotations

import time

import trio
from raftmq.broker.store.metadata import META_TOPIC

from raftmq.client.admin import Admin
from raftmq.client.message_query import query_by_key, query_by_unique_key, query_header
from raftmq.protocol import message as codec
from raftmq.protocol.message import properties_to_string
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import NO_ANSWER, create_topic, group, wait_for, wait_for_route

END_MS = 2**63 - 1


async def send_keyed(g, broker, topic: str, n: int, keys: str) -> str:
    uniq = f"{n:032X}"
    props = properties_to_string({"KEYS": keys, "UNIQ_KEY": uniq})
    response = await g.send(broker, topic, b"b%d" % n, queue_id=n % 2, props=props)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return uniq


async def query(g, broker, topic, key, max_num=64, begin_ms=0, end_ms=END_MS, unique=False):
    ext = query_header(topic, key, max_num, begin_ms, end_ms, unique)
    return await g.call(broker, RequestCode.QUERY_MESSAGE, ext)


def bodies(response) -> list[bytes]:
    return [m.body for m in codec.decode_all(response.body)]


async def caught_up(g) -> None:
    end = g.master().dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))


async def test_query_by_key_unique_key_range_and_max_num(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    await create_topic(g, "Orders", 2)
    master = g.master()
    uniqs = [await send_keyed(g, master, "Orders", n, f"order-{n % 3} all") for n in range(9)]
    await caught_up(g)
    for broker in g.brokers.values():  # every replica indexed the committed messages
        response = await query(g, broker, "Orders", "order-1")
        assert response.code == ResponseCode.SUCCESS
        assert bodies(response) == [b"b1", b"b4", b"b7"]  # oldest first
        assert int(response.ext_fields["indexLastUpdatePhyoffset"]) > 0
        assert bodies(await query(g, broker, "Orders", "all", max_num=4)) == [
            b"b5",
            b"b6",
            b"b7",
            b"b8",
        ]  # the newest maxNum
        found = await query(g, broker, "Orders", uniqs[4], unique=True)
        assert bodies(found) == [b"b4"]
        assert codec.decode_all(found.body)[0].uniq_key == uniqs[4]
    missing = await query(g, master, "Orders", "order-9")
    assert missing.code == ResponseCode.QUERY_NOT_FOUND
    assert missing.remark == "can not find message, maybe time range not correct"
    assert missing.ext_fields["indexLastUpdateTimestamp"] == "0"
    assert (await query(g, master, "Other", "order-1")).code == ResponseCode.QUERY_NOT_FOUND
    future_ms = int(time.time() * 1000) + 60_000
    late = await query(g, master, "Orders", "order-1", begin_ms=future_ms)
    assert late.code == ResponseCode.QUERY_NOT_FOUND


async def test_the_client_filters_collisions_and_the_index_survives_failover(nursery, tmp_path):
    """ "Aa" and "BB" have the same Java hash: the broker returns both, the client keeps
    the one asked for. A restarted member and a new master answer the same."""
    g = await group(nursery, tmp_path)
    await create_topic(g, "Orders", 2)
    master = g.master()
    uniq_aa = await send_keyed(g, master, "Orders", 1, "Aa")
    await send_keyed(g, master, "Orders", 2, "BB")
    await caught_up(g)
    assert bodies(await query(g, master, "Orders", "Aa")) == [b"b1", b"b2"]
    async with Admin(g.namesrv_addr) as admin:
        await wait_for_route(admin, "Orders")
        before = [m.body for m in await query_by_key(admin, "Orders", "Aa")]
        assert before == [b"b1"]
        assert (await query_by_unique_key(admin, "Orders", uniq_aa, begin_ms=0)).body == b"b1"

        old = next(n for n, b in g.brokers.items() if b is master)
        g.crash(old)
        new = await g.wait_master()
        assert new is not master
        await g.start_member(old)  # recovers its index from the dispatch checkpoint
        await caught_up(g)
        for broker in g.brokers.values():
            assert bodies(await query(g, broker, "Orders", "Aa")) == [b"b1", b"b2"]
        with trio.fail_after(15):
            while True:
                try:
                    after = [m.body for m in await query_by_key(admin, "Orders", "Aa")]
                    break
                except NO_ANSWER:
                    await trio.sleep(0.1)
        assert after == before


async def test_message_index_disabled_builds_no_index_and_finds_nothing(nursery, tmp_path):
    """messageIndexEnable=false: no index file on any replica, and QUERY_MESSAGE answers
    QUERY_NOT_FOUND as RocketMQ's broker without index files does, saying why."""
    g = await group(nursery, tmp_path, messageIndexEnable="false")
    await create_topic(g, "Orders", 2)
    master = g.master()
    uniq = await send_keyed(g, master, "Orders", 1, "order-1")
    await caught_up(g)
    for node, broker in g.brokers.items():
        assert broker.store.index is None
        index_dir = tmp_path / node / "index"
        assert not index_dir.exists() or not any(index_dir.iterdir())
        for key, unique in (("order-1", False), (uniq, True)):
            response = await query(g, broker, "Orders", key, unique=unique)
            assert response.code == ResponseCode.QUERY_NOT_FOUND
            assert "messageIndexEnable=false" in response.remark
            assert response.ext_fields["indexLastUpdatePhyoffset"] == "0"
    pulled = await g.pull(master, "Orders", 1, 0)  # the message itself is there
    assert pulled.code == ResponseCode.SUCCESS


async def test_index_files_roll_by_count_are_named_by_time_and_follow_retention(nursery, tmp_path):
    """Files of maxIndexNum - 1 entries, named yyyyMMddHHmmssSSS in creation order;
    once retention deleted the head of the log, each replica drops the leading files
    whose messages are all gone (never the last), and their keys are no longer found."""
    g = await group(nursery, tmp_path, mappedFileSizeCommitLog=str(64 << 10), maxIndexNum="40")
    await create_topic(g, "Orders", 1)
    master = g.master()
    for n in range(160):  # about 1 KiB each, two index entries each: 8 files and more
        props = properties_to_string({"KEYS": f"order-{n}", "UNIQ_KEY": f"{n:032X}"})
        sent = await g.send(master, "Orders", b"%04d" % n + b"x" * 1000, props=props)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
    await caught_up(g)
    names_before = {}
    for node, broker in g.brokers.items():
        names = sorted(p.name for p in (tmp_path / node / "index").iterdir() if p.name.isdigit())
        assert len(names) >= 8 and all(len(name) == 17 for name in names)
        for name in (names[0], names[-1]):  # local time of creation, to the millisecond
            created_s = time.mktime(time.strptime(name[:14], "%Y%m%d%H%M%S"))
            assert abs(created_s - time.time()) < 120, name
        assert names == [f.path.name for f in broker.store.index.files]  # creation order
        assert all(f.index_count == 40 for f in broker.store.index.files[:-1])  # full
        names_before[node] = names
        await broker.store.checkpoint()
        store = broker.dledger.store
        assert store.delete_expired(broker.dledger.retention_floor(), 0) >= 2
    await g.send(master, "Orders", b"wake the dispatchers")
    await caught_up(g)
    for node, broker in g.brokers.items():
        store = broker.dledger.store
        begin = store.pos_at(store.begin_index)
        files = broker.store.index.files
        await wait_for(lambda files=files, begin=begin: files[0].end_phy_offset >= begin)
        left = sorted(p.name for p in (tmp_path / node / "index").iterdir() if p.name.isdigit())
        assert left == names_before[node][len(names_before[node]) - len(left) :]
        assert len(left) < len(names_before[node])
        gone = await query(g, broker, "Orders", "order-0")
        assert gone.code == ResponseCode.QUERY_NOT_FOUND
        kept = await query(g, broker, "Orders", "order-159")
        assert bodies(kept) == [b"0159" + b"x" * 1000]


async def test_view_message_by_id_serves_only_where_a_record_starts(nursery, tmp_path):
    """VIEW_MESSAGE_BY_ID (33) answers the record an offset msgId names; an offset
    inside a record, before the log or past it is SYSTEM_ERROR with RocketMQ's remark
    (RocketMQ would return the bytes an offset inside a record points at)."""
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "Orders", 1)
    master = g.master()
    sent = await g.send(master, "Orders", b"hello")
    offset = decode_message_id(sent.ext_fields["msgId"]).offset
    await caught_up(g)
    found = await g.call(master, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
    assert found.code == ResponseCode.SUCCESS
    assert codec.decode_all(found.body)[0].body == b"hello"
    for wrong in (offset + 1, offset + 20, offset + 28, offset - 1, 0, 48, -5, 1 << 40):
        response = await g.call(master, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": wrong})
        assert (response.code, response.remark) == (
            ResponseCode.SYSTEM_ERROR,
            f"can not find message by the offset, {wrong}",
        )
    meta = master.store.queues.find(META_TOPIC, 0).get(0)[0]  # the ACL's keys may ride in it
    internal = await g.call(master, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": meta})
    assert internal.code == ResponseCode.NO_PERMISSION


async def test_trace_topic_exists_when_enabled_and_its_records_are_found_by_key(nursery, tmp_path):
    """traceTopicEnable creates msgTraceTopicName (one queue) at start, with automatic
    topic creation off; a trace record is found by the traced msgId and keys it carries
    as KEYS, which is how queryMsgTraceById looks it up."""
    g = await group(
        nursery,
        tmp_path,
        nodes=1,
        traceTopicEnable="true",
        msgTraceTopicName="Traces",
        autoCreateTopicEnable="false",
    )
    master = g.master()
    assert master.store.metadata.topics["Traces"].write_queue_nums == 1
    assert "RMQ_SYS_TRACE_TOPIC" not in master.store.metadata.topics
    await send_keyed(g, master, "Traces", 0, "7F0000010001 order-7")
    await caught_up(g)
    async with Admin(g.namesrv_addr) as admin:
        await wait_for_route(admin, "Traces")
        for key in ("7F0000010001", "order-7"):
            assert [m.body for m in await query_by_key(admin, "Traces", key)] == [b"b0"]
