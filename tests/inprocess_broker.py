"""A name server and a DLedger broker group inside the test's trio loop.

The same BrokerController the `mqbroker` process runs, over real TCP on
127.0.0.1, but each member in its own cancel scope, so a test can stop one (as a
crash would: nothing is flushed or unregistered) and start it again on the same
files, and can look inside the members while they run.
"""

from __future__ import annotations

import time
from pathlib import Path

import trio
from raftmq.broker.config import load_broker_config
from raftmq.broker.controller import BrokerController
from raftmq.namesrv.config import NamesrvConfig
from raftmq.namesrv.server import NamesrvServer

from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.tools.dledger_local import free_ports


class InProcessGroup:
    def __init__(
        self,
        nursery: trio.Nursery,
        base: Path,
        nodes: int = 3,
        namesrv: NamesrvConfig | None = None,
        more_namesrv: tuple[str, ...] = (),
        **conf: str,
    ) -> None:
        self.nursery = nursery
        self.base = base
        self.ids = [f"n{i}" for i in range(nodes)]
        ports = free_ports(2 * nodes)
        self.dledger_peers = ";".join(
            f"{n}-127.0.0.1:{p}" for n, p in zip(self.ids, ports[:nodes], strict=True)
        )
        self.listen = dict(zip(self.ids, ports[nodes:], strict=True))
        self.conf = conf
        self.namesrv_config = namesrv or NamesrvConfig(listen_port=0, bind_address="127.0.0.1")
        self.brokers: dict[str, BrokerController] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        self.namesrv_addr = ""
        self.more_namesrv = more_namesrv  # name servers the test runs itself, after ours
        self.credentials: SessionCredentials | None = None  # `call` signs with it (ACL)

    async def start(self, members: int | None = None) -> InProcessGroup:
        """The name server and the first `members` members (all, and a master elected
        among them, by default)."""
        namesrv = NamesrvServer(self.namesrv_config)
        port = await self.nursery.start(namesrv.serve)
        self.namesrv = namesrv
        self.namesrv_addr = f"127.0.0.1:{port}"
        for node in self.ids[:members]:
            await self.start_member(node)
        if members is None:
            await self.wait_master()
        return self

    def config(self, node: str):
        overrides = {
            "brokerClusterName": "TestCluster",
            "brokerName": "broker-t",
            "listenPort": str(self.listen[node]),
            "namesrvAddr": ";".join((self.namesrv_addr, *self.more_namesrv)),
            "storePathRootDir": str(self.base / node),
            "rocketmqHome": str(self.base / node),  # conf/plain_acl.yml with aclEnable
            "enableDLegerCommitLog": "true",
            "dLegerPeers": self.dledger_peers,
            "dLegerSelfId": node,
            "mappedFileSizeCommitLog": str(4 << 20),
            "mappedFileSizeForEntryIndex": str(1 << 20),
            "maxHashSlotNum": "4096",
            "maxIndexNum": "16384",
            **self.conf,
        }
        return load_broker_config(None, overrides=overrides)[0]

    async def start_member(self, node: str) -> BrokerController:
        broker = BrokerController(self.config(node))

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            with trio.CancelScope() as scope:
                self._scopes[node] = scope
                await broker.serve(task_status=task_status)

        await self.nursery.start(run)
        self.brokers[node] = broker
        return broker

    def crash(self, node: str) -> None:
        """Stop a member at once (its sockets close; nothing is flushed)."""
        self._scopes.pop(node).cancel()
        self.brokers.pop(node)

    def master(self) -> BrokerController | None:
        masters = [b for b in self.brokers.values() if b.is_master]
        return masters[0] if len(masters) == 1 else None

    async def wait_master(self, timeout_s: float = 10.0) -> BrokerController:
        with trio.fail_after(timeout_s):
            while self.master() is None:
                await trio.sleep(0.01)
        return self.master()

    def slaves(self) -> list[BrokerController]:
        return [b for b in self.brokers.values() if not b.is_master]

    async def call(self, broker: BrokerController, code: int, ext=None, body=b"", oneway=False):
        async with RemotingClient(broker.address, credentials=self.credentials) as client:
            request = RemotingCommand(code=code, ext_fields=dict(ext or {}), body=body)
            if oneway:
                client.invoke_oneway(request)
                await trio.sleep(0.05)
                return None
            return await client.invoke(request, 10.0)

    async def send(self, broker, topic: str, body: bytes, queue_id: int = 0, props: str = ""):
        born_ms = int(time.time() * 1000)
        ext = send_header_v2("PG", topic, queue_id, born_timestamp_ms=born_ms, properties=props)
        return await self.call(broker, RequestCode.SEND_MESSAGE_V2, ext, body)

    async def pull(self, broker, topic: str, queue_id: int, offset: int, **extra):
        ext = {
            "consumerGroup": "CG", "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 1000,
            "subscription": "*", "subVersion": 0, **extra,
        }  # fmt: skip
        return await self.call(broker, RequestCode.PULL_MESSAGE, ext)
