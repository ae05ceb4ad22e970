"""`broker.conf`: RocketMQ's broker keys, for `mqbroker -c broker.conf [-n host:port;...]`.

An operator's RocketMQ config carries over: the keys are RocketMQ's (`brokerClusterName`,
`brokerName`, `enableDLegerCommitLog`, `dLegerPeers`, ...), and RocketMQ's sample DLedger
configs (`conf/dledger/broker-n*.conf` here) load unchanged. In DLedger mode the
replica's `DLedgerConfig` is derived as RocketMQ's `DLedgerCommitLog` derives it: group
is `dLegerGroup` or else `brokerName`, the store lives under `storePathRootDir` (or
`storePathDLedgerCommitLog`), data segments are `mappedFileSizeCommitLog` bytes and
files are kept `fileReservedTime + 1` hours; ConsumeQueue files are
`mappedFileSizeConsumeQueue` bytes (300,000 entries). DLedger's own timing keys
(`heartBeatTimeIntervalMs`, `maxVoteIntervalMs`, ...) may be written in the file under
their DLedger names and are passed through; RocketMQ has no way to set them.

Deliberate differences from RocketMQ:

- `flushDiskType` defaults to `SYNC_FLUSH`, not `ASYNC_FLUSH`: a send is acknowledged
  only once a quorum has the message fsynced. `ASYNC_FLUSH` is accepted and means
  RocketMQ's page-cache behaviour, which can lose acknowledged messages if the nodes
  lose power together.
- `brokerName` defaults to `broker-a` (RocketMQ uses the host name) and `brokerIP1` to
  127.0.0.1 (RocketMQ picks a non-loopback address), so a bare config is predictable.
- `bindAddress` (RocketMQ 5's NettyServerConfig key: the address the remoting server
  listens on, 0.0.0.0 for every interface) must be an IP address, not a host name.
  It may differ from `brokerIP1`, the address registered with the name servers, when
  clients reach the broker through NAT or a proxy.
- A `~` in a store path is expanded.
- A key we do not know is an error that suggests the nearest known key, and a value
  that does not parse is an error, where RocketMQ silently keeps its default. Keys that
  RocketMQ knows but raftmq has no use for (thread pools, Netty buffers, the classic
  store's file layout, ...) are accepted with a warning, so a production config still
  loads and the operator learns what is not in effect.

In DLedger mode the election decides master or slave, so `brokerRole` and `brokerId`
are not used; as a slave the broker registers as `slave_broker_id`.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Callable

import attrs

from raftmq.broker.store.consumequeue import DEFAULT_FILE_ENTRIES, ENTRY_SIZE
from raftmq.dledger.config import FSYNC, PAGE_CACHE, DLedgerConfig, parse_peers
from raftmq.namesrv.config import parse_properties
from raftmq.streams.address import parse_address

__all__ = ["BrokerConfig", "load_broker_config"]

BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# Keys DLedgerCommitLog derives from broker keys; every other DLedger int key passes through.
_DERIVED_DLEDGER_KEYS = frozenset(
    {"group", "selfId", "peers", "storeBaseDir", "storeType", "flushDiskType",
     "preferredLeaderIds", "mappedFileSizeForEntryData", "fileReservedHours",
     "recordSyncedLengths"}
)  # fmt: skip
_DLEDGER_FIELDS = attrs.fields_dict(DLedgerConfig)
DLEDGER_PASSTHROUGH_KEYS = frozenset(
    key
    for key, name in DLedgerConfig.keys().items()
    if _DLEDGER_FIELDS[name].type == "int" and key not in _DERIVED_DLEDGER_KEYS
)

# RocketMQ 4.x keys with no effect here, grouped by why.
UNUSED_KEYS = frozenset(
    {
        # trio tasks, not Java thread pools and their queues
        "sendMessageThreadPoolNums", "pullMessageThreadPoolNums",
        "processReplyMessageThreadPoolNums", "queryMessageThreadPoolNums",
        "adminBrokerThreadPoolNums", "clientManageThreadPoolNums",
        "consumerManageThreadPoolNums", "heartbeatThreadPoolNums",
        "endTransactionThreadPoolNums", "sendThreadPoolQueueCapacity",
        "pullThreadPoolQueueCapacity", "replyThreadPoolQueueCapacity",
        "queryThreadPoolQueueCapacity", "clientManagerThreadPoolQueueCapacity",
        "consumerManagerThreadPoolQueueCapacity", "heartbeatThreadPoolQueueCapacity",
        "endTransactionPoolQueueCapacity", "waitTimeMillsInSendQueue",
        "waitTimeMillsInPullQueue", "waitTimeMillsInHeartbeatQueue",
        "waitTimeMillsInTransactionQueue", "brokerFastFailureEnable",
        "osPageCacheBusyTimeOutMills", "useReentrantLockWhenPutMessage",
        # Netty server and client tuning
        "serverWorkerThreads", "serverCallbackExecutorThreads", "serverSelectorThreads",
        "serverOnewaySemaphoreValue", "serverAsyncSemaphoreValue",
        "serverChannelMaxIdleTimeSeconds", "serverSocketSndBufSize",
        "serverSocketRcvBufSize", "serverPooledByteBufAllocatorEnable",
        "useEpollNativeSelector", "clientWorkerThreads", "clientCallbackExecutorThreads",
        "clientOnewaySemaphoreValue", "clientAsyncSemaphoreValue", "connectTimeoutMillis",
        "channelNotActiveInterval", "clientChannelMaxIdleTimeSeconds",
        "clientSocketSndBufSize", "clientSocketRcvBufSize",
        "clientPooledByteBufAllocatorEnable", "clientCloseSocketIfTimeout", "useTLS",
        # the classic store's files, flushing and page-cache tricks
        "rocketmqHome", "storePathCommitLog", "storePathConsumeQueue", "storePathIndex",
        "storeCheckpoint",
        "abortFile", "enableConsumeQueueExt", "mappedFileSizeConsumeQueueExt",
        "flushIntervalCommitLog", "commitIntervalCommitLog", "flushCommitLogTimed",
        "flushIntervalConsumeQueue",
        "flushCommitLogLeastPages", "commitCommitLogLeastPages",
        "flushConsumeQueueLeastPages", "flushCommitLogThoroughInterval",
        "commitCommitLogThoroughInterval", "flushConsumeQueueThoroughInterval",
        "flushLeastPagesWhenWarmMapedFile", "warmMapedFileEnable",
        "transientStorePoolEnable", "transientStorePoolSize",
        "fastFailIfNoBufferInStorePool", "syncFlushTimeout", "checkCRCOnRecover",
        "readOnlyCommitLogStorePaths", "enableBatchPush",
        # retention by schedule and disk pressure (files go by age: fileReservedTime)
        "deleteWhen", "diskMaxUsedSpaceRatio", "cleanFileForciblyEnable",
        "cleanResourceInterval", "deleteCommitLogFilesInterval",
        "deleteConsumeQueueFilesInterval", "destroyMapedFileIntervalForcibly",
        "redeleteHangedFileInterval",
        # classic master/slave HA and reading from slaves
        "haListenPort", "haMasterAddress", "haSendHeartbeatInterval",
        "haHousekeepingInterval", "haTransferBatchSize", "haSlaveFallbehindMax",
        "slaveReadEnable", "offsetCheckInSlave", "brokerIP2",
        # features raftmq does not have
        "aclEnable", "traceTopicEnable", "msgTraceTopicName", "messageIndexEnable",
        "messageIndexSafe", "maxHashSlotNum", "maxIndexNum", "filterServerNums",
        "enablePropertyFilter", "enableCalcFilterBitMap", "filterSupportRetry",
        "brokerPermission", "clusterTopicEnable", "brokerTopicEnable",
        "fetchNamesrvAddrByAddressServer", "messageStorePlugIn", "commercialEnable",
        "highSpeedMode", "transferMsgByHeap", "accessMessageInMemoryMaxRatio",
        "compressedRegister", "forceRegister", "regionId", "traceOn",
        "storeReplyMessageEnable", "enableScheduleMessageStats", "duplicationEnable",
        "debugLockEnable", "shortPollingTimeMills", "notifyConsumerIdsChangedEnable",
    }
)  # fmt: skip

# Old spellings RocketMQ renamed (`maped` -> `mapped` in 4.4); old configs still use them.
ALIASES = {
    "mapedFileSizeCommitLog": "mappedFileSizeCommitLog",
    "mapedFileSizeConsumeQueue": "mappedFileSizeConsumeQueue",
}

_SELF_ID = re.compile(r"^[a-zA-Z]\d+$")
_DELAY_LEVEL = re.compile(r"^\d+[smhd]$")


def _home_store() -> str:
    return os.path.expanduser("~/store")


@attrs.frozen
class BrokerConfig:
    """One field per RocketMQ key, snake-cased (`dLegerPeers` -> `dleger_peers`).

    `dledger_overrides` holds the DLedger-named keys found in the file. A replica's files
    go under `<storePathDLedgerCommitLog or storePathRootDir>/dledger-<selfId>`.
    """

    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    listen_port: int = 10911
    bind_address: str = "0.0.0.0"
    broker_ip1: str = "127.0.0.1"
    namesrv_addr: tuple[str, ...] = ()
    store_path_root_dir: str = attrs.Factory(_home_store)
    broker_role: str = "ASYNC_MASTER"
    flush_disk_type: str = FSYNC
    enable_dleger_commit_log: bool = False
    dleger_group: str | None = None
    dleger_peers: dict[str, str] | None = None
    dleger_self_id: str | None = None
    preferred_leader_id: str | None = None
    store_path_dledger_commit_log: str | None = None
    mapped_file_size_commit_log: int = 1 << 30
    mapped_file_size_consume_queue: int = DEFAULT_FILE_ENTRIES * ENTRY_SIZE
    default_topic_queue_nums: int = 8
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    long_polling_enable: bool = True
    register_broker_timeout_mills: int = 6000
    register_name_server_period: int = 30_000
    max_message_size: int = 4 * 1024 * 1024
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    file_reserved_time: int = 72
    record_synced_lengths: bool = False  # raftmq's, for fault-injection harnesses (jepsen/)
    dledger_overrides: dict[str, int] = attrs.Factory(dict)

    def _require_dledger(self) -> None:
        if not self.enable_dleger_commit_log:
            raise ValueError("enableDLegerCommitLog is false: this broker has no DLedger group")

    @property
    def queue_file_entries(self) -> int:
        """Entries per ConsumeQueue file: `mappedFileSizeConsumeQueue` rounded down to
        whole 20-byte entries, as RocketMQ rounds it."""
        return self.mapped_file_size_consume_queue // ENTRY_SIZE

    @property
    def slave_broker_id(self) -> int:
        """RocketMQ's rule: a replica registers as slave `int(selfId[1:]) + 1` (n0 -> 1),
        never the master's 0, so clients see one master however the election went."""
        self._require_dledger()
        assert self.dleger_self_id is not None
        return int(self.dleger_self_id[1:]) + 1

    def dledger_config(self) -> DLedgerConfig:
        """The replica's DLedgerConfig, derived as RocketMQ's DLedgerCommitLog does."""
        self._require_dledger()
        values: dict[str, object] = {
            "group": self.dleger_group or self.broker_name,
            "selfId": self.dleger_self_id,
            "peers": dict(self.dleger_peers or {}),
            "storeBaseDir": self.store_path_dledger_commit_log or self.store_path_root_dir,
            "storeType": "FILE",
            "flushDiskType": self.flush_disk_type,
            "mappedFileSizeForEntryData": self.mapped_file_size_commit_log,
            "fileReservedHours": self.file_reserved_time + 1,
            "recordSyncedLengths": self.record_synced_lengths,
            **self.dledger_overrides,
        }
        if self.preferred_leader_id:
            values["preferredLeaderIds"] = self.preferred_leader_id
        return DLedgerConfig.from_keys(values)


def _text(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


def _path(value: str) -> str:
    return os.path.expanduser(_text(value))


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError("expected true or false")
    return lowered == "true"


def _int(low: int, high: int | None = None) -> Callable[[str], int]:
    def convert(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError("not an integer") from None
        if high is not None and not low <= number <= high:
            raise ValueError(f"out of range {low}..{high}")
        if number < low:
            raise ValueError(f"must be at least {low}")
        return number

    return convert


def _choice(*options: str) -> Callable[[str], str]:
    def convert(value: str) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return value

    return convert


def _ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError("expected an IP address, like 0.0.0.0 or 127.0.0.2") from None


def _namesrv(value: str) -> tuple[str, ...]:
    addresses = tuple(filter(None, (a.strip() for a in value.split(";"))))
    for address in addresses:
        parse_address(address)
    return addresses


def _self_id(value: str) -> str:
    if not _SELF_ID.match(value):
        raise ValueError("expected one letter and digits, like n0")
    return value


def _delay_levels(value: str) -> str:
    levels = value.split()
    if not levels or not all(_DELAY_LEVEL.match(level) for level in levels):
        raise ValueError("expected levels like '1s 5s 1m 2h' (units s, m, h, d)")
    return value


_KEYS: dict[str, tuple[str, Callable[[str], object]]] = {
    "brokerClusterName": ("broker_cluster_name", _text),
    "brokerName": ("broker_name", _text),
    "brokerId": ("broker_id", _int(0)),
    "listenPort": ("listen_port", _int(0, 65535)),
    "bindAddress": ("bind_address", _ip),
    "brokerIP1": ("broker_ip1", _ip),  # it is packed into every msgId: no host names
    "namesrvAddr": ("namesrv_addr", _namesrv),
    "storePathRootDir": ("store_path_root_dir", _path),
    "brokerRole": ("broker_role", _choice(*BROKER_ROLES)),
    "flushDiskType": ("flush_disk_type", _choice(FSYNC, PAGE_CACHE)),
    "enableDLegerCommitLog": ("enable_dleger_commit_log", _bool),
    "dLegerGroup": ("dleger_group", _text),
    "dLegerPeers": ("dleger_peers", parse_peers),
    "dLegerSelfId": ("dleger_self_id", _self_id),
    "preferredLeaderId": ("preferred_leader_id", _text),
    "storePathDLedgerCommitLog": ("store_path_dledger_commit_log", _path),
    "mappedFileSizeCommitLog": ("mapped_file_size_commit_log", _int(1)),
    "mappedFileSizeConsumeQueue": ("mapped_file_size_consume_queue", _int(ENTRY_SIZE)),
    "defaultTopicQueueNums": ("default_topic_queue_nums", _int(1)),
    "autoCreateTopicEnable": ("auto_create_topic_enable", _bool),
    "autoCreateSubscriptionGroup": ("auto_create_subscription_group", _bool),
    "longPollingEnable": ("long_polling_enable", _bool),
    "registerBrokerTimeoutMills": ("register_broker_timeout_mills", _int(1)),
    "registerNameServerPeriod": ("register_name_server_period", _int(1)),
    "maxMessageSize": ("max_message_size", _int(1)),
    "messageDelayLevel": ("message_delay_level", _delay_levels),
    "fileReservedTime": ("file_reserved_time", _int(0)),
    "recordSyncedLengths": ("record_synced_lengths", _bool),
}

# Keys that only matter with enableDLegerCommitLog=true.
_DLEDGER_ONLY = frozenset(
    {"dLegerGroup", "dLegerPeers", "dLegerSelfId", "preferredLeaderId",
     "storePathDLedgerCommitLog", "recordSyncedLengths", *DLEDGER_PASSTHROUGH_KEYS}
)  # fmt: skip


def _nearest(key: str) -> str:
    known = [*_KEYS, *DLEDGER_PASSTHROUGH_KEYS, *UNUSED_KEYS, *ALIASES]
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(key.lower(), by_lower, n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]}?)" if close else ""


def load_broker_config(
    path: str | None,
    namesrv_override: str | None = None,
    overrides: dict[str, str] | None = None,
) -> tuple[BrokerConfig, list[str]]:
    """The config from `path` (None: defaults), then `-D key=value` overrides, then `-n`.

    Returns the config and warnings for keys that were accepted but have no effect.
    Raises ValueError naming the source (file or command-line flag), key and value.
    """
    given: dict[str, tuple[str, str]] = {}  # key -> (source, value); later sources win
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None
        given.update((k, (path, v)) for k, v in parse_properties(text, path).items())
    given.update((k, ("-D", v)) for k, v in (overrides or {}).items())
    if namesrv_override is not None:
        given["namesrvAddr"] = ("-n", namesrv_override)

    kwargs: dict[str, object] = {}
    overrides_for_dledger: dict[str, int] = {}
    warnings: list[str] = []
    for key, (source, value) in given.items():
        name = ALIASES.get(key, key)
        try:
            if name in _KEYS:
                attribute, convert = _KEYS[name]
                kwargs[attribute] = convert(value)
            elif name in DLEDGER_PASSTHROUGH_KEYS:
                overrides_for_dledger[name] = _int(1)(value)
            elif name in UNUSED_KEYS:
                warnings.append(f"{source}: {key}: accepted, not used by raftmq")
            else:
                raise ValueError(f"unknown key{_nearest(key)}")
        except ValueError as exc:
            raise ValueError(f"{source}: {key}={value!r}: {exc}") from None
    config = BrokerConfig(**kwargs, dledger_overrides=overrides_for_dledger)

    def where(key: str) -> str:
        return given[key][0] if key in given else (path or "<defaults>")

    if config.enable_dleger_commit_log:
        _check_dledger(config, where)
        for key in sorted({"brokerId", "brokerRole"} & given.keys()):
            warnings.append(f"{where(key)}: {key}: ignored in DLedger mode, the election decides")
        return config, warnings
    for key in sorted(_DLEDGER_ONLY & given.keys()):
        warnings.append(f"{where(key)}: {key}: ignored, enableDLegerCommitLog is false")
    if config.broker_role == "SLAVE" and config.broker_id == 0:
        raise ValueError(f"{where('brokerId')}: brokerId=0: a SLAVE needs brokerId > 0")
    if config.broker_role != "SLAVE" and config.broker_id != 0:
        # RocketMQ's BrokerStartup also forces a master to brokerId 0.
        warnings.append(f"{where('brokerId')}: brokerId={config.broker_id}: a master is brokerId 0")
        config = attrs.evolve(config, broker_id=0)
    return config, warnings


def _check_dledger(config: BrokerConfig, where: Callable[[str], str]) -> None:
    """What DLedger mode needs, checked here so that the error names the key at fault."""
    if config.dleger_peers is None:
        raise ValueError(f"{where('dLegerPeers')}: enableDLegerCommitLog=true needs dLegerPeers")
    if config.dleger_self_id is None:
        raise ValueError(f"{where('dLegerSelfId')}: enableDLegerCommitLog=true needs dLegerSelfId")
    peers = ";".join(config.dleger_peers)
    for key, node_id in (
        ("dLegerSelfId", config.dleger_self_id),
        ("preferredLeaderId", config.preferred_leader_id),
    ):
        if node_id is not None and node_id not in config.dleger_peers:
            raise ValueError(f"{where(key)}: {key}={node_id!r}: not among dLegerPeers ({peers})")
    try:
        config.dledger_config()
    except ValueError as exc:  # a DLedger key out of line with another, e.g. the vote gaps
        sources = ", ".join(sorted({where(key) for key in config.dledger_overrides}))
        raise ValueError(f"{sources or where('enableDLegerCommitLog')}: {exc}") from None
