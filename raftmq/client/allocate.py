"""`allocate_averagely`: RocketMQ's default queue allocation (`AllocateMessageQueueAveragely`).

Every member of a consumer group runs this on the same inputs and takes its own share,
with no coordinator: queues and member ids are sorted, and member i gets a contiguous
block, the first `len(queues) % len(members)` members one queue more. Members beyond
the queue count get nothing. Agreement only needs every member to see the same id
list, which is why brokers must answer GET_CONSUMER_LIST_BY_GROUP alike.
"""

from __future__ import annotations

from collections.abc import Iterable

from raftmq.client.route import MessageQueue

__all__ = ["allocate_averagely"]


def allocate_averagely(
    queues: Iterable[MessageQueue], client_ids: Iterable[str], client_id: str
) -> list[MessageQueue]:
    queues = sorted(queues)
    members = sorted(set(client_ids))
    if not queues or client_id not in members:
        return []
    index = members.index(client_id)
    count, extra = divmod(len(queues), len(members))
    size = count + (1 if index < extra else 0)
    start = index * count + min(index, extra)
    return queues[start : start + size]
