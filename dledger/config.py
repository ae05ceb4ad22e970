"""A replica's configuration, under DLedger's key names.

Defaults differ from DLedger's where DLedger is slow: DLedger heartbeats every 2 s
and declares a leader dead after 3 missed beats (6 s, about 10 s to a new master in
RocketMQ). On a LAN or loopback a 100 ms beat with the same three-beat leak finds a
dead leader in 200-300 ms, and the vote gaps are scaled to match.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from raftmq.config.address import parse_peers
from raftmq.config.keys import Key, KeyTable, boolean, integer, number
from raftmq.transport.tls import PeerTls

FSYNC = "SYNC_FLUSH"  # acknowledge an entry only once fsynced (RocketMQ's flushDiskType name)
PAGE_CACHE = "ASYNC_FLUSH"  # acknowledge once written to the page cache, as DLedger does


def _key(name: str):
    return {"key": name}


def _flag(value: str | bool) -> bool:
    """A boolean field given as itself or as text ("true", any case, is true)."""
    return value.lower() == "true" if isinstance(value, str) else bool(value)


@attrs.define
class DLedgerConfig:
    group: str = attrs.field(metadata=_key("group"))
    self_id: str = attrs.field(metadata=_key("selfId"))
    peers: dict[str, str] = attrs.field(metadata=_key("peers"))
    store_base_dir: str = attrs.field(default="", metadata=_key("storeBaseDir"))
    store_type: str = attrs.field(default="FILE", metadata=_key("storeType"))
    flush_disk_type: str = attrs.field(default=FSYNC, metadata=_key("flushDiskType"))
    heartbeat_interval_ms: int = attrs.field(default=100, metadata=_key("heartBeatTimeIntervalMs"))
    max_heartbeat_leak: int = attrs.field(default=3, metadata=_key("maxHeartBeatLeak"))
    min_vote_interval_ms: int = attrs.field(default=50, metadata=_key("minVoteIntervalMs"))
    max_vote_interval_ms: int = attrs.field(default=150, metadata=_key("maxVoteIntervalMs"))
    min_take_leadership_vote_interval_ms: int = attrs.field(
        default=10, metadata=_key("minTakeLeadershipVoteIntervalMs")
    )
    max_take_leadership_vote_interval_ms: int = attrs.field(
        default=30, metadata=_key("maxTakeLeadershipVoteIntervalMs")
    )
    max_leadership_transfer_wait_index: int = attrs.field(
        default=1000, metadata=_key("maxLeadershipTransferWaitIndex")
    )
    leadership_transfer_wait_timeout_ms: int = attrs.field(
        default=1000, metadata=_key("leadershipTransferWaitTimeout")
    )
    preferred_leader_ids: tuple[str, ...] = attrs.field(
        default=(),
        converter=lambda v: tuple(filter(None, v.split(";"))) if isinstance(v, str) else tuple(v),
        metadata=_key("preferredLeaderIds"),
    )
    check_preferred_leader_interval_ms: int = attrs.field(
        default=1000, metadata=_key("checkPreferredLeaderIntervalMs")
    )
    max_pending_requests: int = attrs.field(default=10000, metadata=_key("maxPendingRequestsNum"))
    max_wait_ack_time_ms: int = attrs.field(default=2500, metadata=_key("maxWaitAckTimeMs"))
    max_push_timeout_ms: int = attrs.field(default=1000, metadata=_key("maxPushTimeOutMs"))
    max_batch_push_bytes: int = attrs.field(default=256 * 1024, metadata=_key("maxBatchPushSize"))
    max_pending_pushes: int = attrs.field(default=32, metadata=_key("maxPendingSize"))
    mapped_file_size_for_entry_data: int = attrs.field(
        default=1 << 30, metadata=_key("mappedFileSizeForEntryData")
    )
    mapped_file_size_for_entry_index: int = attrs.field(
        default=32 * 5 * 1024 * 1024, metadata=_key("mappedFileSizeForEntryIndex")
    )
    # Not DLedger's: a leader whose own fsyncs' p99 over the last window stays over
    # leaderSlowFsyncMs hands leadership to a voter whose own p99 is under it (0: never).
    leader_slow_fsync_ms: int = attrs.field(default=0, metadata=_key("leaderSlowFsyncMs"))
    leader_slow_fsync_window_ms: int = attrs.field(
        default=10_000, metadata=_key("leaderSlowFsyncWindowMs")
    )
    # page-cache mode (ASYNC_FLUSH) fsyncs this often; acks do not wait for it
    flush_file_interval_ms: int = attrs.field(default=10, metadata=_key("flushFileInterval"))
    file_reserved_hours: float = attrs.field(default=72, metadata=_key("fileReservedHours"))
    # Not DLedger's: a follower that answers heartbeats but stores nothing of what it
    # lacks for this long (a full or stuck disk) stops holding back the leader's
    # retention; if it recovers past what retention deleted, it gets a snapshot.
    follower_stall_timeout_ms: int = attrs.field(
        default=600_000, metadata=_key("followerStallTimeoutMs")
    )
    # How often retention looks for expired files. Not DLedger's (its CleanSpaceService
    # looks every 100 ms) but RocketMQ's broker key, with its default.
    clean_resource_interval_ms: int = attrs.field(
        default=10_000, metadata=_key("cleanResourceInterval")
    )
    # DLedger's CleanSpaceService ratios of the store's filesystem in use: over the
    # first, retention runs at once rather than on its clock; over the second the
    # disk counts as full: the leader refuses appends and a follower pushes
    # (DISK_FULL) until it is under again. Checked every DISK_CHECK_INTERVAL_S.
    disk_space_ratio_to_check_expired: float = attrs.field(
        default=0.70, metadata=_key("diskSpaceRatioToCheckExpired")
    )
    disk_full_ratio: float = attrs.field(default=0.90, metadata=_key("diskFullRatio"))
    # Not DLedger's: for fault-injection harnesses (jepsen/), which cannot ask a killed
    # process what it had fsynced. See DLedgerServer._record_synced.
    record_synced_lengths: bool = attrs.field(
        default=False,
        converter=_flag,
        metadata=_key("recordSyncedLengths"),
    )

    # Not DLedger's: close a peer connection whose sender's configured host does not
    # resolve to the address it comes from (see dledger.net.tcp; no substitute for TLS).
    check_peer_hosts: bool = attrs.field(
        default=True,
        converter=_flag,
        metadata=_key("checkPeerHosts"),
    )

    # Not DLedger's: the standalone `dledger server` serves its dledger_* metrics at
    # http://<its peer host>:metricsPort/metrics (0: none). A broker's DLedger member
    # is served on the broker's own metricsPort instead.
    metrics_port: int = attrs.field(default=0, metadata=_key("metricsPort"))

    # Not DLedger's: a member started to join a running group (docs/membership.md)
    # starts as a learner of dLegerPeers, which lists the group's members and itself,
    # and neither votes nor campaigns until a configuration entry makes it a voter.
    join_as_learner: bool = attrs.field(
        default=False, converter=_flag, metadata=_key("joinAsLearner")
    )

    # Not DLedger's: mutual TLS on the peer port (dledger.net.tcp). All three or none.
    tls_cert_path: str | None = attrs.field(default=None, metadata=_key("tlsCertPath"))
    tls_key_path: str | None = attrs.field(default=None, metadata=_key("tlsKeyPath"))
    tls_trust_cert_path: str | None = attrs.field(default=None, metadata=_key("tlsTrustCertPath"))
    # ... and whether a listener's certificate must name the host of its member's address
    tls_check_peer_host: bool = attrs.field(
        default=False, converter=_flag, metadata=_key("tlsCheckPeerHost")
    )

    def __attrs_post_init__(self) -> None:
        tls_paths = (self.tls_cert_path, self.tls_key_path, self.tls_trust_cert_path)
        if any(tls_paths) and not all(tls_paths):
            raise ValueError("TLS on the peer port needs a certificate, its key and a trust file")
        if self.self_id not in self.peers:
            raise ValueError(f"selfId {self.self_id!r} is not among peers {list(self.peers)}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metricsPort {self.metrics_port} is not a port (0 for none)")
        if self.flush_disk_type not in (FSYNC, PAGE_CACHE):
            raise ValueError(f"flushDiskType must be {FSYNC} or {PAGE_CACHE}")
        if not 0 < self.disk_full_ratio <= 1:
            raise ValueError("diskFullRatio must be above 0 and at most 1")
        if not 0 < self.min_vote_interval_ms <= self.max_vote_interval_ms:
            raise ValueError("need 0 < minVoteIntervalMs <= maxVoteIntervalMs")
        for pid in self.preferred_leader_ids:
            if pid not in self.peers:
                raise ValueError(f"preferred leader {pid!r} is not a peer")

    @property
    def ack_after_fsync(self) -> bool:
        return self.flush_disk_type == FSYNC

    @property
    def peer_tls(self) -> PeerTls | None:
        """The peer port's mutual TLS settings, None when it is plain TCP."""
        if self.tls_cert_path is None:
            return None
        return PeerTls(
            self.tls_cert_path,
            self.tls_key_path,
            self.tls_trust_cert_path,
            check_host=self.tls_check_peer_host,
        )

    @property
    def peer_ids(self) -> list[str]:
        return list(self.peers)

    @classmethod
    def from_keys(cls, values: Mapping[str, str], source: str = "<config>") -> DLedgerConfig:
        """Build from DLedger-named keys and their text (`peers` in DLedger's string form);
        a bad key or value is a ValueError naming `source`, the key and the value."""
        fields, _ = KEYS.read_text(values, source)
        return cls(**fields)


def _reader(field: attrs.Attribute) -> Callable[[str], object]:
    if field.name == "peers":
        return parse_peers
    # str fields take the text as it is; preferredLeaderIds' converter splits its list
    return {"int": integer(), "float": number, "bool": boolean}.get(field.type, str)


# DLedger's key names (DLedgerConfig's field metadata) and how each one's text is read.
KEYS = KeyTable(Key(f.metadata["key"], f.name, _reader(f)) for f in attrs.fields(DLedgerConfig))
