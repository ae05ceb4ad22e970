"""A broker in controller mode (`enableControllerMode=true`): RocketMQ 5's
ReplicasManager, which joins the broker to the controllers (`controller/`) and makes
it master or slave of its group over AutoSwitch HA (`broker.classic`).

Start (RocketMQ's INITIAL -> ... -> RUNNING): connect to every `controllerAddr`;
take the brokerId from `storePathBrokerIdentity` or apply for one
(CONTROLLER_GET_NEXT_BROKER_ID, the temp identity file, CONTROLLER_APPLY_BROKER_ID,
the identity file: `broker.identity`); CONTROLLER_REGISTER_BROKER; then take the role
its answer gives, or ask to be elected (CONTROLLER_ELECT_MASTER with its own id) when
the group has no live master. Until then the broker takes no writes (its role is not
master and its replication is fenced) and does not register with the name servers.

Running: a BROKER_HEARTBEAT (oneway: epoch, maxOffset, confirmOffset,
heartbeatTimeoutMills, electionPriority) to every controller each
`brokerHeartbeatInterval` over a connection kept open, so that a killed broker's
closed connection tells every controller at once; CONTROLLER_GET_REPLICA_INFO at the
leader each `brokerHeartbeatInterval` (RocketMQ: each syncBrokerMetadataPeriod, 5 s);
NOTIFY_BROKER_ROLE_CHANGED from the controller. Either changes the role only for a
newer masterEpoch (an equal one refreshes a master's SyncStateSet).

Master: `AutoSwitchMaster.begin(masterEpoch)` (a new epoch entry), the SyncStateSet
from the controller, the queue offsets rebuilt once everything is dispatched
(`Promotion.take_over`), brokerId 0, and a registration with every name server
before anything else. Slave: brokerId := its controller id, the AutoSwitch slave
toward the master's HA address, which it asks the master for (GET_BROKER_RUNTIME_INFO's
haListenPort) as soon as the controller names the master: RocketMQ's slave learns it
only from a name-server registration answer, up to registerNameServerPeriod (30 s)
later.

The lease (RocketMQ has none, #7017): the controller takes a broker for dead no sooner
than `controllerHeartBeatTimeoutMills` (T) after the last heartbeat it received from
it. Each replica-info poll goes to the leader right behind a heartbeat on the same
connection, so an answer to a poll sent at time s proves the leader had a heartbeat
from this broker no earlier than s, and holds its own lease (a controller that does
not lead, or whose lease lapsed, answers CONTROLLER_NOT_LEADER). The master refuses
puts (`AutoSwitchMaster.lease`) from s + T - margin on, margin =
min(2 x brokerHeartbeatInterval, T/2): before the controller may elect another master.
A controller the master cannot reach that becomes leader heard nothing of the
last heartbeats its predecessor answered: it elects no replacement until T has passed
since it took over (`controller.server`), after every lease its predecessors gave.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio
from raftmq.broker.address import BrokerAddress
from raftmq.broker.classic import ClassicReplica
from raftmq.broker.config import BrokerConfig
from raftmq.broker.identity import IDENTITY_FILE, IdentityFiles, IdentityMismatch
from raftmq.broker.promotion import Promotion
from raftmq.broker.registration import Registration
from raftmq.broker.role import BrokerRole
from raftmq.broker.store.autoswitch import AlterRefused, AlterUnknown, SyncStateSet
from raftmq.broker.store.epoch_file import end_offsets

from raftmq.config.address import parse_address
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.remoting.connection import Connection
from raftmq.remoting.errors import RemotingError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 1.0
RETRY_S = 0.5  # a failed start step is tried again (RocketMQ: every 5 s)
REQUEST_TIMEOUT_S = 3.0
CONTROLLERS_REFRESH_S = 2.0  # how often the leader's list of controllers is asked for
JAVA_LONG_MAX = 2**63 - 1  # the last epoch's endOffset in an EpochEntryCache


def controller_links_to_change(
    linked: frozenset[str], listed: frozenset[str], last_listed: frozenset[str] | None
) -> tuple[frozenset[str], frozenset[str]]:
    """(addresses to link to, links to end) given the broker's links, the members the
    controllers' leader lists now and what it listed the time before (None: never).

    The broker follows the list when it dials the controllers' own addresses (some of
    its links are listed), and otherwise only once the list changes: a broker whose
    controllerAddr names other addresses for the same controllers (proxies, as the
    fault-injection runs put between them) keeps them while the members stay the same;
    following the list there would route around the proxies."""
    if not (linked & listed) and (last_listed is None or listed == last_listed):
        return frozenset(), frozenset()
    return listed - linked, linked - listed


def lease_margin_s(timeout_s: float, interval_s: float) -> float:
    """How long before the controller's heartbeat timeout a master's lease ends: two
    heartbeat intervals (a heartbeat delayed in the connection), at most half of it."""
    return min(2 * interval_s, timeout_s / 2)


class NoController(Exception):
    """No controller answered as leader (or its answer did not parse)."""


BAD_ANSWER = (ValueError, TypeError, AttributeError, KeyError)  # a body or field not as sent


@attrs.frozen
class ReplicaInfo:
    """What the controller says of the group (a register, replica-info or elect answer,
    or a notify)."""

    master_id: int | None
    master_addr: str | None
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int

    @classmethod
    def parse(cls, response: RemotingCommand) -> ReplicaInfo:
        fields = response.ext_fields
        body = json.loads(response.body) if response.body else {}
        master = fields.get("masterBrokerId")
        epoch = fields.get("syncStateSetEpoch") or body.get("syncStateSetEpoch") or 0
        return cls(
            int(master) if master not in (None, "", "null") else None,
            fields.get("masterAddress") or None,
            int(fields.get("masterEpoch") or 0),
            frozenset(int(i) for i in body.get("syncStateSet", ())),
            int(epoch),
        )


class ReplicasManager:
    def __init__(
        self,
        config: BrokerConfig,
        replica: ClassicReplica,
        role: BrokerRole,
        promotion: Promotion,
        registration: Registration,
        address: BrokerAddress,
        store,
        on_slave: Callable[[], None],
        on_master: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_master` runs once this broker serves as master (its lease renewed), before
        it registers as one; `on_slave` once it is made a slave."""
        self.config = config
        self.replica = replica
        self.role = role
        self.promotion = promotion
        self.registration = registration
        self.address = address
        self.store = store
        self.on_slave = on_slave
        self.on_master = on_master
        root = Path(config.store_path_root_dir)
        self.identity = IdentityFiles(
            Path(config.store_path_broker_identity or root / IDENTITY_FILE),
            config.broker_cluster_name,
            config.broker_name,
        )
        self.broker_id: int | None = None  # the controller's id for this broker
        self.master_epoch = 0
        self.clients: dict[str, RemotingClient] = {}
        self.links: dict[str, trio.CancelScope] = {}  # address -> its link's scope
        self.leader: str | None = None
        self.timeout_s = config.controller_heart_beat_timeout_mills / 1000
        self.interval_s = config.broker_heartbeat_interval / 1000
        self.margin_s = lease_margin_s(self.timeout_s, self.interval_s)
        self.lease_from = float("-inf")  # send time of the last answer confirming the role
        self.answered_sent_at = float("-inf")  # send time of the last request answered
        self._listed_in_sync = False  # the newest replica info put this slave in the set
        self._sync_state_seen = (0, 0)  # (masterEpoch, syncStateSetEpoch) of that info
        self._role_lock = trio.Lock()
        self._registering = False
        self._nursery: trio.Nursery | None = None
        replica.ha.alter_sync_state_set = self._alter
        replica.ha.lease = self.holds_lease

    # ------------------------------------------------------------------ controllers
    def holds_lease(self) -> bool:
        return trio.current_time() < self.lease_from + self.timeout_s - self.margin_s

    def holds_every_acknowledged_record(self) -> bool:
        """Whether this broker's log holds every record the group acknowledged (with
        allAckInSyncStateSet, on every SyncStateSet member first): the master while it
        holds its lease, a slave the last replica info listed in the SyncStateSet while
        it follows its master. A broker just started, a slave the master left out of the
        set and a master whose lease lapsed may miss some: their consumer offsets can be
        older than one acknowledged (`consumer_requests`). A slave learns it was left out
        on its next replica info, one heartbeat interval at most after the set shrank."""
        if self.role.is_master:
            return self.holds_lease()
        return self._listed_in_sync and self.replica.client.connected_to is not None

    async def _link(self, address: str) -> None:
        """A connection to one controller, heartbeating on it; reconnected when lost,
        until the controllers' leader no longer lists it (`_follow_controllers`)."""
        with trio.CancelScope() as scope:
            self.links[address] = scope
            try:
                while True:
                    await self._linked(address)
                    await trio.sleep(RETRY_S)
            finally:
                del self.links[address]

    async def _linked(self, address: str) -> None:
        try:
            async with RemotingClient(address, connect_timeout_s=CONNECT_TIMEOUT_S) as client:
                self.clients[address] = client
                while not client.closed:
                    self._heartbeat(client)
                    await trio.sleep(self.interval_s)
        except (RemotingError, OSError) as exc:
            log.debug("controller %s: %s", address, exc)
        finally:
            self.clients.pop(address, None)

    async def _follow_controllers(self) -> None:
        """The controllers are a DLedger group whose members may change (`dledger
        addPeer`/`removePeer` on their peer port, where they also serve remoting): every
        CONTROLLERS_REFRESH_S the leader's CONTROLLER_GET_METADATA_INFO names the members
        in force, and a link starts to each new one and ends to each one removed, so a
        broker configured with the old controllerAddr follows a replaced group (one
        replaced faster than that leaves it knowing none that is still there)."""
        last_listed: frozenset[str] | None = None
        while True:
            await trio.sleep(CONTROLLERS_REFRESH_S)
            # asked of the leader's connection only, not through `call`: any controller
            # answers this, and `call` takes whoever answers for the leader
            client = self.clients.get(self.leader) if self.leader else None
            if client is None or client.closed:
                continue
            try:
                answer = await client.invoke(
                    RemotingCommand(code=RequestCode.CONTROLLER_GET_METADATA_INFO),
                    REQUEST_TIMEOUT_S,
                )
            except (RemotingError, OSError) as exc:
                log.debug("controllers: %s", exc)
                continue
            fields = answer.ext_fields
            if fields.get("isLeader") != "true" or not fields.get("peers"):
                continue
            listed = frozenset(
                peer.partition(":")[2] for peer in fields["peers"].split(";") if ":" in peer
            )
            start, stop = controller_links_to_change(frozenset(self.links), listed, last_listed)
            last_listed = listed
            assert self._nursery is not None
            for address in sorted(start):
                log.info("%s: controller %s joined", self.config.broker_name, address)
                self._nursery.start_soon(self._link, address)
            for address in sorted(stop):
                log.info("%s: controller %s left", self.config.broker_name, address)
                self.links[address].cancel()

    def _heartbeat(self, client: RemotingClient) -> None:
        if self.broker_id is None:
            return
        end = self.replica.log.write_pos
        client.invoke_oneway(
            RemotingCommand(
                code=RequestCode.BROKER_HEARTBEAT,
                ext_fields={
                    "clusterName": self.config.broker_cluster_name,
                    "brokerName": self.config.broker_name,
                    "brokerId": str(self.broker_id),
                    "brokerAddr": self.address.address,
                    "heartbeatTimeoutMills": str(self.config.controller_heart_beat_timeout_mills),
                    "epoch": str(self.replica.epochs.last_epoch),
                    "maxOffset": str(end),
                    "confirmOffset": str(self.replica.log.confirmed() or 0),
                    "electionPriority": str(self.config.broker_election_priority),
                },
            )
        )

    async def call(self, code: int, body: bytes = b"", **fields) -> RemotingCommand:
        """A request to the controller leader (found by trying, then by the
        CONTROLLER_NOT_LEADER answers' leader address); NoController if none answers."""
        request_fields = {k: str(v) for k, v in fields.items()}
        candidates = [self.leader] if self.leader in self.clients else []
        candidates += [a for a in list(self.clients) if a not in candidates]
        for address in candidates:
            client = self.clients.get(address)
            if client is None or client.closed:
                continue
            sent_at = trio.current_time()
            try:
                self._heartbeat(client)  # before the request, on the same connection
                response = await client.invoke(
                    RemotingCommand(code=code, ext_fields=dict(request_fields), body=body),
                    REQUEST_TIMEOUT_S,
                )
            except (RemotingError, OSError) as exc:
                log.debug("controller %s: %s", address, exc)
                continue
            if response.code == ResponseCode.CONTROLLER_NOT_LEADER:
                if self.leader == address:
                    self.leader = None
                continue
            self.leader = address
            self.answered_sent_at = sent_at
            return response
        raise NoController(f"no controller leader among {', '.join(self.links)}")

    # ------------------------------------------------------------------ start
    async def _assign_id(self) -> int:
        granted = self.identity.granted()
        if granted is not None:
            return granted
        while True:
            applying = self.identity.applying()
            if applying is None:
                answer = await self.call(
                    RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                    clusterName=self.config.broker_cluster_name,
                    brokerName=self.config.broker_name,
                )
                try:
                    if answer.code != ResponseCode.SUCCESS:
                        raise ValueError("refused")
                    broker_id = int(answer.ext_fields["nextBrokerId"])
                except BAD_ANSWER:
                    raise NoController(f"next brokerId: {answer.code} {answer.remark}") from None
                check_code = f"{self.address.address};{int(time.time() * 1000)}"
                self.identity.apply(broker_id, check_code)
            else:
                broker_id, check_code = applying.broker_id, applying.check_code or ""
            answer = await self.call(
                RequestCode.CONTROLLER_APPLY_BROKER_ID,
                clusterName=self.config.broker_cluster_name,
                brokerName=self.config.broker_name,
                appliedBrokerId=broker_id,
                registerCheckCode=check_code,
            )
            if answer.code == ResponseCode.SUCCESS:
                self.identity.grant(broker_id)
                log.warning(
                    "%s: brokerId %d from the controller", self.config.broker_name, broker_id
                )
                return broker_id
            if answer.code != ResponseCode.CONTROLLER_BROKER_ID_INVALID:
                raise NoController(f"apply brokerId {broker_id}: {answer.code} {answer.remark}")
            self.identity.refused()  # taken meanwhile: ask for the next one

    async def _start(self) -> ReplicaInfo:
        while True:
            try:
                if self.broker_id is None:
                    self.broker_id = await self._assign_id()
                    self.role.slave_broker_id = self.broker_id
                    self.replica.client.broker_id = self.broker_id
                answer = await self.call(
                    RequestCode.CONTROLLER_REGISTER_BROKER,
                    clusterName=self.config.broker_cluster_name,
                    brokerName=self.config.broker_name,
                    brokerId=self.broker_id,
                    brokerAddress=self.address.address,
                )
                if answer.code == ResponseCode.SUCCESS:
                    try:
                        return ReplicaInfo.parse(answer)
                    except BAD_ANSWER as exc:
                        raise NoController(f"register answer: {exc!r}") from None
                log.warning("register with the controller: %s %s", answer.code, answer.remark)
            except NoController as exc:
                log.warning("%s: %s", self.config.broker_name, exc)
            except IdentityMismatch as exc:  # RocketMQ's stays fenced too: fix the config
                log.error("%s: fenced: %s", self.config.broker_name, exc)
                await trio.sleep_forever()
            await trio.sleep(RETRY_S)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for address in self.config.controller_addr:
                nursery.start_soon(self._link, address)
            nursery.start_soon(self._follow_controllers)
            task_status.started()
            info = await self._start()
            await self.apply(info)
            nursery.start_soon(self._poll)

    async def _poll(self) -> None:
        """The replica info, at the leader, each heartbeat interval: the lease, a role
        change whose notify was lost, a master without one elected."""
        while True:
            await trio.sleep(self.interval_s)
            info = await self._replica_info()
            if info is not None:
                self._renew(*info)
                await self.apply(info[0])

    async def _replica_info(self) -> tuple[ReplicaInfo, float] | None:
        """CONTROLLER_GET_REPLICA_INFO at the leader: what it says, and when it was asked."""
        try:
            answer = await self.call(
                RequestCode.CONTROLLER_GET_REPLICA_INFO, brokerName=self.config.broker_name
            )
            sent_at = self.answered_sent_at
            if answer.code != ResponseCode.SUCCESS:
                return None
            return ReplicaInfo.parse(answer), sent_at
        except NoController as exc:
            log.debug("replica info: %s", exc)
        except BAD_ANSWER as exc:
            log.warning("replica info does not parse: %r", exc)
        return None

    def _renew(self, info: ReplicaInfo, sent_at: float) -> None:
        """The lease, from a replica info the leader answered to a request sent at
        `sent_at`, if it says this broker is still master in its epoch. Only such an
        answer renews it: one naming another master must fence this one first (an
        answer renewing the lease and then applied let a put in between)."""
        if (
            self.role.is_master
            and info.master_id == self.broker_id
            and info.master_epoch == self.master_epoch
        ):
            self.lease_from = max(self.lease_from, sent_at)

    # ------------------------------------------------------------------ roles
    async def notified(self, request: RemotingCommand, connection: Connection):
        """NOTIFY_BROKER_ROLE_CHANGED (oneway): applied in the background."""
        try:
            info = ReplicaInfo.parse(request)
        except BAD_ANSWER as exc:
            log.warning("NOTIFY_BROKER_ROLE_CHANGED from %s ignored: %s", connection, exc)
        else:
            if self._nursery is not None and self.broker_id is not None:
                self._nursery.start_soon(self.apply, info)
        if request.is_oneway:
            return None
        return request.make_response(ResponseCode.SUCCESS)

    async def apply(self, info: ReplicaInfo) -> None:
        """Take the role `info` gives, if it is news (a newer masterEpoch), or ask to be
        elected when the group has no master."""
        async with self._role_lock:
            assert self.broker_id is not None
            seen = (info.master_epoch, info.sync_state_set_epoch)
            if seen >= self._sync_state_seen:  # not an older answer overtaken by a newer
                self._sync_state_seen = seen
                self._listed_in_sync = info.master_id not in (None, self.broker_id) and (
                    self.broker_id in info.sync_state_set
                )
            if info.master_id is None:
                await self._elect()
                return
            if info.master_epoch < self.master_epoch:
                return
            if info.master_epoch == self.master_epoch:
                if self.role.is_master and info.master_id == self.broker_id:
                    if info.sync_state_set_epoch > self.replica.ha.sync_state.epoch:
                        self.replica.ha.known(info.sync_state_set, info.sync_state_set_epoch)
                elif not self.role.is_master and self.replica.client.connected_to is None:
                    await self._follow(info)  # the master's HA address was not known
                return
            self.master_epoch = info.master_epoch
            if info.master_id == self.broker_id:
                await self._become_master(info)
            else:
                await self._become_slave(info)
            if not self._registering:
                self._registering = True
                assert self._nursery is not None
                self._nursery.start_soon(self.registration.run)
                self.registration.register_soon()

    async def _elect(self) -> None:
        try:
            answer = await self.call(
                RequestCode.CONTROLLER_ELECT_MASTER,
                clusterName=self.config.broker_cluster_name,
                brokerName=self.config.broker_name,
                brokerId=self.broker_id,
            )
        except NoController as exc:
            log.warning("elect: %s", exc)
            return
        if answer.code not in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
            log.warning("elect %d: %s %s", self.broker_id, answer.code, answer.remark)
            return
        try:
            info = ReplicaInfo.parse(answer)
        except BAD_ANSWER as exc:
            log.warning("elect answer does not parse: %r", exc)
            return
        if info.master_id is not None and self._nursery is not None:
            self._nursery.start_soon(self.apply, info)  # after this lock is released

    async def _become_master(self, info: ReplicaInfo) -> None:
        assert self.broker_id is not None
        started = time.monotonic()
        ha = self.replica.ha
        self.replica.stop_following()
        ha.broker_id = self.broker_id
        ha.sync_state = SyncStateSet(
            self.broker_id, info.sync_state_set | {self.broker_id}, info.sync_state_set_epoch
        )
        ha.begin(info.master_epoch)
        while not self.store.caught_up():
            await self.store.wait_dispatch(0.05)
        self.promotion.take_over(info.master_epoch)
        # the lease: a notify proves no timing, so ask (one round trip)
        asked = await self._replica_info()
        if asked is not None:
            self._renew(*asked)
        self.on_master()
        if self._registering:
            await self.registration.register_now()
        log.warning(
            "%s: master (controller id %d) in epoch %d, %.0f ms after the controller's word",
            self.config.broker_name,
            self.broker_id,
            info.master_epoch,
            (time.monotonic() - started) * 1000,
        )

    async def _become_slave(self, info: ReplicaInfo) -> None:
        if self.role.is_master or self.replica.ha.fenced is None:
            self.replica.ha.fence(f"broker {info.master_id} is master in epoch {info.master_epoch}")
        self.role.become_slave(info.master_epoch)
        self.on_slave()
        log.warning(
            "%s: slave (brokerId %s) of broker %s in epoch %d",
            self.config.broker_name,
            self.broker_id,
            info.master_id,
            info.master_epoch,
        )
        await self._follow(info)
        if self._registering:
            self.registration.register_soon()

    async def _follow(self, info: ReplicaInfo) -> None:
        """Follow the master's HA port, asked of the master itself."""
        if info.master_addr is None:
            return
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                async with RemotingClient(
                    info.master_addr, connect_timeout_s=CONNECT_TIMEOUT_S
                ) as client:
                    answer = await client.invoke(
                        RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO),
                        REQUEST_TIMEOUT_S,
                    )
            ha_port = int(json.loads(answer.body)["table"]["haListenPort"])
        except (RemotingError, OSError, trio.TooSlowError, ValueError, KeyError) as exc:
            log.warning("master %s's HA port: %s (asked again)", info.master_addr, exc)
            return
        host, _ = parse_address(info.master_addr)
        self.replica.follow(info.master_addr, f"{host}:{ha_port}")

    async def epoch_cache(self, request: RemotingCommand, connection: Connection):
        """GET_BROKER_EPOCH_CACHE (`mqadmin getBrokerEpoch`): the epoch file's entries,
        each with the offset its epoch ends at (the next one's start; the last one's is
        Long.MAX_VALUE, which the tool replaces with maxOffset), as RocketMQ's
        EpochEntryCache."""
        entries = self.replica.epochs.entries
        ends = end_offsets(entries, JAVA_LONG_MAX)
        body = {
            "clusterName": self.config.broker_cluster_name,
            "brokerName": self.config.broker_name,
            "brokerId": self.role.broker_id,
            "epochList": [
                {"epoch": e.epoch, "startOffset": e.start_offset, "endOffset": end}
                for e, end in zip(entries, ends, strict=True)
            ],
            "maxOffset": self.replica.log.write_pos,
        }
        return request.make_response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    # ------------------------------------------------------------------ SyncStateSet
    async def _alter(self, new_set: frozenset[int], master_epoch: int, set_epoch: int):
        """AutoSwitchMaster's proposal, as CONTROLLER_ALTER_SYNC_STATE_SET."""
        body = json.dumps({"syncStateSet": sorted(new_set), "syncStateSetEpoch": set_epoch})
        try:
            answer = await self.call(
                RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                body.encode(),
                brokerName=self.config.broker_name,
                masterBrokerId=self.broker_id,
                masterEpoch=master_epoch,
            )
        except NoController as exc:
            raise AlterUnknown(str(exc)) from None
        if answer.code != ResponseCode.SUCCESS:
            raise AlterRefused(f"{answer.code} {answer.remark}")
        try:
            taken = json.loads(answer.body)
            return frozenset(int(i) for i in taken["syncStateSet"]), int(taken["syncStateSetEpoch"])
        except BAD_ANSWER as exc:
            raise AlterUnknown(f"the answer does not parse: {exc!r}") from None
