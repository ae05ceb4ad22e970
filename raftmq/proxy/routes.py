"""QueryRoute and QueryAssignment answers, from a topic's RocketMQ route.

Queues (`RouteActivity.genMessageQueueFromQueueData`): per broker group, queue ids from
0, first `readQueueNums - rw` READ-only, then `writeQueueNums - rw` WRITE-only, then
`rw = min(read, write)` READ_WRITE when the topic is readable and writable; all READ or
all WRITE for a one-way permission; `max(1, max(read, write))` NONE without either.
Only the master (broker id 0) is listed: the clients use no other, and every queue is
reached through the proxy anyway. In cluster mode every queue's `broker.endpoints` is
the list of endpoints the request came with (Apache's rule: the client reaches the
proxies the way it was configured to; several proxies behind one list all answer the
same).
"""

from __future__ import annotations

from raftmq.client.route import PERM_READ, PERM_WRITE, TopicRouteData
from raftmq.proxy.apis import definition

__all__ = ["accepted_types", "assignments", "message_queues"]

Permission = definition.Permission
MessageType = definition.MessageType

# topic attribute message.type -> accept_message_types (TopicMessageType)
_ACCEPTED = {
    "NORMAL": (MessageType.NORMAL,),
    "FIFO": (MessageType.FIFO,),
    "DELAY": (MessageType.DELAY,),
    "TRANSACTION": (MessageType.TRANSACTION,),
    "MIXED": (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION),
}


def accepted_types(topic_type: str) -> tuple[int, ...]:
    """The accept_message_types of a topic whose `message.type` attribute is `topic_type`."""
    return _ACCEPTED.get(topic_type, (MessageType.MESSAGE_TYPE_UNSPECIFIED,))


def _permissions(read: int, write: int, perm: int) -> list[int]:
    readable, writable = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    if readable and writable:
        both = min(read, write)
        return (
            [Permission.READ] * (read - both)
            + [Permission.WRITE] * (write - both)
            + [Permission.READ_WRITE] * both
        )
    if writable:
        return [Permission.WRITE] * write
    if readable:
        return [Permission.READ] * read
    return [Permission.NONE] * max(1, read, write)


def message_queues(route: TopicRouteData, endpoints, topic_type: str) -> list:
    """The MessageQueues of QueryRoute's answer; `endpoints` is the request's."""
    accepted = accepted_types(topic_type)
    queues = []
    for queue_data in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if route.master(queue_data.broker_name) is None:
            continue
        broker = definition.Broker(name=queue_data.broker_name, id=0, endpoints=endpoints)
        perms = _permissions(
            queue_data.read_queue_nums, queue_data.write_queue_nums, queue_data.perm
        )
        for queue_id, permission in enumerate(perms):
            queues.append(
                definition.MessageQueue(
                    topic=definition.Resource(name=route.topic),
                    id=queue_id,
                    permission=permission,
                    broker=broker,
                    accept_message_types=accepted,
                )
            )
    return queues


def assignments(route: TopicRouteData, endpoints, fifo: bool) -> list:
    """QueryAssignment's answer (the same for every client: POP shares queues): per
    readable master one queue with id -1, or every read queue for an orderly group."""
    result = []
    for queue_data in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if route.master(queue_data.broker_name) is None:
            continue
        if not queue_data.perm & PERM_READ or queue_data.read_queue_nums <= 0:
            continue
        broker = definition.Broker(name=queue_data.broker_name, id=0, endpoints=endpoints)
        ids = range(queue_data.read_queue_nums) if fifo else (-1,)
        for queue_id in ids:
            queue = definition.MessageQueue(
                topic=definition.Resource(name=route.topic),
                id=queue_id,
                permission=Permission.READ_WRITE,
                broker=broker,
                accept_message_types=accepted_types("MIXED"),
            )
            result.append(definition.Assignment(message_queue=queue))
    return result
