"""`PullConsumer`: PULL_MESSAGE (11) and the consumer group's offset calls, by hand.

The application picks queues (`fetch_queues`) and offsets itself, as with Java's
`DefaultMQPullConsumer`; `PushConsumer` is built on the same calls. Reads (pulls,
min/max/search offsets, committed offsets) go to the broker group's master and, when
it cannot be reached, to any replica in the route: every member serves committed data
with the same queue offsets. Writes (offset commits, send-backs) go to the master,
with the route refreshed at once after "not master" or a dead connection.

A pull reply's status (A.9): SUCCESS -> FOUND, PULL_NOT_FOUND -> NO_NEW_MSG,
PULL_RETRY_IMMEDIATELY -> NO_MATCHED_MSG, PULL_OFFSET_MOVED -> OFFSET_ILLEGAL; any
other code raises MQBrokerError. Found messages are filtered by tag here (brokers may
filter only by tag hash) and zlib bodies are inflated. An SQL92 subscription
(`MessageSelector.by_sql`) is filtered by the broker alone, as with Java's client.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Sequence

import attrs

from raftmq.client.errors import MQBrokerError
from raftmq.client.instance import ClientInstance
from raftmq.client.route import MessageQueue
from raftmq.protocol.message import MessageExt, decode_all, inflate, java_string_hash
from raftmq.remoting import RemotingCommand
from raftmq.remoting.codes import RequestCode, ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = [
    "MAX_RECONSUME_TIMES",
    "MessageSelector",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "Subscription",
    "pull_request",
    "pull_result",
]

log = logging.getLogger(__name__)

# PullSysFlag
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

MAX_RECONSUME_TIMES = 16  # a message failed this often goes to %DLQ%group
LONG_POLL_RPC_MARGIN_S = 15.0  # Java: 15 s suspend inside a 30 s RPC timeout


class PullStatus(enum.Enum):
    FOUND = ResponseCode.SUCCESS
    NO_NEW_MSG = ResponseCode.PULL_NOT_FOUND
    NO_MATCHED_MSG = ResponseCode.PULL_RETRY_IMMEDIATELY
    OFFSET_ILLEGAL = ResponseCode.PULL_OFFSET_MOVED


_PULL_STATUS = {status.value: status for status in PullStatus}


@attrs.frozen
class PullResult:
    status: PullStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int
    # pull(raw=True): the records as the broker sent them, neither decoded (messages is
    # empty), filtered by tag nor inflated, for a reader that decodes them its own way
    body: bytes | None = None


TAG, SQL92 = "TAG", "SQL92"  # ExpressionType


@attrs.frozen
class MessageSelector:
    """What a consumer selects (Java's `MessageSelector`): `by_tag("TagA || TagB")`, or
    `by_sql("a > 5 AND TAGS = 'x'")` over the message properties, which the broker
    evaluates; it needs `enablePropertyFilter=true` on the broker."""

    expression_type: str
    expression: str

    @classmethod
    def by_tag(cls, expression: str = "*") -> MessageSelector:
        return cls(TAG, expression or "*")

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        return cls(SQL92, expression)


@attrs.frozen
class Subscription:
    """`SubscriptionData`: a TAG expression, "*" (everything) or "TagA || TagB", or an
    SQL92 one (`expression_type="SQL92"`)."""

    topic: str
    expression: str = "*"
    version: int = attrs.field(factory=lambda: int(time.time() * 1000))
    expression_type: str = attrs.field(default=TAG, kw_only=True)

    @classmethod
    def of(cls, topic: str, selector: MessageSelector | str, version: int | None = None):
        """A subscription to `topic` from a selector or a TAG expression."""
        if isinstance(selector, str):
            selector = MessageSelector.by_tag(selector)
        when = {} if version is None else {"version": version}
        return cls(topic, selector.expression, expression_type=selector.expression_type, **when)

    @property
    def tags(self) -> frozenset[str]:
        if self.expression_type != TAG or self.expression.strip() in ("", "*"):
            return frozenset()
        return frozenset(t.strip() for t in self.expression.split("||") if t.strip())

    def matches(self, msg: MessageExt) -> bool:
        tags = self.tags
        return not tags or msg.tags in tags

    def to_json(self) -> dict:
        tags = sorted(self.tags)
        return {
            "classFilterMode": False,
            "codeSet": [java_string_hash(t) for t in tags],
            "expressionType": self.expression_type,
            "subString": self.expression if tags or self.expression_type != TAG else "*",
            "subVersion": self.version,
            "tagsSet": tags,
            "topic": self.topic,
        }


def _offset(response: RemotingCommand, broker: str) -> int:
    if response.code != ResponseCode.SUCCESS:
        raise MQBrokerError(response.code, response.remark, broker)
    return int(response.ext_fields["offset"])


def pull_request(
    group: str,
    mq: MessageQueue,
    offset: int,
    max_nums: int,
    subscription: Subscription,
    long_poll_s: float | None = None,
    commit_offset: int | None = None,
) -> RemotingCommand:
    """A PULL_MESSAGE request (PullMessageRequestHeader), for any member of the group."""
    sysflag = FLAG_SUBSCRIPTION
    if commit_offset is not None:
        sysflag |= FLAG_COMMIT_OFFSET
    if long_poll_s:
        sysflag |= FLAG_SUSPEND
    return RemotingCommand(
        RequestCode.PULL_MESSAGE,
        ext_fields={
            "consumerGroup": group,
            "topic": mq.topic,
            "queueId": mq.queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "sysFlag": sysflag,
            "commitOffset": commit_offset or 0,
            "suspendTimeoutMillis": int((long_poll_s or 0) * 1000),
            "subscription": subscription.expression,
            "subVersion": subscription.version,
            "expressionType": subscription.expression_type,
        },
    )


def pull_result(
    response: RemotingCommand,
    offset: int,
    subscription: Subscription,
    broker: str,
    raw: bool = False,
) -> PullResult:
    """A pull reply as a PullResult (messages filtered by tag and inflated, or with
    `raw` the body as it came); raises MQBrokerError for a code that is not a pull
    status."""
    status = _PULL_STATUS.get(response.code)
    if status is None:
        raise MQBrokerError(response.code, response.remark, broker)
    ext = response.ext_fields
    messages = []
    if status is PullStatus.FOUND and not raw:
        for msg in decode_all(response.body):
            if subscription.matches(msg):
                inflate(msg)
                messages.append(msg)
    return PullResult(
        status,
        messages,
        int(ext.get("nextBeginOffset", offset)),
        int(ext.get("minOffset", 0)),
        int(ext.get("maxOffset", 0)),
        response.body if raw and status is PullStatus.FOUND else None,
    )


def send_back_request(
    group: str, msg: MessageExt, delay_level: int, max_reconsume_times: int
) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK for `msg` (by its physical offset): to `%RETRY%group`
    after `delay_level`, or to `%DLQ%group` with a negative level or past
    `max_reconsume_times`."""
    return RemotingCommand(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        ext_fields={
            "offset": msg.physical_offset,
            "group": group,
            "delayLevel": delay_level,
            "originMsgId": msg.uniq_key or msg.msg_id,
            "originTopic": msg.topic,
            "unitMode": False,
            "maxReconsumeTimes": max_reconsume_times,
        },
    )


class PullConsumer:
    """`async with PullConsumer(namesrv, "group") as c: await c.pull(mq, offset)`.

    It does not heartbeat, so it never joins a push consumer group's rebalance.
    """

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        group: str = "DEFAULT_CONSUMER",
        *,
        rpc_timeout_s: float = 3.0,
        poll_name_server_interval_s: float = 30.0,
        heartbeat_interval_s: float = 30.0,
        tls: ClientTls | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self.group = group
        self.instance = ClientInstance(
            namesrv_addr,
            rpc_timeout_s=rpc_timeout_s,
            poll_name_server_interval_s=poll_name_server_interval_s,
            heartbeat_interval_s=heartbeat_interval_s,
            tls=tls,
            credentials=credentials,
        )

    async def __aenter__(self) -> PullConsumer:
        await self.instance.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.instance.__aexit__(*exc_info)

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (`fetchSubscribeMessageQueues`)."""
        return (await self.instance.routes.get(topic)).read_queues()

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        subscription: Subscription | MessageSelector | str = "*",
        long_poll_s: float | None = None,
        commit_offset: int | None = None,
        timeout_s: float | None = None,
        raw: bool = False,
    ) -> PullResult:
        """Up to `max_nums` messages of `mq` from `offset` that `subscription` selects:
        a TAG expression ("TagA || TagB"), a MessageSelector or a Subscription. With
        `raw` the result holds the reply's records undecoded (`PullResult.body`): the
        broker filtered them by tag hash only, the caller checks the tags.

        With `long_poll_s` the broker holds the request until a message arrives or that
        time passes (SUSPEND); `commit_offset` rides along for the broker to store
        (COMMIT_OFFSET). The RPC times out after `timeout_s`: by default the RPC
        timeout, or the hold plus 15 s.
        """
        if not isinstance(subscription, Subscription):
            subscription = Subscription.of(mq.topic, subscription, 0)
        request = pull_request(
            self.group, mq, offset, max_nums, subscription, long_poll_s, commit_offset
        )
        if timeout_s is None:
            timeout_s = (
                long_poll_s + LONG_POLL_RPC_MARGIN_S if long_poll_s else self.instance.rpc_timeout_s
            )
        response = await self.instance.call_broker(
            mq.topic, mq.broker_name, request, timeout_s, replicas=True
        )
        return pull_result(response, offset, subscription, mq.broker_name, raw)

    async def _read_offset(self, code: RequestCode, mq: MessageQueue, **extra) -> int:
        request = RemotingCommand(
            code, ext_fields={"topic": mq.topic, "queueId": mq.queue_id, **extra}
        )
        response = await self.instance.call_broker(mq.topic, mq.broker_name, request, replicas=True)
        return _offset(response, mq.broker_name)

    async def min_offset(self, mq: MessageQueue) -> int:
        """The queue's first offset still stored (GET_MIN_OFFSET)."""
        return await self._read_offset(RequestCode.GET_MIN_OFFSET, mq)

    async def max_offset(self, mq: MessageQueue) -> int:
        """The offset the next message will get (GET_MAX_OFFSET)."""
        return await self._read_offset(RequestCode.GET_MAX_OFFSET, mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        return await self._read_offset(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, timestamp=timestamp_ms
        )

    async def query_offset(self, mq: MessageQueue) -> int | None:
        """The group's committed offset for `mq`, None if it has none (QUERY_NOT_FOUND)."""
        request = RemotingCommand(
            RequestCode.QUERY_CONSUMER_OFFSET,
            ext_fields={"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id},
        )
        response = await self.instance.call_broker(mq.topic, mq.broker_name, request, replicas=True)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return _offset(response, mq.broker_name)

    async def update_offset(self, mq: MessageQueue, offset: int) -> None:
        """Commit the group's offset for `mq` at the master (UPDATE_CONSUMER_OFFSET, two-way,
        so a commit that did not land raises instead of vanishing)."""
        request = RemotingCommand(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            ext_fields={
                "consumerGroup": self.group,
                "topic": mq.topic,
                "queueId": mq.queue_id,
                "commitOffset": offset,
            },
        )
        response = await self.instance.call_broker(mq.topic, mq.broker_name, request)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, mq.broker_name)

    async def consumer_ids(self, topic: str) -> list[str]:
        """The group's members as a broker of `topic` knows them (GET_CONSUMER_LIST_BY_GROUP)."""
        route = await self.instance.routes.get(topic)
        broker_name = min(route.brokers)
        request = RemotingCommand(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": self.group}
        )
        response = await self.instance.call_broker(topic, broker_name, request, replicas=True)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, broker_name)
        return list(json.loads(response.body).get("consumerIdList") or [])

    async def send_back(
        self,
        mq: MessageQueue,
        msg: MessageExt,
        delay_level: int = 0,
        max_reconsume_times: int = MAX_RECONSUME_TIMES,
    ) -> None:
        """Hand a message the application failed back to the broker, which stores it in
        %RETRY%group after a delay (or %DLQ%group) (CONSUMER_SEND_MSG_BACK).

        `msg.physical_offset` identifies it; `mq` is where it was pulled from.
        """
        request = send_back_request(self.group, msg, delay_level, max_reconsume_times)
        response = await self.instance.call_broker(mq.topic, mq.broker_name, request)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, mq.broker_name)
