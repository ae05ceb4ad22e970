"""A trio RocketMQ 4.x remoting client: producer, pull and push consumers, blocking facades.

It speaks the wire protocol of Java's `rocketmq-client` 4.9 (SEND_MESSAGE_V2 with the
short header names, SEND_BATCH_MESSAGE, long-polling PULL_MESSAGE, heartbeats, offset
commits, send-back to the retry topic), so it works against a stock broker and name
server as well as raftmq's. Modules:

- `route`: TopicRouteData, MessageQueue, the per-topic route cache
- `connections`: one pipelined connection per address
- `instance`: what a client shares (id, pool, routes, heartbeat, broker calls)
- `producer`: Producer, SendResult; `consumer`: PullConsumer; `push`: PushConsumer
- `transaction`: TransactionProducer (half message, local transaction, check-back)
- `offsets`, `allocate`: consumed-offset bookkeeping and queue allocation
- `blocking`: BlockingProducer, BlockingPullConsumer for scripts
- `errors`: SendError (with `indeterminate`), MQBrokerError, RouteNotFoundError

Where it differs from the Java client, on purpose:

- **Routes refresh at once** after "not master" (SERVICE_NOT_AVAILABLE), SYSTEM_ERROR,
  SYSTEM_BUSY or a dead connection, not at the next 30 s poll. With a DLedger broker
  group the master moves on failover, and the new one registers within a second.
- **A send to a topic on one broker group keeps retrying** that group, with a fresh
  route and a 50 -> 400 ms back-off, until `send_timeout_s`, rather than giving up
  after `retry_times` + 1 attempts (which still applies with several groups).
- **Send failures say whether the message may be stored**: `SendError.indeterminate`
  is True when a request left and no answer came (timeout, lost connection) or the
  broker answered SYSTEM_ERROR; Java throws the same exception types for both.
- **Reads fall back to replicas**: pulls and offset reads go to any member of the
  group when the master is unreachable (every DLedger member serves committed data
  at the same offsets); Java reads a slave only when the master tells it to.
- **Offset commits are two-way** (Java sends UPDATE_CONSUMER_OFFSET oneway) and are
  retried at the new master, and a released queue commits before it counts as
  released; a queue that starts from `consume_from` commits its start offset.
- Pull consumers do not heartbeat, so they never join a push group's rebalance.

Every client takes `credentials=SessionCredentials(access_key, secret_key)` for a
broker with `aclEnable=true`; each request is then signed as Java's AclClientRPCHook
signs it (raftmq.remoting.signing).
"""

from raftmq.client.allocate import allocate_averagely
from raftmq.client.blocking import BlockingProducer, BlockingPullConsumer
from raftmq.client.consumer import (
    MessageSelector,
    PullConsumer,
    PullResult,
    PullStatus,
    Subscription,
)
from raftmq.client.errors import MQBrokerError, MQClientError, RouteNotFoundError, SendError
from raftmq.client.producer import Message, Producer, SendResult, SendStatus
from raftmq.client.push import ConsumeFromWhere, PushConsumer
from raftmq.client.route import MessageQueue, TopicRouteData, parse_route
from raftmq.client.transaction import (
    LocalTransactionState,
    TransactionProducer,
    TransactionSendResult,
)
from raftmq.remoting.signing import SessionCredentials

__all__ = [
    "BlockingProducer",
    "BlockingPullConsumer",
    "ConsumeFromWhere",
    "LocalTransactionState",
    "MQBrokerError",
    "MQClientError",
    "Message",
    "MessageQueue",
    "MessageSelector",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "RouteNotFoundError",
    "SendError",
    "SendResult",
    "SendStatus",
    "SessionCredentials",
    "Subscription",
    "TopicRouteData",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_averagely",
    "parse_route",
]
