"""The group address (`groupAddress`): one IP:port that the master of a DLedger group
listens on and registers as brokerId 0, taken by each new master and released by a
deposed one, with real processes on loopback (127.0.0.2 is the group's address)."""

from __future__ import annotations

import json

import pytest
import trio

from raftmq.client.producer import send_request
from raftmq.client.route import MessageQueue
from raftmq.remoting import (
    RemotingClient,
    RemotingCommand,
    RemotingError,
    RequestCode,
    ResponseCode,
)
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import stopped

pytestmark = pytest.mark.processes


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


async def test_a_deposed_master_releases_the_group_address_and_the_new_master_takes_it(tmp_path):
    """The master is stopped (SIGSTOP: alive, its listener on the group address still
    bound, answering nothing) until the others have elected a new master, which cannot
    bind the address meanwhile; a send is queued on the stopped master's connection.
    Resumed, the old master learns it was deposed: it must not acknowledge the queued
    send, it closes its connections on the group address, and the new master takes
    the address; the routes follow."""
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
