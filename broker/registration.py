"""Registering with every name server: REGISTER_BROKER (103).

RocketMQ re-registers every 30 s, and on a DLedger role change registers oneway,
so the name servers (and through them the clients) may learn of a new master only
at the next tick. Here a role change registers at once and waits for each name
server's answer, retrying a failed one quickly; the periodic registration remains
as the heartbeat that keeps the broker from expiring.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import trio

from broker.store.metadata import META_TOPIC
from remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode, ResponseCode

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = logging.getLogger(__name__)

RETRY_S = 0.2


class Registration:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self._wanted = trio.Event()
        self._clients: dict[str, RemotingClient] = {}
        self._started = 0  # rounds begun; each builds its request from the state then
        self._completed = 0
        self._progress = trio.Event()

    def register_soon(self) -> None:
        self._wanted.set()

    async def register_now(self) -> None:
        """Register what is known now with every name server; return when all have
        answered or failed (a round already under way may predate the change)."""
        target = self._started + 1
        self._wanted.set()
        while self._completed < target:
            await self._progress.wait()

    def _request(self) -> RemotingCommand:
        broker = self.broker
        metadata = broker.store.metadata
        body = {
            "topicConfigSerializeWrapper": {
                "topicConfigTable": {
                    n: t.to_json() for n, t in metadata.topics.items() if n != META_TOPIC
                },
                "dataVersion": metadata.data_version,
            },
            "filterServerList": [],
        }
        return RemotingCommand(
            code=RequestCode.REGISTER_BROKER,
            ext_fields={
                "brokerAddr": broker.address,
                "brokerId": str(broker.broker_id),
                "brokerName": broker.config.broker_name,
                "clusterName": broker.config.broker_cluster_name,
                "haServerAddr": broker.address,
                "compressed": "false",
                "bodyCrc32": "0",
                # not RocketMQ's: lets a name server ignore a deposed master's late claim
                "dLegerTerm": str(broker.role_term),
            },
            body=json.dumps(body, separators=(",", ":")).encode(),
        )

    async def run(self) -> None:
        period = self.broker.config.register_name_server_period / 1000.0
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                with trio.move_on_after(period):
                    await self._wanted.wait()
                self._wanted = trio.Event()
                self._started += 1
                request = self._request()
                failed = []
                async with trio.open_nursery() as round_nursery:
                    for address in self.broker.config.namesrv_addr:
                        round_nursery.start_soon(self._register_one, address, request, failed)
                self._completed = self._started
                self._progress.set()
                self._progress = trio.Event()
                if failed:
                    await trio.sleep(RETRY_S)
                    self._wanted.set()

    async def _register_one(self, address: str, request: RemotingCommand, failed: list) -> None:
        timeout = self.broker.config.register_broker_timeout_mills / 1000.0
        try:
            client = await self._client(address)
            copy = RemotingCommand(
                code=request.code, ext_fields=dict(request.ext_fields), body=request.body
            )
            response = await client.invoke(copy, timeout)
            if response.code != ResponseCode.SUCCESS:
                raise RemotingError(f"answered {response.code}: {response.remark}")
        except (RemotingError, OSError) as exc:
            log.warning("register with name server %s failed: %s", address, exc)
            self._clients.pop(address, None)
            failed.append(address)

    async def _client(self, address: str) -> RemotingClient:
        client = self._clients.get(address)
        if client is None or client.closed:
            client = RemotingClient(address)
            await self._nursery.start(_hold_open, client)
            self._clients[address] = client
        return client


async def _hold_open(client: RemotingClient, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Keep a client's connection open in the registration nursery until it fails."""
    async with client:
        task_status.started()
        await client.connection.wait_closed()
