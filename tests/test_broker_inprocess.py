"""The broker group in one trio loop: store, dispatch, processors and role changes."""

from __future__ import annotations

import json
import shutil
import sys
import time

import pytest
import trio
from raftmq.broker.store.consumequeue import ENTRY_SIZE
from raftmq.dledger.codes import NOT_APPENDED, Code
from raftmq.namesrv.config import NamesrvConfig

from raftmq.config.address import parse_address
from raftmq.protocol import message as codec
from raftmq.protocol.headers import from_send_v2, send_header_v2, to_send_v2
from raftmq.protocol.message import MessageConst
from raftmq.protocol.msgid import decode_message_id
from raftmq.remoting import (
    FLAG_ONEWAY,
    ProcessorTable,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    encode,
)
from raftmq.remoting.frames import FrameReader
from raftmq.transport.awaited import Awaited
from tests.helpers import create_topic, group, status, wait_for
from tests.inprocess_broker import InProcessGroup

# CommitLog segments of 64 KiB and ConsumeQueue files of 16 entries: retention has
# whole files to delete after a few hundred KiB
SMALL_FILES = {
    "mappedFileSizeCommitLog": str(64 << 10),
    "mappedFileSizeConsumeQueue": str(16 * ENTRY_SIZE),
}


async def test_offsets_are_dense_and_identical_on_every_replica(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    await create_topic(g, "T")
    master = g.master()
    sent = []
    for i in range(12):
        response = await g.send(master, "T", b"m%d" % i, queue_id=i % 3)
        assert response.code == ResponseCode.SUCCESS, response.remark
        sent.append(response.ext_fields)
    by_queue = {}
    for ext in sent:
        by_queue.setdefault(ext["queueId"], []).append(int(ext["queueOffset"]))
    assert by_queue == {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3], "2": [0, 1, 2, 3]}
    end = master.dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))
    for broker in g.brokers.values():  # every replica answers with the same records
        response = await g.pull(broker, "T", 1, 0)
        assert response.code == ResponseCode.SUCCESS
        messages = codec.decode_all(response.body)
        assert [m.body for m in messages] == [b"m1", b"m4", b"m7", b"m10"]
        assert [m.msg_id for m in messages] == [e["msgId"] for e in sent if e["queueId"] == "1"]
        for m in messages:  # the physical offset the master wrote into it is the real one
            assert broker.store.message_at(m.physical_offset)[:4] == codec.encode(m)[:4]


async def test_entries_placed_where_the_log_no_longer_ends_are_refused_unwritten(nursery, tmp_path):
    """The master places its records (their physical offsets) before DLedger has them:
    DLedger writes them there or refuses them whole, with a code that says nothing was
    written (so their queue offsets are given back), never at another position."""
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "T")
    server = g.master().dledger
    end_index, end_pos = server.store.end_index, server.store.end_pos
    awaited = Awaited()
    record = codec.encode(codec.MessageExt(topic="T"))
    server.append_nowait([record], awaited, placed=(end_pos + 8, end_pos + 8 + 48 + len(record)))
    code, positions = await awaited.result()
    assert (code, positions) == (Code.LEADER_NOT_READY, None) and code in NOT_APPENDED
    assert (server.store.end_index, server.store.end_pos) == (end_index, end_pos)
    assert (await g.send(g.master(), "T", b"after")).code == ResponseCode.SUCCESS


async def test_pull_status_table(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "T", 2)
    b = g.master()
    empty = await g.pull(b, "T", 0, 0)
    assert status(empty) == (ResponseCode.PULL_NOT_FOUND, "0")
    moved = await g.pull(b, "T", 0, 5)
    assert status(moved) == (ResponseCode.PULL_OFFSET_MOVED, "0")
    for i in range(3):
        await g.send(b, "T", b"x%d" % i, props="TAGS\x01a\x02" if i != 1 else "TAGS\x01b\x02")
    found = await g.pull(b, "T", 0, 0, maxMsgNums=2)
    assert found.code == ResponseCode.SUCCESS
    assert found.ext_fields["nextBeginOffset"] == "2" and found.ext_fields["maxOffset"] == "3"
    at_end = await g.pull(b, "T", 0, 3)
    assert status(at_end) == (ResponseCode.PULL_NOT_FOUND, "3")
    beyond = await g.pull(b, "T", 0, 9)
    assert status(beyond) == (ResponseCode.PULL_OFFSET_MOVED, "3")
    filtered = await g.pull(b, "T", 0, 1, subscription="a")
    assert [m.body for m in codec.decode_all(filtered.body)] == [b"x2"]
    only_b = await g.pull(b, "T", 0, 2, subscription="b")
    assert only_b.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert only_b.ext_fields["nextBeginOffset"] == "3"
    unknown = await g.pull(b, "NOPE", 0, 0)
    assert unknown.code == ResponseCode.TOPIC_NOT_EXIST


async def test_long_poll_waits_for_an_arrival_and_times_out_without_one(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "T", 1)
    b = g.master()
    start = trio.current_time()
    idle = await g.pull(b, "T", 0, 0, sysFlag=2, suspendTimeoutMillis=300)
    waited = trio.current_time() - start
    assert idle.code == ResponseCode.PULL_NOT_FOUND and 0.25 <= waited < 2.0
    result = {}

    async def held_pull():
        start = trio.current_time()
        result["response"] = await g.pull(b, "T", 0, 0, sysFlag=2, suspendTimeoutMillis=10_000)
        result["waited"] = trio.current_time() - start

    async with trio.open_nursery() as inner:
        inner.start_soon(held_pull)
        await trio.sleep(0.3)
        assert "response" not in result  # held, not answered
        await g.send(b, "T", b"wake")
    assert result["response"].code == ResponseCode.SUCCESS
    assert 0.3 <= result["waited"] < 5.0


async def test_bad_requests_get_codes_and_remarks(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    await create_topic(g, "T", 2)
    master = g.master()
    no_topic = await g.call(
        master, RequestCode.SEND_MESSAGE_V2, to_send_v2({"producerGroup": "PG"}), b"x"
    )
    assert no_topic.code == ResponseCode.MESSAGE_ILLEGAL and "<topic>" in no_topic.remark
    bad_queue = await g.send(master, "T", b"x", queue_id=7)
    assert bad_queue.code == ResponseCode.MESSAGE_ILLEGAL and "queueId[7]" in bad_queue.remark
    batch_header = to_send_v2({"topic": "T", "queueId": 0})
    batch = await g.call(master, RequestCode.SEND_BATCH_MESSAGE, batch_header, b"\x00\x01")
    assert batch.code == ResponseCode.MESSAGE_ILLEGAL and "batch" in batch.remark
    not_a_number = await g.pull(master, "T", "zero", 0)
    assert not_a_number.code == ResponseCode.MESSAGE_ILLEGAL and "queueId" in not_a_number.remark
    slave = g.slaves()[0]
    refused = await g.send(slave, "T", b"x")
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert refused.remark.startswith("not master")
    ended = send_header_v2("PG", "T", 0, born_timestamp_ms=0, sys_flag=12)
    rollback = await g.call(master, RequestCode.SEND_MESSAGE_V2, ended, b"x")  # the broker's
    assert rollback.code == ResponseCode.MESSAGE_ILLEGAL
    assert "rollback (12) are written by the broker" in rollback.remark
    still = await g.send(master, "T", b"after the bad ones")
    assert still.code == ResponseCode.SUCCESS


async def test_topics_and_offsets_survive_a_failover(nursery, tmp_path):
    g = await group(nursery, tmp_path)
    await create_topic(g, "Orders", 2)
    master = g.master()
    for i in range(4):
        await g.send(master, "Orders", b"o%d" % i, queue_id=i % 2)
    ext = {"consumerGroup": "CG", "topic": "Orders", "queueId": 1, "commitOffset": 2}
    response = await g.call(master, RequestCode.UPDATE_CONSUMER_OFFSET, ext)
    assert response.code == ResponseCode.SUCCESS
    g.crash(next(n for n, b in g.brokers.items() if b is master))
    new = await g.wait_master()
    assert "Orders" in new.store.metadata.topics
    query = {"consumerGroup": "CG", "topic": "Orders", "queueId": 1}
    answer = await g.call(new, RequestCode.QUERY_CONSUMER_OFFSET, query)
    assert (answer.code, answer.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "2")
    missing = await g.call(new, RequestCode.QUERY_CONSUMER_OFFSET, {**query, "queueId": 0})
    assert missing.code == ResponseCode.QUERY_NOT_FOUND
    after = await g.send(new, "Orders", b"next", queue_id=1)  # queue offsets continue densely
    assert after.code == ResponseCode.SUCCESS and after.ext_fields["queueOffset"] == "2"


async def test_consume_queues_are_rebuilt_from_the_log_after_a_restart(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "T", 1)
    b = g.master()
    for i in range(5):
        await g.send(b, "T", b"r%d" % i)
    await wait_for(lambda: b.store.max_offset("T", 0) == 5)
    b.store.queues.find("T", 0).write()  # unsynced, as the page cache may hold it at a crash
    g.crash("n0")
    queue_file = next((tmp_path / "n0" / "consumequeue" / "T" / "0").iterdir())
    assert queue_file.stat().st_size == 5 * ENTRY_SIZE
    queue_file.write_bytes(queue_file.read_bytes()[: 2 * ENTRY_SIZE + 7])  # lost and torn
    await g.start_member("n0")
    b = await g.wait_master()
    await wait_for(lambda: b.store.max_offset("T", 0) == 5)
    response = await g.pull(b, "T", 0, 0)
    assert [m.body for m in codec.decode_all(response.body)] == [b"r%d" % i for i in range(5)]
    assert [m.queue_offset for m in codec.decode_all(response.body)] == list(range(5))


async def test_a_queue_that_lost_its_tail_alone_is_refilled(nursery, tmp_path):
    """ConsumeQueue files are fsynced only for a dispatch checkpoint, so a power cut
    can take the tail of one queue's file and not another's. Resuming dispatch after
    the highest position any queue held (as before checkpoints) left the short queue
    short for good, and a master would have handed its offsets out again."""
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "T", 2)
    b = g.master()
    for i in range(8):
        if i == 4:
            await b.store.checkpoint()
        for queue_id in (0, 1):
            await g.send(b, "T", b"q%d-%d" % (queue_id, i), queue_id=queue_id)
    await wait_for(lambda: b.store.dispatch_behind() == 0)
    for queue_id in (0, 1):  # unsynced, as the page cache may hold them at a crash
        b.store.queues.find("T", queue_id).write()
    g.crash("n0")
    queue_file = next((tmp_path / "n0" / "consumequeue" / "T" / "0").iterdir())
    queue_file.write_bytes(queue_file.read_bytes()[: 5 * ENTRY_SIZE])  # 3 after the checkpoint
    await g.start_member("n0")
    b = await g.wait_master()
    await wait_for(lambda: b.store.max_offset("T", 0) == 8)
    for queue_id in (0, 1):
        response = await g.pull(b, "T", queue_id, 0)
        bodies = [m.body for m in codec.decode_all(response.body)]
        assert bodies == [b"q%d-%d" % (queue_id, i) for i in range(8)]
    sent = await g.send(b, "T", b"next", queue_id=0)
    assert sent.ext_fields["queueOffset"] == "8"


async def test_retention_moves_every_replicas_queue_heads_and_pulls_jump_past_them(
    nursery, tmp_path
):
    """RocketMQ's CleanConsumeQueueService: once retention deleted the head of the log,
    a queue's head is the first entry whose message is still there, on every replica
    and after a restart. A pull below it is told where to go (PULL_OFFSET_MOVED) in one
    round trip, instead of crawling through the deleted messages one pull each."""
    g = await group(nursery, tmp_path, **SMALL_FILES)
    await create_topic(g, "T", 1)
    master = g.master()
    for i in range(160):  # about 1 KiB each: three segments and more
        response = await g.send(master, "T", b"%04d" % i + b"x" * 1000)
        assert response.code == ResponseCode.SUCCESS, response.remark
    end = master.dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))
    queue_dir = {n: tmp_path / n / "consumequeue" / "T" / "0" for n in g.brokers}
    files_before = {n: len(list(d.iterdir())) for n, d in queue_dir.items()}
    held_before = {
        n: sys.getsizeof(b.store.queues.find("T", 0)._entries) for n, b in g.brokers.items()
    }
    heads = {}
    for node, broker in g.brokers.items():
        store = broker.dledger.store
        await broker.store.checkpoint()
        # retention keeps what the dispatch checkpoint does not cover: a restart needs it
        assert broker.dledger.retention_floor() == broker.store.dispatched_index + 1
        assert store.delete_expired(broker.dledger.retention_floor(), 0) >= 2
        begin = store.pos_at(store.begin_index)
        physical = [broker.store.queues.find("T", 0).get(k)[0] for k in range(160)]
        heads[node] = sum(p < begin for p in physical)
    assert len(set(heads.values())) == 1 and 0 < heads["n0"] < 160
    head = heads["n0"]
    await g.send(master, "T", b"wake the dispatchers")
    for node, broker in g.brokers.items():  # trimmed by each replica on its own
        queue = broker.store.queues.find("T", 0)
        # a follower trims on its own schedule and dispatches the wake-up at its next commit
        await wait_for(lambda queue=queue: (queue.min_offset, queue.max_offset) == (head, 161))
        assert len(list(queue_dir[node].iterdir())) < files_before[node]
        assert sys.getsizeof(queue._entries) < held_before[node]  # the memory it holds
    moved = await g.pull(master, "T", 0, 0)
    assert status(moved) == (ResponseCode.PULL_OFFSET_MOVED, str(head))
    assert moved.ext_fields["minOffset"] == str(head)
    for broker in g.brokers.values():
        first = await g.pull(broker, "T", 0, head)
        assert first.code == ResponseCode.SUCCESS
        assert codec.decode_all(first.body)[0].body.startswith(b"%04d" % head)
        query = {"topic": "T", "queueId": 0}
        minimum = await g.call(broker, RequestCode.GET_MIN_OFFSET, query)
        assert minimum.ext_fields["offset"] == str(head)
        found = await g.call(
            broker, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**query, "timestamp": 0}
        )
        assert (found.code, found.ext_fields["offset"]) == (ResponseCode.SUCCESS, str(head))
        earliest = await g.call(broker, RequestCode.GET_EARLIEST_MSG_STORETIME, query)
        assert earliest.code == ResponseCode.SUCCESS and int(earliest.ext_fields["timestamp"]) > 0
    for node in list(g.brokers):
        g.crash(node)
    for node in ("n0", "n1", "n2"):
        await g.start_member(node)
    for broker in g.brokers.values():  # recovery finds the same head
        queue = broker.store.queues.find("T", 0)
        assert queue.min_offset == head
        await wait_for(lambda queue=queue: queue.max_offset == 161)
    new_master = await g.wait_master()
    after = await g.send(new_master, "T", b"after the restart")
    assert after.ext_fields["queueOffset"] == "161"  # offsets never renumber


async def test_send_back_retries_after_a_delay_then_dead_letters(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1, messageDelayLevel=" ".join(["1s"] * 18))
    await create_topic(g, "T", 1)
    b = g.master()
    sent = await g.send(b, "T", b"fail me", props="TAGS\x01t\x02")
    phys = codec.decode_all((await g.pull(b, "T", 0, 0)).body)[0].physical_offset
    heartbeat = {"clientID": "c1", "consumerDataSet": [{"groupName": "CG"}]}
    await g.call(b, RequestCode.HEART_BEAT, body=json.dumps(heartbeat).encode())
    back = {"offset": phys, "group": "CG", "delayLevel": 0, "originMsgId": sent.ext_fields["msgId"]}
    response = await g.call(b, RequestCode.CONSUMER_SEND_MSG_BACK, back)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert b.store.max_offset("%RETRY%CG", 0) == 0  # delayed, not there yet
    await wait_for(lambda: b.store.max_offset("%RETRY%CG", 0) == 1, timeout_s=5)
    [retry] = codec.decode_all((await g.pull(b, "%RETRY%CG", 0, 0)).body)
    assert retry.body == b"fail me" and retry.reconsume_times == 1
    assert retry.properties[MessageConst.PROPERTY_RETRY_TOPIC] == "T"
    assert retry.properties[MessageConst.PROPERTY_ORIGIN_MESSAGE_ID] == sent.ext_fields["msgId"]
    dead = await g.call(b, RequestCode.CONSUMER_SEND_MSG_BACK, {**back, "delayLevel": -1})
    assert dead.code == ResponseCode.SUCCESS
    await wait_for(lambda: b.store.max_offset("%DLQ%CG", 0) == 1)


@pytest.mark.slow  # waits out the name server's expiry twice
async def test_brokers_stay_registered_past_the_name_servers_expiry(nursery, tmp_path):
    expiring = NamesrvConfig(
        listen_port=0,
        bind_address="127.0.0.1",
        broker_channel_expired_time_ms=1000,
        scan_not_active_broker_interval_ms=100,
    )
    g = await InProcessGroup(
        nursery, tmp_path, nodes=1, namesrv=expiring, registerNameServerPeriod="300"
    ).start()
    await trio.sleep(2.5)  # two and a half expiry periods: only re-registration keeps it
    assert "broker-t" in g.namesrv.routes.broker_addr_table


async def test_a_follower_reset_past_retention_dispatches_from_the_leaders_beginning(
    nursery, tmp_path
):
    """A follower silent while retention deleted the head of the others' logs comes back
    below their beginning: the leader resets its log to the leader's first entry. Its
    dispatcher then continues from that entry (not from the entry after its old end,
    which no longer exists) and its queues start where the log does, as after its own
    retention: a pull below the head moves on, the head itself is served."""
    g = await group(nursery, tmp_path, **SMALL_FILES)
    await create_topic(g, "T", 1)
    master = g.master()
    for i in range(8):
        assert (await g.send(master, "T", b"%04d" % i)).code == ResponseCode.SUCCESS
    end = master.dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))
    silent = next(n for n, b in g.brokers.items() if b is g.slaves()[0])
    silent_end = g.brokers[silent].dledger.store.end_index
    g.crash(silent)
    for i in range(8, 168):  # about 1 KiB each: three segments and more
        response = await g.send(master, "T", b"%04d" % i + b"x" * 1000)
        assert response.code == ResponseCode.SUCCESS, response.remark
    end = master.dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))
    physical = [master.store.queues.find("T", 0).get(k)[0] for k in range(168)]
    for broker in g.brokers.values():
        await broker.store.checkpoint()
        # past the silent follower's match: as retention does once keep_ms has passed
        assert broker.dledger.store.delete_expired(broker.store.checkpointed_index, 0) >= 2
    begin = master.dledger.store.begin_index
    assert begin > silent_end + 1
    head = sum(p < master.dledger.store.pos_at(begin) for p in physical)
    assert 8 < head < 168

    back = await g.start_member(silent)
    await wait_for(lambda: back.dledger.store.begin_index == begin)
    await wait_for(lambda: back.store.dispatched_index >= end)
    queue = back.store.queues.find("T", 0)
    assert (queue.min_offset, queue.max_offset) == (head, 168)
    moved = await g.pull(back, "T", 0, 0)
    assert status(moved) == (ResponseCode.PULL_OFFSET_MOVED, str(head))
    first = await g.pull(back, "T", 0, head)
    assert first.code == ResponseCode.SUCCESS
    assert codec.decode_all(first.body)[0].body.startswith(b"%04d" % head)
    after = await g.send(master, "T", b"after the reset")
    assert after.ext_fields["queueOffset"] == "168"
    await wait_for(lambda: queue.max_offset == 169)


@pytest.mark.parametrize("wiped", [False, True], ids=["down", "wiped"])
async def test_a_follower_reset_past_retention_gets_the_metadata_it_missed(
    nursery, tmp_path, wiped
):
    """The metadata records (a topic, a committed consumer offset) that lay in the range
    retention deleted while a follower was down (or before its files were wiped) reach
    it as a snapshot of the leader's metadata before its log is reset: made master, it
    has the topic and the offset. Before snapshots it dispatched from the leader's first
    entry and had neither."""
    g = await group(nursery, tmp_path, **SMALL_FILES)
    master = g.master()
    silent = next(n for n, b in g.brokers.items() if b is g.slaves()[0])
    silent_end = g.brokers[silent].dledger.store.end_index
    g.crash(silent)
    await create_topic(g, "Missed", 2)
    ext = {"consumerGroup": "CG", "topic": "Missed", "queueId": 1, "commitOffset": 7}
    response = await g.call(master, RequestCode.UPDATE_CONSUMER_OFFSET, ext)
    assert response.code == ResponseCode.SUCCESS
    for i in range(160):  # about 1 KiB each: three segments and more
        response = await g.send(master, "Missed", b"%04d" % i + b"x" * 1000)
        assert response.code == ResponseCode.SUCCESS, response.remark
    end = master.dledger.replica.committed_index
    await wait_for(lambda: all(b.store.dispatched_index >= end for b in g.brokers.values()))
    for broker in g.brokers.values():
        await broker.store.checkpoint()
        assert broker.dledger.store.delete_expired(broker.store.checkpointed_index, 0) >= 2
    begin = master.dledger.store.begin_index
    assert begin > silent_end + 1
    if wiped:
        shutil.rmtree(tmp_path / silent)

    back = await g.start_member(silent)
    await wait_for(lambda: back.dledger.store.begin_index == begin)
    await wait_for(lambda: back.store.dispatched_index >= end)
    await master.dledger.transfer_leadership(silent)
    await wait_for(lambda: back.is_master and g.master() is back, timeout_s=10.0)
    assert "Missed" in back.store.metadata.topics
    query = {"consumerGroup": "CG", "topic": "Missed", "queueId": 1}
    answer = await g.call(back, RequestCode.QUERY_CONSUMER_OFFSET, query)
    assert (answer.code, answer.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "7")
    after = await g.send(back, "Missed", b"after the reset", queue_id=0)
    assert after.code == ResponseCode.SUCCESS, after.remark


async def test_raw_sends_store_and_answer_what_decoded_sends_do(nursery, tmp_path, monkeypatch):
    """The sends of one read taken raw (their headers read from the frame's bytes) give
    the records and answers that decoding every frame gives, in the same order; what
    the raw path cannot read (non-ASCII text, a number among the ext fields, letters
    and long names together) is decoded in its place."""
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "T", 2)
    master = g.master()
    monkeypatch.setattr(master.store, "now_ms", lambda: 1_700_000_000_123)
    appends = []
    put_nowait = master.store.commitlog.put_nowait

    def recording_put_nowait(records, done):
        appends.append([r[:52] + r[56:] for r in records])  # without the producer's port
        put_nowait(records, done)

    monkeypatch.setattr(master.store.commitlog, "put_nowait", recording_put_nowait)

    def request(opaque, queue_id, props="", code=RequestCode.SEND_MESSAGE_V2, **options):
        ext = send_header_v2("PG", "T", queue_id, born_timestamp_ms=1700, properties=props)
        return RemotingCommand(
            code=code,
            opaque=opaque,
            flag=FLAG_ONEWAY if options.get("oneway") else 0,
            ext_fields={**ext, **options.get("ext", {})},
            body=b"body %d" % opaque,
            serialize_type=options.get("serialize_type", SerializeType.JSON),
        )

    long_names = from_send_v2(send_header_v2("PG", "T", 1, born_timestamp_ms=1700))
    requests = [
        request(1, 0, 'UNIQ_KEY\x01K1\x02WAIT\x01true\x02KEYS\x01a \\"b"\x02'),
        request(2, 1, code=RequestCode.SEND_MESSAGE, ext=long_names),
        request(3, 0, "TAGS\x01\u00e9t\u00e9"),  # not ASCII
        request(4, 1, oneway=True),
        request(5, 0, "DELAY\x012\x02"),  # to the schedule topic: `send`
        request(6, 7),  # no such queue: `send` says so
        request(7, 1, ext={"queueId": "0"}),  # letters and a long name
        request(8, 0, ext={"m": "true"}),  # a batch: `send`
        request(9, 1, serialize_type=SerializeType.ROCKETMQ),
        request(10, 0, "A\x01b"),
    ]
    frames = [encode(r) for r in requests]
    # a number among the ext fields, as ali-ons writes queueId
    frames.insert(3, frames[2].replace(b'"e":"0"', b'"e":0  ').replace(b"\xc3\xa9", b"e "))

    async def exchange() -> dict:
        stream = await trio.open_tcp_stream(*parse_address(master.address))
        await stream.send_all(b"".join(frames))
        reader = FrameReader(stream)
        answers = {}
        with trio.fail_after(10):
            while len(answers) < 9:
                response = await reader.__anext__()
                answers.setdefault(response.opaque, []).append(response)
        await stream.aclose()
        return {
            opaque: [(r.code, r.remark, r.serialize_type, sorted(r.ext_fields)) for r in answer]
            for opaque, answer in answers.items()
        }

    raw = await exchange()
    raw_appends, appends[:] = appends[:], []
    monkeypatch.setattr(ProcessorTable, "raw_fields", None)  # decode every frame
    decoded = await exchange()
    assert raw == decoded
    assert raw_appends == appends
    assert len(appends[0]) == 8  # 1, 2, 3, 3 again, 4, 7, 9 and 10
    assert raw[3][0][0] == raw[10][0][0] == ResponseCode.SUCCESS
    assert raw[6][0][0] == ResponseCode.MESSAGE_ILLEGAL


async def test_the_sends_of_one_read_are_one_append_answered_in_one_write(nursery, tmp_path):
    """Plain sends that arrive together are appended together; the rest (delayed, a bad
    queue) take the per-request path, and every answer is what it would be alone."""
    g = await group(nursery, tmp_path, nodes=1)
    await create_topic(g, "T", 2)
    master = g.master()
    commitlog = master.store.commitlog
    appends = []
    put_nowait = commitlog.put_nowait

    def counting_put_nowait(records, done):
        appends.append(len(records))
        put_nowait(records, done)

    commitlog.put_nowait = counting_put_nowait
    born_ms = int(time.time() * 1000)

    def request(opaque, queue_id, body, props="", **options):
        ext = send_header_v2("PG", "T", queue_id, born_timestamp_ms=born_ms, properties=props)
        return RemotingCommand(
            code=options.get("code", RequestCode.SEND_MESSAGE_V2),
            opaque=opaque,
            flag=FLAG_ONEWAY if options.get("oneway") else 0,
            ext_fields=options.get("ext", ext),
            body=body,
            serialize_type=options.get("serialize_type", SerializeType.JSON),
        )

    long_names = {**from_send_v2(send_header_v2("PG", "T", 0, born_timestamp_ms=born_ms))}
    requests = [
        request(1, 0, b"a", "UNIQ_KEY\x01K1\x02WAIT\x01true\x02"),
        request(2, 1, b"b", serialize_type=SerializeType.ROCKETMQ),
        request(3, 0, b"c", code=RequestCode.SEND_MESSAGE, ext=long_names),
        request(4, 0, b"d", "DELAY\x012\x02"),  # to the schedule topic, alone
        request(5, 0, b"e", oneway=True),
        request(6, 7, b"f"),  # no such queue
        request(7, 0, b"g"),
    ]
    stream = await trio.open_tcp_stream(*parse_address(master.address))
    await stream.send_all(b"".join(encode(r) for r in requests))
    reader = FrameReader(stream)
    answers = {}
    with trio.fail_after(10):
        while len(answers) < 6:
            response = await reader.__anext__()
            answers[response.opaque] = response
    await stream.aclose()
    assert appends[0] == 5  # a, b, c, e, g
    assert answers[6].code == ResponseCode.MESSAGE_ILLEGAL
    assert "queueId[7] is illegal" in answers[6].remark
    assert answers[4].code == ResponseCode.SUCCESS
    offsets = {n: answers[n].ext_fields["queueOffset"] for n in (1, 2, 3, 7)}
    assert offsets == {1: "0", 2: "0", 3: "1", 7: "3"}  # e, oneway, took offset 2
    assert answers[2].serialize_type == SerializeType.ROCKETMQ
    for opaque, body in ((1, b"a"), (2, b"b"), (3, b"c"), (7, b"g")):
        ext = answers[opaque].ext_fields
        assert set(ext) == {"msgId", "queueId", "queueOffset", "MSG_REGION", "TRACE_ON"}
        stored, _size = codec.decode(
            master.store.message_at(decode_message_id(ext["msgId"]).offset)
        )
        assert (stored.body, stored.queue_offset) == (body, int(ext["queueOffset"]))
        assert "WAIT" not in stored.properties
        assert stored.properties[MessageConst.PROPERTY_CLUSTER] == "TestCluster"


async def test_inline_sends_whose_append_path_fails_after_the_append_are_stored_once(
    nursery, tmp_path, monkeypatch
):
    """A peer send that raises inside the hand-off, after the batch of one read was
    appended: each send is stored once and answered once (SYSTEM_ERROR, the outcome
    unknown), instead of being handed to the task path and appended a second time."""
    g = await group(nursery, tmp_path)
    await create_topic(g, "T", 1)
    master = g.master()
    server, commitlog = master.dledger, master.store.commitlog
    real_send, real_put_nowait = server.transport.send, commitlog.put_nowait
    appending = []
    injected = []

    def put_nowait(records, done) -> None:
        appending.append(records)
        try:
            real_put_nowait(records, done)
        finally:
            appending.pop()

    def send_failing_once(msg) -> None:
        # the push of the batch's entries, from inside its append (an idle log pushes at once)
        if appending and not injected and getattr(msg, "entries", b""):
            injected.append(msg)
            raise RuntimeError("injected: the peer send failed")
        real_send(msg)

    monkeypatch.setattr(commitlog, "put_nowait", put_nowait)
    monkeypatch.setattr(server.transport, "send", send_failing_once)
    # idle: the batch is appended and pushed at once, inside put_nowait
    await wait_for(lambda: not (server._append_queue or server._group_commit.in_flight))
    born_ms = int(time.time() * 1000)
    bodies = [b"once %d" % n for n in range(5)]
    requests = [
        RemotingCommand(
            code=RequestCode.SEND_MESSAGE_V2,
            opaque=opaque,
            ext_fields=send_header_v2("PG", "T", 0, born_timestamp_ms=born_ms),
            body=body,
        )
        for opaque, body in enumerate(bodies, 1)
    ]
    stream = await trio.open_tcp_stream(*parse_address(master.address))
    await stream.send_all(b"".join(encode(r) for r in requests))
    reader = FrameReader(stream)
    answers: dict[int, list] = {}
    with trio.fail_after(10):
        while len(answers) < len(requests):
            response = await reader.__anext__()
            answers.setdefault(response.opaque, []).append(response)
    assert injected, "the fault was not injected: the batch's push never left"
    after = await g.send(master, "T", b"after")  # the log moves on past the failure
    assert after.code == ResponseCode.SUCCESS, after.remark
    end = master.dledger.replica.committed_index
    await wait_for(lambda: master.store.dispatched_index >= end)
    pulled = codec.decode_all((await g.pull(master, "T", 0, 0)).body)
    assert sorted(m.body for m in pulled) == sorted([*bodies, b"after"])
    with trio.move_on_after(0.5):  # the commit of the batch must not answer them again
        response = await reader.__anext__()
        answers.setdefault(response.opaque, []).append(response)
    await stream.aclose()
    assert {opaque: len(answer) for opaque, answer in answers.items()} == dict.fromkeys(
        range(1, 6), 1
    )
    for [answer] in answers.values():
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert "may or may not be stored" in answer.remark


async def test_a_consumer_offset_pending_when_the_master_steps_down_is_not_acknowledged(
    nursery, tmp_path
):
    """An offset commit whose record has not committed when its master steps down (here
    both slaves are gone and the master's lease runs out; in a jepsen run, the master
    removed from the group) never committed: answering it SUCCESS, as the master did,
    lost an acknowledged commit (the next master served the offset before it). It is
    answered as from a slave, so the client commits again to the new master."""
    g = await group(nursery, tmp_path)
    master = g.master()
    await create_topic(g, "Pending", 1)
    for slave in g.slaves():
        g.crash(next(n for n, b in g.brokers.items() if b is slave))
    ext = {"consumerGroup": "CG", "topic": "Pending", "queueId": 0, "commitOffset": 5}
    response = await g.call(master, RequestCode.UPDATE_CONSUMER_OFFSET, ext)
    assert not master.is_master, "the master stepped down with the commit pending"
    assert response.code != ResponseCode.SUCCESS, response.remark


async def test_a_consumer_offset_query_waits_for_the_log_to_be_applied(nursery, tmp_path):
    """A follower holding an offset commit's record that it has not yet learned is
    committed (its leader died right after the quorum formed) does not answer the offset
    from before it: older answers moved a consumer group back, which a jepsen run found
    with a restarted broker answering before it had applied its log. It answers
    SYSTEM_BUSY, naming why, and the client asks again."""
    g = await group(nursery, tmp_path)
    master = g.master()
    await create_topic(g, "Applied", 1)
    slave, other = g.slaves()
    g.crash(next(n for n, b in g.brokers.items() if b is other))
    ext = {"consumerGroup": "CG", "topic": "Applied", "queueId": 0}
    for offset in (3, 7):
        response = await g.call(
            master, RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": offset}
        )
        assert response.code == ResponseCode.SUCCESS, response.remark
    g.crash(next(n for n, b in g.brokers.items() if b is master))
    answer = await g.call(slave, RequestCode.QUERY_CONSUMER_OFFSET, ext)
    if answer.code == ResponseCode.SUCCESS:
        assert int(answer.ext_fields["offset"]) >= 7
    else:
        assert answer.code == ResponseCode.SYSTEM_BUSY, answer
        assert "did not hold every acknowledged commit" in answer.remark


async def test_a_membership_change_asked_before_the_first_election_waits_for_a_leader(
    nursery, tmp_path
):
    """A member removed the moment the group starts, before any leader is known (a
    jepsen run's setup did this): the member asked waits for the election, then
    forwards the change, instead of answering NOT_LEADER "no leader known". Here the
    member asked runs alone for a moment (it cannot be elected without a second vote),
    then the others start."""
    g = await InProcessGroup(nursery, tmp_path).start(members=1)
    first, *others = g.ids
    asked = g.brokers[first]

    async def start_the_others() -> None:
        await trio.sleep(0.3)
        assert asked.dledger.replica.leader_id is None, "a member alone was elected"
        for node in others:
            await g.start_member(node)

    nursery.start_soon(start_the_others)
    removed = others[-1]
    answer = await g.call(
        asked, RequestCode.DLEDGER_MEMBERS, {"change": "remove", "memberId": removed}
    )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert removed not in json.loads(answer.body)["voters"]
