"""Subscription group configs (RocketMQ's SubscriptionGroupManager): read from the
replicated metadata, changed through the log.

A group with no config consumes under the defaults while `autoCreateSubscriptionGroup`
is on, and its first heartbeat to the master creates the config; with it off, an
unknown group may not consume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftmq.broker.store.metadata import RETRY_PREFIX, Metadata, SubscriptionGroupConfig

from raftmq.remoting import ResponseCode

if TYPE_CHECKING:
    from raftmq.broker.metawriter import MetaWriter

DEFAULT_MAX_RECONSUME_TIMES = 16  # SubscriptionGroupConfig.retryMaxTimes


class SubscriptionGroupManager:
    def __init__(
        self, metadata: Metadata, meta: MetaWriter, auto_create_subscription_group: bool
    ) -> None:
        self.metadata = metadata
        self.meta = meta
        self.auto_create_subscription_group = auto_create_subscription_group

    def serialize_wrapper(self) -> dict:
        return self.metadata.groups_wrapper()

    def refusal(self, group: str) -> tuple[int, str] | None:
        """Why `group` may not consume here, as (response code, remark); None if it may."""
        config = self.metadata.groups.get(group)
        if config is None:
            if self.auto_create_subscription_group:
                return None
            return (
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist, apply first please!",
            )
        if not config.consume_enable:
            return ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}"
        return None

    async def put(self, config: SubscriptionGroupConfig) -> None:
        await self.meta.write("group", config=config.to_json())

    async def delete(self, group: str, remove_offsets: bool = False) -> None:
        """DELETE_SUBSCRIPTIONGROUP: the config goes, through the log; the group's
        committed offsets stay (RocketMQ 4.x keeps them too) unless `remove_offsets`
        (the request's removeOffset, `mqadmin deleteSubGroup -r true`)."""
        if remove_offsets:
            await self.meta.write("deleteGroup", group=group, removeOffset=True)
        else:
            await self.meta.write("deleteGroup", group=group)

    async def ensure(self, group: str) -> None:
        """Create `group`'s config with the defaults, through the log, if it has none and
        `autoCreateSubscriptionGroup` is on (RocketMQ does it on the group's heartbeat)."""
        if group in self.metadata.groups or not self.auto_create_subscription_group:
            return
        await self.put(SubscriptionGroupConfig(group))

    def max_reconsume_times(self, group_or_retry_topic: str) -> int:
        group = group_or_retry_topic.removeprefix(RETRY_PREFIX)
        config = self.metadata.groups.get(group)
        return DEFAULT_MAX_RECONSUME_TIMES if config is None else config.retry_max_times
