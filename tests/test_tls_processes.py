"""Real processes: a name server and a 3-broker group whose remoting ports enforce TLS and
whose DLedger peer links are mutual TLS; our producer and consumer work over TLS, a plain
client is refused, and a killed master is replaced."""

from __future__ import annotations

import ssl

import pytest
import trio
import trustme

from raftmq.client.admin import Admin
from raftmq.client.consumer import PullConsumer
from raftmq.client.errors import MQClientError
from raftmq.client.producer import Producer
from raftmq.config.address import parse_address
from raftmq.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RequestCode,
)
from raftmq.transport.tls import ClientTls
from tests.helpers import TlsCluster, tls_conf

pytestmark = [pytest.mark.processes, pytest.mark.untimed]

TOPIC = "TlsOrders"


async def _send(producer: Producer, bodies: list[bytes]) -> None:
    for body in bodies:
        with trio.fail_after(30):
            while True:
                try:
                    await producer.send(TOPIC, body)
                    break
                except MQClientError:  # the group is between masters
                    await trio.sleep(0.2)


async def test_a_tls_group_serves_our_clients_and_fails_over(tmp_path):
    conf, ca = tls_conf(tmp_path)
    tls = ClientTls(enable=True, trust_cert_path=ca)
    async with TlsCluster(tmp_path / "cluster", conf) as cluster:
        master = await cluster.wait_master()
        with pytest.raises(RemotingConnectError):  # plain TCP on an enforcing port
            async with RemotingClient(cluster.broker_addrs[master]) as plain:
                await plain.invoke(RemotingCommand(code=RequestCode.HEART_BEAT), timeout_s=3)
        async with Admin(cluster.namesrv_addr, tls=tls) as admin:
            await admin.create_topic(TOPIC, 4, 4)
        before = [f"before-{i}".encode() for i in range(30)]
        after = [f"after-{i}".encode() for i in range(30)]
        async with Producer(cluster.namesrv_addr, "tls-producer", tls=tls) as producer:
            await _send(producer, before)
            cluster.kill(master)
            new_master = await cluster.wait_master(timeout_s=30, not_node=master)
            assert new_master != master
            await _send(producer, after)
        consumed: list[bytes] = []
        async with PullConsumer(cluster.namesrv_addr, "tls-consumer", tls=tls) as consumer:
            for mq in await consumer.fetch_queues(TOPIC):
                offset = 0
                while True:
                    result = await consumer.pull(mq, offset, 32)
                    if not result.messages:
                        break
                    consumed += [msg.body for msg in result.messages]
                    offset = result.next_begin_offset
        assert set(consumed) == set(before + after)
        log_path = cluster.base_dir / f"{new_master}.log"
        assert "failed TLS authentication" not in log_path.read_text()
        # a stranger without a certificate of the group's CA on the peer port: dropped, logged
        stranger_ca = trustme.CA()
        stranger = stranger_ca.issue_cert("127.0.0.1")
        context = ssl.create_default_context(cafile=None)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        stranger.configure_cert(context)
        host, port = parse_address(cluster.peer_addrs[new_master])
        stream = trio.SSLStream(await trio.open_tcp_stream(host, port), context)
        with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
            with trio.fail_after(5):
                await stream.send_all(b"\0" * 64)
                while await stream.receive_some(1):
                    pass
                raise trio.ClosedResourceError  # closed without a word: also a refusal
        with trio.fail_after(5):
            while "failed TLS authentication" not in log_path.read_text():
                await trio.sleep(0.05)
        assert await cluster.wait_master() == new_master  # the group serves on
