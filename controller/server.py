"""`ControllerServer`: the state machine on a DLedger group, behind RocketMQ's requests.

    server = ControllerServer(config)
    await nursery.start(server.serve)

Each controller runs a `DLedgerServer` whose log holds the controller's events
(`events`), and serves RocketMQ's remoting requests on that server's peer port, as
RocketMQ's controller does: a connection whose first bytes are not a DLedger frame is
handed to the remoting server (`dledger.net.tcp`'s `foreign`).

Writes: only the leader decides, one request at a time (a lock, RocketMQ's single
event thread): it checks the request against its state, appends the events, and
answers once they are committed and applied here, so what it decides next sees them.
A new leader serves nothing until it has applied an entry of its own term (the NOOP
DLedger appends on election), and so everything its predecessors committed; a leader
whose lease has run out serves nothing either, reads included (RocketMQ answers reads
from the leader's memory without such a check). Other controllers answer
CONTROLLER_NOT_LEADER with the leader's address, except CONTROLLER_GET_METADATA_INFO,
heartbeats, the config requests and DLEDGER_MEMBERS (which forwards a change to the
DLedger leader), which any controller answers.

Every controller applies the committed events in log order (`ReplicasInfo.apply`):
a restart replays the whole log, which is kept whole (retention never deletes it).

Liveness (`liveness`): brokers heartbeat every controller, so every controller keeps
its own table, and a new leader starts with a full one (RocketMQ #5712 lost it on a
leader change). A controller that has run for less than one heartbeat timeout may not
have heard a live broker yet: it takes no broker for dead (it elects no replacement of
a master) until it has run that long or heard every member of the group. Nor does a
new leader before the master's heartbeat timeout has passed since it took over, unless
the master's connection to it closed since: the master's lease (`broker.replicas_manager`)
counts from the last answer of a leader, which the previous one may have given just
before this one took over, later than anything this one heard from the master (a master
that reached the old leader only). A broker is
dead when its heartbeats stop for its timeout (scanned when the first is due, and at
least every `scanNotActiveBrokerInterval`) or at once when its connection closes; a dead master is
replaced by an election (retried `electMasterMaxRetryCount` times), and the leader
also checks every `scanInactiveMasterInterval` for groups whose master is dead while
another member lives. After an election the group's live brokers are told
(NOTIFY_BROKER_ROLE_CHANGED, oneway).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import attrs
import trio
from prometheus_client import CollectorRegistry
from raftmq.controller import events
from raftmq.controller.config import DEFAULT_HEARTBEAT_TIMEOUT_MS, KEYS, ControllerConfig
from raftmq.controller.liveness import BrokerLiveInfo, Liveness
from raftmq.controller.metrics import ControllerCollector
from raftmq.controller.replicas import ReplicasInfo, Result, sync_state_set_body
from raftmq.dledger.codes import Role
from raftmq.dledger.server import DLedgerError, DLedgerServer
from raftmq.dledger.store.entry import EntryType

from raftmq.config.address import parse_address
from raftmq.config.properties import format_properties, parse_properties
from raftmq.process.metrics_endpoint import serve_metrics
from raftmq.remoting.client import RemotingClient
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.command import RemotingCommand
from raftmq.remoting.connection import Connection
from raftmq.remoting.errors import RemotingConnectError, RemotingError
from raftmq.remoting.fields import BadRequest, boolean, integer, text
from raftmq.remoting.processor import ProcessorTable
from raftmq.remoting.server import RemotingServer

__all__ = ["ControllerServer"]

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 5.0  # RocketMQ's wait for an event's commit
NOTIFY_TIMEOUT_S = 3.0
# keys updateControllerConfig changes at once; the others need a restart
LIVE_KEYS = frozenset(
    {
        "enableElectUncleanMaster",
        "notifyBrokerRoleChanged",
        "scanNotActiveBrokerInterval",
        "scanInactiveMasterInterval",
        "electMasterMaxRetryCount",
    }
)


#: past a heartbeat timeout before the scan looks: a broker is dead once it has passed
EXPIRY_SLACK_S = 0.001


class NotLeader(Exception):
    """This controller may not answer: it does not lead, or not yet, or not any more."""


class ControllerServer:
    def __init__(self, config: ControllerConfig, **dledger_overrides) -> None:
        config.check()
        self.config = config
        self.state = ReplicasInfo(config.enable_elect_unclean_master)
        self.remoting = RemotingServer(
            None, 0, self._processors(), on_disconnect=self._connection_closed
        )
        self.dledger = DLedgerServer(
            config.dledger(**dledger_overrides),
            client_appends=False,
            foreign=self.remoting.serve_accepted,
        )
        self.dledger.add_retention_limit(lambda: 0)  # the log is the state: keep it whole
        self.dledger.add_commit_handler(self._on_commit)
        self.liveness = Liveness(started_ms=self._now_ms())
        self.metrics = CollectorRegistry(auto_describe=False)
        self.metrics.register(ControllerCollector(self))
        self.applied_index = self.dledger.store.begin_index - 1
        self._applied = trio.Event()  # set, and replaced, whenever applied_index moves
        self._ready_term = -1  # the last term this controller led and caught up in
        self._ready_since_ms = float("inf")  # when it caught up in that term
        self._write_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        # the heartbeat-timeout scan's wait (`_scan_not_active_brokers`)
        self._scan_wait = trio.CancelScope()

    @staticmethod
    def _now_ms() -> float:
        return trio.current_time() * 1000.0

    @property
    def port(self) -> int:
        return self.dledger.transport.listen_port

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; `task_status.started(port)` once listening."""
        self.liveness = Liveness(started_ms=self._now_ms())
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.dledger.serve)
            nursery.start_soon(self._scan_not_active_brokers)
            nursery.start_soon(self._scan_inactive_masters)
            config = self.config
            if config.prom_exporter_port:
                host = config.prom_exporter_host or parse_address(config.peers[config.self_id])[0]
                await nursery.start(serve_metrics, self.metrics, host, config.prom_exporter_port)
            task_status.started(self.port)

    # ------------------------------------------------------------------ the log
    def _on_commit(self, committed_index: int) -> None:
        replica = self.dledger.replica
        moved = False
        while self.applied_index < committed_index:
            entry = self.dledger.store.get(self.applied_index + 1)
            if entry.type == EntryType.NORMAL:
                try:
                    event = events.decode(entry.body)
                except ValueError as exc:  # the same on every controller: skipped by all
                    log.error("entry %d holds no event the controller reads: %s", entry.index, exc)
                    event = None
                if event is not None:
                    self.state.apply(event)
            if replica.role is Role.LEADER and entry.term == replica.term:
                if self._ready_term != entry.term:
                    self._ready_since_ms = self._now_ms()
                self._ready_term = entry.term  # everything before its own entry is applied
            self.applied_index = entry.index
            moved = True
        if moved:
            self._applied.set()
            self._applied = trio.Event()

    def leading(self) -> bool:
        """Whether this controller may answer: it leads, has caught up, holds its lease."""
        replica = self.dledger.replica
        return (
            replica.role is Role.LEADER
            and self._ready_term == replica.term
            and replica.holds_lease(self._now_ms())
        )

    def _check_leading(self) -> None:
        if not self.leading():
            raise NotLeader()

    async def _until_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._applied.wait()

    async def write(self, decide: Callable[[], Result]) -> Result:
        """Decide on the leader's state and carry the decision out through the log;
        returns once its events are applied here. NotLeader, DLedgerError, TooSlowError."""
        async with self._write_lock:
            self._check_leading()
            result = decide()
            if result.events:
                entries = [events.encode(event) for event in result.events]
                with trio.fail_after(WRITE_TIMEOUT_S):
                    positions = await self.dledger.append_batch(entries)
                    await self._until_applied(positions[-1][0])
            return result

    # ------------------------------------------------------------------ liveness
    def alive(self, cluster: str, broker_name: str, broker_id: int) -> bool:
        return self.liveness.alive(cluster, broker_name, broker_id, self._now_ms())

    def live_info(self, cluster: str, broker_name: str, broker_id: int) -> BrokerLiveInfo | None:
        return self.liveness.get(cluster, broker_name, broker_id)

    def may_take_for_dead(self, broker_name: str) -> bool:
        """Whether the group's master, unheard, is dead as far as this controller can
        tell: it has listened for a heartbeat timeout or heard every member (#5712), and
        the master's lease is over: it has led for the master's heartbeat timeout, or
        the master's connection to it closed while it led (a process that died closes
        it; a silent network does not)."""
        now_ms = self._now_ms()
        timeouts = [i.heartbeat_timeout_ms for i in self.liveness.brokers.values()]
        warm_ms = max([DEFAULT_HEARTBEAT_TIMEOUT_MS, *timeouts])
        replicas = self.state.replicas.get(broker_name)
        listened = self.liveness.heard_for_ms(now_ms) >= warm_ms or (
            replicas is not None
            and all(
                (replicas.cluster_name, broker_name, b) in self.liveness.heard
                for b in replicas.brokers
            )
        )
        state = self.state.sync_states.get(broker_name)
        if not listened or state is None or state.master_broker_id is None:
            return listened
        master = (state.cluster_name, broker_name, state.master_broker_id)
        lease_ms = self.liveness.timeouts_ms.get(master, warm_ms)
        closed_ms = self.liveness.closed_ms.get(master, float("-inf"))
        return closed_ms >= self._ready_since_ms or now_ms - self._ready_since_ms >= lease_ms

    def _connection_closed(self, connection: Connection) -> None:
        self._brokers_gone(self.liveness.channel_closed(connection, self._now_ms()))

    async def _scan_not_active_brokers(self) -> None:
        """Take brokers for dead as their heartbeat timeouts pass. RocketMQ only scans
        every scanNotActiveBrokerInterval, so a silent master goes unnoticed for up to
        that long past its timeout (5 s past a 10 s one); here the scan also wakes when
        the first timeout is due, and a heartbeat due before the wake (a new broker's,
        or a shorter timeout) brings it forward (`_heartbeat`)."""
        interval_s = self.config.scan_not_active_broker_interval_ms / 1000
        while True:
            wake_s = trio.current_time() + interval_s
            due_ms = self.liveness.next_deadline_ms()
            if due_ms is not None:
                wake_s = min(wake_s, due_ms / 1000 + EXPIRY_SLACK_S)
            with trio.move_on_at(wake_s) as self._scan_wait:
                await trio.sleep_forever()
            self._brokers_gone(self.liveness.expire(self._now_ms()))

    def _brokers_gone(self, gone: list[BrokerLiveInfo]) -> None:
        for info in gone:
            log.warning(
                "broker %s/%s id %d (%s) is no longer alive",
                info.cluster_name,
                info.broker_name,
                info.broker_id,
                info.broker_addr,
            )
            state = self.state.sync_states.get(info.broker_name)
            if self.leading() and state is not None and state.master_broker_id == info.broker_id:
                self._nursery.start_soon(self._elect_for, info.broker_name)

    async def _scan_inactive_masters(self) -> None:
        while True:
            await trio.sleep(self.config.scan_inactive_master_interval_ms / 1000)
            if self.leading():
                for name in self.state.groups_to_reelect(self.alive):
                    await self._elect_for(name)

    async def _elect_for(self, broker_name: str) -> None:
        """The controller's own election for a group whose master died."""
        for _ in range(self.config.elect_master_max_retry_count):
            if not self.may_take_for_dead(broker_name):
                return  # not heard long enough: the next scan tries again
            try:
                result = await self.write(lambda: self._elect(broker_name, None, False))
            except (NotLeader, DLedgerError, trio.TooSlowError) as exc:
                log.warning("election for %s not made: %r", broker_name, exc)
                continue
            log.warning("election for %s: %s %s", broker_name, result.code, result.remark or "")
            if result.code in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
                return
            if result.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE:
                return  # no candidate: a member that comes back asks for itself

    def _elect(self, broker_name: str, broker_id: int | None, designate: bool) -> Result:
        result = self.state.elect_master(
            broker_name, broker_id, designate, self.alive, self.live_info
        )
        state = self.state.sync_states.get(broker_name)
        replacing = (
            result.events
            and state is not None
            and state.master_broker_id is not None
            and not self.alive(state.cluster_name, broker_name, state.master_broker_id)
        )
        if replacing and not self.may_take_for_dead(broker_name):
            return Result(
                ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                "this controller has not heard the group's brokers for a heartbeat timeout"
                " yet, or the master's lease may not be over: it takes no master for dead",
            )
        if result.code == ResponseCode.SUCCESS and self.config.notify_broker_role_changed:
            self._nursery.start_soon(self._notify, broker_name, result)
        return result

    async def _notify(self, broker_name: str, result: Result) -> None:
        """Tell the group's live brokers of its new master (once applied)."""
        epoch = int(result.header["masterEpoch"])

        def applied() -> bool:
            state = self.state.sync_states.get(broker_name)
            return state is None or state.master_epoch >= epoch

        with trio.move_on_after(WRITE_TIMEOUT_S):
            while not applied():
                await self._applied.wait()
        state, replicas = (
            self.state.sync_states.get(broker_name),
            self.state.replicas.get(broker_name),
        )
        if state is None or replicas is None or state.master_epoch != epoch:
            return  # not committed, or superseded: whoever made the newer one tells
        header = {
            k: result.header[k]
            for k in ("masterAddress", "masterEpoch", "syncStateSetEpoch", "masterBrokerId")
            if k in result.header
        }
        body = sync_state_set_body(
            [int(result.header["masterBrokerId"])], int(result.header["syncStateSetEpoch"])
        )
        for broker_id, (address, _) in sorted(replicas.brokers.items()):
            if self.alive(replicas.cluster_name, broker_name, broker_id):
                self._nursery.start_soon(self._notify_one, address, header, body)

    @staticmethod
    async def _notify_one(address: str, header: dict[str, str], body: bytes) -> None:
        request = RemotingCommand(
            code=RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext_fields=dict(header), body=body
        )
        with trio.move_on_after(NOTIFY_TIMEOUT_S):
            try:
                async with RemotingClient(address, connect_timeout_s=NOTIFY_TIMEOUT_S) as client:
                    client.invoke_oneway(request)
                    while client.connection.unsent_bytes and not client.closed:
                        await trio.sleep(0.001)  # sent before the client closes
            except (RemotingConnectError, RemotingError, OSError) as exc:
                log.warning("cannot tell %s of its group's new master: %r", address, exc)

    # ------------------------------------------------------------------ requests
    def _processors(self) -> ProcessorTable:
        handlers = {
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self._alter_sync_state_set,
            RequestCode.CONTROLLER_ELECT_MASTER: self._elect_master,
            RequestCode.CONTROLLER_REGISTER_BROKER: self._register_broker,
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self._get_replica_info,
            RequestCode.CONTROLLER_GET_METADATA_INFO: self._get_metadata_info,
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: self._get_sync_state_data,
            RequestCode.BROKER_HEARTBEAT: self._heartbeat,
            RequestCode.UPDATE_CONTROLLER_CONFIG: self._update_config,
            RequestCode.GET_CONTROLLER_CONFIG: self._get_config,
            RequestCode.CLEAN_BROKER_DATA: self._clean_broker_data,
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self._get_next_broker_id,
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self._apply_broker_id,
            RequestCode.DLEDGER_MEMBERS: self._dledger_members,
        }
        return ProcessorTable({code: self._answering(h) for code, h in handlers.items()})

    def _answering(self, handler):
        """`handler(request, connection) -> Result` as a processor: bad input, another
        leader and a write whose outcome is unknown become RocketMQ answers."""

        async def process(request: RemotingCommand, connection: Connection):
            try:
                result = await handler(request, connection)
            except BadRequest as exc:
                result = Result(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc))
            except NotLeader:
                replica = self.dledger.replica
                leader = replica.leader_id
                address = self.dledger.metadata()["peers"].get(leader) if leader else None
                result = Result(
                    ResponseCode.CONTROLLER_NOT_LEADER,
                    f"The controller is not in leader state; the leader is {leader} at {address}"
                    if leader and leader != self.config.self_id
                    else "The controller is not in leader state (no leader known yet)",
                    {"controllerLeaderId": leader, "controllerLeaderAddress": address}
                    if leader and address
                    else {},
                )
            except DLedgerError as exc:
                result = Result(ResponseCode.SYSTEM_ERROR, f"the event was not committed: {exc}")
            except trio.TooSlowError:
                result = Result(
                    ResponseCode.SYSTEM_ERROR,
                    f"the event was not committed within {WRITE_TIMEOUT_S} s (it may still be)",
                )
            if request.is_oneway:
                return None
            return request.make_response(
                result.code, result.remark, ext_fields=dict(result.header), body=result.body
            )

        return process

    async def _alter_sync_state_set(self, request, connection) -> Result:
        name = text(request, "brokerName")
        master = integer(request, "masterBrokerId")
        master_epoch = integer(request, "masterEpoch")
        body = _json_body(request)
        ids, epoch = body.get("syncStateSet"), body.get("syncStateSetEpoch")
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise BadRequest("the body's syncStateSet is not a list of brokerIds")
        if type(epoch) is not int:
            raise BadRequest("the body's syncStateSetEpoch is not an integer")
        return await self.write(
            lambda: self.state.alter_sync_state_set(
                name, master, master_epoch, frozenset(ids), epoch, self.alive
            )
        )

    async def _elect_master(self, request, connection) -> Result:
        name = text(request, "brokerName")
        broker_id = integer(request, "brokerId", -1)
        designate = boolean(request, "designateElect")
        return await self.write(lambda: self._elect(name, broker_id, designate))

    async def _register_broker(self, request, connection) -> Result:
        cluster, name = text(request, "clusterName"), text(request, "brokerName")
        broker_id = integer(request, "brokerId")
        address = text(request, "brokerAddress")
        return await self.write(
            lambda: self.state.register_broker(cluster, name, broker_id, address, self.alive)
        )

    async def _get_replica_info(self, request, connection) -> Result:
        name = text(request, "brokerName")
        self._check_leading()
        return self.state.replica_info(name)

    async def _get_metadata_info(self, request, connection) -> Result:
        leader = self.dledger.replica.leader_id
        members = self.dledger.metadata()["peers"]  # in force, not as configured
        peers = "".join(f"{i}:{a};" for i, a in members.items())
        return Result(
            header={
                "group": self.config.group,
                "controllerLeaderId": leader or "",
                "controllerLeaderAddress": members.get(leader, "") if leader else "",
                "isLeader": "true" if self.leading() else "false",
                "peers": peers,
            }
        )

    async def _dledger_members(self, request, connection) -> Result:
        """DLEDGER_MEMBERS (ours), as a DLedger broker answers it: the controllers'
        group, after an add, promote or remove forwarded to its DLedger leader has
        committed (`mqadmin addControllerPeer`, `removeControllerPeer`,
        `getControllerPeers`). Any controller answers."""
        change = text(request, "change", "")
        members = self.dledger.members()
        try:  # a DLedgerError is answered SYSTEM_ERROR, the change not committed
            if change:
                member, address = text(request, "memberId"), text(request, "address", "")
                members = await self.dledger.change_at_leader(change, member, address)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return Result(body=json.dumps(members).encode())

    async def _get_sync_state_data(self, request, connection) -> Result:
        names = _json_body(request, list)
        if not all(isinstance(n, str) for n in names):
            raise BadRequest("the body is not a JSON list of brokerNames")
        self._check_leading()
        return self.state.sync_state_data(names, self.alive)

    async def _heartbeat(self, request, connection) -> Result:
        if request.ext_fields.get("brokerId") in (None, ""):
            raise BadRequest("Heart beat with empty brokerId")
        info = BrokerLiveInfo(
            cluster_name=text(request, "clusterName"),
            broker_name=text(request, "brokerName"),
            broker_id=integer(request, "brokerId"),
            broker_addr=text(request, "brokerAddr"),
            last_update_ms=self._now_ms(),
            heartbeat_timeout_ms=integer(
                request, "heartbeatTimeoutMills", DEFAULT_HEARTBEAT_TIMEOUT_MS
            ),
            epoch=integer(request, "epoch", 0),
            max_offset=integer(request, "maxOffset", 0),
            confirm_offset=integer(request, "confirmOffset", 0),
            election_priority=integer(request, "electionPriority", 2**31 - 1),
            channel=connection,
        )
        self.liveness.heartbeat(info)
        due_s = (info.last_update_ms + info.heartbeat_timeout_ms) / 1000 + EXPIRY_SLACK_S
        self._scan_wait.deadline = min(self._scan_wait.deadline, due_s)
        return Result(remark="Heart beat success")

    async def _get_config(self, request, connection) -> Result:
        return Result(body=format_properties(self.config.properties()).encode())

    async def _update_config(self, request, connection) -> Result:
        try:
            given = parse_properties(request.body.decode("utf-8"), "updateControllerConfig")
        except (UnicodeDecodeError, ValueError) as exc:
            return Result(ResponseCode.SYSTEM_ERROR, f"string2Properties error: {exc}")
        black = {k for k in self.config.config_black_list.split(";") if k} | {"rocketmqHome"}
        if given.keys() & black:
            return Result(ResponseCode.NO_PERMISSION, "Can not update config in black list.")
        fixed = sorted(given.keys() - LIVE_KEYS)
        if fixed:
            return Result(
                ResponseCode.INVALID_PARAMETER,
                f"{', '.join(fixed)}: not changed at runtime here (only"
                f" {', '.join(sorted(LIVE_KEYS))}); change the config file and restart",
            )
        try:
            fields, _ = KEYS.read_text(given, "updateControllerConfig")
        except ValueError as exc:
            return Result(ResponseCode.INVALID_PARAMETER, str(exc))
        self.config = attrs.evolve(self.config, **fields)
        self.state.enable_elect_unclean_master = self.config.enable_elect_unclean_master
        return Result()

    async def _clean_broker_data(self, request, connection) -> Result:
        cluster = request.ext_fields.get("clusterName") or None
        name = text(request, "brokerName")
        ids = request.ext_fields.get("brokerControllerIdsToClean") or None
        living = boolean(request, "isCleanLivingBroker")
        return await self.write(
            lambda: self.state.clean_broker_data(cluster, name, ids, living, self.alive)
        )

    async def _get_next_broker_id(self, request, connection) -> Result:
        cluster, name = text(request, "clusterName"), text(request, "brokerName")
        self._check_leading()
        return self.state.next_broker_id(cluster, name)

    async def _apply_broker_id(self, request, connection) -> Result:
        cluster, name = text(request, "clusterName"), text(request, "brokerName")
        broker_id = integer(request, "appliedBrokerId")
        check_code = text(request, "registerCheckCode")
        return await self.write(
            lambda: self.state.apply_broker_id(cluster, name, broker_id, check_code)
        )


def _json_body(request: RemotingCommand, kind: type = dict):
    try:
        value = json.loads(request.body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(value, kind):
        raise BadRequest(f"the body is not a JSON {'object' if kind is dict else 'list'}")
    return value
