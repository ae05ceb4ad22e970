"""What an executor does with one `QueueRange`: pull exactly [start, end), in order.

The range was planned from committed offsets, so every message in it exists on a
quorum and, once dispatched, on every member at the same offset. A pull that cannot
make progress therefore means "not here yet" or "not from this member", never "no
such message": the master died and the route still names it, a replica that answered
lags behind the commit, a deposed master is still in the route. The loop refreshes the
route and tries again with back-off (50 -> 400 ms) until a member that has the
messages answers, normally the new master within about a second, and gives up only
after `timeout_s` without progress.

The one answer that does mean "gone" is an offset below the member's minimum
(retention deleted it), or messages missing between two that arrived: data loss,
raised as `DataLossError`, or skipped and logged when `fail_on_data_loss` is false.
Nothing past `end` is ever returned, whatever a pull brings back.

With a selector that filters (a TAG expression other than "*", or SQL92) the broker
skips what it does not select, so offsets between two messages are expected, not lost,
and the read moves on by the answer's `nextBeginOffset`, including past a pull that
matched nothing (PULL_RETRY_IMMEDIATELY with the offset moved; with the offset unchanged
it is a lagging replica, retried as above). A selector the broker refuses (an SQL92
expression that does not parse, or brokers without `enablePropertyFilter`) fails the
read at once with the broker's remark: every member would answer the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from raftmq.client.consumer import SQL92, MessageSelector, PullResult, PullStatus
from raftmq.client.errors import MQBrokerError
from raftmq.client.instance import backoff_delays
from raftmq.client.spark.offsets import DataLossError, QueueRange
from raftmq.client.spark.session import BROKER_ERRORS
from raftmq.protocol.message import MessageExt
from raftmq.remoting import ResponseCode

__all__ = ["PULL_BATCH", "FilterRefusedError", "Puller", "StalledError", "read_range"]

log = logging.getLogger(__name__)

PULL_BATCH = 32  # a broker answers at most 32 messages per pull (maxTransferCountOnMessageInMemory)


class Puller(Protocol):
    def pull(
        self,
        topic: str,
        broker_name: str,
        queue_id: int,
        offset: int,
        count: int,
        until: int,
        selector: MessageSelector | None,
    ) -> PullResult: ...

    def forget_route(self, topic: str) -> None: ...


class StalledError(Exception):
    """No member handed out the next message of a planned range in time."""


class FilterRefusedError(Exception):
    """A broker refused the read's selector; asking again would get the same answer."""


def _refused(exc: MQBrokerError, selector: MessageSelector | None) -> bool:
    """Whether `exc` refuses the selector itself: a parse failure, or SQL92 on brokers
    without enablePropertyFilter (RocketMQ answers that with SYSTEM_ERROR)."""
    if selector is None:
        return False
    return exc.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED or (
        exc.code == ResponseCode.SYSTEM_ERROR and selector.expression_type == SQL92
    )


def read_range(
    puller: Puller,
    topic: str,
    queue: QueueRange,
    *,
    fail_on_data_loss: bool,
    timeout_s: float,
    selector: MessageSelector | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[list[MessageExt]]:
    """Yield the messages of `queue`'s range in offset order, in the chunks pulls return;
    with a filtering `selector` (None: every message), only those it selects."""
    offset = queue.start
    delays = backoff_delays()
    stalled_since: float | None = None
    while offset < queue.end:
        try:
            result = puller.pull(
                topic,
                queue.broker_name,
                queue.queue_id,
                offset,
                min(PULL_BATCH, queue.end - offset),
                queue.end,
                selector,
            )
        except MQBrokerError as exc:
            if _refused(exc, selector):
                raise FilterRefusedError(f"queue {queue.key} of {topic}: {exc}") from None
            why = f"pull failed: {exc}"
        except BROKER_ERRORS as exc:
            why = f"pull failed: {exc}"
        else:
            if result.status is PullStatus.FOUND or (
                selector is not None and result.status is PullStatus.NO_MATCHED_MSG
            ):
                if selector is None:
                    chunk, following = _in_range(queue, offset, result.messages, fail_on_data_loss)
                else:
                    chunk, following = _selected(queue, offset, result)
                if following > offset:
                    offset, stalled_since, delays = following, None, backoff_delays()
                    if chunk:
                        yield chunk
                    continue
                why = "the member answered with no message of the range"
            elif result.status is PullStatus.OFFSET_ILLEGAL and offset < result.min_offset:
                _lost(queue, offset, min(result.min_offset, queue.end), fail_on_data_loss)
                offset = min(result.min_offset, queue.end)
                continue
            else:
                why = (
                    f"{result.status.name}: the member that answered ends at {result.max_offset}"
                    " (a lagging replica, or the master moved)"
                )
        now = clock()
        if stalled_since is None:
            stalled_since = now
        elif now - stalled_since >= timeout_s:
            raise StalledError(
                f"queue {queue.key} of {topic}: no message at offset {offset} of the range "
                f"[{queue.start}, {queue.end}) for {timeout_s:.0f} s; last: {why}"
            )
        log.info("queue %s at %d: %s; retrying with a fresh route", queue.key, offset, why)
        puller.forget_route(topic)
        sleep(next(delays))


def _in_range(
    queue: QueueRange, offset: int, messages: list[MessageExt], fail_on_data_loss: bool
) -> tuple[list[MessageExt], int]:
    """The pulled messages inside [offset, end), gaps reported, and the next offset."""
    chunk = []
    for msg in messages:
        if msg.queue_offset < offset:
            continue
        if msg.queue_offset >= queue.end:
            break
        if msg.queue_offset > offset:
            _lost(queue, offset, msg.queue_offset, fail_on_data_loss)
        chunk.append(msg)
        offset = msg.queue_offset + 1
    return chunk, offset


def _selected(queue: QueueRange, offset: int, result: PullResult) -> tuple[list[MessageExt], int]:
    """The messages a filtering pull returned inside [offset, end) (the gaps between
    them are messages the selector skipped), and the next offset: past what the broker
    examined, within the range."""
    chunk = [msg for msg in result.messages if offset <= msg.queue_offset < queue.end]
    following = max(result.next_begin_offset, chunk[-1].queue_offset + 1 if chunk else offset)
    return chunk, min(following, queue.end)


def _lost(queue: QueueRange, start: int, end: int, fail_on_data_loss: bool) -> None:
    loss = f"queue {queue.key}: offsets {start}..{end - 1} were deleted before they were read"
    if fail_on_data_loss:
        raise DataLossError([loss])
    log.warning("%s; skipped (failOnDataLoss=false)", loss)
