"""Topic configs (RocketMQ's TopicConfigManager): read from the replicated metadata,
changed through the log, announced to the name servers.

Every way a topic comes to exist — an admin request, a send auto-creating it from
TBW102, a consumer's first heartbeat creating its retry topic, a message going to a
dead-letter queue — passes `put`, so a topic's name is checked in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import trio
from raftmq.broker.headers import BadRequest
from raftmq.broker.store.metadata import (
    DEFAULT_TOPIC,
    DLQ_PREFIX,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    RETRY_PREFIX,
    Metadata,
    TopicConfig,
    topic_problem,
)

from raftmq.remoting import ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.metawriter import MetaWriter

ANNOUNCE_WAIT_S = 1.0  # how long a topic change waits for the name servers' answers


class RouteAnnouncer(Protocol):
    """What tells the name servers this broker's topics (broker.registration)."""

    async def register_now(self) -> None: ...

    def register_soon(self) -> None: ...


class TopicConfigManager:
    def __init__(
        self,
        metadata: Metadata,
        meta: MetaWriter,
        announcer: RouteAnnouncer,
        auto_create_topic_enable: bool,
    ) -> None:
        self.metadata = metadata
        self.meta = meta
        self.announcer = announcer
        self.auto_create_topic_enable = auto_create_topic_enable

    def get(self, topic: str) -> TopicConfig | None:
        return self.metadata.topics.get(topic)

    @property
    def by_name(self) -> dict[str, TopicConfig]:
        """Every topic's config by name, live (the send path's lookups): read, never
        changed, through it."""
        return self.metadata.topics

    def serialize_wrapper(self) -> dict:
        return self.metadata.topics_wrapper()

    async def put(self, config: TopicConfig) -> TopicConfig:
        """Create or update a topic through the log, then tell the name servers: the
        caller (an admin tool, a consumer's first heartbeat creating its retry topic)
        usually asks for the route next. A dead name server delays it by at most
        ANNOUNCE_WAIT_S."""
        problem = topic_problem(config.topic_name)
        if problem is not None:
            raise BadRequest(problem, ResponseCode.SYSTEM_ERROR)  # as TopicValidator answers
        await self.meta.write("topic", config=config.to_json())
        with trio.move_on_after(ANNOUNCE_WAIT_S):
            await self.announcer.register_now()
        return config

    async def delete(self, topic: str) -> None:
        await self.meta.write("deleteTopic", topic=topic)
        self.announcer.register_soon()

    async def for_send(self, topic: str, default_topic: str, queue_nums: int) -> TopicConfig:
        """The topic's config, auto-created from TBW102 as RocketMQ's msgCheck does."""
        config = self.metadata.topics.get(topic)
        if config is not None:
            return config
        if topic.startswith(RETRY_PREFIX):
            return await self.ensure_retry_topic(topic[len(RETRY_PREFIX) :])
        template = self.metadata.topics.get(default_topic or DEFAULT_TOPIC)
        inheritable = template is not None and template.perm & PERM_INHERIT
        if not self.auto_create_topic_enable or not inheritable:
            raise BadRequest(
                f"topic[{topic}] not exist, apply first please!", ResponseCode.TOPIC_NOT_EXIST
            )
        queues = max(1, min(queue_nums, template.write_queue_nums))
        return await self.put(TopicConfig(topic, queues, queues, PERM_READ | PERM_WRITE))

    async def ensure_retry_topic(self, group: str) -> TopicConfig:
        existing = self.metadata.topics.get(RETRY_PREFIX + group)
        if existing is not None:
            return existing
        return await self.put(TopicConfig(RETRY_PREFIX + group, 1, 1, PERM_READ | PERM_WRITE))

    async def ensure_system_topic(self, topic: str) -> TopicConfig:
        """A broker-written topic of one queue (the transaction topics), created the
        first time it is needed, as RocketMQ's createTopicInSendMessageBackMethod does."""
        existing = self.metadata.topics.get(topic)
        if existing is not None:
            return existing
        return await self.put(TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE))

    async def ensure_dlq(self, group: str) -> TopicConfig:
        existing = self.metadata.topics.get(DLQ_PREFIX + group)
        if existing is not None:
            return existing
        return await self.put(TopicConfig(DLQ_PREFIX + group, 1, 1, PERM_WRITE))
