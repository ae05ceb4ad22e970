"""Request processors and the message store built from their parts, over a one-replica
log in memory: no DLedger group, no sockets, no name server.

Each processor gets only what it uses (the role, the store, the managers); here the
replicated log under the store is `OneReplicaLog`, a real implementation of the
store's replicated-log protocol in which every append commits at once.
"""

from __future__ import annotations

import json
import random

import pytest
import trio
from raftmq.broker.address import BrokerAddress
from raftmq.broker.admin_requests import AdminRequests
from raftmq.broker.clients import ClientManager
from raftmq.broker.config import BrokerConfig
from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
from raftmq.broker.controller import answer_refusals
from raftmq.broker.metawriter import MetaWriter
from raftmq.broker.pull import PullProcessor, subscription_codes
from raftmq.broker.role import BrokerRole
from raftmq.broker.send import SendProcessor
from raftmq.broker.stats import BrokerStats
from raftmq.broker.store.messagestore import (
    MAX_PULL_BYTES,
    MAX_PULL_MESSAGES,
    GetStatus,
    MessageStore,
    parse_delay_levels,
)
from raftmq.broker.store.metadata import builtin_topics
from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
from raftmq.broker.topic_config_manager import TopicConfigManager
from raftmq.dledger.codes import Code, EntryType
from raftmq.dledger.server import DLedgerError
from raftmq.dledger.store.file import FileLogStore

from raftmq.config.properties import parse_properties
from raftmq.protocol import message as codec
from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import RemotingCommand, RequestCode, ResponseCode
from tests.helpers import OneReplicaLog


class NoNameServers:
    """A broker that registers with no name server: announcing is done at once."""

    async def register_now(self) -> None:
        pass

    def register_soon(self) -> None:
        pass


class Peer:
    """The one thing the processors here ask of the connection a request came on."""

    remote_address = "10.0.0.7:50123"


class Broker:
    """The parts of one broker, wired as the controller wires them."""

    def __init__(self, root, auto_create: bool = True) -> None:
        self.log = OneReplicaLog()
        self.store = MessageStore(
            self.log, root, builtin_topics("C", "broker-p", 4), parse_delay_levels("1s 5s")
        )
        self.role = BrokerRole("broker-p", "n0", 1, lambda: None)
        address = BrokerAddress("10.0.0.1", 10911)
        meta = MetaWriter(self.store, address)
        metadata = self.store.metadata
        self.topics = TopicConfigManager(metadata, meta, NoNameServers(), auto_create)
        self.groups = SubscriptionGroupManager(metadata, meta, auto_create)
        self.offsets = ConsumerOffsetManager(metadata, meta, self.role)
        self.stats = BrokerStats()
        parts = (self.role, self.store, self.topics, self.groups)
        self.send = SendProcessor(
            *parts,
            address,
            self.stats,
            cluster_name="C",
            broker_name="broker-p",
            max_message_size=1024,
        )
        self.pull = PullProcessor(
            *parts,
            self.offsets,
            self.stats,
            ClientManager(),
            long_polling_enable=False,
            property_filter_enabled=False,
        )
        config = BrokerConfig(broker_name="broker-p", auto_create_topic_enable=auto_create)
        self.admin = AdminRequests(self.role, self.topics, self.groups, config)

    async def call(self, handler, code: int, ext: dict, body: bytes = b"") -> RemotingCommand:
        request = RemotingCommand(code=code, ext_fields={k: str(v) for k, v in ext.items()})
        request.body = body
        return await answer_refusals(handler)(request, Peer())

    async def send_message(self, topic: str, body: bytes) -> RemotingCommand:
        header = send_header_v2("PG", topic, 0, born_timestamp_ms=0, properties="TAGS\x01a")
        return await self.call(self.send.send, RequestCode.SEND_MESSAGE_V2, header, body)

    async def pull_messages(self, topic: str, offset: int, group: str = "CG") -> RemotingCommand:
        ext = {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": offset}
        return await self.call(self.pull.pull, RequestCode.PULL_MESSAGE, ext)


@pytest.fixture
async def broker(nursery, tmp_path) -> Broker:
    broker = Broker(tmp_path)
    await nursery.start(broker.store.run)  # the dispatcher: metadata writes wait for it
    broker.role.become_master(OneReplicaLog.TERM)
    return broker


async def dispatched(broker: Broker) -> None:
    with trio.fail_after(5):
        while broker.store.dispatched_index < broker.log.store.end_index:
            await trio.sleep(0.001)


async def test_a_send_is_stored_at_the_next_queue_offset_and_pulled_back(broker):
    await broker.call(
        broker.admin.create_topic, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T"}
    )
    first = await broker.send_message("T", b"one")
    second = await broker.send_message("T", b"two")
    assert (first.code, second.code) == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
    assert (first.ext_fields["queueOffset"], second.ext_fields["queueOffset"]) == ("0", "1")
    await dispatched(broker)
    pulled = await broker.pull_messages("T", 0)
    assert pulled.code == ResponseCode.SUCCESS
    messages = codec.decode_all(pulled.body)
    assert [(m.body, m.queue_offset, m.born_host) for m in messages] == [
        (b"one", 0, ("10.0.0.7", 50123)),
        (b"two", 1, ("10.0.0.7", 50123)),
    ]
    assert messages[0].msg_id == first.ext_fields["msgId"]
    assert (broker.stats.put_messages, broker.stats.got_messages) == (2, 2)


async def test_a_slave_refuses_writes_and_names_itself(broker):
    broker.role.become_slave(2)
    refused = await broker.send_message("T", b"x")
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert refused.remark.startswith("not master: broker-p member n0 is a slave")
    created = await broker.call(
        broker.admin.create_topic, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T"}
    )
    assert created.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert broker.topics.get("T") is None


async def test_an_offset_commit_waits_on_a_master_only(broker, nursery):
    """A commit awaited on a broker that is no master (any more) is answered False at
    once: nothing would ever write its record (it hung forever before)."""
    nursery.start_soon(broker.offsets.run)
    with trio.fail_after(5):
        assert await broker.offsets.commit_and_wait("CG", "T", 0, 4)
        broker.role.become_slave(2)
        broker.offsets.forget_pending()
        assert not await broker.offsets.commit_and_wait("CG", "T", 1, 7)
    assert broker.offsets.query("CG", "T", 0) == 4
    assert broker.offsets.query("CG", "T", 1) is None


async def test_admin_topics_and_groups_go_through_the_log(broker):
    bad = await broker.call(
        broker.admin.create_topic, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "a b"}
    )
    assert bad.code == ResponseCode.SYSTEM_ERROR and "illegal characters" in bad.remark
    ext = {"topic": "T", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    created = await broker.call(broker.admin.create_topic, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    assert created.code == ResponseCode.SUCCESS
    topics = await broker.call(broker.admin.all_topics, RequestCode.GET_ALL_TOPIC_CONFIG, {})
    table = json.loads(topics.body)["topicConfigTable"]
    assert table["T"]["writeQueueNums"] == 2 and "RMQ_SYS_RAFTMQ_META" not in table
    group = {"groupName": "off", "consumeEnable": False, "retryMaxTimes": 3}
    made = await broker.call(
        broker.admin.create_group,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        {},
        json.dumps(group).encode(),
    )
    assert made.code == ResponseCode.SUCCESS
    groups = await broker.call(
        broker.admin.all_groups, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}
    )
    assert json.loads(groups.body)["subscriptionGroupTable"]["off"]["retryMaxTimes"] == 3
    refused = await broker.pull_messages("T", 0, group="off")
    assert refused.code == ResponseCode.NO_PERMISSION
    assert broker.groups.max_reconsume_times("%RETRY%off") == 3
    deleted = await broker.call(
        broker.admin.delete_group, RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "off"}
    )
    assert deleted.code == ResponseCode.SUCCESS and "off" not in broker.store.metadata.groups
    assert (await broker.pull_messages("T", 0, group="off")).code != ResponseCode.NO_PERMISSION


async def test_broker_config_is_read_and_changed_where_it_can_be(broker):
    """GET_BROKER_CONFIG is properties text; UPDATE_BROKER_CONFIG changes the keys read
    at run time and names any other key it refuses."""
    got = await broker.call(broker.admin.broker_config, RequestCode.GET_BROKER_CONFIG, {})
    properties = parse_properties(got.body.decode())
    assert properties["brokerName"] == "broker-p"
    assert properties["autoCreateTopicEnable"] == "true"
    assert json.loads(got.ext_fields["version"])["counter"] >= 0

    async def update(text: str) -> RemotingCommand:
        return await broker.call(
            broker.admin.update_broker_config, RequestCode.UPDATE_BROKER_CONFIG, {}, text.encode()
        )

    assert (await update("autoCreateTopicEnable=false\n")).code == ResponseCode.SUCCESS
    assert (await broker.send_message("Nowhere", b"x")).code == ResponseCode.TOPIC_NOT_EXIST
    got = await broker.call(broker.admin.broker_config, RequestCode.GET_BROKER_CONFIG, {})
    assert parse_properties(got.body.decode())["autoCreateTopicEnable"] == "false"
    for text, reason in (
        ("listenPort=1", "listenPort: cannot change at run time"),
        ("autoCreateTopicEnable=maybe", "autoCreateTopicEnable='maybe'"),
        ("noSuchKey=1", "unknown key"),
    ):
        refused = await update(text)
        assert refused.code == ResponseCode.SYSTEM_ERROR and reason in refused.remark, refused


async def test_a_send_to_an_unknown_topic_is_refused_without_auto_create(nursery, tmp_path):
    broker = Broker(tmp_path, auto_create=False)
    await nursery.start(broker.store.run)
    broker.role.become_master(OneReplicaLog.TERM)
    refused = await broker.send_message("Nowhere", b"x")
    assert refused.code == ResponseCode.TOPIC_NOT_EXIST
    assert broker.log.store.empty  # nothing was appended


def test_a_log_reset_past_the_dispatcher_moves_it_to_the_new_beginning(tmp_path):
    """A follower silent past the leader's retention has its log reset to the leader's
    first entry (DLedger's TRUNCATE with reset). The dispatcher, below that beginning,
    continues from it instead of scanning entries the log no longer has (an
    IndexError), and the queues start where the log does, as after retention."""
    broker = Broker(tmp_path)
    store, log = broker.store, broker.log

    def append(body: bytes) -> None:
        msg = codec.MessageExt(topic="T", body=body, queue_id=0, born_host=("10.0.0.7", 1))
        store.commitlog.put_nowait([codec.encode(msg)], lambda code, placed: None)

    for i in range(5):
        append(b"before %d" % i)
    store.dispatch_some(100)
    queue = store.queues.find("T", 0)
    assert (queue.min_offset, queue.max_offset) == (0, 5)
    # the leader's log begins at index 20, with queue offset 30 of T/0 there
    log.store.reset(20, log.store.end_pos + (1 << 20), OneReplicaLog.TERM)
    store.commitlog.reset_offsets({("T", 0): 30})
    append(b"the leader's first")
    assert store.dispatch_some(100) == 1
    assert store.dispatched_index == 20
    assert (queue.min_offset, queue.max_offset) == (30, 31)
    moved = store.get_message("T", 0, 0, 32)
    assert (moved.status, moved.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, 30)
    found = store.get_message("T", 0, 30, 32)
    assert found.status == GetStatus.FOUND
    assert codec.decode(found.records[0])[0].body == b"the leader's first"
    store.checkpoint_work()()  # the checkpoint finds the dispatcher's position in the log


class _MisplacingLog(OneReplicaLog):
    """A log that writes an entry of its own before each append it is handed."""

    def append_nowait(self, bodies, callback, *, placed=None) -> None:
        self.store.append_leader(self.TERM, [(EntryType.NORMAL, b"of its own")])
        super().append_nowait(bodies, callback)


class _RefusingLog(OneReplicaLog):
    """A log whose leader refuses appends while `refusing` is set (a full pending queue)."""

    refusing = False

    def append_nowait(self, bodies, callback, *, placed=None) -> None:
        if self.refusing:
            callback(Code.LEADER_PENDING_FULL, None)
        else:
            super().append_nowait(bodies, callback, placed=placed)


async def test_a_message_written_elsewhere_than_placed_is_an_error_not_a_wrong_offset(tmp_path):
    """The leader writes a message's physical offset into it before DLedger has it; a
    log that wrote it elsewhere is a broken invariant, never a msgId pointing elsewhere."""
    log = _MisplacingLog()
    store = MessageStore(log, tmp_path, builtin_topics("C", "b", 4), parse_delay_levels(""))
    with pytest.raises(AssertionError, match="were written at"):
        await store.commitlog.put([codec.encode(codec.MessageExt(topic="T"))])


async def test_an_append_refused_before_it_was_written_gives_its_queue_offsets_back(tmp_path):
    """A queue offset is assigned once, when the leader places the message; an append
    DLedger refuses whole takes none, so the queue stays dense."""
    log = _RefusingLog()
    store = MessageStore(log, tmp_path, builtin_topics("C", "b", 4), parse_delay_levels(""))
    record = codec.encode(codec.MessageExt(topic="T", queue_id=1))
    assert await store.commitlog.put([record, record]) == [(48, 0), (48 + 48 + len(record), 1)]
    log.refusing = True
    with pytest.raises(DLedgerError, match="LEADER_PENDING_FULL"):
        await store.commitlog.put([record, record])
    log.refusing = False
    [(_physical_offset, queue_offset)] = await store.commitlog.put([record])
    assert queue_offset == 2


@pytest.mark.parametrize("segment_kib", [128, 1024])
def test_pulls_copy_records_from_the_mapped_segments_as_read_at_reads_them(tmp_path, segment_kib):
    """A pull takes its records from the file log's mapped segments in one call: the
    bytes `read_at` gives, across segment ends, within RocketMQ's limits (32 messages,
    256 KiB unless the first is larger), by tag hash when subscribed, and every message
    of the queue comes back once, in order, pull after pull."""
    log = OneReplicaLog(FileLogStore(tmp_path / "log", segment_size=segment_kib << 10))
    store = MessageStore(log, tmp_path / "b", builtin_topics("C", "b", 4), parse_delay_levels(""))
    rng = random.Random(segment_kib)
    sent = []
    for n in range(300):
        body = bytes([n % 251]) * rng.choice([1, 100, 3000, 20_000, 70_000])
        tag = rng.choice(["A", "B"])
        msg = codec.MessageExt(topic="T", body=body, properties={"TAGS": tag})
        store.commitlog.put_nowait([codec.encode(msg)], lambda code, placed: None)
        sent.append((body, tag))
    store.dispatch_some(1000)
    queue = store.queues.find("T", 0)
    assert queue.max_offset == 300 and len(log.store.mapped_data()[0]) > 1
    for subscription in (None, "A"):
        codes = subscription_codes(subscription)
        offset, bodies = 0, []
        while offset < queue.max_offset:
            result = store.get_message("T", 0, offset, 64, codes)
            expected, scanned, total = [], 0, 0
            for phys, size, tags in queue.entries(offset, 4 * MAX_PULL_MESSAGES):
                full = len(expected) == MAX_PULL_MESSAGES
                if full or (expected and total + size > MAX_PULL_BYTES):
                    break
                scanned += 1
                if codes is None or tags in codes:
                    expected.append(log.store.read_at(phys, size))
                    total += size
            assert result.body == b"".join(expected)
            assert (result.count, result.next_begin_offset) == (len(expected), offset + scanned)
            assert result.status == (GetStatus.FOUND if expected else GetStatus.NO_MATCHED_MESSAGE)
            if expected:
                last = codec.decode(expected[-1])[0].physical_offset
                assert result.last_physical_offset == last
            bodies += [codec.decode(record)[0].body for record in result.records]
            offset = result.next_begin_offset
        assert bodies == [body for body, tag in sent if subscription in (None, tag)]
