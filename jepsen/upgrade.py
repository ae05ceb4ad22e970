"""The `upgraded` topology's set-up: a classic SYNC_MASTER and its slave take old
messages into every queue and a consumer group's committed offsets, then stop and
become a DLedger group in place (`LocalClassicGroup.upgraded`, the procedure the
upgrade test and `broker_local --upgrade` use: the master's store copied to each
member beyond the two, the configs switched to DLedger), which the run then puts
behind its proxies as any DLedger group.

The old sends and commits go into the history as ops like the workload's, marked
`era="classic"` and sent straight to the master's real address (no proxy listens in
the classic era). So the checkers require every old message at its queue offset, as
they do every acknowledged one, and `consumer_offsets_monotonic` requires the resuming
group's first fetch after the upgrade to return at least what it committed before.
"""

from __future__ import annotations

from pathlib import Path

from jepsen.cluster import JepsenCluster, addressing
from jepsen.history import Recorder
from jepsen.workload import (
    GROUP,
    PRODUCER_GROUP,
    QUEUES,
    SEND_TIMEOUT_S,
    TOPIC,
    WAIT_PROPERTIES,
    message_body,
)
from raftmq.client.producer import send_request
from raftmq.client.route import MessageQueue
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalClassicGroup

OLD_PER_QUEUE = 40
# A group that consumed half of every queue's old messages before the upgrade and
# resumes there; the workload's own group (GROUP) has no offsets and reads from 0.
RESUMING_GROUP = "jepsen-resumers"
CONSUMER_GROUPS = (GROUP, RESUMING_GROUP)
ERA = "classic"
SETUP_PROCESS = 0  # the workload's processes count from 1


async def upgraded_cluster(
    base_dir: Path, nodes: int, extra_conf: dict[str, str], history: Recorder
) -> JepsenCluster:
    """A classic group in `base_dir` given old messages and offsets, stopped, and returned
    as the `nodes`-member DLedger group it becomes (not started)."""
    classic = LocalClassicGroup(base_dir, 1, "SYNC_MASTER", extra_conf=extra_conf, **addressing(2))
    async with classic:
        await classic.create_topic(TOPIC, QUEUES)
        master = classic.ids[0]
        async with RemotingClient(classic.broker_addrs[master]) as client:
            for queue_id in range(QUEUES):
                queue = MessageQueue(TOPIC, classic.broker_name, queue_id)
                for seq in range(OLD_PER_QUEUE):
                    await _send_old(client, history, queue, f"{ERA}-{queue_id}-{seq}", master)
                await _commit_old(client, history, queue, OLD_PER_QUEUE // 2)
        await classic.wait_replicated()
    return classic.upgraded(nodes, JepsenCluster)


async def _send_old(
    client: RemotingClient, history: Recorder, queue: MessageQueue, value: str, node: str
) -> None:
    op = {"value": value, "key": queue.queue_id, "era": ERA}
    history.invoke(SETUP_PROCESS, "send", **op)
    request = send_request(
        RequestCode.SEND_MESSAGE_V2, PRODUCER_GROUP, queue, message_body(value, 0),
        WAIT_PROPERTIES, 0,
    )  # fmt: skip
    response = await client.invoke(request, SEND_TIMEOUT_S)
    if response.code != ResponseCode.SUCCESS:  # no fault yet: the set-up itself failed
        raise RuntimeError(f"old message {value}: code {response.code}: {response.remark}")
    ext = response.ext_fields
    history.complete(
        "ok", SETUP_PROCESS, "send", **op,
        offset=int(ext["queueOffset"]), node=node, msg_id=ext.get("msgId", ""),
    )  # fmt: skip


async def _commit_old(
    client: RemotingClient, history: Recorder, queue: MessageQueue, offset: int
) -> None:
    fields = {"group": RESUMING_GROUP, "key": queue.queue_id, "offset": offset}
    history.invoke(SETUP_PROCESS, "commit", **fields, era=ERA)
    ext = {
        "consumerGroup": RESUMING_GROUP,
        "topic": queue.topic,
        "queueId": str(queue.queue_id),
        "commitOffset": str(offset),
    }
    command = RemotingCommand(code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=ext)
    response = await client.invoke(command, SEND_TIMEOUT_S)
    if response.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"commit {fields}: code {response.code}: {response.remark}")
    history.complete("ok", SETUP_PROCESS, "commit", **fields, era=ERA)
