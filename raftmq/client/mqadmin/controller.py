"""The controller's verbs (RocketMQ 5, RIP-44): getControllerMetaData, getSyncStateSet,
getBrokerEpoch, getControllerConfig, updateControllerConfig, electMaster,
cleanBrokerMetadata; and ours, which change the controllers' own group as
addDLedgerPeer changes a broker group: getControllerPeers, addControllerPeer,
removeControllerPeer.

Flags and output are RocketMQ 5.3.3's (`tools/.../command/controller/*`,
`ha/GetSyncStateSetSubCommand`). As RocketMQ's client does, the verbs that change or
read the controllers' state (electMaster, cleanBrokerMetadata, getSyncStateSet) ask the
controller named by `-a` who leads and send their request there; the config verbs ask
every address of `-a` (each controller has its own). None needs a name server but
getSyncStateSet -c, which looks up the cluster's broker names there.
"""

from __future__ import annotations

import argparse
import json

import trio

from raftmq.client.admin import Admin
from raftmq.client.errors import MQClientError
from raftmq.client.mqadmin.brokers import add_member, print_members, remove_member
from raftmq.client.mqadmin.commands import (
    UsageError,
    option,
    print_row,
    verb,
)
from raftmq.config.properties import format_properties, parse_properties
from raftmq.remoting.codes import RequestCode

CONTROLLER = option("-a", "controllerAddress", "the address of controller", required=True)
CONTROLLERS = option(
    "-a",
    "controllerAddress",
    "Controller address list, eg: 192.168.0.1:9878;192.168.0.2:9878",
    required=True,
)


def _addresses(text: str) -> list[str]:
    return [a.strip() for a in text.split(";") if a.strip()]


async def metadata(admin: Admin, address: str) -> dict[str, str]:
    """CONTROLLER_GET_METADATA_INFO from one controller (any answers)."""
    response = await admin.call(address, RequestCode.CONTROLLER_GET_METADATA_INFO)
    return dict(response.ext_fields)


async def leader(admin: Admin, address: str) -> str:
    """The controller leader's address, as the controller at `address` knows it."""
    leader_address = (await metadata(admin, address)).get("controllerLeaderAddress")
    if not leader_address:
        raise MQClientError(f"controller {address} knows no leader")
    return leader_address


def _java(value) -> str:
    """A value as Java's printf prints it (%d or %s of a possibly null object)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@verb(
    "getControllerMetaData", "Get controller cluster's metadata.", CONTROLLER, needs_namesrv=False
)
async def get_controller_metadata(admin: Admin, args: argparse.Namespace) -> None:
    meta = await metadata(admin, args.controllerAddress.strip())
    print(f"\n#ControllerGroup\t{meta.get('group')}", end="")
    print(f"\n#ControllerLeaderId\t{meta.get('controllerLeaderId')}", end="")
    print(f"\n#ControllerLeaderAddress\t{meta.get('controllerLeaderAddress')}", end="")
    for peer in filter(None, (meta.get("peers") or "").split(";")):
        print(f"\n#Peer:\t{peer}", end="")
    print()


async def sync_state_data(admin: Admin, controller: str, names: list[str]) -> dict:
    """brokerName -> its replicas' info (master, epochs, in-sync and not), as the
    controllers' leader (found through `controller`) answers CONTROLLER_GET_SYNC_STATE_DATA."""
    address = await leader(admin, controller)
    response = await admin.call(
        address, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=json.dumps(names).encode()
    )
    try:
        return json.loads(response.body)["replicasInfoTable"]
    except (ValueError, KeyError, TypeError) as exc:
        raise MQClientError(f"{address} answered malformed sync state data: {exc}") from None


async def _print_sync_state_sets(admin: Admin, controller: str, names: list[str]) -> None:
    if not names:
        return
    table = await sync_state_data(admin, controller, names)
    for name, info in table.items():
        in_sync, not_in_sync = info.get("inSyncReplicas") or [], info.get("notInSyncReplicas") or []
        print(
            f"\n#brokerName\t{name}\n#MasterBrokerId\t{_java(info.get('masterBrokerId'))}"
            f"\n#MasterAddr\t{_java(info.get('masterAddress'))}"
            f"\n#MasterEpoch\t{_java(info.get('masterEpoch'))}"
            f"\n#SyncStateSetEpoch\t{_java(info.get('syncStateSetEpoch'))}"
            f"\n#SyncStateSetNums\t{len(in_sync)}"
        )
        for label, members in (("InSyncReplica", in_sync), ("NotInSyncReplica", not_in_sync)):
            for m in members:
                print(
                    f"\n{label}:\tReplicaIdentity{{brokerName='{m.get('brokerName')}',"
                    f" brokerId={_java(m.get('brokerId'))},"
                    f" brokerAddress='{m.get('brokerAddress')}', alive={_java(m.get('alive'))}}}"
                )


@verb(
    "getSyncStateSet",
    "Fetch syncStateSet for target brokers.",
    CONTROLLER,
    option("-c", "clusterName", "which cluster"),
    option("-b", "brokerName", "which broker to fetch"),
    option("-i", "interval", "the interval(second) of get info"),
    needs_namesrv=False,
)
async def get_sync_state_set(admin: Admin, args: argparse.Namespace) -> None:
    """With -i, again every interval seconds (3 if empty) until interrupted."""
    controller = _addresses(args.controllerAddress)[0]
    if args.brokerName is None and args.clusterName is None:
        raise UsageError("give -b (a broker name) or -c (a cluster)")
    if args.brokerName is None and not admin.namesrv_addrs:
        raise UsageError("-c looks the cluster up at a name server: give -n or set NAMESRV_ADDR")
    while True:
        if args.brokerName is not None:
            names = [args.brokerName.strip()]
        else:
            info = await admin.cluster_info()
            names = sorted(b.broker_name for b in info.broker_datas(args.clusterName.strip()))
        await _print_sync_state_sets(admin, controller, names)
        if args.interval is None:
            return
        await trio.sleep(int(args.interval) if args.interval.strip() else 3)


@verb(
    "getBrokerEpoch",
    "Fetch broker epoch entries",
    option("-c", "clusterName", "which cluster"),
    option("-b", "brokerName", "which broker to fetch"),
    option("-i", "interval", "the interval(second) of get info"),
)
async def get_broker_epoch(admin: Admin, args: argparse.Namespace) -> int | None:
    """Each member of the group (-b) or of the cluster's groups (-c), as the name
    servers list them, asked for its epoch entries (GET_BROKER_EPOCH_CACHE); printed
    as RocketMQ 5.3.3 prints them, the last entry ending at the broker's max offset."""
    if args.brokerName is None and args.clusterName is None:
        raise UsageError("getBrokerEpoch needs -b brokerName or -c clusterName")
    while True:
        info = await admin.cluster_info()
        if args.brokerName is not None:
            groups = [b for b in info.broker_datas() if b.broker_name == args.brokerName.strip()]
        else:
            groups = info.broker_datas(args.clusterName.strip())
        for address in sorted({a for group in groups for a in group.addrs.values()}):
            response = await admin.call(address, RequestCode.GET_BROKER_EPOCH_CACHE)
            cache = json.loads(response.body)
            print(
                f"\n#clusterName\t{cache['clusterName']}\n#brokerName\t{cache['brokerName']}"
                f"\n#brokerAddr\t{address}\n#brokerId\t{cache['brokerId']}",
                end="",
            )
            entries = cache["epochList"]
            for i, entry in enumerate(entries):
                end = cache["maxOffset"] if i == len(entries) - 1 else entry["endOffset"]
                print(
                    f"\n#Epoch: EpochEntry{{epoch={entry['epoch']}, startOffset="
                    f"{entry['startOffset']}, endOffset={end}}}",
                    end="",
                )
            print()
        if args.interval is None:
            return None
        await trio.sleep(int(args.interval) if args.interval.strip() else 3)


@verb("getControllerConfig", "Get controller config.", CONTROLLERS, needs_namesrv=False)
async def get_controller_config(admin: Admin, args: argparse.Namespace) -> None:
    for address in _addresses(args.controllerAddress):
        response = await admin.call(address, RequestCode.GET_CONTROLLER_CONFIG)
        try:
            config = parse_properties(response.body.decode("utf-8"), address)
        except (UnicodeDecodeError, ValueError) as exc:
            raise MQClientError(f"{address} answered a malformed config: {exc}") from None
        print(f"============{address}============")
        for key, value in config.items():
            print_row("%-50s=  %s", key, value)


@verb(
    "updateControllerConfig",
    "Update controller config.",
    CONTROLLERS,
    option("-k", "key", "config key", required=True),
    option("-v", "value", "config value", required=True),
    needs_namesrv=False,
)
async def update_controller_config(admin: Admin, args: argparse.Namespace) -> None:
    key, value = args.key.strip(), args.value.strip()
    addresses = _addresses(args.controllerAddress)
    body = format_properties({key: value}).encode()
    for address in addresses:
        await admin.call(address, RequestCode.UPDATE_CONTROLLER_CONFIG, body=body)
    print(f"update controller config success![{', '.join(addresses)}]\n{key} : {value}")


@verb(
    "electMaster",
    "Re-elect the specified broker as master.",
    option("-a", "controllerAddress", "The address of controller", required=True),
    option("-b", "brokerId", "The id of the broker which requires to become master", required=True),
    option(
        "-bn",
        "brokerName",
        "The broker name of the replicas that require to be manipulated",
        required=True,
    ),
    option("-c", "clusterName", "the clusterName of broker", required=True),
    needs_namesrv=False,
)
async def elect_master(admin: Admin, args: argparse.Namespace) -> None:
    cluster, name = args.clusterName.strip(), args.brokerName.strip()
    try:
        broker_id = int(args.brokerId.strip())
    except ValueError:
        raise UsageError(f"-b {args.brokerId!r} is not a brokerId") from None
    address = await leader(admin, args.controllerAddress.strip())
    response = await admin.call(
        address,
        RequestCode.CONTROLLER_ELECT_MASTER,
        {
            "clusterName": cluster,
            "brokerName": name,
            "brokerId": str(broker_id),
            "designateElect": "true",
        },
    )
    header = response.ext_fields
    print(
        f"\n#ClusterName\t{cluster}\n#BrokerName\t{name}"
        f"\n#BrokerMasterAddr\t{header.get('masterAddress')}"
        f"\n#MasterEpoch\t{header.get('masterEpoch')}"
        f"\n#SyncStateSetEpoch\t{header.get('syncStateSetEpoch')}"
    )
    try:
        group = json.loads(response.body).get("brokerMemberGroup") or {}
    except (ValueError, AttributeError):
        group = {}
    for broker, broker_address in sorted(
        (group.get("brokerAddrs") or {}).items(), key=lambda kv: int(kv[0])
    ):
        print(f"\t#Broker\t{broker}\t{broker_address}")


@verb(
    "cleanBrokerMetadata",
    "Clean metadata of broker on controller.",
    option("-a", "controllerAddress", "The address of controller", required=True),
    option(
        "-b",
        "brokerControllerIdsToClean",
        "The brokerController id list which requires to clean metadata. eg: 1;2;3, means"
        " that clean broker-1, broker-2 and broker-3",
    ),
    option(
        "-bn",
        "brokerName",
        "The broker name of the replicas that require to be manipulated",
        required=True,
    ),
    option("-c", "clusterName", "The clusterName of broker"),
    option(
        "-l",
        "cleanLivingBroker",
        "Whether clean up living brokers,default value is false",
        action="store_true",
    ),
    needs_namesrv=False,
)
async def clean_broker_metadata(admin: Admin, args: argparse.Namespace) -> None:
    name = args.brokerName.strip()
    cluster = (args.clusterName or "").strip() or None
    ids = (args.brokerControllerIdsToClean or "").strip() or None
    if ids is not None:
        try:
            [int(i) for i in ids.split(";")]
        except ValueError:
            raise UsageError(
                "please set the option <brokerControllerIdsToClean> according to the format"
            ) from None
    if not args.cleanLivingBroker and cluster is None:
        raise UsageError("cleanLivingBroker option is false, clusterName option can not be empty.")
    ext = {"brokerName": name, "isCleanLivingBroker": _java(bool(args.cleanLivingBroker))}
    if cluster is not None:
        ext["clusterName"] = cluster
    if ids is not None:
        ext["brokerControllerIdsToClean"] = ids
    await admin.call(
        await leader(admin, args.controllerAddress.strip()), RequestCode.CLEAN_BROKER_DATA, ext
    )
    print(f"clear broker {name} metadata from controller success! ")


@verb(
    "getControllerPeers",
    "Show the members (voters, learners) of the controllers' DLedger group",
    CONTROLLER,
    needs_namesrv=False,
)
async def get_controller_peers(admin: Admin, args: argparse.Namespace) -> None:
    address = args.controllerAddress.strip()
    print_members(address, await admin.dledger_members(address), "#Controller")


@verb(
    "addControllerPeer",
    "Add a controller started with joinAsLearner=true to the controllers' group",
    CONTROLLER,
    option("-m", "member", "the new controller's controllerDLegerSelfId-host:port", required=True),
    option("-t", "timeoutSeconds", "for it to catch up and be promoted (60)", type=float),
    needs_namesrv=False,
)
async def add_controller_peer(admin: Admin, args: argparse.Namespace) -> None:
    """As addDLedgerPeer: added as a learner, promoted once caught up; safe to rerun."""
    address = args.controllerAddress.strip()
    members = await add_member(admin, address, args.member, args.timeoutSeconds)
    print_members(address, members, "#Controller")


@verb(
    "removeControllerPeer",
    "Remove a controller from the controllers' group (the leader too)",
    CONTROLLER,
    option("-m", "member", "its controllerDLegerSelfId", required=True),
    needs_namesrv=False,
)
async def remove_controller_peer(admin: Admin, args: argparse.Namespace) -> None:
    address = args.controllerAddress.strip()
    members = await remove_member(admin, address, args.member.strip())
    print_members(address, members, "#Controller")
