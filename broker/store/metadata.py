"""Broker metadata replicated through the log: topics, subscription groups, offsets.

RocketMQ's master keeps topic configs, subscription groups and consumer offsets in
JSON files and slaves copy them every few seconds, so after a failover the new
master can miss the last offsets committed and consumers re-consume. Here every
change is a message of the internal topic `META_TOPIC` (one queue) appended
through the replicated log, and every replica applies it when it commits, in log
order: a new master has exactly the committed metadata.

A record's body is JSON: `{"op": "topic", "config": {...}}`, `{"op":
"deleteTopic", "topic": t}`, `{"op": "group", "config": {...}}`, `{"op": "deleteGroup",
"group": g}` (with `"removeOffset": true`, its consumer offsets too), `{"op":
"offsets", "entries": [[group, topic, queueId, offset], ...]}`,
`{"op": "delay", "entries": {level: offset}}`, the POP records (broker.store.pop_state),
`{"op": "timer", "firedMs": t, "position": p}` (timer messages' firing progress,
broker.store.timerwheel), `{"op": "acl", "document": {...}}` (the
whole `plain_acl.yml` after a change by `mqadmin updateAclConfig` and its kin; each
replica writes it to its own file, broker.acl). A snapshot (`config/metadata.json`, written and
fsynced by the message store's dispatch checkpoint) records the state and the
META_TOPIC queue offset it covers, so a restart replays only what came after it. The
same snapshot, as of the last entry dispatched, goes to a follower whose log the leader
restarts at its first entry (dledger.core.snapshot), which replaces its state with it
(`MessageStore.install_metadata_snapshot`) and then skips the records it covers.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import attrs
from raftmq.broker.store.pop_state import POP_OPS, PopState
from raftmq.broker.store.timerwheel import NO_PROGRESS

from raftmq.protocol.headers import DEFAULT_TOPIC

META_TOPIC = "RMQ_SYS_RAFTMQ_META"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1

TOPIC_MAX_LENGTH = 127  # TopicValidator.TOPIC_MAX_LENGTH (4.x)
_TOPIC_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")


def topic_problem(topic: str) -> str | None:
    """What is wrong with `topic` as a name, in TopicValidator's words; None if nothing.

    Besides clients' expectations, the character set is what keeps a name from
    leaving the store: a topic is a directory under `consumequeue/`."""
    if not topic or topic.isspace():
        return "The specified topic is blank."
    if not _TOPIC_CHARS.fullmatch(topic):
        return (
            f"The specified topic[{topic}] contains illegal characters, "
            "allowing only ^[%|a-zA-Z0-9_-]+$"
        )
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"The specified topic is longer than topic max length {TOPIC_MAX_LENGTH}."
    return None


@attrs.define
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    # RocketMQ 5's attributes (broker.topic_attributes); written only when there are
    # some, so a topic without them is stored as before.
    attributes: dict[str, str] = attrs.field(factory=dict)

    def to_json(self) -> dict:
        doc = {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }
        if self.attributes:
            doc["attributes"] = dict(self.attributes)
        return doc

    @classmethod
    def from_json(cls, d: dict) -> TopicConfig:
        return cls(
            str(d["topicName"]),
            int(d.get("readQueueNums", 4)),
            int(d.get("writeQueueNums", 4)),
            int(d.get("perm", PERM_READ | PERM_WRITE)),
            str(d.get("topicFilterType", "SINGLE_TAG")),
            int(d.get("topicSysFlag", 0)),
            bool(d.get("order", False)),
            {str(k): str(v) for k, v in (d.get("attributes") or {}).items()},
        )


def builtin_topics(
    cluster: str, broker_name: str, default_queues: int, trace_topic: str | None = None
) -> dict[str, TopicConfig]:
    """Topics every broker has without being asked (TopicConfigManager's constructor);
    `trace_topic` (traceTopicEnable's msgTraceTopicName) with one queue, where clients
    that trace send their records."""
    rw = PERM_READ | PERM_WRITE
    topics = [
        TopicConfig(DEFAULT_TOPIC, default_queues, default_queues, rw | PERM_INHERIT),
        TopicConfig("SELF_TEST_TOPIC", 1, 1, rw),
        TopicConfig(cluster, 16, 16, rw),
        TopicConfig(broker_name, 1, 1, rw),
        TopicConfig("OFFSET_MOVED_EVENT", 1, 1, rw),
        TopicConfig(SCHEDULE_TOPIC, 18, 18, rw),
        TopicConfig(META_TOPIC, 1, 1, 0),
    ]
    if trace_topic is not None:
        topics.append(TopicConfig(trace_topic, 1, 1, rw))
    return {t.topic_name: t for t in topics}


@attrs.define
class SubscriptionGroupConfig:
    """RocketMQ's SubscriptionGroupConfig. raftmq acts on consumeEnable and
    retryMaxTimes; the others are kept and reported, as an operator set them
    (`consumeMessageOrderly` and `groupRetryPolicy`, RocketMQ 5's, are read by the
    proxy: FIFO receives and a NACK's backoff)."""

    group_name: str
    consume_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool = False
    # Apache's GroupRetryPolicy JSON: {"type": "CUSTOMIZED", "customizedRetryPolicy":
    # {"next": [ms, ...]}} or {"type": "EXPONENTIAL", "exponentialRetryPolicy":
    # {"initial": ms, "max": ms, "multiplier": m}}
    group_retry_policy: dict = attrs.Factory(lambda: {"type": "CUSTOMIZED"})

    def to_json(self) -> dict:
        return {
            "groupName": self.group_name,
            "consumeEnable": self.consume_enable,
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "consumeFromMinEnable": self.consume_from_min_enable,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "brokerId": self.broker_id,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "consumeMessageOrderly": self.consume_message_orderly,
            "groupRetryPolicy": self.group_retry_policy,
        }

    @classmethod
    def from_json(cls, d: dict) -> SubscriptionGroupConfig:
        return cls(
            str(d["groupName"]),
            bool(d.get("consumeEnable", True)),
            int(d.get("retryQueueNums", 1)),
            int(d.get("retryMaxTimes", 16)),
            bool(d.get("consumeFromMinEnable", True)),
            bool(d.get("consumeBroadcastEnable", True)),
            int(d.get("brokerId", 0)),
            int(d.get("whichBrokerWhenConsumeSlowly", 1)),
            bool(d.get("notifyConsumerIdsChangedEnable", True)),
            bool(d.get("consumeMessageOrderly", False)),
            dict(d.get("groupRetryPolicy") or {"type": "CUSTOMIZED"}),
        )


def encode_record(op: str, **fields) -> bytes:
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode()


# Apache RocketMQ's broker's tables, in `storePathRootDir/config`: topics, subscription
# groups, consumer offsets, delay-level offsets
ROCKETMQ_TABLES = (
    "topics.json",
    "subscriptionGroup.json",
    "consumerOffset.json",
    "delayOffset.json",
)
_UNQUOTED_KEY = re.compile(rb"([{,])(-?\d+):")


def loads(body: bytes):
    """JSON, or fastjson's with unquoted integer map keys."""
    try:
        return json.loads(body)
    except ValueError:
        return json.loads(_UNQUOTED_KEY.sub(rb'\1"\2":', body))


def consumer_offsets(doc: dict) -> dict[tuple[str, str, int], int]:
    """{(group, topic, queueId): offset} from ConsumerOffsetManager's JSON."""
    offsets = {}
    for key, queues in doc["offsetTable"].items():
        topic, _, group = key.rpartition("@")
        for queue_id, offset in queues.items():
            offsets[(group, topic, int(queue_id))] = int(offset)
    return offsets


def delay_offsets(doc: dict) -> dict[int, int]:
    """{delay level: ConsumeQueue offset} from DelayOffsetSerializeWrapper's JSON."""
    return {int(level): int(offset) for level, offset in doc["offsetTable"].items()}


class Metadata:
    """The applied state. `apply` writes it on every replica, in log order; a classic
    slave also takes the master's tables as they are (`synchronize`)."""

    def __init__(self, builtin: dict[str, TopicConfig]) -> None:
        self.builtin = builtin
        self.topics: dict[str, TopicConfig] = dict(builtin)
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.delay_offsets: dict[int, int] = {}
        self.pop = PopState()
        self.timer_progress = NO_PROGRESS  # (fired_ms, position): broker.store.timerwheel
        self.acl: dict | None = None  # the last replicated plain_acl.yml document
        self.acl_meta_offset = -1  # the META_TOPIC offset of the record that set it
        self.applied_meta_offset = 0  # META_TOPIC queue offset of the next record to apply
        # {(topic, queueId): the next offset} of queues dropped with their topic: a new
        # master continues there, so a topic created again never reuses an offset
        self.dropped_queue_offsets: dict[tuple[str, int], int] = {}
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": 0}

    def apply(self, body: bytes, meta_offset: int) -> str | None:
        """Apply the META_TOPIC record at queue offset `meta_offset` (once, in order);
        the topic it deleted, if it deleted one (the store drops its queues)."""
        if meta_offset < self.applied_meta_offset:
            return None
        self.applied_meta_offset = meta_offset + 1
        record = json.loads(body)
        op = record.get("op")
        if op == "topic":
            config = TopicConfig.from_json(record["config"])
            self.topics[config.topic_name] = config
            self._bump()
        elif op == "deleteTopic":
            if self.topics.pop(record["topic"], None) is not None:
                self._bump()
            return str(record["topic"])
        elif op == "group":
            config = SubscriptionGroupConfig.from_json(record["config"])
            self.groups[config.group_name] = config
        elif op == "deleteGroup":
            group = record["group"]
            self.groups.pop(group, None)
            if record.get("removeOffset"):  # absent in records from before it existed
                for key in [key for key in self.offsets if key[0] == group]:
                    del self.offsets[key]
        elif op == "offsets":
            for group, topic, queue_id, offset in record["entries"]:
                self.offsets[(group, topic, int(queue_id))] = int(offset)
        elif op == "delay":
            for level, offset in record["entries"].items():
                self.delay_offsets[int(level)] = int(offset)
        elif op in POP_OPS:
            self.pop.apply(op, record)
        elif op == "timer":
            self.timer_progress = (int(record["firedMs"]), int(record["position"]))
        elif op == "acl":
            self.acl = dict(record["document"])
            self.acl_meta_offset = meta_offset
        return None

    def synchronize(
        self,
        topics: dict | None = None,
        groups: dict | None = None,
        offsets: dict[tuple[str, str, int], int] | None = None,
        delay_offsets: dict[int, int] | None = None,
    ) -> None:
        """SlaveSynchronize's results (None: not fetched): the master's topic and
        subscription group tables (their wrappers; topics taken whole when their data
        version differs from ours), consumer offsets (added and overwritten, never
        removed, as RocketMQ's `putAll`) and delay offsets."""
        if topics is not None and topics.get("dataVersion") != self.data_version:
            table = {
                name: TopicConfig.from_json(config)
                for name, config in topics["topicConfigTable"].items()
            }
            self.topics.clear()  # in place: the managers hold the tables
            self.topics.update(self.builtin)
            self.topics.update(table)
            self.data_version = dict(topics["dataVersion"])
        if groups is not None:
            self.groups.clear()
            for name, config in groups["subscriptionGroupTable"].items():
                self.groups[name] = SubscriptionGroupConfig.from_json(config)
        self.offsets.update(offsets or {})
        self.delay_offsets.update(delay_offsets or {})

    def _bump(self) -> None:
        self.data_version = {
            "timestamp": int(time.time() * 1000),
            "counter": self.data_version["counter"] + 1,
        }

    def offsets_of_group(self, group: str) -> dict[tuple[str, int], int]:
        return {(t, q): o for (g, t, q), o in self.offsets.items() if g == group}

    # ------------------------------------------------------------------ RocketMQ's files
    def topics_wrapper(self) -> dict:
        """TopicConfigSerializeWrapper: every topic but the internal metadata one, and the
        data version, as GET_ALL_TOPIC_CONFIG and REGISTER_BROKER carry them."""
        return {
            "topicConfigTable": {n: t.to_json() for n, t in self.topics.items() if n != META_TOPIC},
            "dataVersion": self.data_version,
        }

    def groups_wrapper(self) -> dict:
        """SubscriptionGroupWrapper, as GET_ALL_SUBSCRIPTIONGROUP_CONFIG carries it."""
        return {
            "subscriptionGroupTable": {n: g.to_json() for n, g in self.groups.items()},
            "dataVersion": self.data_version,
        }

    def offsets_wrapper(self) -> dict:
        """ConsumerOffsetManager's JSON: {"offsetTable": {"topic@group": {queueId: offset}}}."""
        table: dict[str, dict[str, int]] = {}
        for (group, topic, queue_id), offset in self.offsets.items():
            table.setdefault(f"{topic}@{group}", {})[str(queue_id)] = offset
        return {"offsetTable": table}

    def delay_offsets_wrapper(self) -> dict:
        """DelayOffsetSerializeWrapper: {"offsetTable": {delayLevel: ConsumeQueue offset}}."""
        return {"offsetTable": {str(level): o for level, o in self.delay_offsets.items()}}

    def rocketmq_tables(self) -> dict[str, bytes]:
        """The files Apache RocketMQ's broker keeps its tables in (`config/<name>`), as
        it reads them: what raftmq leaves at a clean stop so that RocketMQ's broker
        started on the store knows its topics, groups and offsets."""
        tables = {
            ROCKETMQ_TABLES[0]: self.topics_wrapper(),
            ROCKETMQ_TABLES[1]: self.groups_wrapper(),
            ROCKETMQ_TABLES[2]: self.offsets_wrapper(),
            ROCKETMQ_TABLES[3]: self.delay_offsets_wrapper(),
        }
        return {name: json.dumps(table, indent=1).encode() for name, table in tables.items()}

    def load_rocketmq(self, config_dir: Path) -> list[str]:
        """Take the tables Apache RocketMQ's broker keeps in `config_dir` (topics.json,
        subscriptionGroup.json, consumerOffset.json, delayOffset.json, or the `.bak`
        it leaves beside each), for a store it wrote that raftmq opens: without them
        the store's messages are there and no topic is. Returns the files read."""
        read = {}
        for name in ROCKETMQ_TABLES:
            for path in (config_dir / name, config_dir / f"{name}.bak"):
                if path.exists() and (body := path.read_bytes()).strip():
                    read[name] = (path, loads(body))
                    break
        doc = {name: value for name, (_path, value) in read.items()}
        offsets, delay = doc.get(ROCKETMQ_TABLES[2]), doc.get(ROCKETMQ_TABLES[3])
        self.synchronize(
            doc.get(ROCKETMQ_TABLES[0]),
            doc.get(ROCKETMQ_TABLES[1]),
            None if offsets is None else consumer_offsets(offsets),
            None if delay is None else delay_offsets(delay),
        )
        return [path.name for path, _value in read.values()]

    # ------------------------------------------------------------------ snapshot
    def to_json(self) -> dict:
        return {
            "appliedMetaOffset": self.applied_meta_offset,
            "dataVersion": self.data_version,
            "topicConfigTable": {
                n: t.to_json() for n, t in self.topics.items() if n not in self.builtin
            },
            "subscriptionGroupTable": {n: g.to_json() for n, g in self.groups.items()},
            "offsetTable": [[g, t, q, o] for (g, t, q), o in self.offsets.items()],
            "delayOffsetTable": {str(k): v for k, v in self.delay_offsets.items()},
            "pop": self.pop.to_json(),
            "timerProgress": list(self.timer_progress),
            "acl": self.acl,
            "aclMetaOffset": self.acl_meta_offset,
            "droppedQueueOffsets": [[t, q, o] for (t, q), o in self.dropped_queue_offsets.items()],
        }

    def snapshot_bytes(self) -> bytes:
        """The snapshot `load` reads, as of now."""
        return json.dumps(self.to_json()).encode()

    def load(self, path: Path) -> None:
        if path.exists():
            self.restore(json.loads(path.read_text()))

    @classmethod
    def from_snapshot(cls, builtin: dict[str, TopicConfig], body: bytes) -> Metadata:
        """The state `snapshot_bytes` gave, from a peer (a leader's snapshot): ValueError,
        saying what, for bytes that are not one."""
        metadata = cls(builtin)
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise TypeError(f"a {type(data).__name__}, not an object")
            metadata.restore(data)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed metadata snapshot: {exc!r:.200}") from None
        return metadata

    def replace_with(self, other: Metadata) -> None:
        """Take `other`'s state whole (a leader's snapshot), into this object's own tables:
        the managers hold them."""
        tables = (
            (self.topics, other.topics),
            (self.groups, other.groups),
            (self.offsets, other.offsets),
            (self.delay_offsets, other.delay_offsets),
            (self.dropped_queue_offsets, other.dropped_queue_offsets),
        )
        for mine, theirs in tables:
            mine.clear()
            mine.update(theirs)
        self.pop = other.pop
        self.timer_progress = other.timer_progress
        self.acl, self.acl_meta_offset = other.acl, other.acl_meta_offset
        self.applied_meta_offset = other.applied_meta_offset
        self.data_version = other.data_version

    def restore(self, data: dict) -> None:
        """Take the state `to_json` gave, over a fresh object's."""
        self.applied_meta_offset = int(data["appliedMetaOffset"])
        self.data_version = data["dataVersion"]
        for name, config in data["topicConfigTable"].items():
            self.topics[name] = TopicConfig.from_json(config)
        for name, config in data["subscriptionGroupTable"].items():
            self.groups[name] = SubscriptionGroupConfig.from_json(config)
        for g, t, q, o in data["offsetTable"]:
            self.offsets[(g, t, int(q))] = int(o)
        for k, v in data["delayOffsetTable"].items():
            self.delay_offsets[int(k)] = int(v)
        self.pop.load(data.get("pop", {}))  # absent in snapshots from before POP
        fired_ms, position = data.get("timerProgress", NO_PROGRESS)  # absent before timers
        self.timer_progress = (int(fired_ms), int(position))
        self.acl = data.get("acl")  # absent in snapshots from before ACL
        self.acl_meta_offset = int(data.get("aclMetaOffset", -1))
        for t, q, o in data.get("droppedQueueOffsets", []):  # absent before topics were dropped
            self.dropped_queue_offsets[(t, int(q))] = int(o)
