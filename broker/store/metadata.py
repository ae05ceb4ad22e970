"""Broker metadata replicated through the log: topics, subscription groups, offsets.

RocketMQ's master keeps topic configs, subscription groups and consumer offsets in
JSON files and slaves copy them every few seconds, so after a failover the new
master can miss the last offsets committed and consumers re-consume. Here every
change is a message of the internal topic `META_TOPIC` (one queue) appended
through the replicated log, and every replica applies it when it commits, in log
order: a new master has exactly the committed metadata.

A record's body is JSON: `{"op": "topic", "config": {...}}`, `{"op":
"deleteTopic", "topic": t}`, `{"op": "group", "config": {...}}`, `{"op": "deleteGroup",
"group": g}`, `{"op": "offsets", "entries": [[group, topic, queueId, offset], ...]}`,
`{"op": "delay", "entries": {level: offset}}`, `{"op": "acl", "document": {...}}` (the
whole `plain_acl.yml` after a change by `mqadmin updateAclConfig` and its kin; each
replica writes it to its own file, broker.acl). A snapshot (`config/metadata.json`, written and
fsynced by the message store's dispatch checkpoint) records the state and the
META_TOPIC queue offset it covers, so a restart replays only what came after it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import attrs

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

    def to_json(self) -> dict:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }

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
        )


def builtin_topics(cluster: str, broker_name: str, default_queues: int) -> dict[str, TopicConfig]:
    """Topics every broker has without being asked (TopicConfigManager's constructor)."""
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
    return {t.topic_name: t for t in topics}


@attrs.define
class SubscriptionGroupConfig:
    """RocketMQ's SubscriptionGroupConfig. raftmq acts on consumeEnable and
    retryMaxTimes; the others are kept and reported, as an operator set them."""

    group_name: str
    consume_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

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
        )


def encode_record(op: str, **fields) -> bytes:
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode()


class Metadata:
    """The applied state. `apply` writes it on every replica, in log order; a classic
    slave also takes the master's tables as they are (`synchronize`)."""

    def __init__(self, builtin: dict[str, TopicConfig]) -> None:
        self.builtin = builtin
        self.topics: dict[str, TopicConfig] = dict(builtin)
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.delay_offsets: dict[int, int] = {}
        self.acl: dict | None = None  # the last replicated plain_acl.yml document
        self.acl_meta_offset = -1  # the META_TOPIC offset of the record that set it
        self.applied_meta_offset = 0  # META_TOPIC queue offset of the next record to apply
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": 0}

    def apply(self, body: bytes, meta_offset: int) -> None:
        """Apply the META_TOPIC record at queue offset `meta_offset` (once, in order)."""
        if meta_offset < self.applied_meta_offset:
            return
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
        elif op == "group":
            config = SubscriptionGroupConfig.from_json(record["config"])
            self.groups[config.group_name] = config
        elif op == "deleteGroup":
            self.groups.pop(record["group"], None)
        elif op == "offsets":
            for group, topic, queue_id, offset in record["entries"]:
                self.offsets[(group, topic, int(queue_id))] = int(offset)
        elif op == "delay":
            for level, offset in record["entries"].items():
                self.delay_offsets[int(level)] = int(offset)
        elif op == "acl":
            self.acl = dict(record["document"])
            self.acl_meta_offset = meta_offset

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
            "acl": self.acl,
            "aclMetaOffset": self.acl_meta_offset,
        }

    def snapshot_bytes(self) -> bytes:
        """The snapshot `load` reads, as of now."""
        return json.dumps(self.to_json()).encode()

    def load(self, path: Path) -> None:
        if not path.exists():
            return
        data = json.loads(path.read_text())
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
        self.acl = data.get("acl")  # absent in snapshots from before ACL
        self.acl_meta_offset = int(data.get("aclMetaOffset", -1))
