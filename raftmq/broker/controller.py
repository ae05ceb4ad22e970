"""BrokerController: one broker of a DLedger group, wired together and run.

It owns the DLedger replica, the message store on top of it, the remoting server
with every request processor, the name-server registration and the services only
a master runs (delayed delivery, offset and metadata writes).

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
import random
import time
from pathlib import Path

import trio

from raftmq.broker.admin_requests import AdminRequests
from raftmq.broker.clients import ClientManager
from raftmq.broker.config import BrokerConfig
from raftmq.broker.consumer_requests import ConsumerRequests
from raftmq.broker.headers import BadRequest
from raftmq.broker.locks import LockRequests, QueueLocks
from raftmq.broker.metawriter import MetaWriter, OffsetWriter
from raftmq.broker.pull import PullProcessor
from raftmq.broker.registration import Registration
from raftmq.broker.schedule import ScheduleService
from raftmq.broker.send import SendProcessor
from raftmq.broker.store.messagestore import MessageStore, parse_delay_levels
from raftmq.broker.store.metadata import (
    DEFAULT_TOPIC,
    DLQ_PREFIX,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    RETRY_PREFIX,
    SubscriptionGroupConfig,
    TopicConfig,
    builtin_topics,
    topic_problem,
)
from raftmq.dledger.codes import Role
from raftmq.dledger.server import DLedgerError, DLedgerServer
from raftmq.remoting import (
    Connection,
    ProcessorTable,
    RemotingCommand,
    RemotingServer,
    RequestCode,
    ResponseCode,
    listen_host,
)

log = logging.getLogger(__name__)

EXPIRE_SCAN_S = 10.0


class BrokerController:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        dconfig = config.dledger_config()
        self.dledger = DLedgerServer(dconfig)
        self.self_id = dconfig.self_id
        self.root = Path(config.store_path_root_dir)
        self.store = MessageStore(
            self.dledger,
            self.root,
            builtin_topics(
                config.broker_cluster_name, config.broker_name, config.default_topic_queue_nums
            ),
            parse_delay_levels(config.message_delay_level),
            config.queue_file_entries,
        )
        self.is_master = False
        self.broker_id = config.slave_broker_id
        self.role_term = 0  # the DLedger term of the current role; registrations carry it
        self.port = config.listen_port
        self.clients = ClientManager()
        self.locks = QueueLocks(self.store.now_ms)
        self.meta = MetaWriter(self)
        self.offsets = OffsetWriter(self)
        self.sender = SendProcessor(self)
        self.schedule = ScheduleService(self)
        self.registration = Registration(self)
        self.stats_put = 0
        self.stats_got = 0
        self.master_since: float | None = None
        self._roles_send, self._roles_recv = trio.open_memory_channel(1000)
        self.dledger.add_role_change_handler(self._on_role_change)
        self.server = RemotingServer(
            listen_host(config.bind_address),
            config.listen_port,
            self._processors(),
            on_disconnect=self.clients.on_disconnect,
        )
        self.started = trio.Event()

    # ------------------------------------------------------------------ identity
    @property
    def address(self) -> str:
        return f"{self.config.broker_ip1}:{self.port}"

    @property
    def store_host(self) -> tuple[str, int]:
        return (self.config.broker_ip1, self.port)

    def not_master(self, request: RemotingCommand) -> RemotingCommand | None:
        if request.is_oneway:
            return None
        leader = self.dledger.replica.leader_id
        return request.make_response(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"not master: {self.config.broker_name} member {self.self_id} is a slave"
            f" (DLedger leader: {leader or 'none yet'}); refresh the route",
        )

    # ------------------------------------------------------------------ processors
    def _processors(self) -> ProcessorTable:
        send, pull = self.sender, PullProcessor(self)
        consumer, admin, locks = ConsumerRequests(self), AdminRequests(self), LockRequests(self)
        table = {
            RequestCode.SEND_MESSAGE: send.send,
            RequestCode.SEND_MESSAGE_V2: send.send,
            RequestCode.SEND_BATCH_MESSAGE: send.send,
            RequestCode.CONSUMER_SEND_MSG_BACK: send.send_back,
            RequestCode.PULL_MESSAGE: pull.pull,
            RequestCode.HEART_BEAT: consumer.heartbeat,
            RequestCode.UNREGISTER_CLIENT: consumer.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: consumer.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: consumer.update_offset,
            RequestCode.GET_MAX_OFFSET: consumer.max_offset,
            RequestCode.GET_MIN_OFFSET: consumer.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: consumer.search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: consumer.earliest_time,
            RequestCode.LOCK_BATCH_MQ: locks.lock,
            RequestCode.UNLOCK_BATCH_MQ: locks.unlock,
            RequestCode.UPDATE_AND_CREATE_TOPIC: admin.create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: admin.all_topics,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.create_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.all_groups,
            RequestCode.GET_BROKER_RUNTIME_INFO: admin.runtime_info,
            RequestCode.VIEW_MESSAGE_BY_ID: admin.view_message,
            RequestCode.GET_TOPIC_STATS_INFO: admin.topic_stats,
            RequestCode.GET_CONSUME_STATS: admin.consume_stats,
        }
        processors = ProcessorTable({code: self._guard(h) for code, h in table.items()})
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
            processors.register_inline(code, send.send_inline)
        return processors

    def _guard(self, handler):
        """Bad input is answered with a code and a remark; a bug answers SYSTEM_ERROR."""

        async def processor(request: RemotingCommand, connection: Connection):
            try:
                response = await handler(request, connection)
            except BadRequest as exc:
                response = request.make_response(exc.code, str(exc))
            except DLedgerError as exc:
                code = ResponseCode.SERVICE_NOT_AVAILABLE
                response = request.make_response(code, f"not master: {exc}")
            except Exception as exc:
                log.exception("request code %d failed", request.code)
                response = request.make_response(
                    ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"
                )
            return None if request.is_oneway else response

        return processor

    # ------------------------------------------------------------------ topics
    async def put_topic(self, config: TopicConfig) -> TopicConfig:
        """Create or update a topic through the log, then tell the name servers: the
        caller (an admin tool, a consumer's first heartbeat creating its retry topic)
        usually asks for the route next. A dead name server delays it by at most 1 s.
        Every way a topic comes to exist passes here, so its name is checked here."""
        problem = topic_problem(config.topic_name)
        if problem is not None:
            raise BadRequest(problem, ResponseCode.SYSTEM_ERROR)  # as TopicValidator answers
        await self.meta.write("topic", config=config.to_json())
        with trio.move_on_after(1.0):
            await self.registration.register_now()
        return config

    async def topic_for_send(self, topic: str, default_topic: str, queue_nums: int) -> TopicConfig:
        """The topic's config, auto-created from TBW102 as RocketMQ's msgCheck does."""
        config = self.store.metadata.topics.get(topic)
        if config is not None:
            return config
        if topic.startswith(RETRY_PREFIX):
            return await self.ensure_retry_topic(topic[len(RETRY_PREFIX) :])
        template = self.store.metadata.topics.get(default_topic or DEFAULT_TOPIC)
        if (
            not self.config.auto_create_topic_enable
            or template is None
            or not template.perm & PERM_INHERIT
        ):
            raise BadRequest(
                f"topic[{topic}] not exist, apply first please!", ResponseCode.TOPIC_NOT_EXIST
            )
        queues = max(1, min(queue_nums, template.write_queue_nums))
        return await self.put_topic(TopicConfig(topic, queues, queues, PERM_READ | PERM_WRITE))

    async def ensure_retry_topic(self, group: str) -> TopicConfig:
        existing = self.store.metadata.topics.get(RETRY_PREFIX + group)
        if existing is not None:
            return existing
        return await self.put_topic(TopicConfig(RETRY_PREFIX + group, 1, 1, PERM_READ | PERM_WRITE))

    async def ensure_dlq(self, group: str) -> TopicConfig:
        existing = self.store.metadata.topics.get(DLQ_PREFIX + group)
        if existing is not None:
            return existing
        return await self.put_topic(TopicConfig(DLQ_PREFIX + group, 1, 1, PERM_WRITE))

    def group_refusal(self, group: str) -> tuple[int, str] | None:
        """Why `group` may not consume here, as (response code, remark); None if it may.

        A group with no config consumes under the defaults while
        `autoCreateSubscriptionGroup` is on (its heartbeat creates the config)."""
        config = self.store.metadata.groups.get(group)
        if config is None:
            if self.config.auto_create_subscription_group:
                return None
            return (
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist, apply first please!",
            )
        if not config.consume_enable:
            return ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}"
        return None

    async def ensure_group(self, group: str) -> None:
        """Create `group`'s config with the defaults, through the log, if it has none and
        `autoCreateSubscriptionGroup` is on (RocketMQ does it on the group's heartbeat)."""
        if group in self.store.metadata.groups or not self.config.auto_create_subscription_group:
            return
        await self.meta.write("group", config=SubscriptionGroupConfig(group).to_json())

    def max_reconsume_times(self, group_or_retry_topic: str) -> int:
        group = group_or_retry_topic.removeprefix(RETRY_PREFIX)
        config = self.store.metadata.groups.get(group)
        return 16 if config is None else config.retry_max_times

    # ------------------------------------------------------------------ roles
    def _on_role_change(self, term: int, role: Role) -> None:
        self._roles_send.send_nowait((term, role, time.monotonic()))

    async def _role_loop(self) -> None:
        async for term, role, when in self._roles_recv:
            if role is Role.LEADER:
                await self._become_master(term, when)
            elif self.is_master or self.broker_id != self.config.slave_broker_id:
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
        self.is_master = False
        self.master_since = None
        self.role_term = term
        self.broker_id = self.config.slave_broker_id
        self.offsets.forget_pending()
        self.locks.clear()
        self.registration.register_soon()

    async def _become_master(self, term: int, elected_at: float) -> None:
        replica, store = self.dledger.replica, self.store
        while True:
            if replica.role is not Role.LEADER or replica.term != term:
                return  # lost it meanwhile; the next event decides
            if store.caught_up():
                break
            await store.wait_dispatch(0.05)
        store.take_over_offsets()
        self.schedule.reset()
        self.is_master = True
        self.master_since = time.monotonic()
        self.role_term = term
        self.broker_id = 0
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
        async with trio.open_nursery() as nursery:
            await nursery.start(self.dledger.serve)
            await nursery.start(self.store.run)
            self.port = await nursery.start(self.server.serve)
            nursery.start_soon(self._role_loop)
            nursery.start_soon(self.registration.run)
            nursery.start_soon(self.offsets.run)
            nursery.start_soon(self.schedule.run)
            nursery.start_soon(self._expire_loop)
            self.registration.register_soon()
            self.started.set()
            task_status.started(self.port)
