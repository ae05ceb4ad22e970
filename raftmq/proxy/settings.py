"""The Settings a client gets back on its Telemetry stream (`GrpcClientSettingsManager`).

A client writes its Settings (type, topics or subscriptions) when it opens a stream;
the proxy keeps them per client id and answers with the merge: the client's own fields
plus what the server decides. The official Python client applies the answer only when
its status is OK, and a PushConsumer waits up to 10 s for it before `startup()` returns.

- producers: 3 attempts with exponential back-off 10 ms -> 1 s (x2),
  `validate_message_type`, `max_body_size` 4 MiB;
- consumers: receive batch 32, long polling 20 s, and from the subscription group's
  config (`group`, its JSON as the broker keeps it; defaults without one): `fifo` =
  consumeMessageOrderly, attempts = retryMaxTimes + 1 (17), and its groupRetryPolicy:
  CUSTOMIZED `next` delays (RocketMQ's 1s 5s 10s 30s 1m ... 2h by default) or
  EXPONENTIAL initial / max / multiplier (defaults 5 s, 2 h, x2).
"""

from __future__ import annotations

from raftmq.proxy.apis import definition
from raftmq.proxy.sending import MAX_BODY_BYTES

__all__ = ["CONSUMER_BACKOFF_S", "merged_settings"]

ClientType = definition.ClientType

PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
RETRY_MAX_TIMES = 16  # SubscriptionGroupConfig.retryMaxTimes
EXPONENTIAL_DEFAULTS_MS = (5000, 7_200_000, 2.0)  # ExponentialRetryPolicy's
CONSUMER_BATCH = 32
LONG_POLLING_S = 20
# RocketMQ's delay levels, the default CUSTOMIZED retry policy of a subscription group.
CONSUMER_BACKOFF_S = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip


def _consumer_backoff(policy, group: dict) -> None:
    retry = group.get("groupRetryPolicy") or {}
    if retry.get("type") == "EXPONENTIAL":
        given = retry.get("exponentialRetryPolicy") or {}
        initial_ms, max_ms, multiplier = EXPONENTIAL_DEFAULTS_MS
        exponential = policy.exponential_backoff
        exponential.initial.FromMilliseconds(int(given.get("initial", initial_ms)))
        exponential.max.FromMilliseconds(int(given.get("max", max_ms)))
        exponential.multiplier = float(given.get("multiplier", multiplier))
        return
    next_ms = (retry.get("customizedRetryPolicy") or {}).get("next")
    if not next_ms:
        next_ms = [seconds * 1000 for seconds in CONSUMER_BACKOFF_S]
    for delay_ms in next_ms:
        policy.customized_backoff.next.add().FromMilliseconds(int(delay_ms))


def merged_settings(given, *, group: dict | None = None, validate_message_type: bool = True):
    """The Settings to answer `given` with (a copy; `given` is not changed)."""
    merged = definition.Settings()
    merged.CopyFrom(given)
    policy = merged.backoff_policy
    if merged.HasField("publishing"):
        policy.Clear()
        policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        exponential = policy.exponential_backoff
        exponential.initial.FromMilliseconds(PRODUCER_BACKOFF_INITIAL_MS)
        exponential.max.FromMilliseconds(PRODUCER_BACKOFF_MAX_MS)
        exponential.multiplier = PRODUCER_BACKOFF_MULTIPLIER
        merged.publishing.validate_message_type = validate_message_type
        merged.publishing.max_body_size = MAX_BODY_BYTES
    elif merged.HasField("subscription"):
        group = group or {}
        policy.Clear()
        policy.max_attempts = int(group.get("retryMaxTimes", RETRY_MAX_TIMES)) + 1
        _consumer_backoff(policy, group)
        subscription = merged.subscription
        subscription.receive_batch_size = CONSUMER_BATCH
        subscription.long_polling_timeout.FromSeconds(LONG_POLLING_S)
        subscription.fifo = bool(group.get("consumeMessageOrderly", False))
    return merged
