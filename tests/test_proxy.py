"""mqproxy in process: SendMessage's checks, the FIFO queue choice, the Settings merge,
QueryRoute's queues, the MQv2-HMAC-SHA1 check, the asyncio <-> trio bridge, and the
gRPC server itself against a name server of its own (real gRPC over TCP, grpcio's own
client in a worker thread)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import time

import grpc
import httpx
import pytest
import trio
import trustme
from prometheus_client.parser import text_string_to_metric_families

from raftmq.client.route import BrokerData, QueueData, TopicRouteData
from raftmq.proxy.apis import definition, service, service_grpc
from raftmq.proxy.auth import Authenticator
from raftmq.proxy.bridge import AsyncioThread, TrioPortal
from raftmq.proxy.config import ProxyConfig, load_proxy_config
from raftmq.proxy.routes import assignments, message_queues
from raftmq.proxy.sending import Refusal, check_message, fifo_queue_index, stored_properties
from raftmq.proxy.server import serve_proxy
from raftmq.proxy.settings import CONSUMER_BACKOFF_S, merged_settings
from tests.helpers import PROXY_FAMILIES, dashboard_metrics, start_namesrv

Code = definition.Code
Permission = definition.Permission
MessageType = definition.MessageType
NOW_MS = 1_800_000_000_000


def message(**system) -> definition.Message:
    made = definition.Message(body=system.pop("body", b"x"))
    made.topic.name = system.pop("topic", "T")
    for key, value in system.pop("user", {}).items():
        made.user_properties[key] = value
    made.system_properties.message_id = system.pop("message_id", "01ABC")
    keys = system.pop("keys", ())
    made.system_properties.keys.extend(keys)
    delivery_ms = system.pop("delivery_ms", None)
    if delivery_ms is not None:
        made.system_properties.delivery_timestamp.FromMilliseconds(delivery_ms)
    for name, value in system.items():
        setattr(made.system_properties, name, value)
    return made


@pytest.mark.parametrize(
    ("fields", "code", "names"),
    [
        ({"topic": ""}, Code.ILLEGAL_TOPIC, "blank"),
        ({"topic": "a b"}, Code.ILLEGAL_TOPIC, "'a b'"),
        ({"topic": "x" * 128}, Code.ILLEGAL_TOPIC, "127"),
        ({"topic": "rmq_sys_TRACE"}, Code.ILLEGAL_TOPIC, "system topic"),
        ({"body": b""}, Code.MESSAGE_BODY_EMPTY, "body"),
        ({"body": b"x" * (4 * 1024 * 1024 + 1)}, Code.MESSAGE_BODY_TOO_LARGE, "body"),
        ({"user": {f"k{i}": "v" for i in range(129)}}, Code.MESSAGE_PROPERTIES_TOO_LARGE, "129"),
        ({"user": {"k": "v" * 17000}}, Code.MESSAGE_PROPERTIES_TOO_LARGE, "bytes"),
        ({"user": {"UNIQ_KEY": "v"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "'UNIQ_KEY'"),
        ({"user": {"k": "a\x01b"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "'k'"),
        ({"tag": " "}, Code.ILLEGAL_MESSAGE_TAG, "tag"),
        ({"tag": "a|b"}, Code.ILLEGAL_MESSAGE_TAG, "'a|b'"),
        ({"keys": ["ok", " "]}, Code.ILLEGAL_MESSAGE_KEY, "key"),
        ({"message_group": "g" * 64}, Code.ILLEGAL_MESSAGE_GROUP, "message_group"),
        ({"message_id": " "}, Code.ILLEGAL_MESSAGE_ID, "message_id"),
        ({"delivery_ms": NOW_MS + 86_400_001}, Code.ILLEGAL_DELIVERY_TIME, "86400000"),
    ],
)
def test_send_checks_answer_apaches_code_and_name_the_field(fields, code, names):
    with pytest.raises(Refusal) as refused:
        check_message(message(**fields), NOW_MS)
    assert refused.value.code == code
    assert names in refused.value.message


def test_a_message_within_every_limit_passes():
    check_message(
        message(tag="t", keys=["k1", "k2"], message_group="g" * 63, delivery_ms=NOW_MS + 1000),
        NOW_MS,
    )


def test_stored_properties_are_what_rocketmq_consumers_read():
    sent = message(
        tag="TagA", keys=["k1", "k2"], message_group="order-1", user={"app": "v"}, born_host="h"
    )
    props = stored_properties(sent, "T", "10.0.0.1")
    assert props["TAGS"] == "TagA"
    assert props["KEYS"] == "k1 k2"
    assert props["UNIQ_KEY"] == "01ABC"
    assert props["__SHARDINGKEY"] == "order-1"
    assert props["PGROUP"] == "T"
    assert props["app"] == "v"
    assert props["__BORNHOST"] == "h"
    timed = stored_properties(message(delivery_ms=NOW_MS), "T", "10.0.0.1")
    assert timed["TIMER_DELIVER_MS"] == str(NOW_MS)
    half = stored_properties(message(message_type=MessageType.TRANSACTION), "T", "h")
    assert half["TRAN_MSG"] == "true"


# Guava 31.1's Hashing.consistentHash(group.hashCode(), n) for n = 1, 4, 8, 16, 100.
GUAVA = {
    "group-1": [0, 1, 7, 15, 36],
    "g1": [0, 0, 6, 9, 41],
    "g2": [0, 3, 4, 9, 9],
    "g3": [0, 2, 2, 14, 47],
    "order-42": [0, 3, 3, 10, 25],
    "中文": [0, 3, 3, 3, 80],
}


@pytest.mark.parametrize("group", sorted(GUAVA))
def test_fifo_queue_choice_is_guavas_consistent_hash_of_the_groups_java_hash(group):
    assert [fifo_queue_index(group, n) for n in (1, 4, 8, 16, 100)] == GUAVA[group]


def test_settings_merge_gives_producers_and_consumers_what_the_python_client_reads():
    producer = definition.Settings(client_type=definition.ClientType.PRODUCER)
    producer.publishing.topics.add(name="T")
    merged = merged_settings(producer)
    assert merged.publishing.max_body_size == 4 * 1024 * 1024
    assert merged.publishing.validate_message_type
    assert merged.backoff_policy.max_attempts == 3
    assert merged.backoff_policy.exponential_backoff.max.ToMilliseconds() == 1000
    assert [t.name for t in merged.publishing.topics] == ["T"]
    consumer = definition.Settings(client_type=definition.ClientType.PUSH_CONSUMER)
    consumer.subscription.group.name = "G"
    merged = merged_settings(consumer)
    assert merged.subscription.long_polling_timeout.ToSeconds() == 20
    assert merged.subscription.receive_batch_size == 32
    assert not merged.subscription.fifo
    assert merged.backoff_policy.max_attempts == 17
    backoff = merged.backoff_policy.customized_backoff.next
    assert [d.ToSeconds() for d in backoff] == list(CONSUMER_BACKOFF_S)
    assert not consumer.HasField("backoff_policy")  # the given settings are left alone
    orderly = {
        "consumeMessageOrderly": True,
        "retryMaxTimes": 3,
        "groupRetryPolicy": {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 2000]}},
    }
    merged = merged_settings(consumer, group=orderly)
    assert merged.subscription.fifo
    assert merged.backoff_policy.max_attempts == 4
    assert [d.ToMilliseconds() for d in merged.backoff_policy.customized_backoff.next] == [
        1000,
        2000,
    ]
    exponential = {"groupRetryPolicy": {"type": "EXPONENTIAL", "exponentialRetryPolicy": {}}}
    backoff = merged_settings(consumer, group=exponential).backoff_policy.exponential_backoff
    assert (backoff.initial.ToSeconds(), backoff.max.ToSeconds(), backoff.multiplier) == (
        5,
        7200,
        2.0,
    )


def route(perm: int = 6, read: int = 4, write: int = 4, master: bool = True) -> TopicRouteData:
    addrs = {0: "127.0.0.1:10911"} if master else {1: "127.0.0.1:10912"}
    return TopicRouteData(
        "T",
        {"b": BrokerData("c", "b", addrs)},
        (QueueData("b", read, write, perm),),
    )


ENDPOINTS = definition.Endpoints(
    scheme=definition.AddressScheme.IPv4, addresses=[definition.Address(host="10.0.0.9", port=8081)]
)


@pytest.mark.parametrize(
    ("perm", "read", "write", "expected"),
    [
        (6, 4, 4, [Permission.READ_WRITE] * 4),
        (6, 4, 2, [Permission.READ] * 2 + [Permission.READ_WRITE] * 2),
        (6, 1, 3, [Permission.WRITE] * 2 + [Permission.READ_WRITE]),
        (2, 4, 4, [Permission.WRITE] * 4),
        (4, 4, 2, [Permission.READ] * 4),
        (0, 0, 0, [Permission.NONE]),
    ],
)
def test_route_queues_follow_apaches_permission_rule(perm, read, write, expected):
    queues = message_queues(route(perm, read, write), ENDPOINTS, "FIFO")
    assert [q.permission for q in queues] == expected
    assert [q.id for q in queues] == list(range(len(expected)))
    assert all(q.broker.endpoints == ENDPOINTS and q.broker.id == 0 for q in queues)
    assert all(list(q.accept_message_types) == [MessageType.FIFO] for q in queues)


def test_route_leaves_out_groups_without_a_master_and_mixed_accepts_four_types():
    assert message_queues(route(master=False), ENDPOINTS, "MIXED") == []
    (first, *_) = message_queues(route(), ENDPOINTS, "MIXED")
    assert set(first.accept_message_types) == {1, 2, 3, 4}


def test_assignments_are_one_queue_per_broker_or_every_queue_for_fifo():
    assert [a.message_queue.id for a in assignments(route(), ENDPOINTS, False)] == [-1]
    assert [a.message_queue.id for a in assignments(route(), ENDPOINTS, True)] == [0, 1, 2, 3]
    assert assignments(route(perm=2), ENDPOINTS, False) == []


ACL = """
accounts:
  - accessKey: RocketMQ5
    secretKey: 12345678
"""


def authorization(access_key: str, secret: str, date_time: str) -> dict[str, str]:
    """What the Python client sends (its `rocketmq/v5/util/signature.py`)."""
    digest = hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    value = (
        f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={digest}"
    )
    return {"authorization": value, "x-mq-date-time": date_time}


def test_signatures_are_checked_against_the_acl_accounts(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    auth = Authenticator(str(path))
    good = authorization("RocketMQ5", "12345678", "20261128T012345Z")
    assert auth.refusal(good, "10.0.0.1") is None
    head, _, signature = good["authorization"].rpartition("=")
    upper = dict(good, authorization=f"{head}={signature.upper()}")
    assert auth.refusal(upper, "10.0.0.1") is None  # hex case does not matter
    wrong = authorization("RocketMQ5", "87654321", "20261128T012345Z")
    assert "Check signature failed" in auth.refusal(wrong, "10.0.0.1")
    unknown = authorization("Nobody000", "12345678", "20261128T012345Z")
    assert "No acl config" in auth.refusal(unknown, "10.0.0.1")
    assert "username cannot be null" in auth.refusal({}, "10.0.0.1")
    assert "x-mq-date-time" in auth.refusal({"authorization": good["authorization"]}, "h")
    empty = authorization("", "", "20261128T012345Z")  # the client's empty credentials
    assert "no Credential" in auth.refusal(empty, "10.0.0.1")


def test_config_reads_apaches_keys_and_names_a_bad_one(tmp_path):
    path = tmp_path / "rmq-proxy.json"
    path.write_text(
        '{"rocketMQClusterName": "c", "namesrvAddr": "1.2.3.4:9876",'
        ' "grpcServerPort": 18081, "remotingListenPort": 18080}'
    )
    config, warnings = load_proxy_config(str(path))
    assert config == ProxyConfig(namesrv_addr="1.2.3.4:9876", grpc_port=18081)
    assert len(warnings) == 2
    path.write_text('{"namesrvAddr": "a:1", "grpcServerPort": "x"}')
    with pytest.raises(ValueError, match="grpcServerPort='x': not an integer"):
        load_proxy_config(str(path))
    with pytest.raises(ValueError, match="namesrvAddr is required"):
        load_proxy_config(None)


# ------------------------------------------------------------------------ the bridge


async def _asyncio_main(work, ready, stop: asyncio.Event) -> None:
    ready(asyncio.get_running_loop())
    await stop.wait()


async def test_the_bridge_runs_trio_work_for_asyncio_and_carries_errors_and_cancellation():
    async with trio.open_nursery() as nursery:
        portal = TrioPortal(trio.lowlevel.current_trio_token(), nursery)
        async with AsyncioThread(functools.partial(_asyncio_main, None), "t") as loop:
            cancelled = trio.Event()

            async def double(x: int) -> int:
                await trio.sleep(0)
                return 2 * x

            async def fail() -> None:
                raise KeyError("no")

            async def hang() -> None:
                try:
                    await trio.sleep_forever()
                finally:
                    cancelled.set()

            def on_loop(coroutine):
                return asyncio.run_coroutine_threadsafe(coroutine, loop).result(5)

            assert await trio.to_thread.run_sync(on_loop, portal.call(double, 21)) == 42
            with pytest.raises(KeyError):
                await trio.to_thread.run_sync(on_loop, portal.call(fail))

            async def give_up():
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(portal.call(hang), 0.05)

            await trio.to_thread.run_sync(on_loop, give_up())
            with trio.fail_after(5):
                await cancelled.wait()  # the trio task was cancelled with the call
        nursery.cancel_scope.cancel()


async def test_the_bridge_round_trip_costs_microseconds():
    """The per-call cost of the bridge (docs/proxy.md): asyncio -> trio -> asyncio for
    a call that does nothing, sequentially. A bound loose enough for a shared machine."""
    calls = 2000
    async with trio.open_nursery() as nursery:
        portal = TrioPortal(trio.lowlevel.current_trio_token(), nursery)
        async with AsyncioThread(functools.partial(_asyncio_main, None), "t") as loop:

            async def nothing() -> None:
                return None

            async def run_many() -> float:
                started = time.perf_counter()
                for _ in range(calls):
                    await portal.call(nothing)
                return time.perf_counter() - started

            elapsed_s = await trio.to_thread.run_sync(
                lambda: asyncio.run_coroutine_threadsafe(run_many(), loop).result(60)
            )
        nursery.cancel_scope.cancel()
    per_call_us = elapsed_s / calls * 1e6
    print(f"bridge round trip: {per_call_us:.1f} us per call")
    assert per_call_us < 2000


# ------------------------------------------------------------------------ the server


def _call(port: int, fn):
    """`fn(stub)` with a plaintext channel to the proxy (grpcio's blocking client)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return fn(service_grpc.MessagingServiceStub(channel))


CLIENT = (("x-mq-client-id", "test@1@0@x"), ("x-mq-language", "PYTHON"))


async def test_the_server_answers_codes_and_survives_bad_input():
    async with trio.open_nursery() as nursery:
        namesrv = await start_namesrv(nursery)
        config = ProxyConfig(namesrv_addr=namesrv, grpc_port=0, grpc_host="127.0.0.1")
        port, _metrics = await nursery.start(serve_proxy, config)

        def calls(stub):
            request = service.QueryRouteRequest(topic=definition.Resource(name="Nope"))
            no_id = stub.QueryRoute(request, timeout=5)
            unknown = stub.QueryRoute(request, metadata=CLIENT, timeout=10)
            bad_topic = stub.QueryRoute(
                service.QueryRouteRequest(topic=definition.Resource(name="a b")),
                metadata=CLIENT,
                timeout=5,
            )
            with pytest.raises(grpc.RpcError) as pull:
                list(stub.PullMessage(service.PullMessageRequest(), metadata=CLIENT, timeout=5))
            heartbeat = stub.Heartbeat(service.HeartbeatRequest(), metadata=CLIENT, timeout=5)
            end = stub.EndTransaction(
                service.EndTransactionRequest(transaction_id="forged"), metadata=CLIENT, timeout=5
            )
            empty_send = stub.SendMessage(service.SendMessageRequest(), metadata=CLIENT, timeout=5)
            group, topic = definition.Resource(name="G"), definition.Resource(name="T")
            bad_ack = stub.AckMessage(
                service.AckMessageRequest(
                    group=group,
                    topic=topic,
                    entries=[service.AckMessageEntry(message_id="m", receipt_handle="forged")],
                ),
                metadata=CLIENT,
                timeout=5,
            )
            bad_change = stub.ChangeInvisibleDuration(
                service.ChangeInvisibleDurationRequest(
                    group=group, topic=topic, receipt_handle="forged", message_id="m"
                ),
                metadata=CLIENT,
                timeout=5,
            )
            short = service.ReceiveMessageRequest(group=group, batch_size=1)
            short.message_queue.topic.name = "T"
            short.invisible_duration.FromSeconds(1)
            receive = list(stub.ReceiveMessage(short, metadata=CLIENT, timeout=5))
            recall = stub.RecallMessage(
                service.RecallMessageRequest(topic=topic, recall_handle="forged"),
                metadata=CLIENT,
                timeout=5,
            )
            return (
                no_id,
                unknown,
                bad_topic,
                pull.value.code(),
                heartbeat,
                end,
                empty_send,
                (bad_ack, bad_change, receive, recall),
            )

        answers = await trio.to_thread.run_sync(_call, port, calls)
        no_id, unknown, bad_topic, pull, heartbeat, end, empty_send, consuming = answers
        bad_ack, bad_change, receive, recall = consuming
        assert bad_ack.status.code == Code.INVALID_RECEIPT_HANDLE
        assert bad_ack.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE
        assert bad_change.status.code == Code.INVALID_RECEIPT_HANDLE
        assert bad_change.receipt_handle == "forged"  # the client stores it before the status
        assert [i.status.code for i in receive if i.HasField("status")] == [
            Code.ILLEGAL_INVISIBLE_TIME
        ]
        assert receive[-1].HasField("delivery_timestamp")
        assert recall.status.code == Code.BAD_REQUEST
        assert no_id.status.code == Code.CLIENT_ID_REQUIRED
        assert unknown.status.code == Code.TOPIC_NOT_FOUND
        assert bad_topic.status.code == Code.ILLEGAL_TOPIC
        assert pull == grpc.StatusCode.UNIMPLEMENTED
        assert heartbeat.status.code == Code.OK
        assert end.status.code == Code.INVALID_TRANSACTION_ID
        assert empty_send.status.code == Code.MESSAGE_CORRUPTED

        def garbage(channel_port: int):
            with grpc.insecure_channel(f"127.0.0.1:{channel_port}") as channel:
                method = channel.unary_unary(
                    "/apache.rocketmq.v2.MessagingService/QueryRoute",
                    request_serializer=lambda b: b,
                    response_deserializer=lambda b: b,
                )
                with pytest.raises(grpc.RpcError) as refused:
                    method(b"\xff\xff\xff\xff", metadata=CLIENT, timeout=5)
                return refused.value.code()

        # bytes that are no QueryRouteRequest: grpcio answers UNKNOWN, the proxy goes on
        assert await trio.to_thread.run_sync(garbage, port) == grpc.StatusCode.UNKNOWN

        def telemetry_without_settings(stub):
            command = service.TelemetryCommand(settings=definition.Settings())
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Telemetry(iter([command]), metadata=CLIENT, timeout=5))
            return refused.value.code()

        code = await trio.to_thread.run_sync(_call, port, telemetry_without_settings)
        assert code == grpc.StatusCode.INVALID_ARGUMENT

        def telemetry_without_client_id(stub):
            command = service.TelemetryCommand(settings=definition.Settings())
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Telemetry(iter([command]), timeout=5))
            return refused.value.code(), refused.value.details()

        code, details = await trio.to_thread.run_sync(_call, port, telemetry_without_client_id)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "x-mq-client-id" in details
        still = await trio.to_thread.run_sync(
            _call, port, lambda stub: stub.Heartbeat(service.HeartbeatRequest(), metadata=CLIENT)
        )
        assert still.status.code == Code.OK
        nursery.cancel_scope.cancel()


async def test_a_permissive_port_serves_tls_and_plaintext_clients(tmp_path):
    """tls.server.mode=permissive (Apache's default): one port, a TLS client and a
    plaintext one both answered, each told apart by its first byte; a Telemetry stream
    (bidi) is answered through it too."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_path, key_path = tmp_path / "proxy.pem", tmp_path / "proxy.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    async with trio.open_nursery() as nursery:
        namesrv = await start_namesrv(nursery)
        config = ProxyConfig(
            namesrv_addr=namesrv, grpc_port=0, grpc_host="127.0.0.1",
            tls_cert_path=str(cert_path), tls_key_path=str(key_path), tls_mode="permissive",
        )  # fmt: skip
        port, _metrics_port = await nursery.start(serve_proxy, config)

        def calls():
            credentials = grpc.ssl_channel_credentials(ca.cert_pem.bytes())
            with (
                grpc.secure_channel(f"127.0.0.1:{port}", credentials) as secure,
                grpc.insecure_channel(f"127.0.0.1:{port}") as plain,
            ):
                answers = []
                for channel in (secure, plain, secure):
                    stub = service_grpc.MessagingServiceStub(channel)
                    answers.append(
                        stub.Heartbeat(service.HeartbeatRequest(), metadata=CLIENT, timeout=5)
                    )
                command = service.TelemetryCommand(settings=definition.Settings())
                with pytest.raises(grpc.RpcError) as refused:  # the proxy's own answer
                    list(
                        service_grpc.MessagingServiceStub(plain).Telemetry(
                            iter([command]), metadata=CLIENT, timeout=5
                        )
                    )
                return answers, refused.value

        beats, telemetry = await trio.to_thread.run_sync(calls)
        assert [b.status.code for b in beats] == [Code.OK] * 3
        assert telemetry.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "settings carry neither" in telemetry.details()
        nursery.cancel_scope.cancel()


def test_tls_mode_is_enforcing_or_permissive():
    with pytest.raises(ValueError, match=r"tls\.server\.mode"):
        load_proxy_config(None, {"namesrvAddr": "127.0.0.1:9876", "tls.server.mode": "optional"})
    config, _ = load_proxy_config(
        None, {"namesrvAddr": "127.0.0.1:9876", "tls.server.mode": "permissive"}
    )
    assert config.tls_mode == "permissive"


async def test_tls_signatures_and_metrics_on_a_served_proxy(tmp_path):
    """With TLS files the port speaks TLS (a client trusting the CA gets through, a
    plaintext one does not); with aclEnable a call signed with a wrong secret is
    UNAUTHORIZED and a Telemetry stream UNAUTHENTICATED; the metrics endpoint counts
    calls per RPC and code."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_path, key_path = tmp_path / "proxy.pem", tmp_path / "proxy.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL)
    async with trio.open_nursery() as nursery:
        namesrv = await start_namesrv(nursery)
        config = ProxyConfig(
            namesrv_addr=namesrv,
            grpc_port=0,
            grpc_host="127.0.0.1",
            metrics_port=0,
            metrics_host="127.0.0.1",
            tls_cert_path=str(cert_path),
            tls_key_path=str(key_path),
            acl_enable=True,
            acl_file=str(acl_path),
        )
        port, metrics_port = await nursery.start(serve_proxy, config)
        signed = (*CLIENT, *authorization("RocketMQ5", "12345678", "20261128T012345Z").items())
        forged = (*CLIENT, *authorization("RocketMQ5", "wrong-secret", "20261128T012345Z").items())

        def calls():
            credentials = grpc.ssl_channel_credentials(ca.cert_pem.bytes())
            with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
                stub = service_grpc.MessagingServiceStub(channel)
                good = stub.Heartbeat(service.HeartbeatRequest(), metadata=signed, timeout=5)
                bad = stub.Heartbeat(service.HeartbeatRequest(), metadata=forged, timeout=5)
                command = service.TelemetryCommand(settings=definition.Settings())
                with pytest.raises(grpc.RpcError) as refused:
                    list(stub.Telemetry(iter([command]), metadata=forged, timeout=5))
            with (
                grpc.insecure_channel(f"127.0.0.1:{port}") as plain,
                pytest.raises(grpc.RpcError) as plaintext,
            ):
                service_grpc.MessagingServiceStub(plain).Heartbeat(
                    service.HeartbeatRequest(), metadata=signed, timeout=2
                )
            return good, bad, refused.value.code(), plaintext.value.code()

        good, bad, telemetry, plaintext = await trio.to_thread.run_sync(calls)
        assert good.status.code == Code.OK
        assert bad.status.code == Code.UNAUTHORIZED
        assert "Check signature failed for accessKey=RocketMQ5" in bad.status.message
        assert telemetry == grpc.StatusCode.UNAUTHENTICATED
        assert plaintext == grpc.StatusCode.UNAVAILABLE
        async with httpx.AsyncClient() as http:
            scraped = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        assert 'rocketmq_proxy_rpc_total{code="OK",rpc="Heartbeat"} 1.0' in scraped
        assert 'rocketmq_proxy_rpc_total{code="UNAUTHORIZED",rpc="Heartbeat"} 1.0' in scraped
        assert 'rocketmq_proxy_rpc_latency_seconds_count{rpc="Heartbeat"} 2.0' in scraped
        served = {s.name for f in text_string_to_metric_families(scraped) for s in f.samples}
        assert dashboard_metrics(*PROXY_FAMILIES) <= served  # what the Grafana dashboard reads
        nursery.cancel_scope.cancel()
