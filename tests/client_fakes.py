"""A name server and in-memory broker members for the client tests.

`FakeBroker` is a real remoting server that answers the requests a client sends the
way a raftmq broker group member does — sends, long-polling pulls, offsets, heartbeats
and membership, send-back — from a `FakeStore` its "replicas" share, so the queue
offsets and physical offsets are the same on every member. A slave refuses writes
with SERVICE_NOT_AVAILABLE "not master". Tests steer a member with `answer`, which
replaces the handler of one request code. What is under test is the client.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Awaitable, Callable

import trio
from raftmq.namesrv import NamesrvConfig, NamesrvServer

from raftmq.protocol.message import MessageConst, MessageExt, decode, encode, string_to_properties
from raftmq.remoting import (
    Connection,
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingServer,
    RequestCode,
    ResponseCode,
)

Handler = Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand | None]]
_BATCH_ITEM = struct.Struct(">iiiii")


async def start_namesrv(nursery: trio.Nursery) -> str:
    server = NamesrvServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    await nursery.start(server.serve)
    return f"127.0.0.1:{server.port}"


def register_request(
    broker_name: str, address: str, broker_id: int, topics: dict[str, int]
) -> RemotingCommand:
    table = {
        topic: {"topicName": topic, "readQueueNums": n, "writeQueueNums": n, "perm": 6}
        for topic, n in topics.items()
    }
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": table}}).encode()
    fields = {
        "brokerName": broker_name,
        "brokerAddr": address,
        "clusterName": "DefaultCluster",
        "haServerAddr": address,
        "brokerId": broker_id,
    }
    return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=fields, body=body)


async def group_of(
    nursery: trio.Nursery,
    namesrv: str,
    members: int = 1,
    name: str = "broker-a",
    topics: dict[str, int] | None = None,
) -> tuple[FakeStore, list[FakeBroker]]:
    """Members of one broker group sharing a store, registered as ids 0, 1, ...; the
    first is the master. Topics default to "T" with 4 queues."""
    store = FakeStore(topics or {"T": 4})
    brokers = []
    for i in range(members):
        broker = FakeBroker(store, name, master=i == 0)
        await nursery.start(broker.run)
        await broker.register(namesrv, i)
        brokers.append(broker)
    return store, brokers


class FakeStore:
    """What the members of one fake broker group share: queues, offsets, members."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = dict(topics)
        self.queues: dict[tuple[str, int], list[MessageExt]] = {}
        self.by_physical: dict[int, MessageExt] = {}
        self.next_physical = 1000
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.members: dict[str, dict[str, Connection]] = {}  # group -> clientID -> conn
        self.arrived = trio.Event()

    def put(self, msg: MessageExt) -> MessageExt:
        queue = self.queues.setdefault((msg.topic, msg.queue_id), [])
        msg.queue_offset = len(queue)
        msg.physical_offset = self.next_physical
        msg.store_host = ("127.0.0.1", 10911)
        record = encode(msg)
        self.next_physical += len(record)
        stored, _ = decode(record)
        queue.append(stored)
        self.by_physical[stored.physical_offset] = stored
        self.arrived.set()
        self.arrived = trio.Event()
        return stored

    def notify(self, group: str) -> None:
        for connection in list(self.members.get(group, {}).values()):
            request = RemotingCommand(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields={"consumerGroup": group}
            )
            if not connection.closed:
                connection.invoke_oneway(request)


class FakeBroker:
    """One member of a broker group; it serves from `run` until `stop`."""

    def __init__(self, store: FakeStore, name: str = "broker-a", *, master: bool = True):
        self.store = store
        self.name = name
        self.master = master
        self.requests: list[RemotingCommand] = []
        self.connections: set[Connection] = set()
        self._handlers: dict[int, Handler] = {
            RequestCode.SEND_MESSAGE_V2: self._send,
            RequestCode.SEND_BATCH_MESSAGE: self._send,
            RequestCode.PULL_MESSAGE: self._pull,
            RequestCode.GET_MAX_OFFSET: self._max_offset,
            RequestCode.GET_MIN_OFFSET: self._min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset,
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_offset,
            RequestCode.HEART_BEAT: self._heartbeat,
            RequestCode.UNREGISTER_CLIENT: self._unregister,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self._send_back,
        }
        self.server = RemotingServer(
            "127.0.0.1",
            0,
            ProcessorTable(default=self._process),
            on_connect=self.connections.add,
            on_disconnect=self.connections.discard,
        )
        self._nursery: trio.Nursery | None = None
        self._stopped = trio.Event()
        self._namesrv_links: dict[str, RemotingClient] = {}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def codes(self) -> list[int]:
        return [r.code for r in self.requests]

    def answer(self, code: int, handler: Handler) -> None:
        self._handlers[code] = handler

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`: `await nursery.start(broker.run)`."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.server.serve)
                task_status.started()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        """Like a killed process: stop listening, drop every connection (the name
        servers forget this member at once)."""
        self._nursery.cancel_scope.cancel()
        await self._stopped.wait()

    async def register(self, namesrv_addr: str, broker_id: int) -> None:
        """REGISTER_BROKER with the store's topics, over a connection kept open."""
        link = self._namesrv_links.get(namesrv_addr)
        if link is None:
            link = self._namesrv_links[namesrv_addr] = await self._nursery.start(
                self._hold_link, namesrv_addr
            )
        request = register_request(self.name, self.address, broker_id, self.store.topics)
        response = await link.invoke(request)
        assert response.code == ResponseCode.SUCCESS, response.remark

    async def _hold_link(self, namesrv_addr: str, task_status=trio.TASK_STATUS_IGNORED):
        async with RemotingClient(namesrv_addr) as link:
            task_status.started(link)
            await trio.sleep_forever()

    async def _process(self, request: RemotingCommand, connection: Connection):
        self.requests.append(request)
        handler = self._handlers.get(request.code)
        if handler is None:
            return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "fake")
        return await handler(request, connection)

    def _not_master(self, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "not master: slave")

    # -- sends ----------------------------------------------------------------------
    async def _send(self, request: RemotingCommand, connection: Connection):
        if not self.master:
            return self._not_master(request)
        f = request.ext_fields
        topic, queue_id = f["b"], int(f["e"])
        if topic not in self.store.topics:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic}")
        if request.code == RequestCode.SEND_BATCH_MESSAGE:
            items = decode_batch(request.body)
        else:
            items = [(request.body, string_to_properties(f["i"]), int(f["f"]))]
        stored = []
        for body, props, sysflag in items:
            props.pop(MessageConst.PROPERTY_WAIT_STORE_MSG_OK, None)
            msg = MessageExt(topic, body, props, queue_id=queue_id, sysflag=sysflag)
            msg.born_timestamp = int(f["g"])
            stored.append(self.store.put(msg))
        ext = {
            "msgId": ",".join(m.msg_id for m in stored),
            "queueId": str(queue_id),
            "queueOffset": str(stored[0].queue_offset),
        }
        return request.make_response(ResponseCode.SUCCESS, ext_fields=ext)

    async def _send_back(self, request: RemotingCommand, connection: Connection):
        if not self.master:
            return self._not_master(request)
        f = request.ext_fields
        original = self.store.by_physical[int(f["offset"])]
        retry = f"%RETRY%{f['group']}"
        props = dict(original.properties)
        props.setdefault(MessageConst.PROPERTY_RETRY_TOPIC, original.topic)
        props[MessageConst.PROPERTY_ORIGIN_MESSAGE_ID] = f["originMsgId"]
        msg = MessageExt(retry, original.body, props, reconsume_times=original.reconsume_times + 1)
        self.store.put(msg)
        return request.make_response(ResponseCode.SUCCESS)

    # -- reads ----------------------------------------------------------------------
    def _queue(self, request: RemotingCommand) -> list[MessageExt]:
        f = request.ext_fields
        return self.store.queues.get((f["topic"], int(f["queueId"])), [])

    async def _pull(self, request: RemotingCommand, connection: Connection):
        f = request.ext_fields
        offset, sysflag = int(f["queueOffset"]), int(f["sysFlag"])
        if sysflag & 1 and self.master:
            key = (f["consumerGroup"], f["topic"], int(f["queueId"]))
            self.store.offsets[key] = int(f["commitOffset"])
        if sysflag & 2 and offset == len(self._queue(request)):
            with trio.move_on_after(int(f["suspendTimeoutMillis"]) / 1000):
                while offset == len(self._queue(request)):
                    await self.store.arrived.wait()
        queue = self._queue(request)
        ext = {"minOffset": "0", "maxOffset": str(len(queue)), "suggestWhichBrokerId": "0"}
        if offset > len(queue) or (not queue and offset):
            ext["nextBeginOffset"] = str(len(queue))
            return request.make_response(ResponseCode.PULL_OFFSET_MOVED, ext_fields=ext)
        found = queue[offset : offset + int(f["maxMsgNums"])]
        ext["nextBeginOffset"] = str(offset + len(found))
        if not found:
            return request.make_response(ResponseCode.PULL_NOT_FOUND, ext_fields=ext)
        body = b"".join(encode(m) for m in found)
        return request.make_response(ResponseCode.SUCCESS, ext_fields=ext, body=body)

    async def _max_offset(self, request: RemotingCommand, connection: Connection):
        return _offset(request, len(self._queue(request)))

    async def _min_offset(self, request: RemotingCommand, connection: Connection):
        return _offset(request, 0)

    async def _search_offset(self, request: RemotingCommand, connection: Connection):
        stamp = int(request.ext_fields["timestamp"])
        queue = self._queue(request)
        return _offset(
            request, next((m.queue_offset for m in queue if m.born_timestamp >= stamp), len(queue))
        )

    # -- consumer groups ------------------------------------------------------------
    async def _query_offset(self, request: RemotingCommand, connection: Connection):
        f = request.ext_fields
        offset = self.store.offsets.get((f["consumerGroup"], f["topic"], int(f["queueId"])))
        if offset is None:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND, "no offset")
        return _offset(request, offset)

    async def _update_offset(self, request: RemotingCommand, connection: Connection):
        if not self.master:
            return self._not_master(request)
        f = request.ext_fields
        key = (f["consumerGroup"], f["topic"], int(f["queueId"]))
        self.store.offsets[key] = int(f["commitOffset"])
        return request.make_response(ResponseCode.SUCCESS)

    async def _heartbeat(self, request: RemotingCommand, connection: Connection):
        data = json.loads(request.body)
        for consumer in data["consumerDataSet"]:
            members = self.store.members.setdefault(consumer["groupName"], {})
            new = data["clientID"] not in members
            members[data["clientID"]] = connection
            if new:
                self.store.notify(consumer["groupName"])
        return request.make_response(ResponseCode.SUCCESS)

    async def _unregister(self, request: RemotingCommand, connection: Connection):
        f = request.ext_fields
        group = f.get("consumerGroup")
        if group and self.store.members.get(group, {}).pop(f["clientID"], None):
            self.store.notify(group)
        return request.make_response(ResponseCode.SUCCESS)

    async def _consumer_list(self, request: RemotingCommand, connection: Connection):
        members = self.store.members.get(request.ext_fields["consumerGroup"])
        if not members:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "no consumer for this group")
        body = json.dumps({"consumerIdList": sorted(members)}).encode()
        return request.make_response(ResponseCode.SUCCESS, body=body)


def _offset(request: RemotingCommand, offset: int) -> RemotingCommand:
    return request.make_response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})


def decode_batch(body: bytes) -> list[tuple[bytes, dict[str, str], int]]:
    """A SEND_BATCH_MESSAGE body as the broker reads it: (body, properties, sysflag)."""
    items, pos = [], 0
    while pos < len(body):
        total, magic, crc, flag, body_len = _BATCH_ITEM.unpack_from(body, pos)
        assert (magic, crc, flag) == (0, 0, 0)
        start = pos + _BATCH_ITEM.size
        (props_len,) = struct.unpack_from(">h", body, start + body_len)
        props = body[start + body_len + 2 : start + body_len + 2 + props_len].decode()
        assert total == _BATCH_ITEM.size + body_len + 2 + props_len
        items.append((body[start : start + body_len], string_to_properties(props), 0))
        pos += total
    return items


def inflated(msg: MessageExt) -> bytes:
    """A stored body as the application sent it."""
    return zlib.decompress(msg.body) if msg.sysflag & 1 else msg.body
