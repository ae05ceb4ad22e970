"""A classic broker's store and replication (`enableDLegerCommitLog=false`).

The CommitLog files (`store.classic_log`), the CommitLog the message store uses over
them (`store.classic_commitlog`), and HA (`store.ha`): every classic broker listens
on `haListenPort`, as RocketMQ's does; a SYNC_MASTER's puts wait for a slave's
acknowledgement; a SLAVE connects to `haMasterAddress`, or else to the HA address
the name servers gave in the last REGISTER_BROKER answer, and appends what it is
sent. The role never changes at run time (RocketMQ 4.x has no automatic failover
in this mode; that is what DLedger mode is for).

A slave without a connection to its master re-registers every half second
(`master_wanted`; broker.registration), not every registerNameServerPeriod: a slave
whose first registration reached the name servers before its master's learns the
master's address within half a second of the master's registration, not 30 s later
(RocketMQ 4.9 waits for its next registration, 10 s after start and every 30 s
after that), and a master restarted on another HA port is found the same way once
the old connection breaks.

In controller mode (`enableControllerMode`) the replication is RocketMQ 5's AutoSwitch
HA (`store.autoswitch`) over the same files, with the epoch file beside them: the
master side listens on `haListenPort` whatever the role (a broker that is not master
refuses slaves and puts: it is fenced), and the slave side follows the HA address
`follow` gives it; `broker.replicas_manager` decides which.
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio
from raftmq.broker.config import BrokerConfig
from raftmq.broker.store.autoswitch import AutoSwitchConfig, AutoSwitchMaster, AutoSwitchSlave
from raftmq.broker.store.classic_commitlog import ClassicCommitLog, PutPolicy
from raftmq.broker.store.classic_log import ABORT_FILE, ClassicLog
from raftmq.broker.store.epoch_file import EPOCH_FILE, EpochFile
from raftmq.broker.store.ha import HAClient, HAConfig, HAService
from raftmq.dledger.config import FSYNC

from raftmq.disk.filesystem import used_ratio
from raftmq.remoting import listen_host

log = logging.getLogger(__name__)

DISK_CHECK_INTERVAL_S = 0.1  # as DLedger mode's


class ClassicReplica:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.log = ClassicLog(
            Path(config.store_path_commit_log),
            config.mapped_file_size_commit_log,
            Path(config.store_path_root_dir) / ABORT_FILE,
        )
        ha_config = HAConfig(
            heartbeat_interval_s=config.ha_send_heartbeat_interval / 1000,
            housekeeping_interval_s=config.ha_housekeeping_interval / 1000,
            transfer_batch_bytes=config.ha_transfer_batch_size,
            fallbehind_max_bytes=config.ha_slave_fallbehind_max,
        )
        self.controller_mode = config.enable_controller_mode
        if self.controller_mode:
            self._autoswitch(config, ha_config)
            return
        self.ha = HAService(self.log, ha_config)
        self.commitlog = ClassicCommitLog(
            self.log,
            self._put_policy(config),
            replication=self.ha if config.broker_role == "SYNC_MASTER" else None,
        )
        self.ha.on_ack = self.commitlog.on_slave_ack
        self.master_ha_address = config.ha_master_address
        self.master_addr: str | None = None  # the master's remoting address, for slave sync
        self.client = HAClient(self.log, ha_config, lambda: self.master_ha_address)
        self.ha_port = config.ha_port

    def _autoswitch(self, config: BrokerConfig, ha_config: HAConfig) -> None:
        """Controller mode's replication: fenced until `replicas_manager` makes this
        broker master (`AutoSwitchMaster.begin`) or a slave (`follow`)."""
        root = Path(config.store_path_root_dir)
        self.epochs = EpochFile(Path(config.store_path_epoch_file or root / EPOCH_FILE))
        switch_config = AutoSwitchConfig(
            link=ha_config,
            max_not_caught_up_s=config.ha_max_time_slave_not_catchup / 1000,
            all_ack_in_sync_state_set=config.all_ack_in_sync_state_set,
            in_sync_replicas=config.in_sync_replicas,
            min_in_sync_replicas=config.min_in_sync_replicas,
        )
        self.commitlog = ClassicCommitLog(self.log, self._put_policy(config))
        self.ha = AutoSwitchMaster(
            self.log, self.epochs, switch_config, 0, self._not_wired, self.commitlog.on_slave_ack
        )
        self.ha.fenced = "not master yet"  # until replicas_manager makes it master
        self.commitlog.replication = self.ha
        self.master_ha_address: str | None = None
        self.master_addr: str | None = None
        self.client = AutoSwitchSlave(
            self.log, self.epochs, switch_config, 0, lambda: self.master_ha_address
        )
        self.ha_port = config.ha_port
        self._follow_scope = trio.CancelScope()

    @staticmethod
    async def _not_wired(*_args):
        raise AssertionError("the controller's alter_sync_state_set is wired before any begin")

    def follow(self, master_addr: str, ha_address: str) -> None:
        """Controller mode: copy the master at `ha_address` from now on."""
        self.master_addr = master_addr
        self.log.confirmed = lambda: self.client.confirm_offset  # dispatch stops there
        if ha_address != self.master_ha_address or self.client.connected_to is None:
            self.master_ha_address = ha_address
            self._follow_scope.cancel()  # a session with another master ends
            self.client.master_given()

    def stop_following(self) -> None:
        self.master_addr = self.master_ha_address = None
        self._follow_scope.cancel()

    async def _follow_loop(self) -> None:
        while True:
            with trio.CancelScope() as self._follow_scope:
                await self.client.run()

    @staticmethod
    def _put_policy(config: BrokerConfig) -> PutPolicy:
        return PutPolicy(
            sync_flush=config.flush_disk_type == FSYNC,
            sync_flush_timeout_s=config.sync_flush_timeout / 1000,
            flush_interval_s=config.flush_interval_commit_log / 1000,
            slave_timeout_s=config.slave_timeout / 1000,
        )

    @property
    def master_wanted(self) -> bool:
        """A slave not connected to its master: worth asking the name servers again."""
        return self.config.is_slave and self.client.connected_to is None

    @property
    def ha_server_addr(self) -> str:
        """What REGISTER_BROKER advertises: brokerIP2 (else brokerIP1) and the HA port."""
        return f"{self.config.broker_ip2 or self.config.broker_ip1}:{self.ha_port}"

    def learn_master(self, answer: dict[str, str]) -> None:
        """From a REGISTER_BROKER answer: the master's address for SlaveSynchronize
        (masterAddr, taken even when absent, as RocketMQ does) and its HA address
        (haServerAddr, kept when absent; never over a set haMasterAddress). A slave
        without a connection tries the master at once."""
        self.master_addr = answer.get("masterAddr")
        ha_server_addr = answer.get("haServerAddr")
        if self.config.ha_master_address or not ha_server_addr:
            return
        if ha_server_addr != self.master_ha_address:
            log.warning("HA: master's address from the name server: %s", ha_server_addr)
            self.master_ha_address = ha_server_addr
        if self.client.connected_to is None:
            self.client.master_given()

    def info(self) -> dict[str, str]:
        """Runtime-info entries: the HA state as mqadmin brokerStatus shows it."""
        table = {
            "commitLogMinOffset": str(self.log.min_offset),
            "commitLogWriteOffset": str(self.log.write_pos),  # RocketMQ's getMaxPhyOffset
            "haListenPort": str(self.ha_port),
        }
        if self.controller_mode:
            table["haConnections"] = str(len(self.ha.connections))
            table["masterAddr"] = self.client.connected_to or ""
            table["masterEpoch"] = str(self.epochs.last_epoch)
            table["syncStateSet"] = ",".join(map(str, sorted(self.ha.sync_state.members)))
            table["confirmOffset"] = str(
                self.ha.confirm_offset if self.ha.fenced is None else self.client.confirm_offset
            )
        elif self.config.is_slave:
            table["masterAddr"] = self.client.connected_to or ""
            table["haMasterAddress"] = self.master_ha_address or ""
        else:
            table["haConnections"] = str(len(self.ha.connections))
            table["slaveAckOffset"] = str(self.ha.acked_offset)
            table["slaveFallBehindBytes"] = str(self.ha.slave_lag_bytes)
        return table

    def ha_runtime_info(self) -> dict:
        """RocketMQ 5's HARuntimeInfo (GET_BROKER_HA_STATUS, `mqadmin haStatus`)."""
        if self.controller_mode:
            following = self.ha.fenced is not None and self.master_ha_address is not None
            return self.client.runtime_info() if following else self.ha.runtime_info()
        return self.client.runtime_info() if self.config.is_slave else self.ha.runtime_info()

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush, serve HA (and follow the master, on a slave) until cancelled; the log
        is closed (cleanly: no abort file) once everything using it has stopped."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.commitlog.run)
            self.ha_port = await nursery.start(
                self.ha.serve, listen_host(self.config.bind_address), self.ha_port
            )
            if self.config.is_slave:
                nursery.start_soon(self.client.run)
            if self.controller_mode:
                nursery.start_soon(self._follow_loop)
            nursery.start_soon(self._expire_files)
            nursery.start_soon(self._check_disk)
            task_status.started(self.ha_port)

    async def _expire_files(self) -> None:
        """RocketMQ's CleanCommitLogService, by age only: every cleanResourceInterval,
        delete the files older than fileReservedTime hours (see ClassicLog.delete_expired)."""
        while True:
            await trio.sleep(self.config.clean_resource_interval / 1000)
            self.log.delete_expired(self.config.file_reserved_time * 3600.0)

    async def _check_disk(self) -> None:
        """As DLedger mode's disk check: over diskSpaceWarningLevelRatio the CommitLog
        refuses sends (SERVICE_NOT_AVAILABLE, RocketMQ's disk-full remark) until the
        filesystem holding it is under again."""
        directory = self.log.directory
        limit = self.config.disk_space_warning_level_ratio / 100
        while True:
            ratio = await trio.to_thread.run_sync(used_ratio, directory)
            full = ratio > limit
            if full != self.commitlog.disk_full:
                self.commitlog.disk_full = full
                log.warning(
                    "disk %s: %.1f%% of the filesystem of %s in use (diskSpaceWarningLevelRatio"
                    " %.0f%%)",
                    "full, refusing sends" if full else "space OK, taking sends",
                    ratio * 100,
                    directory,
                    limit * 100,
                )
            await trio.sleep(DISK_CHECK_INTERVAL_S)

    def close(self) -> None:
        self.log.close()
