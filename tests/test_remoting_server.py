"""RemotingServer and RemotingClient over real TCP on 127.0.0.1.

Ports are picked by the OS and every wait is under a `fail_after`, so a regression
shows as a failure rather than a hung run. Where the claim is about bytes on the wire
(no response to a oneway request, the response's serialize type, a closed
connection) the test reads the raw socket instead of trusting our own client.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import trio

from raftmq.remoting import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    Connection,
    LanguageCode,
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RemotingServer,
    RemotingTimeoutError,
    RequestCode,
    ResponseCode,
    Route,
    SerializeType,
    encode,
)
from raftmq.remoting.frames import FrameReader

ECHO = RequestCode.HEART_BEAT
SLOW = RequestCode.PULL_MESSAGE
ONEWAY = RequestCode.UPDATE_CONSUMER_OFFSET
BOOM = RequestCode.CONSUMER_SEND_MSG_BACK
HUGE = RequestCode.GET_CONSUMER_LIST_BY_GROUP
DROP = RequestCode.LOCK_BATCH_MQ


class Broker:
    """Processors for the tests, and what they saw."""

    def __init__(self) -> None:
        self.oneway_seen: list[RemotingCommand] = []
        self.oneway_event = trio.Event()
        self.connected: list[Connection] = []
        self.disconnected: list[Connection] = []
        self.table = ProcessorTable(
            {
                ECHO: self.echo,
                SLOW: self.slow,
                ONEWAY: self.oneway,
                BOOM: self.boom,
                HUGE: self.huge,
                DROP: self.drop,
            }
        )

    async def echo(self, request, connection):
        # Built from scratch, not with make_response: the server must stamp the
        # request's opaque and serialize type and the response flag itself.
        return RemotingCommand(
            code=ResponseCode.SUCCESS, ext_fields=dict(request.ext_fields), body=request.body
        )

    async def slow(self, request, connection):
        await trio.sleep(float(request.ext_fields["sleep_s"]))
        return request.make_response(ResponseCode.PULL_NOT_FOUND, "slept")

    async def oneway(self, request, connection):
        await trio.sleep(float(request.ext_fields.get("sleep_s", 0)))
        self.oneway_seen.append(request)
        self.oneway_event.set()
        return request.make_response(ResponseCode.SUCCESS)  # must not be sent

    async def boom(self, request, connection):
        raise RuntimeError("boom")

    async def huge(self, request, connection):
        return request.make_response(ResponseCode.SUCCESS, body=b"x" * 70_000)

    async def drop(self, request, connection):
        connection.close("dropped by the test")
        await trio.sleep_forever()


@pytest.fixture
async def broker(nursery):
    broker = Broker()
    server = RemotingServer(
        "127.0.0.1",
        0,
        broker.table,
        max_frame_bytes=64 * 1024,
        on_connect=broker.connected.append,
        on_disconnect=broker.disconnected.append,
    )
    await nursery.start(server.serve)
    broker.server = server
    broker.address = f"127.0.0.1:{server.port}"
    return broker


def echo_request(i: int = 0, serialize_type=SerializeType.JSON) -> RemotingCommand:
    return RemotingCommand(
        code=ECHO,
        ext_fields={"i": str(i)},
        body=f"body-{i}".encode(),
        serialize_type=serialize_type,
    )


async def test_200_concurrent_invokes_each_get_their_own_response(broker):
    results = {}

    async def one(client, i):
        kind = SerializeType.JSON if i % 2 else SerializeType.ROCKETMQ
        results[i] = await client.invoke(echo_request(i, kind), timeout_s=5)

    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client:
            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(one, client, i)
            assert client.in_flight == 0
    assert len(results) == 200
    for i, response in results.items():
        assert response.code == ResponseCode.SUCCESS
        assert response.is_response
        assert response.ext_fields == {"i": str(i)}
        assert response.body == f"body-{i}".encode()
        assert response.serialize_type == (SerializeType.JSON if i % 2 else SerializeType.ROCKETMQ)
    assert len({r.opaque for r in results.values()}) == 200


async def test_a_slow_request_does_not_hold_up_later_ones(broker):
    done = []

    async def call(client, request, name):
        await client.invoke(request, timeout_s=5)
        done.append(name)

    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client, trio.open_nursery() as nursery:
            slow = RemotingCommand(code=SLOW, ext_fields={"sleep_s": "0.3"})
            nursery.start_soon(call, client, slow, "slow")
            await trio.sleep(0.05)
            nursery.start_soon(call, client, echo_request(), "fast")
    assert done == ["fast", "slow"]


async def raw_connection(broker) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", broker.server.port)


async def test_oneway_requests_get_no_response(broker):
    with trio.fail_after(5):
        # Through the client: the processor runs.
        async with RemotingClient(broker.address) as client:
            client.invoke_oneway(RemotingCommand(code=ONEWAY, ext_fields={"commitOffset": "7"}))
            await broker.oneway_event.wait()
        assert broker.oneway_seen[0].is_oneway
        assert broker.oneway_seen[0].ext_fields == {"commitOffset": "7"}
        # On the wire: once the oneway request has been processed, the first thing
        # back is the answer to the request sent after it.
        broker.oneway_event = trio.Event()
        stream = await raw_connection(broker)
        await stream.send_all(encode(RemotingCommand(code=ONEWAY, opaque=1, flag=FLAG_ONEWAY)))
        await broker.oneway_event.wait()
        await stream.send_all(encode(RemotingCommand(code=ECHO, opaque=2)))
        first = await anext(FrameReader(stream))
        assert (first.code, first.opaque) == (ResponseCode.SUCCESS, 2)
        assert len(broker.oneway_seen) == 2
        await stream.aclose()


@pytest.mark.parametrize("serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ])
async def test_response_uses_the_request_serialize_type_on_the_wire(broker, serialize_type):
    with trio.fail_after(5):
        stream = await raw_connection(broker)
        request = RemotingCommand(
            code=ECHO, language=LanguageCode.JAVA, opaque=41, serialize_type=serialize_type
        )
        await stream.send_all(encode(request))
        data = b""
        while len(data) < 8:
            data += await stream.receive_some()
        assert data[4] == serialize_type  # the high byte of the header-length field
        response = await anext(FrameReader(_Prepend(data, stream)))
        assert response.serialize_type == serialize_type
        assert (response.opaque, response.flag & FLAG_RESPONSE) == (41, FLAG_RESPONSE)
        await stream.aclose()


class _Prepend(trio.abc.ReceiveStream):
    def __init__(self, first: bytes, stream: trio.abc.ReceiveStream) -> None:
        self._first = first
        self._stream = stream

    async def receive_some(self, max_bytes=None):
        if self._first:
            first, self._first = self._first, b""
            return first
        return await self._stream.receive_some(max_bytes)

    async def aclose(self):
        await self._stream.aclose()


async def test_unknown_code_is_not_supported(broker):
    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client:
            response = await client.invoke(RemotingCommand(code=999))
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert response.remark == " request type 999 not supported"


async def test_processor_exception_is_a_system_error_and_the_server_carries_on(broker, caplog):
    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client:
            response = await client.invoke(RemotingCommand(code=BOOM))
            assert response.code == ResponseCode.SYSTEM_ERROR
            assert response.remark == "RuntimeError: boom"
            again = await client.invoke(echo_request(5))
            assert again.ext_fields == {"i": "5"}
    assert any("processor failed" in r.message and r.exc_info for r in caplog.records)


async def test_unencodable_response_becomes_a_system_error(broker):
    """The processor's response is larger than the server's frame limit."""
    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client:
            response = await client.invoke(RemotingCommand(code=HUGE))
            assert response.code == ResponseCode.SYSTEM_ERROR
            assert "exceeds the 65536-byte limit" in response.remark
            assert (await client.invoke(echo_request())).code == ResponseCode.SUCCESS


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # length field 0x47455420: too large
        b"\x00\x00\x00\x08\x07\x00\x00\x00garbage!",  # serialize type 7
        b"\x00\x00\x00\x0a\x00\x00\x00\x02[]junk",  # JSON header that is not an object
    ],
)
async def test_garbage_closes_only_that_connection(broker, caplog, garbage):
    caplog.set_level(logging.WARNING, logger="raftmq.remoting")
    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client:
            assert (await client.invoke(echo_request(1))).code == ResponseCode.SUCCESS
            stream = await raw_connection(broker)
            await stream.send_all(garbage)
            assert await stream.receive_some() == b""  # the server closed it
            await stream.aclose()
            # The other connection, and new ones, are served as before.
            assert (await client.invoke(echo_request(2))).ext_fields == {"i": "2"}
        async with RemotingClient(broker.address) as other:
            assert (await other.invoke(echo_request(3))).ext_fields == {"i": "3"}
    assert any("closing connection" in r.message for r in caplog.records)


async def test_connection_failure_fails_every_pending_call(broker):
    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client:
            errors = []

            async def pending():
                with pytest.raises(RemotingConnectError) as info:
                    await client.invoke(RemotingCommand(code=SLOW, ext_fields={"sleep_s": "10"}))
                errors.append(info.value)

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(pending)
                await trio.sleep(0.05)
                nursery.start_soon(pending)
                await trio.sleep(0.05)
                with pytest.raises(RemotingConnectError):
                    await client.invoke(RemotingCommand(code=DROP))
            assert len(errors) == 4
            assert "closed by the peer" in str(errors[0])
            assert client.closed
            with pytest.raises(RemotingConnectError):
                await client.invoke(echo_request())
            with pytest.raises(RemotingConnectError):
                client.invoke_oneway(echo_request())


async def test_timeout_leaves_the_connection_usable(broker):
    with trio.fail_after(5):
        async with RemotingClient(broker.address) as client:
            started = trio.current_time()
            with pytest.raises(RemotingTimeoutError, match="request code 11"):
                await client.invoke(
                    RemotingCommand(code=SLOW, ext_fields={"sleep_s": "0.5"}), timeout_s=0.1
                )
            assert trio.current_time() - started < 0.4
            assert (await client.invoke(echo_request(9))).ext_fields == {"i": "9"}
            assert client.in_flight == 0


async def test_connect_failure_is_a_clear_error():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    with trio.fail_after(5), pytest.raises(RemotingConnectError, match="cannot connect to"):
        async with RemotingClient(f"127.0.0.1:{port}"):
            pass


async def test_server_initiated_requests_reach_the_client_processor(broker):
    notified = trio.Event()

    async def notify(request, connection):
        assert request.ext_fields == {"consumerGroup": "G"}
        notified.set()

    async def running_info(request, connection):
        return request.make_response(ResponseCode.SUCCESS, body=b'{"properties":{}}')

    client_table = ProcessorTable(
        {
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: notify,
            RequestCode.GET_CONSUMER_RUNNING_INFO: running_info,
        }
    )
    with trio.fail_after(5):
        async with RemotingClient(broker.address, processor=client_table) as client:
            await client.invoke(echo_request())  # the server has seen the connection
            (connection,) = broker.connected
            connection.invoke_oneway(
                RemotingCommand(
                    code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                    ext_fields={"consumerGroup": "G"},
                )
            )
            await notified.wait()
            info = await connection.invoke(
                RemotingCommand(code=RequestCode.GET_CONSUMER_RUNNING_INFO), timeout_s=2
            )
            assert info.body == b'{"properties":{}}'
            unknown = await connection.invoke(RemotingCommand(code=RequestCode.CHECK_CLIENT_CONFIG))
            assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        await connection.wait_closed()
    assert broker.disconnected == [connection]
    assert connection not in broker.server.connections
    with pytest.raises(RemotingConnectError):
        connection.send(RemotingCommand())


async def test_requests_received_before_the_peer_left_still_complete(broker):
    """A oneway offset commit sent just before a client exits is not lost."""
    with trio.fail_after(5):
        stream = await raw_connection(broker)
        oneway = RemotingCommand(code=ONEWAY, opaque=2, flag=FLAG_ONEWAY)
        oneway.ext_fields["sleep_s"] = "0.1"  # still working when the peer's EOF arrives
        await stream.send_all(encode(oneway))
        await stream.aclose()
        await broker.oneway_event.wait()
    assert broker.oneway_seen[0].opaque == 2
    assert broker.disconnected  # the connection had ended while the processor ran


async def test_server_shutdown_tells_on_disconnect_and_fails_pending_calls():
    broker = Broker()
    disconnected = []
    server = RemotingServer("127.0.0.1", 0, broker.table, on_disconnect=disconnected.append)
    server_scope = trio.CancelScope()

    async def serve(task_status=trio.TASK_STATUS_IGNORED):
        with server_scope:
            await server.serve(task_status=task_status)

    async def pending_call(client):
        with pytest.raises(RemotingConnectError, match="closed by the peer"):
            await client.invoke(RemotingCommand(code=SLOW, ext_fields={"sleep_s": "10"}))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve)
            async with RemotingClient(f"127.0.0.1:{port}") as client:
                assert (await client.invoke(echo_request())).code == ResponseCode.SUCCESS
                (connection,) = server.connections
                async with trio.open_nursery() as calls:
                    calls.start_soon(pending_call, client)
                    await trio.sleep(0.05)
                    server_scope.cancel()
    assert disconnected == [connection]
    assert not server.connections


async def test_a_peer_that_stops_reading_is_disconnected(caplog):
    """Responses queue up to max_pending_bytes for a client that never reads, then the
    server hangs up rather than buffer without bound."""
    broker = Broker()
    gone = trio.Event()
    server = RemotingServer(
        "127.0.0.1", 0, broker.table, max_pending_bytes=1 << 20, on_disconnect=lambda c: gone.set()
    )
    request = encode(RemotingCommand(code=ECHO, body=b"x" * 60_000))
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            with contextlib.suppress(trio.BrokenResourceError):  # the server hangs up midway
                for _ in range(500):
                    await stream.send_all(request)
            await gone.wait()
            await stream.aclose()
            nursery.cancel_scope.cancel()
    assert any("the peer is not reading" in r.message for r in caplog.records)


async def test_requests_past_the_cap_in_flight_are_answered_busy(nursery):
    """A client pipelining slow requests without end (held pulls, say) gets SYSTEM_BUSY
    past `max_running_requests` instead of a task per request; the capacity comes back
    as the running ones finish."""
    broker = Broker()
    server = RemotingServer("127.0.0.1", 0, broker.table, max_running_requests=5)
    port = await nursery.start(server.serve)
    slow = {"sleep_s": "0.5"}
    async with RemotingClient(f"127.0.0.1:{port}") as client:
        codes = []

        async def call() -> None:
            request = RemotingCommand(code=SLOW, ext_fields=dict(slow))
            codes.append((await client.invoke(request, 5.0)).code)

        with trio.fail_after(5):
            async with trio.open_nursery() as calls:
                for _ in range(8):
                    calls.start_soon(call)
        assert sorted(codes) == [ResponseCode.SYSTEM_BUSY] * 3 + [ResponseCode.PULL_NOT_FOUND] * 5
        later = await client.invoke(RemotingCommand(code=SLOW, ext_fields=dict(slow)), 5.0)
        assert later.code == ResponseCode.PULL_NOT_FOUND  # the five are done: room again


async def test_an_inline_handler_that_fails_leaves_what_another_took_answered_once(broker):
    """Two inline handlers get the requests of one read: the first answers its request
    inline, the second raises before taking its own. Only the second's request goes to
    the task path; the first's is not run a second time (it was answered twice)."""
    taken = []

    def answer_inline(requests, connection):
        for request in requests:
            taken.append(request.opaque)
            connection.respond(request, request.make_response(ResponseCode.SUCCESS, "inline"))
        return []

    def fail_inline(requests, connection):
        raise RuntimeError("injected: the second inline handler failed")

    broker.table.register(ECHO, Route(broker.echo, answer_inline))
    broker.table.register(BOOM, Route(broker.boom, fail_inline))
    stream = await trio.open_tcp_stream("127.0.0.1", broker.server.port)
    requests = [
        RemotingCommand(code=ECHO, opaque=1),
        RemotingCommand(code=BOOM, opaque=2),
        RemotingCommand(code=ECHO, opaque=3),
    ]
    await stream.send_all(b"".join(encode(r) for r in requests))
    reader = FrameReader(stream)
    answers: dict[int, list[str]] = {}
    with trio.move_on_after(1.0):  # long enough for an answer given twice to arrive
        async for response in reader:
            answers.setdefault(response.opaque, []).append(response.remark)
    await stream.aclose()
    assert taken == [1, 3]
    assert answers == {1: ["inline"], 2: ["RuntimeError: boom"], 3: ["inline"]}


async def test_an_inline_handler_whose_invariant_breaks_ends_the_connection_and_reruns_nothing(
    broker,
):
    """An AssertionError is a broken invariant, perhaps after the handler took requests
    (a send it handed to the store): none of them goes to the task path, where it would
    be run a second time; the connection ends instead."""
    taken = []

    def answer_then_break(requests, connection):
        for request in requests:
            taken.append(request.opaque)
            connection.respond(request, request.make_response(ResponseCode.SUCCESS, "inline"))
        raise AssertionError("injected: an invariant broke after the requests were taken")

    broker.table.register(ECHO, Route(broker.echo, answer_then_break))
    stream = await trio.open_tcp_stream("127.0.0.1", broker.server.port)
    requests = [RemotingCommand(code=ECHO, opaque=1), RemotingCommand(code=ECHO, opaque=2)]
    await stream.send_all(b"".join(encode(r) for r in requests))
    answers: dict[int, list[str]] = {}
    with trio.fail_after(5):  # the connection ends: the read loop stops
        async for response in FrameReader(stream):
            answers.setdefault(response.opaque, []).append(response.remark)
    await stream.aclose()
    assert taken == [1, 2]
    assert answers == {1: ["inline"], 2: ["inline"]}
