"""`broker.conf`: RocketMQ's broker keys, for `mqbroker -c broker.conf [-n host:port;...]`.

An operator's RocketMQ config carries over: the keys are RocketMQ's (`brokerClusterName`,
`brokerName`, `enableDLegerCommitLog`, `dLegerPeers`, ...), and RocketMQ's sample DLedger
configs (`conf/dledger/broker-n*.conf` here) load unchanged. In DLedger mode the
replica's `DLedgerConfig` is derived as RocketMQ's `DLedgerCommitLog` derives it: group
is `dLegerGroup` or else `brokerName`, the store lives under `storePathRootDir` (or
`storePathDLedgerCommitLog`), data segments are `mappedFileSizeCommitLog` bytes and
files are kept `fileReservedTime + 1` hours (or DLedger's `fileReservedHours`, which
may be a fraction, when given); ConsumeQueue files are
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
are not used; as a slave the broker registers as `slave_broker_id`. Without DLedger the
broker is RocketMQ's classic master or slave (`broker.classic`): `brokerRole`, `brokerId`
and the HA keys (`haListenPort`, `haMasterAddress`, `brokerIP2`, ...) apply, DLedger's
keys do not.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

import attrs
from raftmq.broker.store.consumequeue import DEFAULT_FILE_ENTRIES, ENTRY_SIZE
from raftmq.broker.store.indexfile import MAX_HASH_SLOT_NUM, MAX_INDEX_NUM
from raftmq.dledger.config import FSYNC, PAGE_CACHE, DLedgerConfig
from raftmq.dledger.config import KEYS as DLEDGER_KEYS

from raftmq.config.address import parse_address, parse_address_list, parse_peers
from raftmq.config.keys import (
    Key,
    KeyTable,
    boolean,
    choice,
    file_path,
    integer,
    ip_address,
    number,
    read_config_file,
    text,
)
from raftmq.transport.tls import (
    TLS_KEYS,
    TLS_SECRET_KEYS,
    TLS_UNUSED_KEYS,
    ClientTls,
    ServerTls,
    with_tls,
)

__all__ = ["RUNTIME_KEYS", "BrokerConfig", "config_properties", "load_broker_config", "updated"]

BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# Keys DLedgerCommitLog derives from broker keys (and metricsPort, the broker's own,
# which serves the member's metrics too); every other DLedger int or boolean key
# passes through.
_DERIVED_DLEDGER_KEYS = frozenset(
    {"group", "selfId", "peers", "storeBaseDir", "storeType", "flushDiskType",
     "preferredLeaderIds", "mappedFileSizeForEntryData", "fileReservedHours",
     "cleanResourceInterval", "recordSyncedLengths", "metricsPort"}
)  # fmt: skip
DLEDGER_PASSTHROUGH_KEYS = frozenset(
    key.name
    for key, field in zip(DLEDGER_KEYS.keys, attrs.fields(DLedgerConfig), strict=True)
    if field.type in ("int", "bool") and key.name not in _DERIVED_DLEDGER_KEYS
)
_DLEDGER_FLAGS = frozenset(
    key.name
    for key, field in zip(DLEDGER_KEYS.keys, attrs.fields(DLedgerConfig), strict=True)
    if field.type == "bool"
)

# RocketMQ 4.x keys with no effect here, grouped by why.
UNUSED_KEYS = frozenset(
    {
        # controller mode (broker.replicas_manager): heartbeats are oneway on kept
        # connections, the replica info is asked for each brokerHeartbeatInterval, the
        # leader is found from the controllers' answers, the SyncStateSet checked every 5 s
        "sendHeartbeatTimeoutMillis", "syncBrokerMetadataPeriod",
        "syncControllerMetadataPeriod", "checkSyncStateSetPeriod",
        "fetchControllerAddrByDnsLookup",
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
        "storePathConsumeQueue", "storePathIndex", "storeCheckpoint",
        "abortFile", "enableConsumeQueueExt", "mappedFileSizeConsumeQueueExt",
        "commitIntervalCommitLog", "flushCommitLogTimed",
        "flushIntervalConsumeQueue",
        "flushCommitLogLeastPages", "commitCommitLogLeastPages",
        "flushConsumeQueueLeastPages", "flushCommitLogThoroughInterval",
        "commitCommitLogThoroughInterval", "flushConsumeQueueThoroughInterval",
        "flushLeastPagesWhenWarmMapedFile", "warmMapedFileEnable",
        "transientStorePoolEnable", "transientStorePoolSize",
        "fastFailIfNoBufferInStorePool", "checkCRCOnRecover",
        "readOnlyCommitLogStorePaths", "enableBatchPush",
        # retention by schedule and disk pressure (files go by age: fileReservedTime)
        "deleteWhen", "cleanFileForciblyEnable", "deleteCommitLogFilesInterval",
        "deleteConsumeQueueFilesInterval", "destroyMapedFileIntervalForcibly",
        "redeleteHangedFileInterval",
        # reading from slaves
        "offsetCheckInSlave",
        # RocketMQ 5's TimerLog and TimerWheel and their threads: timer messages here are
        # buckets by due time with no roll window (docs/timers.md)
        "timerRollWindowSlot", "timerFlushIntervalMs", "mappedFileSizeTimerLog",
        "timerGetMessageThreadNum", "timerPutMessageThreadNum", "timerCongestNumEachSlot",
        "timerSkipUnknownError", "timerInterceptDelayLevel", "timerWarmEnable",
        # the key index is always recovered from the dispatch checkpoint, as safe as
        # RocketMQ's messageIndexSafe=true
        "messageIndexSafe",
        # features raftmq does not have
        "filterServerNums",
        "enableCalcFilterBitMap", "filterSupportRetry",
        "brokerPermission", "clusterTopicEnable", "brokerTopicEnable",
        "fetchNamesrvAddrByAddressServer", "messageStorePlugIn", "commercialEnable",
        "highSpeedMode", "transferMsgByHeap",
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


def _rocketmq_home() -> str | None:
    return os.environ.get("ROCKETMQ_HOME")


@attrs.frozen
class BrokerConfig:
    """One field per RocketMQ key, snake-cased (`dLegerPeers` -> `dleger_peers`).

    `dledger_overrides` holds the DLedger-named keys found in the file. A replica's files
    go under `<storePathDLedgerCommitLog or storePathRootDir>/dledger-<selfId>`.

    The `tls.*` keys (transport.tls) set the remoting server's TLS and that of the broker's
    connections to the name servers; the `dLegerTls*` keys make the DLedger peer port
    mutual TLS.
    """

    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    listen_port: int = 10911
    # RocketMQ's VIP channel: a Java broker also serves on listenPort - 2, and its slaves
    # sync topics and offsets from their master there. 0: not served (a raftmq slave
    # syncs on listenPort); a raftmq master followed by Java slaves sets listenPort - 2.
    fast_listen_port: int = 0
    bind_address: str = "0.0.0.0"
    broker_ip1: str = "127.0.0.1"
    namesrv_addr: tuple[str, ...] = ()
    store_path_root_dir: str = attrs.Factory(_home_store)
    # The classic CommitLog files: a classic broker's log, or an upgraded store's files
    # from before the upgrade. RocketMQ's default: storePathRootDir/commitlog.
    store_path_commit_log: str = attrs.Factory(
        lambda self: os.path.join(self.store_path_root_dir, "commitlog"), takes_self=True
    )
    broker_role: str = "ASYNC_MASTER"
    flush_disk_type: str = FSYNC
    enable_dleger_commit_log: bool = False
    dleger_group: str | None = None
    dleger_peers: dict[str, str] | None = None
    dleger_self_id: str | None = None
    preferred_leader_id: str | None = None
    # ours: a DLedger group's leader hands over by itself when leaders crowd a host
    # (broker.leader_balance), checked every interval
    enable_auto_leader_balance: bool = False
    auto_leader_balance_interval_ms: int = 30_000
    store_path_dledger_commit_log: str | None = None
    mapped_file_size_commit_log: int = 1 << 30
    mapped_file_size_consume_queue: int = DEFAULT_FILE_ENTRIES * ENTRY_SIZE
    max_hash_slot_num: int = MAX_HASH_SLOT_NUM  # slots of one IndexFile
    max_index_num: int = MAX_INDEX_NUM  # entries of one IndexFile
    message_index_enable: bool = True  # false: no key index, QUERY_MESSAGE finds nothing
    default_topic_queue_nums: int = 8
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    long_polling_enable: bool = True
    enable_property_filter: bool = False  # SQL92 subscriptions (broker.sql92)
    slave_read_enable: bool = False  # pulls may suggest a slave (suggestWhichBrokerId)
    access_message_in_memory_max_ratio: int = 40  # % of RAM: a pull further behind is "slow"
    register_broker_timeout_mills: int = 6000
    register_name_server_period: int = 30_000
    max_message_size: int = 4 * 1024 * 1024
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    file_reserved_time: int = 72
    reject_transaction_message: bool = False
    timer_wheel_enable: bool = True  # RocketMQ 5's timer messages (broker.timer)
    trace_topic_enable: bool = False  # the broker creates msgTraceTopicName (docs/traces.md)
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"
    timer_precision_ms: int = 1000  # a timer message goes out < this late
    timer_max_delay_sec: int = 259_200  # 3 days: a longer delay is refused
    transaction_time_out: int = 6000  # ms before a half message may be checked
    transaction_check_max: int = 15  # checks before a half message is discarded
    transaction_check_interval: int = 60_000  # ms between check runs
    # Percent of the store's filesystem in use: over the first, retention deletes
    # expired files at once; over the second, sends are refused until it is under.
    disk_max_used_space_ratio: int = 75
    disk_space_warning_level_ratio: int = 90
    file_reserved_hours: float | None = None  # DLedger's key; overrides fileReservedTime + 1
    clean_resource_interval: int = 10_000  # ms between retention's looks for expired files
    record_synced_lengths: bool = False  # raftmq's, for fault-injection harnesses (jepsen/)
    metrics_port: int = 0  # raftmq's: the Prometheus endpoint's port, 0 for none
    dleger_tls_cert_path: str | None = None
    dleger_tls_key_path: str | None = None
    dleger_tls_trust_cert_path: str | None = None
    # classic mode (enableDLegerCommitLog=false): the CommitLog's flushing and HA
    flush_interval_commit_log: int = 500  # ms between ASYNC_FLUSH flushes
    sync_flush_timeout: int = 5000  # ms until FLUSH_DISK_TIMEOUT
    slave_timeout: int = 3000  # ms until FLUSH_SLAVE_TIMEOUT (SYNC_MASTER)
    ha_listen_port: int | None = None  # default listenPort + 1
    ha_master_address: str | None = None  # else learnt from REGISTER_BROKER answers
    ha_send_heartbeat_interval: int = 5000
    ha_housekeeping_interval: int = 20_000
    ha_transfer_batch_size: int = 32 * 1024
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    broker_ip2: str | None = None  # the HA address's host; default brokerIP1
    # raftmq's own (DLedger mode): IP:port the group's master also serves at, and
    # registers as brokerId 0's address (broker.group_address)
    group_address: str | None = None
    tls_server: ServerTls = attrs.Factory(ServerTls)
    tls_client: ClientTls = attrs.Factory(ClientTls)  # the broker's connections to the name servers
    acl_enable: bool = False
    rocketmq_home: str | None = attrs.Factory(_rocketmq_home)
    acl_plain_file: str = "conf/plain_acl.yml"  # RocketMQ's -Drocketmq.acl.plain.file
    dledger_overrides: dict[str, int | bool] = attrs.Factory(dict)
    # controller mode (RocketMQ 5's ReplicasManager: broker.replicas_manager); times in ms
    enable_controller_mode: bool = False
    controller_addr: tuple[str, ...] = ()
    all_ack_in_sync_state_set: bool = False
    min_in_sync_replicas: int = 1
    in_sync_replicas: int = 1
    ha_max_time_slave_not_catchup: int = 15_000
    store_path_epoch_file: str | None = None  # default <storePathRootDir>/epochFileCheckpoint
    store_path_broker_identity: str | None = None  # default <storePathRootDir>/brokerIdentity
    broker_election_priority: int = 2**31 - 1
    controller_heart_beat_timeout_mills: int = 10_000
    broker_heartbeat_interval: int = 1000

    @property
    def is_slave(self) -> bool:
        """A classic slave (in DLedger and controller mode the election decides, not
        the config)."""
        return (
            not self.enable_dleger_commit_log
            and not self.enable_controller_mode
            and self.broker_role == "SLAVE"
        )

    @property
    def ha_port(self) -> int:
        """haListenPort, or listenPort + 1 as RocketMQ's BrokerStartup sets it (0, any
        free port, when listenPort is 0)."""
        if self.ha_listen_port is not None:
            return self.ha_listen_port
        return self.listen_port + 1 if self.listen_port else 0

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

    @property
    def acl_file_path(self) -> str | None:
        """plain_acl.yml: `rocketmq.acl.plain.file`, under `rocketmqHome` when relative
        (RocketMQ's rule); None when relative and there is no home."""
        path = os.path.expanduser(self.acl_plain_file)
        if os.path.isabs(path):
            return path
        return None if self.rocketmq_home is None else os.path.join(self.rocketmq_home, path)

    def dledger_config(self) -> DLedgerConfig:
        """The replica's DLedgerConfig, derived as RocketMQ's DLedgerCommitLog does."""
        self._require_dledger()
        assert self.dleger_self_id is not None
        passed_through = {
            DLEDGER_KEYS.field(key): value for key, value in self.dledger_overrides.items()
        }
        return DLedgerConfig(
            group=self.dleger_group or self.broker_name,
            self_id=self.dleger_self_id,
            peers=dict(self.dleger_peers or {}),
            store_base_dir=self.store_path_dledger_commit_log or self.store_path_root_dir,
            store_type="FILE",
            flush_disk_type=self.flush_disk_type,
            mapped_file_size_for_entry_data=self.mapped_file_size_commit_log,
            file_reserved_hours=self.file_reserved_time + 1
            if self.file_reserved_hours is None
            else self.file_reserved_hours,
            clean_resource_interval_ms=self.clean_resource_interval,
            disk_space_ratio_to_check_expired=self.disk_max_used_space_ratio / 100,
            disk_full_ratio=self.disk_space_warning_level_ratio / 100,
            record_synced_lengths=self.record_synced_lengths,
            preferred_leader_ids=self.preferred_leader_id or (),
            tls_cert_path=self.dleger_tls_cert_path,
            tls_key_path=self.dleger_tls_key_path,
            tls_trust_cert_path=self.dleger_tls_trust_cert_path,
            **passed_through,
        )


def _self_id(value: str) -> str:
    if not _SELF_ID.match(value):
        raise ValueError("expected one letter and digits, like n0")
    return value


def _address(value: str) -> str:
    parse_address(value)
    return value


def _ip_and_port(value: str) -> str:
    """An address a socket binds: an IP address (no host name) and a port."""
    host, port = parse_address(value)
    ip_address(host)
    if port == 0:
        raise ValueError("expected a fixed port, not 0")
    return value


def _positive_hours(value: str) -> float:
    """`fileReservedHours` in fractions too (0.05 is three minutes), so that retention can
    be watched cycling files in a test or a soak; fileReservedTime counts whole hours."""
    hours = number(value)
    if not hours > 0:
        raise ValueError("must be more than 0")
    return hours


def _delay_levels(value: str) -> str:
    levels = value.split()
    if not levels or not all(_DELAY_LEVEL.match(level) for level in levels):
        raise ValueError("expected levels like '1s 5s 1m 2h' (units s, m, h, d)")
    return value


_DLEDGER_PASSTHROUGH = [
    Key(key, key, boolean if key in _DLEDGER_FLAGS else integer(1))
    for key in sorted(DLEDGER_PASSTHROUGH_KEYS)
]
# The broker's keys; DLedger's own keys pass through under their names, into dledger_overrides.
KEYS = KeyTable(
    [
        Key("brokerClusterName", "broker_cluster_name", text),
        Key("brokerName", "broker_name", text),
        Key("brokerId", "broker_id", integer(-1)),  # -1: the controller assigns it
        Key("listenPort", "listen_port", integer(0, 65535)),
        Key("fastListenPort", "fast_listen_port", integer(0, 65535)),
        Key("bindAddress", "bind_address", ip_address),
        Key("brokerIP1", "broker_ip1", ip_address),  # packed into every msgId: no host names
        Key("namesrvAddr", "namesrv_addr", parse_address_list),
        Key("storePathRootDir", "store_path_root_dir", file_path),
        Key("storePathCommitLog", "store_path_commit_log", file_path),
        Key("brokerRole", "broker_role", choice(BROKER_ROLES)),
        Key("flushDiskType", "flush_disk_type", choice((FSYNC, PAGE_CACHE))),
        Key("enableDLegerCommitLog", "enable_dleger_commit_log", boolean),
        Key("dLegerGroup", "dleger_group", text),
        Key("dLegerPeers", "dleger_peers", parse_peers),
        Key("dLegerSelfId", "dleger_self_id", _self_id),
        Key("preferredLeaderId", "preferred_leader_id", text),
        Key("enableAutoLeaderBalance", "enable_auto_leader_balance", boolean),
        Key("autoLeaderBalanceIntervalMs", "auto_leader_balance_interval_ms", integer(1)),
        Key("storePathDLedgerCommitLog", "store_path_dledger_commit_log", file_path),
        Key("mappedFileSizeCommitLog", "mapped_file_size_commit_log", integer(1)),
        Key("mappedFileSizeConsumeQueue", "mapped_file_size_consume_queue", integer(ENTRY_SIZE)),
        Key("maxHashSlotNum", "max_hash_slot_num", integer(1)),
        Key("maxIndexNum", "max_index_num", integer(2)),
        Key("messageIndexEnable", "message_index_enable", boolean),
        Key("defaultTopicQueueNums", "default_topic_queue_nums", integer(1)),
        Key("autoCreateTopicEnable", "auto_create_topic_enable", boolean),
        Key("autoCreateSubscriptionGroup", "auto_create_subscription_group", boolean),
        Key("longPollingEnable", "long_polling_enable", boolean),
        Key("enablePropertyFilter", "enable_property_filter", boolean),
        Key("slaveReadEnable", "slave_read_enable", boolean),
        Key(
            "accessMessageInMemoryMaxRatio",
            "access_message_in_memory_max_ratio",
            integer(0, 100),
        ),
        Key("registerBrokerTimeoutMills", "register_broker_timeout_mills", integer(1)),
        Key("registerNameServerPeriod", "register_name_server_period", integer(1)),
        Key("maxMessageSize", "max_message_size", integer(1)),
        Key("messageDelayLevel", "message_delay_level", _delay_levels),
        Key("fileReservedTime", "file_reserved_time", integer(0)),
        Key("rejectTransactionMessage", "reject_transaction_message", boolean),
        Key("timerWheelEnable", "timer_wheel_enable", boolean),
        Key("traceTopicEnable", "trace_topic_enable", boolean),
        Key("msgTraceTopicName", "msg_trace_topic_name", text),
        Key("timerPrecisionMs", "timer_precision_ms", integer(1)),
        Key("timerMaxDelaySec", "timer_max_delay_sec", integer(1)),
        Key("transactionTimeOut", "transaction_time_out", integer(0)),
        Key("transactionCheckMax", "transaction_check_max", integer(0)),
        Key("transactionCheckInterval", "transaction_check_interval", integer(1)),
        Key("diskMaxUsedSpaceRatio", "disk_max_used_space_ratio", integer(1, 100)),
        Key("diskSpaceWarningLevelRatio", "disk_space_warning_level_ratio", integer(1, 100)),
        Key("fileReservedHours", "file_reserved_hours", _positive_hours),
        Key("cleanResourceInterval", "clean_resource_interval", integer(1)),
        Key("recordSyncedLengths", "record_synced_lengths", boolean),
        Key("flushIntervalCommitLog", "flush_interval_commit_log", integer(1)),
        Key("syncFlushTimeout", "sync_flush_timeout", integer(1)),
        Key("slaveTimeout", "slave_timeout", integer(1)),
        Key("haListenPort", "ha_listen_port", integer(0, 65535)),
        Key("haMasterAddress", "ha_master_address", _address),
        Key("haSendHeartbeatInterval", "ha_send_heartbeat_interval", integer(1)),
        Key("haHousekeepingInterval", "ha_housekeeping_interval", integer(1)),
        Key("haTransferBatchSize", "ha_transfer_batch_size", integer(1)),
        Key("haSlaveFallbehindMax", "ha_slave_fallbehind_max", integer(1)),
        Key("brokerIP2", "broker_ip2", ip_address),
        Key("groupAddress", "group_address", _ip_and_port),
        Key("metricsPort", "metrics_port", integer(0, 65535)),
        Key("dLegerTlsCertPath", "dleger_tls_cert_path", file_path),
        Key("dLegerTlsKeyPath", "dleger_tls_key_path", file_path),
        Key("dLegerTlsTrustCertPath", "dleger_tls_trust_cert_path", file_path),
        Key("aclEnable", "acl_enable", boolean),
        Key("rocketmqHome", "rocketmq_home", file_path),
        Key("rocketmq.acl.plain.file", "acl_plain_file", text),
        Key("enableControllerMode", "enable_controller_mode", boolean),
        Key("controllerAddr", "controller_addr", parse_address_list),
        Key("allAckInSyncStateSet", "all_ack_in_sync_state_set", boolean),
        Key("minInSyncReplicas", "min_in_sync_replicas", integer(1)),
        Key("inSyncReplicas", "in_sync_replicas", integer(1)),
        Key("haMaxTimeSlaveNotCatchup", "ha_max_time_slave_not_catchup", integer(1)),
        Key("storePathEpochFile", "store_path_epoch_file", file_path),
        Key("storePathBrokerIdentity", "store_path_broker_identity", file_path),
        Key("brokerElectionPriority", "broker_election_priority", integer(0)),
        Key(
            "controllerHeartBeatTimeoutMills",
            "controller_heart_beat_timeout_mills",
            integer(1),
        ),
        Key("brokerHeartbeatInterval", "broker_heartbeat_interval", integer(1)),
        *TLS_KEYS,
        *_DLEDGER_PASSTHROUGH,
    ],
    unused=UNUSED_KEYS | TLS_UNUSED_KEYS,
    aliases=ALIASES,
)

# Keys that only matter with enableDLegerCommitLog=false.
_CLASSIC_ONLY = frozenset(
    {"flushIntervalCommitLog", "syncFlushTimeout", "slaveTimeout", "haListenPort",
     "haMasterAddress", "haSendHeartbeatInterval", "haHousekeepingInterval",
     "haTransferBatchSize", "haSlaveFallbehindMax", "brokerIP2"}
)  # fmt: skip
# Keys that only matter with enableDLegerCommitLog=true.
_DLEDGER_ONLY = frozenset(
    {"dLegerGroup", "dLegerPeers", "dLegerSelfId", "preferredLeaderId",
     "storePathDLedgerCommitLog", "recordSyncedLengths", "dLegerTlsCertPath",
     "dLegerTlsKeyPath", "dLegerTlsTrustCertPath", "fileReservedHours", "groupAddress",
     "enableAutoLeaderBalance", "autoLeaderBalanceIntervalMs", *DLEDGER_PASSTHROUGH_KEYS}
)  # fmt: skip


class ModesConflict(ValueError):
    """enableControllerMode with enableDLegerCommitLog: RocketMQ's BrokerStartup exits
    with -4 (status 252); so does mqbroker here."""


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
        given.update((k, (path, v)) for k, v in read_config_file(path).items())
    given.update((k, ("-D", v)) for k, v in (overrides or {}).items())
    if namesrv_override is not None:
        given["namesrvAddr"] = ("-n", namesrv_override)

    fields, warnings = KEYS.read(given)
    for_dledger = {key: fields.pop(key) for key in DLEDGER_PASSTHROUGH_KEYS if key in fields}

    def where(key: str) -> str:
        return given[key][0] if key in given else (path or "<defaults>")

    try:
        fields = with_tls(fields)
    except ValueError as exc:
        raise ValueError(f"{where('tls.server.mode')}: {exc}") from None
    config = BrokerConfig(**fields, dledger_overrides=for_dledger)
    if config.acl_enable and config.acl_file_path is None:
        raise ValueError(
            f"{where('aclEnable')}: aclEnable=true: plain_acl.yml is "
            f"{config.acl_plain_file!r} under rocketmqHome, which is not set "
            "(set rocketmqHome or ROCKETMQ_HOME, or an absolute rocketmq.acl.plain.file)"
        )

    if config.enable_controller_mode:
        if config.enable_dleger_commit_log:
            raise ModesConflict(
                f"{where('enableControllerMode')}: enableControllerMode=true with"
                " enableDLegerCommitLog=true: a group is replicated by DLedger or by the"
                " controller's AutoSwitch HA, not both"
            )
        if not config.controller_addr:
            raise ValueError(
                f"{where('enableControllerMode')}: enableControllerMode=true needs controllerAddr"
            )
        for key in sorted({"brokerId", "brokerRole", "haMasterAddress"} & given.keys()):
            warnings.append(
                f"{where(key)}: {key}: ignored in controller mode (the controller decides)"
            )
        return config, warnings
    if config.enable_dleger_commit_log:
        _check_dledger(config, where)
        for key in sorted(({"brokerId", "brokerRole"} | _CLASSIC_ONLY) & given.keys()):
            warnings.append(f"{where(key)}: {key}: ignored in DLedger mode")
        if config.enable_auto_leader_balance and config.preferred_leader_id is not None:
            # the preferred leader check would move back what the balance moved away
            warnings.append(
                f"{where('enableAutoLeaderBalance')}: enableAutoLeaderBalance: ignored in a"
                " group with preferredLeaderId, which pins its leader"
            )
        if "storePathCommitLog" in given:
            warnings.append(
                f"{where('storePathCommitLog')}: storePathCommitLog: in DLedger mode the "
                "CommitLog is the DLedger log under storePathRootDir (or "
                "storePathDLedgerCommitLog); only classic files from before an upgrade "
                "are read here"
            )
        return config, warnings
    dledger_only = _DLEDGER_ONLY - ({"groupAddress"} if config.enable_controller_mode else set())
    for key in sorted(dledger_only & given.keys()):
        warnings.append(f"{where(key)}: {key}: ignored, enableDLegerCommitLog is false")
    if config.broker_id < 0:
        raise ValueError(
            f"{where('brokerId')}: brokerId={config.broker_id}: only controller mode"
            " (enableControllerMode=true) takes its brokerId from the controller"
        )
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
    if config.group_address is not None:
        host, port = parse_address(config.group_address)
        if port == config.listen_port and config.bind_address in ("0.0.0.0", "::", host):
            raise ValueError(
                f"{where('groupAddress')}: groupAddress={config.group_address}: its port is "
                f"listenPort's on an address bindAddress={config.bind_address} covers, so "
                "the master could never bind it: use another port"
            )
    try:
        config.dledger_config()
    except ValueError as exc:  # a DLedger key out of line with another, e.g. the vote gaps
        sources = ", ".join(sorted({where(key) for key in config.dledger_overrides}))
        raise ValueError(f"{sources or where('enableDLegerCommitLog')}: {exc}") from None


# Keys UPDATE_BROKER_CONFIG (25) may change while the broker runs: each is read where
# it is used, on every request. The rest take effect at the next start.
RUNTIME_KEYS = frozenset({"autoCreateTopicEnable", "autoCreateSubscriptionGroup"})


def _property_text(value: object) -> str:
    """A value as it would be written in broker.conf."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ";".join(value)
    if isinstance(value, dict):
        return ";".join(f"{k}-{v}" for k, v in value.items())
    return str(value)


def config_properties(config: BrokerConfig) -> dict[str, str]:
    """Every key's value, as GET_BROKER_CONFIG (26) reports it (`mqadmin getBrokerConfig`);
    DLedger's pass-through keys only when set, TLS key passwords never."""
    values = {}
    for key in KEYS.keys:
        if key.name in TLS_SECRET_KEYS:
            continue  # a key's password is not for anyone who can ask
        if key.name in DLEDGER_PASSTHROUGH_KEYS:
            if key.name in config.dledger_overrides:
                values[key.name] = str(config.dledger_overrides[key.name])
        else:
            # a dotted field is one of a part's (tls_server.mode)
            value = functools.reduce(getattr, key.field.split("."), config)
            values[key.name] = _property_text(value)
    return values


def updated(config: BrokerConfig, changes: dict[str, str], source: str) -> BrokerConfig:
    """`config` with `changes` applied; ValueError naming a key that is unknown, does
    not parse, or is not in RUNTIME_KEYS."""
    return KEYS.updated(config, changes, source, RUNTIME_KEYS, "broker.conf")
