"""The queue workload: producers and consumers that record every operation.

Producers send unique values ("<process>-<seq>") to random queues of one topic, one
request per operation and no retries, except that a request with no answer after
0.3 s is sent again, with the same UNIQ_KEY and marked a resend, to each new master
the route names while it waits (`raftmq.client.hedge`, as our Producer does): the
broker answers a resend it already stores with that copy, so a value is stored at most
once unless the broker duplicates it. Outcomes are mapped conservatively (chaos.md
§5.2): `ok` only on SEND_OK; `fail` only when the message provably was not appended (no
route or master, the connection could not be opened, or the broker refused it before
appending, and no other attempt may have); everything else — a timeout, a lost
connection, SYSTEM_ERROR, the "stored but late" statuses — is `info`.

Consumers, one per queue in each consumer group (one group unless told more), pull
their queues through our PullConsumer (master first, then replicas), commit their
offsets every few hundred milliseconds, and after any failed pull go
back to the group's committed offset, as a restarted consumer would: that is what
re-delivers messages, and what shows whether committed offsets survive failover.
"""

from __future__ import annotations

import random

import trio

from jepsen.history import Recorder
from raftmq.client.consumer import PullConsumer, PullStatus, Subscription, pull_request, pull_result
from raftmq.client.errors import MQClientError
from raftmq.client.hedge import Hedger
from raftmq.client.instance import ClientInstance, local_ip
from raftmq.client.producer import RESEND_MARK, send_request
from raftmq.client.route import MessageQueue
from raftmq.protocol.message import MessageConst, MessageFormatError, properties_to_string
from raftmq.protocol.msgid import UniqIdGenerator
from raftmq.remoting import RemotingClient, RemotingError
from raftmq.remoting.codes import RequestCode, ResponseCode

TOPIC = "jepsen"
GROUP = "jepsen-consumers"
PRODUCER_GROUP = "jepsen-producers"
QUEUES = 4
SEND_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0
COMMIT_EVERY_S = 0.3
PULL_BATCH = 32
READ_RETRY_S = 15.0
PADDING = b"."
WAIT_PROPERTIES = properties_to_string({MessageConst.PROPERTY_WAIT_STORE_MSG_OK: "true"})
# What a request to a broker can raise: remoting's connect and timeout errors are
# OSErrors; RemotingError is a malformed frame; MQClientError the client's own;
# MessageFormatError a reply holding bytes that are not a message (a replica whose
# ConsumeQueue points at a rewritten log, as the unsafe page-cache mode can leave).
REQUEST_ERRORS = (OSError, RemotingError, MQClientError, MessageFormatError)
# Stored, but the broker could not confirm the flush or the replica copy in time.
MAYBE_STORED = frozenset(
    (
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
    )
)


def message_body(value: str, body_bytes: int) -> bytes:
    """The body carrying `value`, padded with dots to `body_bytes` (a soak sends messages of
    a realistic size); a value ("<process>-<seq>") holds no dot, so the padding strips off."""
    return value.encode().ljust(body_bytes, PADDING)


def message_value(body: bytes) -> str:
    return body.rstrip(PADDING).decode(errors="replace")


class Processes:
    """Process ids: each actor gets a fresh one whenever its op ended `info`."""

    def __init__(self) -> None:
        self._next = 0

    def new(self) -> int:
        self._next += 1
        return self._next


class Workload:
    def __init__(
        self,
        namesrv_addr: str,
        broker_name: str,
        node_of: dict[str, str],
        history: Recorder,
        rng: random.Random,
        producers: int = 6,
        consumers: int = 2,
        rate: float = 1000.0,
        body_bytes: int = 0,
        groups: tuple[str, ...] = (GROUP,),
    ) -> None:
        self.namesrv_addr = namesrv_addr
        self.broker_name = broker_name
        self.node_of = node_of  # broker address -> node id
        self.history = history
        self.rng = rng
        self.producers = producers
        self.consumers = consumers
        self.rate = rate
        self.body_bytes = body_bytes  # bodies padded to this size (see message_body)
        self.groups = groups  # the consumer groups, each reading every queue
        self.processes = Processes()
        self._uniq_ids = UniqIdGenerator(ip=local_ip())
        self.producing = True
        self.drain_to: dict[int, int] | None = None  # queue -> offset the consumers must reach
        # group -> queue -> the group's consumer's next offset
        self.positions: dict[str, dict[int, int]] = {group: {} for group in groups}
        self.drained = trio.Event()
        self.sends_done = trio.Event()  # the producers stopped sending
        self.hedger: Hedger | None = None  # the producers' (`produce`)

    def queue(self, queue_id: int) -> MessageQueue:
        return MessageQueue(TOPIC, self.broker_name, queue_id)

    # ------------------------------------------------------------------ producers
    async def produce(self) -> None:
        client = ClientInstance(self.namesrv_addr, rpc_timeout_s=SEND_TIMEOUT_S)
        self.hedger = Hedger(client)
        async with client, trio.open_nursery() as nursery:
            for _ in range(self.producers):
                nursery.start_soon(self._producer, client)
        self.sends_done.set()

    async def settle(self, master_address: str) -> bool:
        """Wait, after the faults, for what the broker still owes the history before the
        drain (nothing, for plain sends); returns whether it came."""
        return True

    def _operation(self, process: int, seq: int) -> dict:
        """The fields of a send's invoke: a unique value and the queue it goes to."""
        return {"value": f"{process}-{seq}", "key": self.rng.randrange(QUEUES)}

    async def _perform(self, client: ClientInstance, op: dict) -> tuple[str, dict]:
        """(outcome, completion fields) of the send `op`."""
        return await self._send(client, op["value"], op["key"])

    async def _producer(self, client: ClientInstance) -> None:
        process = self.processes.new()
        seq = 0
        interval = self.producers / self.rate if self.rate > 0 else 0.0
        while self.producing:
            started = trio.current_time()
            op = self._operation(process, seq)
            seq += 1
            self.history.invoke(process, "send", **op)
            outcome, fields = await self._perform(client, op)
            self.history.complete(outcome, process, "send", **op, **fields)
            if outcome == "info":
                process, seq = self.processes.new(), 0
            pause = interval - (trio.current_time() - started)
            if outcome != "ok":
                pause = max(pause, 0.05)
            if pause > 0:
                await trio.sleep(pause)

    async def _connect(self, client: ClientInstance):
        """(connection, master address, None) or (None, None, why): nothing sent yet."""
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            try:
                master = (await client.routes.get(TOPIC)).master(self.broker_name)
                if master is None:
                    return None, None, "no master in the route"
                return await client.pool.get(master), master, None
            except REQUEST_ERRORS as exc:
                return None, None, str(exc)
        return None, None, "no connection within the connect timeout"

    async def _send(
        self, client: ClientInstance, value: str, queue_id: int, properties: str = WAIT_PROPERTIES
    ):
        connection, master, why = await self._connect(client)
        if connection is None:
            client.routes.invalidate(TOPIC)
            return "fail", {"error": why}
        body = message_body(value, self.body_bytes)
        uniq_key = self._uniq_ids.next_id()
        properties += properties_to_string(
            {MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq_key}
        )

        def make_request(mq: MessageQueue, resend: bool):
            marked = properties + RESEND_MARK if resend else properties
            return send_request(RequestCode.SEND_MESSAGE_V2, PRODUCER_GROUP, mq, body, marked, 0)

        try:
            sent = await self.hedger.send(
                self.queue(queue_id),
                master,
                make_request,
                trio.current_time() + SEND_TIMEOUT_S,
                resend=False,
            )
        except REQUEST_ERRORS as exc:  # a malformed answer: it may have been stored
            client.routes.invalidate(TOPIC)
            node = self.node_of.get(master, master)
            return "info", {"error": f"{type(exc).__name__}: {exc}", "node": node}
        response, unknown, node = sent.response, sent.unknown, self.node_of.get(sent.address)
        if response is None:
            client.routes.invalidate(TOPIC)
            return ("info" if unknown else "fail"), {"error": sent.reason, "node": node}
        if response.code == ResponseCode.SUCCESS:
            ext = response.ext_fields
            return "ok", {
                "offset": int(ext["queueOffset"]),
                "node": node,
                "msg_id": ext.get("msgId", ""),
            }
        error = f"code {response.code}: {response.remark}"
        if response.code in MAYBE_STORED or unknown:
            return "info", {"error": error, "node": node, "code": response.code}
        client.routes.invalidate(TOPIC)
        return "fail", {"error": error, "node": node}

    # ------------------------------------------------------------------ consumers
    async def consume(self) -> None:
        async with trio.open_nursery() as nursery:
            for group in self.groups:
                nursery.start_soon(self._consume_group, group)
        self.drained.set()

    async def _consume_group(self, group: str) -> None:
        consumer = PullConsumer(self.namesrv_addr, group, rpc_timeout_s=2.0)
        async with consumer, trio.open_nursery() as nursery:
            for queue_id in range(QUEUES):
                nursery.start_soon(self._consumer, consumer, queue_id)

    def _caught_up(self, queue_id: int, offset: int) -> bool:
        return self.drain_to is not None and offset >= self.drain_to.get(queue_id, 0)

    async def _consumer(self, consumer: PullConsumer, queue_id: int) -> None:
        mq = self.queue(queue_id)
        group = consumer.group
        process = self.processes.new()
        offset = None
        committed_at = trio.current_time()
        while True:
            if offset is None:
                process, offset = await self._fetch_offset(consumer, process, queue_id)
                continue
            self.positions[group][queue_id] = offset
            if self._caught_up(queue_id, offset):
                process, _ = await self._commit(consumer, process, queue_id, offset)
                return
            self.history.invoke(process, "poll", key=queue_id, offset=offset, group=group)
            try:
                result = await consumer.pull(
                    mq, offset, PULL_BATCH, long_poll_s=0.5, timeout_s=SEND_TIMEOUT_S
                )
            except REQUEST_ERRORS as exc:
                # A read changes nothing, so a failed one is `fail`, never `info`.
                self.history.complete(
                    "fail", process, "poll", key=queue_id, group=group, error=str(exc)
                )
                offset = None  # start again from the committed offset, as a new consumer would
                await trio.sleep(0.1)
                continue
            values = [[m.queue_offset, message_value(m.body)] for m in result.messages]
            next_offset = result.next_begin_offset
            if result.status is PullStatus.OFFSET_ILLEGAL:
                next_offset = max(offset, result.min_offset)
            self.history.complete(
                "ok",
                process,
                "poll",
                key=queue_id,
                group=group,
                offset=offset,
                value=values,
                next_offset=next_offset,
            )
            offset = next_offset
            if trio.current_time() - committed_at >= COMMIT_EVERY_S:
                committed_at = trio.current_time()
                process, _ = await self._commit(consumer, process, queue_id, offset)

    async def _fetch_offset(self, consumer: PullConsumer, process: int, queue_id: int):
        group = consumer.group
        self.history.invoke(process, "fetch_offset", group=group, key=queue_id)
        try:
            committed = await consumer.query_offset(self.queue(queue_id))
        except REQUEST_ERRORS as exc:
            self.history.complete(
                "fail", process, "fetch_offset", group=group, key=queue_id, error=str(exc)
            )
            await trio.sleep(0.1)
            return process, None
        offset = -1 if committed is None else committed
        self.history.complete(
            "ok", process, "fetch_offset", group=group, key=queue_id, offset=offset
        )
        return process, max(offset, 0)

    async def _commit(self, consumer: PullConsumer, process: int, queue_id: int, offset: int):
        group = consumer.group
        self.history.invoke(process, "commit", group=group, key=queue_id, offset=offset)
        try:
            await consumer.update_offset(self.queue(queue_id), offset)
        except REQUEST_ERRORS as exc:
            self.history.complete(
                "info", process, "commit", group=group, key=queue_id, error=str(exc)
            )
            return self.processes.new(), False
        self.history.complete("ok", process, "commit", group=group, key=queue_id, offset=offset)
        return process, True


async def read_queue(
    address: str, mq: MessageQueue, errors: list[str] | None = None
) -> list[tuple[int, str]]:
    """Every committed message of `mq` that the member at `address` serves, in order.

    A member just restarted may refuse a pull for a moment (still recovering, or
    its connection just reset): each request is retried for up to READ_RETRY_S. A
    reply that does not decode ends the read there; the reason goes to `errors`."""
    found: list[tuple[int, str]] = []
    subscription = Subscription(mq.topic, "*", 0)
    offset = 0
    while True:
        request = pull_request("jepsen-reader", mq, offset, PULL_BATCH, subscription)
        try:
            result = await _pull_retrying(address, request, offset, subscription)
        except MessageFormatError as exc:
            if errors is not None:
                errors.append(f"{address} {mq.topic}/{mq.queue_id} at {offset}: {exc}")
            return found
        if result.status is PullStatus.OFFSET_ILLEGAL and result.min_offset > offset:
            offset = result.min_offset
            continue
        if result.status is not PullStatus.FOUND:
            return found
        found.extend((m.queue_offset, message_value(m.body)) for m in result.messages)
        offset = result.next_begin_offset


async def wait_stored(
    master_address: str, queues: list[MessageQueue], values: set[str], timeout_s: float
) -> bool:
    """Until the master's `queues` hold every one of `values` (True), or `timeout_s` passed."""
    with trio.move_on_after(timeout_s):
        while True:
            stored = set()
            for mq in queues:
                stored.update(value for _offset, value in await read_queue(master_address, mq))
            if values <= stored:
                return True
            await trio.sleep(0.5)
    return False


async def _pull_retrying(address, request, offset, subscription):
    deadline = trio.current_time() + READ_RETRY_S
    while True:
        try:
            async with RemotingClient(address) as client:
                response = await client.invoke(request, 5.0)
            return pull_result(response, offset, subscription, address)
        except (OSError, RemotingError, MQClientError):
            if trio.current_time() >= deadline:
                raise
            await trio.sleep(0.2)
