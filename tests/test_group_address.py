"""The group address (`groupAddress`): one IP:port that the master of a DLedger group
listens on and registers as brokerId 0, taken by each new master and released by a
deposed one, with real processes on loopback (127.0.0.2 is the group's address); and
how a release ends the connections accepted there, in process over real TCP."""

from __future__ import annotations

import json

import pytest
import trio
from raftmq.broker.group_address import FINISH_QUIET_S, GroupListener

from raftmq.client.producer import send_request
from raftmq.client.route import MessageQueue
from raftmq.remoting import (
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RemotingError,
    RemotingServer,
    RequestCode,
    ResponseCode,
)
from raftmq.tools.broker_local import LocalCluster
from raftmq.tools.dledger_local import free_ports
from tests.helpers import stopped


async def member_behind(client: RemotingClient) -> dict[str, str]:
    """The runtime table of the member that answers on `client`'s connection."""
    response = await client.invoke(RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO), 5.0)
    return json.loads(response.body)["table"]


async def wait_routed(cluster: LocalCluster, master: str) -> None:
    """Until the name server routes the group as it should under `master`: the group
    address as brokerId 0, every other member at its own address under its slave id
    (n0 is 1), and the master's own address nowhere: within 5 s, before its slave entry
    could expire by silence (LocalCluster's name server waits 10 s)."""
    slaves = {str(int(n[1:]) + 1): cluster.client_addrs[n] for n in cluster.ids if n != master}
    with trio.fail_after(5):
        while await cluster.broker_addresses() != {"0": cluster.group_addr, **slaves}:
            await trio.sleep(0.05)


@pytest.mark.processes
async def test_a_deposed_master_releases_the_group_address_and_the_new_master_takes_it(tmp_path):
    """The master is stopped (SIGSTOP: alive, its listener on the group address still
    bound, answering nothing) until the others have elected a new master, which cannot
    bind the address meanwhile and registers its own instead; a send is queued on the
    stopped master's connection. Resumed, the old master learns it was deposed: it must
    not acknowledge the queued send, it closes its connections on the group address,
    and the new master takes the address; the routes follow."""
    async with LocalCluster(tmp_path, group_address=True) as cluster:
        old = await cluster.wait_master()
        await cluster.create_topic("T", 1)
        await wait_routed(cluster, old)
        request = send_request(
            RequestCode.SEND_MESSAGE_V2, "P", MessageQueue("T", cluster.broker_name, 0), b"x",
            "", 0,
        )  # fmt: skip
        queued: list[object] = []  # the queued send's answer, or the error that ended it

        async def send_queued(client: RemotingClient) -> None:
            try:
                queued.append(await client.invoke(request, 10.0))
            except (OSError, RemotingError) as exc:  # closed unanswered: no acknowledgment
                queued.append(exc)

        async with RemotingClient(cluster.group_addr) as held:
            assert (await member_behind(held))["dLegerSelfId"] == old
            assert (await held.invoke(request, 5.0)).code == ResponseCode.SUCCESS
            async with trio.open_nursery() as nursery:
                with stopped(cluster.pid(old)):
                    new = await cluster.wait_master(not_node=old)
                    # it cannot bind the address the stopped one holds: meanwhile it
                    # registers its own, where clients that ask the name server reach it
                    with trio.fail_after(5):
                        while await cluster.master_address() != cluster.client_addrs[new]:
                            await trio.sleep(0.02)
                    nursery.start_soon(send_queued, held)
                    await trio.sleep(0.2)  # the request waits in the stopped master's socket
                with trio.fail_after(10):
                    await held.connection.wait_closed()
        [outcome] = queued
        assert not (
            isinstance(outcome, RemotingCommand) and outcome.code == ResponseCode.SUCCESS
        ), "a deposed master acknowledged a send"

        with trio.fail_after(10):
            while True:
                try:
                    async with RemotingClient(cluster.group_addr) as client:
                        if (await member_behind(client))["dLegerSelfId"] == new:
                            response = await client.invoke(request, 5.0)
                            break
                except (OSError, RemotingError):
                    pass  # refused while nobody listens, or closed by the deposed master
                await trio.sleep(0.05)
        assert response.code == ResponseCode.SUCCESS, response.remark
        await wait_routed(cluster, new)


async def test_a_release_answers_what_the_connection_is_serving_and_what_arrives_then(nursery):
    """A member that stops being master stops listening on the group address at once,
    but closes a connection accepted there only once its client has gone quiet with
    every request answered: a send in progress, and one the client writes after the
    release, are answered ("not master", say), and the end of the connection follows.
    The release used to close every such connection at once, and RocketMQ's C++ client
    then waited out its 3 s send timeout for the answer that never came."""
    answer_slow = trio.Event()

    async def slow(request, connection):
        await answer_slow.wait()
        return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "not master")

    async def echo(request, connection):
        return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "not master")

    [port] = free_ports(1, hosts=["127.0.0.2"])
    table = ProcessorTable({RequestCode.SEND_MESSAGE: slow, RequestCode.HEART_BEAT: echo})
    listener = GroupListener(RemotingServer("127.0.0.2", port, table))
    nursery.start_soon(listener.run)
    listener.claim()
    answers = []

    async def call(client: RemotingClient, code: RequestCode) -> None:
        answers.append((code, (await client.invoke(RemotingCommand(code), 5.0)).code))

    with trio.fail_after(10):
        while True:
            try:
                await (await trio.open_tcp_stream("127.0.0.2", port)).aclose()
                break
            except OSError:  # not bound yet
                await trio.sleep(0.01)
        async with RemotingClient(f"127.0.0.2:{port}") as client, trio.open_nursery() as calls:
            calls.start_soon(call, client, RequestCode.SEND_MESSAGE)
            await trio.sleep(0.05)  # the send is being served
            listener.release()
            with pytest.raises(RemotingConnectError):  # no new connection is accepted
                async with RemotingClient(f"127.0.0.2:{port}") as other:
                    await other.invoke(RemotingCommand(RequestCode.HEART_BEAT), 5.0)
            await call(client, RequestCode.HEART_BEAT)  # written after the release
            answer_slow.set()
        busy = ResponseCode.SERVICE_NOT_AVAILABLE
        assert answers == [(RequestCode.HEART_BEAT, busy), (RequestCode.SEND_MESSAGE, busy)]
        await trio.sleep(FINISH_QUIET_S + 0.05)
        with pytest.raises(RemotingConnectError):  # quiet and answered: closed
            await client.invoke(RemotingCommand(RequestCode.HEART_BEAT), 5.0)
