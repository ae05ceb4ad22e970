"""The controller's config: RocketMQ 5's `ControllerConfig` keys.

Read from `mqcontroller -c file`, or from a name server's config with
`enableControllerInNamesrv=true` (the same keys beside the name server's). Keys
(defaults in brackets):

- `controllerDLegerGroup`, `controllerDLegerPeers` (`n0-host:port;n1-host:port;...`),
  `controllerDLegerSelfId` [required]: the DLedger group replicating the controller's
  events; this controller's peer address is also where it serves remoting requests;
- `controllerStorePath` [`~/DLedgerController`]: the group's log (the whole state: a
  restart replays it); `mappedFileSize` [64 MiB, RocketMQ's 1 GiB]: its data file size.
  raftmq reserves every block of a log file when it creates it (no SIGBUS on a full
  disk), so the default is smaller: an event takes about 150 bytes, 64 MiB holds some
  400,000; the index file is sized to match (32 bytes an entry);
- `enableElectUncleanMaster` [false]: elect outside the SyncStateSet when no member of
  it is alive (may lose acknowledged messages);
- `notifyBrokerRoleChanged` [true]: tell a group's live brokers of its new master;
- `scanNotActiveBrokerInterval` [5000]: ms between heartbeat-timeout scans;
- `scanInactiveMasterInterval` [5000]: ms between the leader's checks for groups whose
  master is dead while another member lives;
- `electMasterMaxRetryCount` [3]: tries of an election the controller starts;
- `configBlackList` [`configBlackList;configStorePath`]: keys `updateControllerConfig`
  may not change;
- `controllerType` [DLedger]: `jRaft` is refused (raftmq replicates with DLedger only);
- `metricsPromExporterPort` [0, off], `metricsPromExporterHost` [this controller's peer
  host]: serve Prometheus metrics (`raftmq.controller.metrics`) there, whatever
  `metricsExporterType` says.

Java's thread-pool, other metrics-exporter and JRaft keys are accepted with a warning.
"""

from __future__ import annotations

import os

import attrs
from raftmq.dledger.config import DLedgerConfig

from raftmq.config.address import parse_peers
from raftmq.config.keys import Key, KeyTable, boolean, choice, file_path, integer, text

__all__ = ["CONTROLLER_KEYS", "UNUSED_CONTROLLER_KEYS", "ControllerConfig"]

DEFAULT_HEARTBEAT_TIMEOUT_MS = 10_000  # a heartbeat without heartbeatTimeoutMills
EVENT_BYTES = 150  # a log entry holding an event, about (48 of it DLedger's header)
INDEX_ENTRY_BYTES = 32


@attrs.frozen
class ControllerConfig:
    group: str = ""
    peers: dict[str, str] = attrs.Factory(dict)
    self_id: str = ""
    store_path: str = os.path.expanduser("~/DLedgerController")
    mapped_file_size: int = 64 << 20
    enable_elect_unclean_master: bool = False
    notify_broker_role_changed: bool = True
    scan_not_active_broker_interval_ms: int = 5_000
    scan_inactive_master_interval_ms: int = 5_000
    elect_master_max_retry_count: int = 3
    config_black_list: str = "configBlackList;configStorePath"
    prom_exporter_port: int = 0  # metricsPromExporterPort; 0: no metrics endpoint
    prom_exporter_host: str = ""  # metricsPromExporterHost; empty: the peer address's host
    controller_type: str = "DLedger"
    # DLedger's key: a controller added to a running group (`dledger addPeer`) starts as
    # a learner, with controllerDLegerPeers naming the group and itself
    join_as_learner: bool = False

    def check(self) -> None:
        """ValueError naming what is missing or inconsistent."""
        for key, value in (
            ("controllerDLegerGroup", self.group),
            ("controllerDLegerPeers", self.peers),
            ("controllerDLegerSelfId", self.self_id),
        ):
            if not value:
                raise ValueError(f"{key} is required")
        if self.self_id not in self.peers:
            raise ValueError(
                f"controllerDLegerSelfId={self.self_id} is not among controllerDLegerPeers"
            )

    def dledger(self, **overrides) -> DLedgerConfig:
        """The DLedger group's config (RocketMQ's controller uses DLedger's defaults)."""
        return DLedgerConfig(
            group=self.group,
            self_id=self.self_id,
            peers=dict(self.peers),
            store_base_dir=self.store_path,
            mapped_file_size_for_entry_data=self.mapped_file_size,
            join_as_learner=self.join_as_learner,
            mapped_file_size_for_entry_index=INDEX_ENTRY_BYTES
            * max(1024, self.mapped_file_size // EVENT_BYTES),
            **overrides,
        )

    def properties(self) -> dict[str, str]:
        """Every key with its value, as `getControllerConfig` lists them."""
        values = {}
        for key in CONTROLLER_KEYS:
            value = getattr(self, key.field)
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, dict):
                value = ";".join(f"{i}-{a}" for i, a in value.items())
            values[key.name] = str(value)
        return values


CONTROLLER_KEYS = (
    Key("controllerDLegerGroup", "group", text),
    Key("controllerDLegerPeers", "peers", parse_peers),
    Key("controllerDLegerSelfId", "self_id", text),
    Key("controllerStorePath", "store_path", file_path),
    Key("mappedFileSize", "mapped_file_size", integer(4096)),
    Key("enableElectUncleanMaster", "enable_elect_unclean_master", boolean),
    Key("notifyBrokerRoleChanged", "notify_broker_role_changed", boolean),
    Key("scanNotActiveBrokerInterval", "scan_not_active_broker_interval_ms", integer(1)),
    Key("scanInactiveMasterInterval", "scan_inactive_master_interval_ms", integer(1)),
    Key("electMasterMaxRetryCount", "elect_master_max_retry_count", integer(1)),
    Key("configBlackList", "config_black_list", str),
    Key("controllerType", "controller_type", choice(["DLedger"])),
    Key("metricsPromExporterPort", "prom_exporter_port", integer(0, 65535)),
    Key("metricsPromExporterHost", "prom_exporter_host", text),
    Key("joinAsLearner", "join_as_learner", boolean),
)
UNUSED_CONTROLLER_KEYS = frozenset(
    {
        "rocketmqHome",
        "configStorePath",
        "controllerThreadPoolNums",
        "controllerRequestThreadPoolQueueCapacity",
        "isProcessReadEvent",
        "processReadEvent",
        "metricsExporterType",
        "metricsGrpcExporterTarget",
        "metricsGrpcExporterHeader",
        "metricGrpcExporterTimeOutInMills",
        "metricGrpcExporterIntervalInMills",
        "metricLoggingExporterIntervalInMills",
        "metricsLabel",
        "metricsInDelta",
        "jRaftGroupId",
        "jRaftServerId",
        "jRaftInitConf",
        "jRaftControllerRPCAddr",
        "jRaftElectionTimeoutMs",
        "jRaftSnapshotIntervalSecs",
        "jRaftScanWaitTimeoutMs",
    }
)
KEYS = KeyTable(CONTROLLER_KEYS, unused=UNUSED_CONTROLLER_KEYS)


def read_controller_config(
    values: dict[str, str], source: str
) -> tuple[ControllerConfig, list[str]]:
    """The config from `values` (a file's keys), and warnings for keys with no effect.
    Raises ValueError naming the source, key and value, or what is missing."""
    fields, warnings = KEYS.read_text(values, source)
    config = ControllerConfig(**fields)
    try:
        config.check()
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return config, warnings
