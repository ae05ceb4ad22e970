"""BrokerController: one broker of a DLedger group (or a classic master or slave),
wired together and run.

It builds the DLedger replica (or the classic CommitLog and HA: `classic`), the
message store on top of it, the role, the
managers of topics, subscription groups and consumer offsets, each request
processor (given only the parts it uses), the remoting server, the name-server
registration and the services only a master runs (delayed delivery, timer
messages, the transaction check-back, POP's redelivery, offset and metadata
writes); then it runs them and carries out role changes. It holds no request logic
of its own. With `metricsPort` it also serves Prometheus metrics: the broker's
(broker.metrics) and its DLedger member's (dledger.metrics) or, on a classic
broker, its HA replication's.

Role changes follow RocketMQ's DLedgerRoleChangeHandler, faster and safer:
- follower or candidate: slave at once (brokerId = selfId number + 1), registered
  with the name servers right away;
- leader: wait until the entries of earlier terms and the NOOP of this term are
  committed and dispatched to the ConsumeQueues, rebuild the topic-queue offset
  table from them, then become brokerId 0 and register with every name server,
  waiting for their answers (RocketMQ registers oneway, and clients may wait for
  the next 30 s tick to find the new master).
"""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry
from raftmq.broker.access_control import AccessControl
from raftmq.broker.address import BrokerAddress
from raftmq.broker.admin_queries import AdminQueries
from raftmq.broker.admin_requests import AdminRequests
from raftmq.broker.classic import ClassicReplica
from raftmq.broker.clients import ClientManager
from raftmq.broker.config import BrokerConfig
from raftmq.broker.consumer_offset_manager import ConsumerOffsetManager
from raftmq.broker.consumer_requests import ConsumerRequests
from raftmq.broker.dledger_members import DLedgerMembers
from raftmq.broker.group_address import GroupListener
from raftmq.broker.headers import BadRequest
from raftmq.broker.leader_balance import AutoLeaderBalance
from raftmq.broker.locks import LockRequests, QueueLocks
from raftmq.broker.metawriter import MetaWriter
from raftmq.broker.metrics import AutoSwitchHACollector, BrokerCollector, ClassicHACollector
from raftmq.broker.pop import PopProcessor
from raftmq.broker.promotion import Promotion
from raftmq.broker.pull import PullProcessor
from raftmq.broker.registration import Registration
from raftmq.broker.replicas_manager import ReplicasManager
from raftmq.broker.revive import ReviveService
from raftmq.broker.role import BrokerRole
from raftmq.broker.schedule import ScheduleService
from raftmq.broker.send import SendProcessor
from raftmq.broker.send_encoding import SEND_VALUE_NAMES
from raftmq.broker.slave_sync import SlaveSynchronize
from raftmq.broker.stats import BrokerStats, record_at_midnight
from raftmq.broker.store.classic_log import ABORT_FILE
from raftmq.broker.store.indexfile import IndexService
from raftmq.broker.store.messagestore import MessageStore, parse_delay_levels
from raftmq.broker.store.metadata import builtin_topics
from raftmq.broker.store.replicated_log import CommitLog
from raftmq.broker.store.upgrade import UpgradedCommitLog, open_old_log
from raftmq.broker.subscription_group_manager import SubscriptionGroupManager
from raftmq.broker.timer import RecallProcessor, TimerConfig, TimerService, to_timer
from raftmq.broker.topic_config_manager import TopicConfigManager
from raftmq.broker.transaction_check import TransactionCheckService
from raftmq.broker.transactions import TransactionalMessages
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.metrics import DLedgerCollector
from raftmq.dledger.server import DLedgerError, DLedgerServer, store_dir

from raftmq.config.address import parse_address
from raftmq.process.metrics_endpoint import serve_metrics
from raftmq.remoting import (
    Connection,
    Dispatcher,
    Processor,
    ProcessorTable,
    RemotingCommand,
    RemotingServer,
    RequestCode,
    ResponseCode,
    Route,
    listen_host,
)

log = logging.getLogger(__name__)

EXPIRE_SCAN_S = 10.0
ROLE_EVENTS_BUFFERED = 1000


def physical_memory_bytes() -> int:
    """The machine's RAM (RocketMQ's TOTAL_PHYSICAL_MEMORY_SIZE)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def answer_refusals(handler: Processor) -> Processor:
    """`handler` with the broker's refusals answered: bad input (BadRequest) with its
    code and remark, a DLedger refusal as "not master" (or a full disk). Anything else
    it raises is a bug, which the connection answers SYSTEM_ERROR
    (remoting.processor.system_error)."""

    async def processor(request: RemotingCommand, connection: Connection):
        try:
            response = await handler(request, connection)
        except BadRequest as exc:
            response = request.make_response(exc.code, str(exc))
        except DLedgerError as exc:
            what = "the broker's disk is full" if exc.code is Code.DISK_FULL else "not master"
            response = request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, f"{what}: {exc}")
        return None if request.is_oneway else response

    return processor


async def acl_disabled(request: RemotingCommand, connection: Connection):
    """The ACL requests (50-54) on a broker without aclEnable."""
    return request.make_response(
        ResponseCode.SYSTEM_ERROR, "aclEnable=false on this broker: there is no ACL to change"
    )


class BrokerController:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.root = Path(config.store_path_root_dir)
        self.dledger: DLedgerServer | None = None
        self.classic: ClassicReplica | None = None
        self.upgraded: UpgradedCommitLog | None = None  # over classic files (an upgrade)
        if config.enable_dleger_commit_log:
            dconfig = config.dledger_config()
            old = open_old_log(
                Path(config.store_path_commit_log),
                self.root / ABORT_FILE,
                config.mapped_file_size_commit_log,
                store_dir(dconfig),
                lambda log, commitlog: self._message_store(log, commitlog).drain(),
            )
            self.dledger = DLedgerServer(dconfig, client_appends=False)
            self.self_id = dconfig.self_id
            log_server, commitlog = self.dledger, None
            if old is not None:
                commitlog = self.upgraded = UpgradedCommitLog(self.dledger, old)
        else:
            self.classic = ClassicReplica(config)
            self.self_id = f"brokerId {config.broker_id}"
            log_server, commitlog = self.classic.log, self.classic.commitlog
        self.store = self._message_store(log_server, commitlog)
        metadata = self.store.metadata
        if self.dledger is not None:
            dledger = self.dledger
            # for a follower the leader restarts at its first entry (retention)
            dledger.set_state_snapshots(
                self.store.metadata_snapshot, self.store.install_metadata_snapshot
            )
            self.role = BrokerRole(
                config.broker_name,
                self.self_id,
                config.slave_broker_id,
                lambda: dledger.replica.leader_id,
            )
        else:
            self.role = BrokerRole(
                config.broker_name,
                self.self_id,
                config.broker_id if config.is_slave else 0,
                lambda: None,
                # controller mode: RocketMQ's role once elected, whatever brokerRole says
                master_role="SYNC_MASTER" if config.enable_controller_mode else config.broker_role,
                classic=True,
            )
        # a classic group's master never changes without a controller: groupAddress is
        # for DLedger groups and controller-mode groups
        group_address = (
            config.group_address
            if self.dledger is not None or config.enable_controller_mode
            else None
        )
        self.broker_addr = BrokerAddress(config.broker_ip1, config.listen_port, group_address)
        self.stats = BrokerStats()
        self.clients = ClientManager()
        self.locks = QueueLocks(self.store.now_ms)
        self.meta = MetaWriter(self.store, self.broker_addr)
        classic = self.classic
        self.registration = Registration(
            config,
            self.role,
            self.broker_addr,
            metadata,
            ha_server_addr=None if classic is None else lambda: classic.ha_server_addr,
            on_answer=None if classic is None else classic.learn_master,
            master_wanted=lambda: classic is not None and classic.master_wanted,
        )
        if classic is not None:  # a lost master is looked for at once
            classic.client.on_lost = self.registration.register_soon
            classic.log.add_cut_handler(self.store.cut_back)  # a slave's diverged tail
        self.topics = TopicConfigManager(
            metadata, self.meta, self.registration, config.auto_create_topic_enable
        )
        self.groups = SubscriptionGroupManager(
            metadata, self.meta, config.auto_create_subscription_group
        )
        self.offsets = ConsumerOffsetManager(metadata, self.meta, self.role)
        self.acl = (
            AccessControl(config, metadata, self.meta, self.role) if config.acl_enable else None
        )
        timer = TimerConfig(
            config.timer_wheel_enable, config.timer_precision_ms, config.timer_max_delay_sec
        )
        self.sender = SendProcessor(
            self.role,
            self.store,
            self.topics,
            self.groups,
            self.broker_addr,
            self.stats,
            cluster_name=config.broker_cluster_name,
            broker_name=config.broker_name,
            max_message_size=config.max_message_size,
            reject_transaction_message=config.reject_transaction_message,
            timer=timer,
        )
        self.slave_sync = None
        if classic is not None and (config.is_slave or config.enable_controller_mode):
            self.slave_sync = SlaveSynchronize(
                metadata,
                lambda: classic.master_addr,
                lambda: self.broker_addr.address,
                config.tls_client,
            )
        self.schedule = ScheduleService(
            self.role, self.store, self.meta, self.sender.put, self.broker_addr
        )
        self.timers = TimerService(
            self.role, self.store, self.meta, self.sender.put, self.broker_addr, timer
        )
        self.recall = RecallProcessor(
            self.role,
            self.topics,
            lambda msg: to_timer(msg, self.store.now_ms(), timer),
            self.sender.put,
            self.broker_addr,
            self.timers,
            config.broker_name,
            timer,
            self.store.now_ms,
        )
        self.promotion = Promotion(
            self.store, self.role, resets=(self.schedule.reset, self.timers.reset)
        )
        self.replicas = None  # controller mode's ReplicasManager
        if classic is not None and config.enable_controller_mode:
            self.replicas = ReplicasManager(
                config,
                classic,
                self.role,
                self.promotion,
                self.registration,
                self.broker_addr,
                self.store,
                on_master=self._claim_group_address,
                on_slave=self._controller_slave,
            )
        self.transactions = TransactionalMessages(
            self.role,
            self.store,
            self.topics,
            self.broker_addr,
            self.sender.put,
            self.sender.schedule_if_delayed,
        )
        self.transaction_check = TransactionCheckService(
            self.transactions,
            self.clients,
            check_interval_ms=config.transaction_check_interval,
            timeout_ms=config.transaction_time_out,
            check_max=config.transaction_check_max,
        )
        self.pop = PopProcessor(
            self.role,
            self.store,
            self.topics,
            self.groups,
            self.offsets,
            self.meta,
            self.stats,
            broker_name=config.broker_name,
            property_filter_enabled=config.enable_property_filter,
        )
        self.revive = ReviveService(
            self.role,
            self.store,
            self.topics,
            self.groups,
            self.meta,
            self.sender.put,
            self.broker_addr,
            self.pop.polling,
        )
        self._roles_send, self._roles_recv = trio.open_memory_channel(ROLE_EVENTS_BUFFERED)
        if self.dledger is not None:
            self.dledger.add_role_change_handler(self._on_role_change)
        names = {"cluster": config.broker_cluster_name, "broker_name": config.broker_name}
        self.metrics = BrokerCollector(
            self.role,
            self.store,
            self.offsets,
            self.clients,
            self.stats,
            self.broker_addr,
            **names,
            timer_status=self.timers.status,
        )
        processors = self._processors()

        def serving(host: str | None, port: int) -> RemotingServer:
            """The broker's processors served on (host, port)."""
            return RemotingServer(
                host, port, processors, on_disconnect=self.clients.on_disconnect,
                tls=config.tls_server,
            )  # fmt: skip

        host = listen_host(config.bind_address)
        self.server = serving(host, config.listen_port)
        # RocketMQ's VIP channel (fastListenPort), for Java slaves' SlaveSynchronize
        self.fast_server = (
            serving(host, config.fast_listen_port) if config.fast_listen_port else None
        )
        self.group_listener = None
        if group_address is not None:
            self.group_listener = GroupListener(
                serving(*parse_address(group_address)), on_listening=self._group_listening
            )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)
        if self.dledger is not None:  # a classic broker has no DLedger member
            self.registry.register(DLedgerCollector(self.dledger))
        else:
            assert self.classic is not None
            if self.replicas is None:
                ha = ClassicHACollector(self.classic, self.broker_addr, **names)
            else:
                ha = AutoSwitchHACollector(self.classic, self.broker_addr, self.role, **names)
            self.registry.register(ha)
        self.started = trio.Event()

    def _message_store(self, log_server, commitlog: CommitLog | None) -> MessageStore:
        config = self.config
        return MessageStore(
            log_server,
            self.root,
            builtin_topics(
                config.broker_cluster_name,
                config.broker_name,
                config.default_topic_queue_nums,
                config.msg_trace_topic_name if config.trace_topic_enable else None,
            ),
            parse_delay_levels(config.message_delay_level),
            config.queue_file_entries,
            IndexService(self.root / "index", config.max_hash_slot_num, config.max_index_num)
            if config.message_index_enable
            else None,
            commitlog,
            config.message_index_enable,
        )

    # ------------------------------------------------------------------ identity
    @property
    def address(self) -> str:
        return self.broker_addr.address

    @property
    def is_master(self) -> bool:
        return self.role.is_master

    # ------------------------------------------------------------------ processors
    def _processors(self) -> Dispatcher:
        send, store = self.sender, self.store
        pull = PullProcessor(
            self.role,
            store,
            self.topics,
            self.groups,
            self.offsets,
            self.stats,
            self.clients,
            long_polling_enable=self.config.long_polling_enable,
            property_filter_enabled=self.config.enable_property_filter,
            slave_read_enable=self.config.slave_read_enable,
            in_memory_bytes=(
                physical_memory_bytes() * self.config.access_message_in_memory_max_ratio // 100
            ),
        )
        # controller mode asks its SyncStateSet and lease; a DLedger or classic node holds
        # every acknowledged record once its log is applied
        holds_every_record = (
            (lambda: True)
            if self.replicas is None
            else self.replicas.holds_every_acknowledged_record
        )
        consumer = ConsumerRequests(
            self.role,
            self.clients,
            store,
            self.topics,
            self.groups,
            self.offsets,
            property_filter_enabled=self.config.enable_property_filter,
            holds_every_acknowledged_record=holds_every_record,
        )
        admin = AdminRequests(self.role, self.topics, self.groups, self.config)
        queries = AdminQueries(
            self.role,
            store,
            self.topics,
            self.offsets,
            self.stats,
            self.clients,
            broker_name=self.config.broker_name,
            broker_addr=lambda: self.broker_addr.address,
            dledger_metadata=None if self.dledger is None else self.dledger.metadata,
            classic_info=dict if self.classic is None else self.classic.info,
            ha_runtime_info=None if self.classic is None else self.classic.ha_runtime_info,
            runtime_keys=lambda: {
                **self.metrics.runtime_keys(),
                **{k: str(v) for k, v in self.timers.status().items()},
            },
            group_get_tps=self.metrics.group_get_tps,
        )
        locks = LockRequests(self.role, self.locks)
        # A send's one route: the common sends of a read in one batch (send_inline),
        # the rest (a topic to create, a retry to dead-letter, an error to explain)
        # each in a task of its own (send).
        send_route = Route(answer_refusals(send.send), send.send_inline, SEND_VALUE_NAMES)
        table = {
            RequestCode.SEND_MESSAGE: send_route,
            RequestCode.SEND_MESSAGE_V2: send_route,
            RequestCode.SEND_BATCH_MESSAGE: send.send,
            RequestCode.CONSUMER_SEND_MSG_BACK: send.send_back,
            RequestCode.RECALL_MESSAGE: self.recall.recall,
            RequestCode.END_TRANSACTION: self.transactions.end_transaction,
            RequestCode.PULL_MESSAGE: pull.pull,
            RequestCode.HEART_BEAT: consumer.heartbeat,
            RequestCode.CHECK_CLIENT_CONFIG: consumer.check_client_config,
            RequestCode.UNREGISTER_CLIENT: consumer.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: consumer.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: consumer.update_offset,
            RequestCode.GET_MAX_OFFSET: consumer.max_offset,
            RequestCode.GET_MIN_OFFSET: consumer.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: consumer.search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: consumer.earliest_time,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: consumer.reset_offset,
            RequestCode.LOCK_BATCH_MQ: locks.lock,
            RequestCode.UNLOCK_BATCH_MQ: locks.unlock,
            RequestCode.UPDATE_AND_CREATE_TOPIC: admin.create_topic,
            RequestCode.GET_TOPIC_CONFIG: admin.topic_config,
            RequestCode.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: admin.all_topics,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: admin.system_topics,
            RequestCode.GET_ALL_CONSUMER_OFFSET: admin.all_consumer_offsets,
            RequestCode.GET_ALL_DELAY_OFFSET: admin.all_delay_offsets,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.create_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.all_groups,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: admin.delete_group,
            RequestCode.GET_BROKER_CONFIG: admin.broker_config,
            RequestCode.UPDATE_BROKER_CONFIG: admin.update_broker_config,
            RequestCode.GET_BROKER_RUNTIME_INFO: queries.runtime_info,
            RequestCode.QUERY_MESSAGE: queries.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: queries.view_message,
            RequestCode.CONSUME_MESSAGE_DIRECTLY: queries.consume_message_directly,
            RequestCode.GET_CONSUMER_RUNNING_INFO: queries.consumer_running_info,
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: queries.consumer_status,
            RequestCode.GET_BROKER_CONSUME_STATS: queries.broker_consume_stats,
            RequestCode.QUERY_CONSUME_QUEUE: queries.query_consume_queue,
            RequestCode.GET_ALL_PRODUCER_INFO: queries.producer_info,
            RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: queries.clean_expired_consume_queue,
            RequestCode.CLEAN_UNUSED_TOPIC: queries.clean_unused_topic,
            RequestCode.GET_TOPIC_STATS_INFO: queries.topic_stats,
            RequestCode.GET_CONSUME_STATS: queries.consume_stats,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: queries.consumer_connections,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: queries.producer_connections,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: queries.topic_consumed_by,
            RequestCode.VIEW_BROKER_STATS_DATA: queries.broker_stats,
            RequestCode.GET_BROKER_HA_STATUS: queries.ha_status,
            **(
                {}
                if self.dledger is None
                else {RequestCode.DLEDGER_MEMBERS: DLedgerMembers(self.dledger).members}
            ),
            **(
                {}
                if self.replicas is None
                else {
                    RequestCode.NOTIFY_BROKER_ROLE_CHANGED: self.replicas.notified,
                    RequestCode.GET_BROKER_EPOCH_CACHE: self.replicas.epoch_cache,
                }
            ),
            RequestCode.POP_MESSAGE: self.pop.pop,
            RequestCode.ACK_MESSAGE: self.pop.ack,
            RequestCode.BATCH_ACK_MESSAGE: self.pop.batch_ack,
            RequestCode.PEEK_MESSAGE: self.pop.peek,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.pop.change_invisible_time,
            RequestCode.NOTIFICATION: self.pop.notification,
            RequestCode.POLLING_INFO: self.pop.polling_info,
        }
        acl_codes = dict.fromkeys(AccessControl.CODES, acl_disabled)
        table.update(acl_codes if self.acl is None else self.acl.processors())
        processors = ProcessorTable(
            {code: h if isinstance(h, Route) else answer_refusals(h) for code, h in table.items()}
        )
        return processors if self.acl is None else self.acl.guard(processors)

    # ------------------------------------------------------------------ roles
    def _on_role_change(self, term: int, role: Role) -> None:
        if role is not Role.LEADER and self.group_listener is not None:
            # at once: the role loop may still be registering as master (a name server
            # that hangs holds it up to registerBrokerTimeoutMills), and the new master
            # cannot bind the address while this member holds it
            self.group_listener.release()
        self._roles_send.send_nowait((term, role, time.monotonic()))

    async def _role_loop(self) -> None:
        async for term, role, when in self._roles_recv:
            if role is Role.LEADER:
                await self._become_master(term, when)
            elif not self.role.is_registered_slave():
                self._become_slave(term, role)
            else:
                self.registration.register_soon()

    def _become_slave(self, term: int, role: Role) -> None:
        log.warning(
            "%s: %s in term %d: slave (brokerId %d)",
            self.self_id,
            role.name,
            term,
            self.config.slave_broker_id,
        )
        if self.group_listener is not None:  # before any request is answered "not master"
            self.group_listener.release()
        self.role.become_slave(term)
        self._slave_again()
        self.registration.register_soon()

    def _group_listening(self, listening: bool) -> None:
        """The group address bound or let go: the name servers are given the address
        this broker is reached at now (`BrokerAddress.registered`)."""
        self.broker_addr.group_bound = listening
        self.registration.register_soon()

    def _claim_group_address(self) -> None:
        """Controller mode: serve the group address once master (ReplicasManager)."""
        if self.group_listener is not None:
            self.group_listener.claim()

    def _controller_slave(self) -> None:
        """Controller mode: a master (or a starting broker) made slave by the controller."""
        if self.group_listener is not None:  # before any request is answered "not master"
            self.group_listener.release()
        self._slave_again()

    def _slave_again(self) -> None:
        """What a master leaves behind when it becomes a slave."""
        self.offsets.forget_pending()
        self.locks.clear()

    async def _classic_role(self) -> None:
        """A classic broker's role, from its config: a master once the ConsumeQueues hold
        everything its CommitLog does (its queue offsets continue from them)."""
        if self.config.is_slave:
            self.role.become_slave(0)
        else:
            while not self.store.caught_up():
                await self.store.wait_dispatch(0.05)
            self.promotion.take_over(0)
        log.warning(
            "%s: %s (brokerId %d)", self.config.broker_name, self.config.broker_role,
            self.role.broker_id,
        )  # fmt: skip
        await self.registration.register_now()

    async def _become_master(self, term: int, elected_at: float) -> None:
        assert self.dledger is not None
        while True:
            promoted = self.promotion.try_lead(self.dledger.replica, term, self.dledger.now_ms())
            if promoted is None:
                return  # lost it meanwhile; the next event decides
            if promoted:
                break
            await self.store.wait_dispatch(0.05)
        if self.group_listener is not None:
            self.group_listener.claim()
        await self.registration.register_now()
        log.warning(
            "%s: master of %s in term %d, %.0f ms after the election",
            self.self_id,
            self.config.broker_name,
            term,
            (time.monotonic() - elected_at) * 1000,
        )

    # ------------------------------------------------------------------ running
    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(EXPIRE_SCAN_S + random.random())
            self.clients.expire(self.store.now_ms())

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. A stopped broker's connections close, and the name
        servers drop it at once (their channel-destroy rule)."""
        try:
            async with trio.open_nursery() as nursery:
                await self._serve_in(nursery)
                task_status.started(self.broker_addr.port)
        finally:
            if self.classic is not None:
                self.classic.close()
            if self.upgraded is not None:
                self.upgraded.old_log.close()

    async def _serve_in(self, nursery: trio.Nursery) -> None:
        # the CommitLog first (DLedger replica, or classic files with flushing and HA)
        if self.dledger is not None:
            await nursery.start(self.dledger.serve)
        else:
            assert self.classic is not None
            await nursery.start(self.classic.serve)
        await nursery.start(self.store.run)
        self.broker_addr.port = await nursery.start(self.server.serve)
        if self.fast_server is not None:
            await nursery.start(self.fast_server.serve)
        if self.replicas is not None:  # it registers with the name servers once it has a role
            await nursery.start(self.replicas.run)
        else:
            nursery.start_soon(self._role_loop if self.classic is None else self._classic_role)
            nursery.start_soon(self.registration.run)
        if self.slave_sync is not None:
            nursery.start_soon(self.slave_sync.run)
        if self.group_listener is not None:
            nursery.start_soon(self.group_listener.run)
        if (
            self.dledger is not None
            and self.config.enable_auto_leader_balance
            and self.config.preferred_leader_id is None  # it pins the leader (a warning)
        ):
            balance = AutoLeaderBalance(
                self.config.broker_cluster_name,
                self.config.broker_name,
                self.config.namesrv_addr,
                self.dledger,
                self.config.auto_leader_balance_interval_ms / 1000,
                self.config.tls_client,
            )
            nursery.start_soon(balance.run)
        nursery.start_soon(self.offsets.run)
        nursery.start_soon(self.schedule.run)
        nursery.start_soon(self.timers.run)
        nursery.start_soon(self.transaction_check.run)
        nursery.start_soon(self.revive.run)
        nursery.start_soon(self._expire_loop)
        if self.upgraded is not None:
            nursery.start_soon(
                self.upgraded.expire_old_files,
                self.config.file_reserved_time * 3600.0,
                self.config.clean_resource_interval / 1000,
            )
        if self.acl is not None:
            nursery.start_soon(self.acl.run)
        nursery.start_soon(self.metrics.run_sampler)  # for the runtime table's rates too
        nursery.start_soon(record_at_midnight, self.stats)
        if self.config.metrics_port:
            host = self.config.bind_address or "0.0.0.0"
            await nursery.start(serve_metrics, self.registry, host, self.config.metrics_port)
        self.registration.register_soon()
        self.started.set()
