"""Registration with two name servers, one of which accepts connections and never answers.

The hung one is a real NamesrvServer whose REGISTER_BROKER handler blocks, as a
SIGSTOPped name server looks from the broker: the kernel still accepts, nothing
answers. The healthy one must not wait for it, and the broker must not pile up
connections to it, one per timed-out attempt.
"""

from __future__ import annotations

import time

import pytest
import trio
from raftmq.namesrv.config import NamesrvConfig
from raftmq.namesrv.routes import MASTER_ID
from raftmq.namesrv.server import NamesrvServer

from raftmq.remoting import RequestCode
from raftmq.tools.dledger_local import free_ports
from tests.helpers import wait_for
from tests.inprocess_broker import InProcessGroup

TIMEOUT_MS = 1500  # registerBrokerTimeoutMills: how long each attempt at the hung one lasts
PROMPT_S = 0.5  # how soon the healthy name server must hear of a change; well under TIMEOUT_MS


class HungNamesrv:
    """A name server that takes every REGISTER_BROKER and never answers it."""

    def __init__(self) -> None:
        self.server = NamesrvServer(NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
        self.server.remoting.processor.register(RequestCode.REGISTER_BROKER, self._hang)
        self.server.remoting.on_connect = self._connected
        self.requests = 0
        self.most_connections = 0
        self._arrived = trio.Event()

    async def start(self, nursery: trio.Nursery) -> HungNamesrv:
        await nursery.start(self.server.serve)
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def next_request(self) -> None:
        await self._arrived.wait()

    def _connected(self, connection) -> None:
        self.most_connections = max(self.most_connections, len(self.server.remoting.connections))

    async def _hang(self, request, connection):
        self.requests += 1
        self._arrived.set()
        self._arrived = trio.Event()
        await trio.sleep_forever()


def master_addr(namesrv: NamesrvServer) -> str | None:
    broker = namesrv.routes.broker_addr_table.get("broker-t")
    return None if broker is None else broker["brokerAddrs"].get(MASTER_ID)


@pytest.mark.slow  # waits out registration timeouts at the hung name server
async def test_a_hung_name_server_delays_no_other_and_gets_one_connection(nursery, tmp_path):
    hung = await HungNamesrv().start(nursery)
    g = await InProcessGroup(
        nursery,
        tmp_path,
        nodes=1,
        more_namesrv=(hung.address,),
        registerBrokerTimeoutMills=str(TIMEOUT_MS),
    ).start()
    with trio.fail_after(4 * TIMEOUT_MS / 1000):
        while hung.requests < 3:  # two attempts timed out, each retried
            await hung.next_request()
    assert hung.most_connections == 1
    # A registration is under way at the hung one; a new topic must not wait for it.
    ext = {"topic": "T", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    nursery.start_soon(g.call, g.master(), RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    await wait_for(lambda: "T" in g.namesrv.routes.topic_queue_table, PROMPT_S)
    await hung.next_request()  # the attempt that was under way timed out, and one more
    assert hung.most_connections == 1


async def test_a_new_master_reaches_the_healthy_name_server_at_once(nursery, tmp_path):
    hung = await HungNamesrv().start(nursery)
    g = await InProcessGroup(
        nursery,
        tmp_path,
        more_namesrv=(hung.address,),
        registerBrokerTimeoutMills=str(TIMEOUT_MS),
    ).start()
    old = g.master()
    await wait_for(lambda: master_addr(g.namesrv) == old.address, PROMPT_S)
    g.crash(next(node for node, broker in g.brokers.items() if broker is old))
    new = await g.wait_master()
    await wait_for(lambda: master_addr(g.namesrv) == new.address, PROMPT_S + TIMEOUT_MS / 1000)
    assert time.monotonic() - new.role.master_since < PROMPT_S


async def test_a_restarted_name_server_hears_from_the_broker_before_the_period(nursery, tmp_path):
    [port] = free_ports(1)
    config = NamesrvConfig(listen_port=port, bind_address="127.0.0.1")

    async def serve(namesrv, task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as inner:
            await inner.start(namesrv.serve)
            task_status.started(inner.cancel_scope)

    first = NamesrvServer(config)
    scope = await nursery.start(serve, first)
    await InProcessGroup(nursery, tmp_path, nodes=1, more_namesrv=(f"127.0.0.1:{port}",)).start()
    await wait_for(lambda: master_addr(first) is not None, PROMPT_S)
    scope.cancel()
    second = NamesrvServer(config)
    await nursery.start(serve, second)
    await wait_for(lambda: master_addr(second) is not None, 1.0)  # the period is 30 s
