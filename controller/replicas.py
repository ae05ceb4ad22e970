"""The controller's state machine (`ReplicasInfoManager`), sans-IO.

Per brokerName, a `BrokerReplicaInfo` (the members: brokerId -> address and the check
code it registered with) and a `SyncStateInfo` (the master, its epoch, the SyncStateSet
and its epoch). A request is checked against this state and answered with a `Result`:
a response code, header fields, a body, and the events that carry it out. The events
go through the replicated log and every controller applies them in log order with
`apply`; the reply is sent once they are applied. Reads are answered from the state.

Epochs (RocketMQ's rules): electing a master raises masterEpoch and syncStateSetEpoch
by one and makes the set {master}; electing no one (the controller found the master
dead and no candidate) clears the master, raises masterEpoch, keeps the set; an
altered set raises syncStateSetEpoch. A group never elected has masterEpoch 0, and its
first election takes the broker that asks.

Whether a broker is alive and what it last reported are the controller's own
knowledge (`liveness`), handed to the checks as functions of (cluster, brokerName,
brokerId).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs
from raftmq.controller import election
from raftmq.controller.events import (
    AlterSyncStateSet,
    ApplyBrokerId,
    CleanBrokerData,
    ElectMaster,
    Event,
    UpdateBrokerAddress,
)
from raftmq.controller.liveness import BrokerLiveInfo

from raftmq.remoting.codes import ResponseCode

__all__ = ["BrokerReplicaInfo", "ReplicasInfo", "Result", "SyncStateInfo"]

FIRST_BROKER_CONTROLLER_ID = 1  # MixAll.FIRST_BROKER_CONTROLLER_ID

Alive = Callable[[str, str, int], bool]
LiveInfo = Callable[[str, str, int], BrokerLiveInfo | None]


@attrs.define
class BrokerReplicaInfo:
    cluster_name: str
    broker_name: str
    next_assign_broker_id: int = FIRST_BROKER_CONTROLLER_ID
    brokers: dict[int, tuple[str, str]] = attrs.Factory(dict)  # id -> (address, checkCode)

    def address(self, broker_id: int | None) -> str | None:
        entry = self.brokers.get(broker_id) if broker_id is not None else None
        return entry[0] if entry else None


@attrs.define
class SyncStateInfo:
    cluster_name: str
    broker_name: str
    master_broker_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0


@attrs.frozen
class Result:
    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    header: dict[str, str] = attrs.Factory(dict)
    body: bytes = b""
    events: tuple[Event, ...] = ()


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def sync_state_set_body(ids, epoch: int) -> bytes:
    """RocketMQ's `SyncStateSet` body."""
    return _json({"syncStateSet": sorted(ids), "syncStateSetEpoch": epoch})


def _header(**fields) -> dict[str, str]:
    """Ext fields as RocketMQ writes them: strings, absent when null."""
    out = {}
    for name, value in fields.items():
        if value is not None:
            out[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


@attrs.define
class ReplicasInfo:
    """Both tables; `apply` is the only thing that changes them."""

    enable_elect_unclean_master: bool = False
    replicas: dict[str, BrokerReplicaInfo] = attrs.Factory(dict)
    sync_states: dict[str, SyncStateInfo] = attrs.Factory(dict)
    # masters elected per group since the log began (the same on every controller)
    elections: dict[str, int] = attrs.Factory(dict)

    def _known(self, broker_name: str) -> bool:
        return broker_name in self.replicas and broker_name in self.sync_states

    # ------------------------------------------------------------------ writes
    def alter_sync_state_set(
        self,
        broker_name: str,
        master_broker_id: int,
        master_epoch: int,
        new_set: frozenset[int],
        sync_state_set_epoch: int,
        alive: Alive,
    ) -> Result:
        """The master reports its new SyncStateSet, fenced by both epochs."""
        fail = ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
        if not self._known(broker_name):
            return Result(fail, "Broker metadata is not existed")
        state, replicas = self.sync_states[broker_name], self.replicas[broker_name]
        if new_set == state.sync_state_set:
            return Result(fail, "The newSyncStateSet is equal with oldSyncStateSet")
        if state.master_broker_id is None or state.master_broker_id != master_broker_id:
            return Result(
                ResponseCode.CONTROLLER_INVALID_MASTER,
                f"the current master is {state.master_broker_id}, not {master_broker_id}",
            )
        if master_epoch != state.master_epoch:
            return Result(
                ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                f"the current master epoch is {state.master_epoch}, not {master_epoch}",
            )
        if sync_state_set_epoch != state.sync_state_set_epoch:
            return Result(
                ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                f"the current syncStateSet epoch is {state.sync_state_set_epoch},"
                f" not {sync_state_set_epoch}",
            )
        for broker_id in sorted(new_set):
            if broker_id not in replicas.brokers:
                return Result(
                    ResponseCode.CONTROLLER_INVALID_REPLICAS, f"replica {broker_id} does not exist"
                )
            if not alive(replicas.cluster_name, broker_name, broker_id):
                return Result(
                    ResponseCode.CONTROLLER_BROKER_NOT_ALIVE, f"replica {broker_id} is not alive"
                )
        if state.master_broker_id not in new_set:
            return Result(fail, f"the new syncStateSet lacks the master {state.master_broker_id}")
        epoch = state.sync_state_set_epoch + 1
        return Result(
            header=_header(newSyncStateSetEpoch=epoch),
            body=sync_state_set_body(new_set, epoch),
            events=(AlterSyncStateSet(broker_name, frozenset(new_set)),),
        )

    def elect_master(
        self,
        broker_name: str,
        broker_id: int | None,
        designate_elect: bool,
        alive: Alive,
        live_info: LiveInfo,
    ) -> Result:
        """Elect the group's master. `broker_id` None or -1: the controller asks (its
        master is dead), and finding no one clears the master."""
        if not self._known(broker_name):
            return Result(
                ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                "Broker hasn't been registered",
            )
        state, replicas = self.sync_states[broker_name], self.replicas[broker_name]
        cluster, old = replicas.cluster_name, state.master_broker_id
        new = None
        if state.master_epoch == 0 and broker_id in replicas.brokers:
            # a group's first election takes the broker that asks; RocketMQ takes any
            # id asked for, one that is no member too, and makes it master
            new = broker_id
        if new is None:
            new = election.elect(
                state.sync_state_set,
                set(replicas.brokers) if self.enable_elect_unclean_master else None,
                old,
                broker_id if designate_elect else None,
                lambda b: alive(cluster, broker_name, b),
                lambda b: live_info(cluster, broker_name, b),
            )
        if new is not None and new == old:
            return Result(
                ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                f"The old master {old} is still alive, no need to elect a new master"
                f" for broker {broker_name}",
                _header(
                    masterBrokerId=old,
                    masterAddress=replicas.address(old),
                    masterEpoch=state.master_epoch,
                    syncStateSetEpoch=state.sync_state_set_epoch,
                ),
                _json({"syncStateSet": sorted(state.sync_state_set)}),
            )
        if new is not None:
            group = {
                "cluster": cluster,
                "brokerName": broker_name,
                "brokerAddrs": {str(i): a for i, (a, _) in sorted(replicas.brokers.items())},
            }
            return Result(
                header=_header(
                    masterBrokerId=new,
                    masterAddress=replicas.address(new),
                    masterEpoch=state.master_epoch + 1,
                    syncStateSetEpoch=state.sync_state_set_epoch + 1,
                ),
                body=_json({"brokerMemberGroup": group, "syncStateSet": [new]}),
                events=(ElectMaster(True, broker_name, new),),
            )
        if broker_id in (None, -1):
            # RocketMQ appends the cleared master even when there is none (a group never
            # elected, or one cleared before): that raises masterEpoch for nothing and
            # ends a new group's first-election rule, so its first broker could no
            # longer be elected from the empty set. Here there must be a master to clear.
            return Result(
                ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                "Old master has down and failed to elect a new broker master",
                events=(ElectMaster(False, broker_name),) if old is not None else (),
            )
        return Result(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED, "Failed to elect a new master")

    def apply_broker_id(
        self, cluster: str, broker_name: str, broker_id: int, check_code: str
    ) -> Result:
        """A broker claims `broker_id`: granted when free, or already its own (same
        check code: a retry after a lost reply); a new group starts at id 1."""
        header = _header(clusterName=cluster, brokerName=broker_name)
        event = ApplyBrokerId(cluster, broker_name, check_code.split(";")[0], check_code, broker_id)
        replicas = self.replicas.get(broker_name)
        if replicas is None:
            if broker_id == FIRST_BROKER_CONTROLLER_ID:
                return Result(header=header, events=(event,))
            return Result(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                f"Broker-set: {broker_name} hasn't been registered in controller, but broker"
                f" try to apply brokerId: {broker_id}",
                header,
            )
        held = replicas.brokers.get(broker_id)
        if held is None or held[1] == check_code:
            return Result(header=header, events=(event,))
        return Result(
            ResponseCode.CONTROLLER_BROKER_ID_INVALID,
            f"Fail to apply brokerId: {broker_id} in broker-set: {broker_name}",
            header,
        )

    def register_broker(
        self, cluster: str, broker_name: str, broker_id: int, address: str, alive: Alive
    ) -> Result:
        """A broker with its id starts: the group's master (if alive) and SyncStateSet;
        a changed address is recorded."""
        header = _header(clusterName=cluster, brokerName=broker_name)
        if not self._known(broker_name):
            return Result(
                ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                f"Broker-set: {broker_name} hasn't been registered in controller",
                header,
            )
        state, replicas = self.sync_states[broker_name], self.replicas[broker_name]
        if broker_id not in replicas.brokers:
            return Result(
                ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                f"BrokerId: {broker_id} hasn't been registered in broker-set: {broker_name}",
                header,
            )
        master = state.master_broker_id
        if master is not None and alive(cluster, broker_name, master):
            header |= _header(
                masterBrokerId=master,
                masterAddress=replicas.address(master),
                masterEpoch=state.master_epoch,
                syncStateSetEpoch=state.sync_state_set_epoch,
            )
        events = ()
        if replicas.address(broker_id) != address:
            events = (UpdateBrokerAddress(cluster, broker_name, address, broker_id),)
        return Result(
            header=header,
            body=sync_state_set_body(state.sync_state_set, state.sync_state_set_epoch),
            events=events,
        )

    def clean_broker_data(
        self,
        cluster: str | None,
        broker_name: str,
        ids_to_clean: str | None,
        clean_living_broker: bool,
        alive: Alive,
    ) -> Result:
        """Forget a group, or some of its members (`mqadmin cleanBrokerMetadata`)."""
        invalid = ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
        ids = None
        if ids_to_clean and ids_to_clean.strip():
            try:
                ids = frozenset(int(i) for i in ids_to_clean.split(";"))
            except ValueError as exc:
                return Result(invalid, f"brokerControllerIdsToClean must be ids like 1;2 ({exc})")
        if not clean_living_broker:
            state = self.sync_states.get(broker_name)
            if ids is None and state is not None and state.master_broker_id is not None:
                return Result(invalid, f"Broker {broker_name} is still alive, clean up failure")
            for broker_id in sorted(ids or ()):
                if alive(cluster or "", broker_name, broker_id):
                    return Result(
                        invalid,
                        f"Broker [{broker_name}, {broker_id}] is still alive, clean up failure",
                    )
        if self._known(broker_name):
            return Result(events=(CleanBrokerData(broker_name, ids),))
        return Result(invalid, f"Broker {broker_name} is not existed,clean broker data failure.")

    # ------------------------------------------------------------------ reads
    def next_broker_id(self, cluster: str, broker_name: str) -> Result:
        replicas = self.replicas.get(broker_name)
        next_id = FIRST_BROKER_CONTROLLER_ID if replicas is None else replicas.next_assign_broker_id
        return Result(
            header=_header(clusterName=cluster, brokerName=broker_name, nextBrokerId=next_id)
        )

    def replica_info(self, broker_name: str) -> Result:
        if not self._known(broker_name):
            return Result(
                ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, "Broker metadata is not existed"
            )
        state, replicas = self.sync_states[broker_name], self.replicas[broker_name]
        return Result(
            header=_header(
                masterBrokerId=state.master_broker_id,
                masterAddress=replicas.address(state.master_broker_id),
                masterEpoch=state.master_epoch,
            ),
            body=sync_state_set_body(state.sync_state_set, state.sync_state_set_epoch),
        )

    def sync_state_data(self, broker_names: list[str], alive: Alive) -> Result:
        """`BrokerReplicasInfo` of the named groups (unknown names are left out)."""
        table = {}
        for name in broker_names:
            if not self._known(name):
                continue
            state, replicas = self.sync_states[name], self.replicas[name]
            in_sync, not_in_sync = [], []
            for broker_id, (address, _) in sorted(replicas.brokers.items()):
                replica = {
                    "brokerName": name,
                    "brokerId": broker_id,
                    "brokerAddress": address,
                    "alive": alive(replicas.cluster_name, name, broker_id),
                }
                (in_sync if broker_id in state.sync_state_set else not_in_sync).append(replica)
            table[name] = {
                "masterBrokerId": state.master_broker_id,
                "masterAddress": replicas.address(state.master_broker_id),
                "masterEpoch": state.master_epoch,
                "syncStateSetEpoch": state.sync_state_set_epoch,
                "inSyncReplicas": in_sync,
                "notInSyncReplicas": not_in_sync,
            }
        return Result(body=_json({"replicasInfoTable": table}))

    def groups_to_reelect(self, alive: Alive) -> list[str]:
        """Groups whose master is dead while another member lives (the backstop scan)."""
        found = []
        for name, state in sorted(self.sync_states.items()):
            replicas = self.replicas.get(name)
            master = state.master_broker_id
            if replicas is None or master is None:
                continue
            cluster = replicas.cluster_name
            if not alive(cluster, name, master) and any(
                alive(cluster, name, b) for b in replicas.brokers
            ):
                found.append(name)
        return found

    # ------------------------------------------------------------------ apply
    def apply(self, event: Event) -> None:
        """Carry out a committed event; the same on every controller, in log order."""
        if isinstance(event, ApplyBrokerId):
            replicas = self.replicas.get(event.broker_name)
            if replicas is None or event.broker_name not in self.sync_states:
                replicas = BrokerReplicaInfo(event.cluster_name, event.broker_name)
                self.replicas[event.broker_name] = replicas
                self.sync_states[event.broker_name] = SyncStateInfo(
                    event.cluster_name, event.broker_name
                )
            if event.new_broker_id not in replicas.brokers:
                replicas.brokers[event.new_broker_id] = (
                    event.broker_address,
                    event.register_check_code,
                )
                # RocketMQ adds one; past the applied id too, so that an id taken out
                # of turn is never handed out again
                replicas.next_assign_broker_id = (
                    max(replicas.next_assign_broker_id, event.new_broker_id) + 1
                )
            return
        if not self._known(event.broker_name):
            return
        state = self.sync_states[event.broker_name]
        replicas = self.replicas[event.broker_name]
        if isinstance(event, AlterSyncStateSet):
            state.sync_state_set = event.new_sync_state_set
            state.sync_state_set_epoch += 1
        elif isinstance(event, ElectMaster):
            state.master_epoch += 1
            if event.new_master_elected:
                self.elections[event.broker_name] = self.elections.get(event.broker_name, 0) + 1
                state.master_broker_id = event.new_master_broker_id
                state.sync_state_set = frozenset({event.new_master_broker_id})
                state.sync_state_set_epoch += 1
            else:
                state.master_broker_id = None
        elif isinstance(event, UpdateBrokerAddress):
            held = replicas.brokers.get(event.broker_id)
            if held is not None:
                replicas.brokers[event.broker_id] = (event.broker_address, held[1])
        elif isinstance(event, CleanBrokerData):
            if not event.broker_id_set_to_clean:
                del self.replicas[event.broker_name], self.sync_states[event.broker_name]
                return
            for broker_id in event.broker_id_set_to_clean:
                replicas.brokers.pop(broker_id, None)
                state.sync_state_set -= {broker_id}
            if not replicas.brokers:
                del self.replicas[event.broker_name]
            if not state.sync_state_set:
                del self.sync_states[event.broker_name]

    def snapshot(self) -> dict:
        """Both tables as plain data, for comparing two controllers' states."""
        return {
            "replicas": {n: attrs.asdict(r) for n, r in sorted(self.replicas.items())},
            "syncStates": {
                n: {**attrs.asdict(s), "sync_state_set": sorted(s.sync_state_set)}
                for n, s in sorted(self.sync_states.items())
            },
        }
