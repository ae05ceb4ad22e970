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

Pulls come back undecoded; each is read into Arrow-layout columns (`decode_columns`,
compiled) for its queue offsets, and a `Chunk` is the bytes of the records of the
range among them, which the reader joins and decodes again into one Arrow batch: no
MessageExt is ever built. The loop runs in the session's trio thread and hands Spark's
thread one joined chunk of about 2,048 messages at a time (`read_joined`,
`BlockingSession.iterate`): a thread hop per pull cost as much CPU as the rest of the
read.

With a selector that filters (a TAG expression other than "*", or SQL92) the broker
skips what it does not select, so offsets between two messages are expected, not lost,
and the read moves on by the answer's `nextBeginOffset`, including past a pull that
matched nothing (PULL_RETRY_IMMEDIATELY with the offset moved; with the offset unchanged
it is a lagging replica, retried as above). A selector the broker refuses (an SQL92
expression that does not parse, or brokers without `enablePropertyFilter`) fails the
read at once with the broker's remark: every member would answer the same.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import attrs
import trio

from raftmq.client.consumer import SQL92, MessageSelector, PullResult, PullStatus
from raftmq.client.errors import MQBrokerError
from raftmq.client.instance import backoff_delays
from raftmq.client.spark.offsets import DataLossError, QueueRange
from raftmq.client.spark.session import BROKER_ERRORS
from raftmq.protocol.columns import DECODE_COLUMNS, RecordColumns
from raftmq.remoting import ResponseCode

__all__ = [
    "PULL_BATCH",
    "Chunk",
    "FilterRefusedError",
    "Puller",
    "StalledError",
    "read_joined",
    "read_range",
]

log = logging.getLogger(__name__)

PULL_BATCH = 32  # a broker answers at most 32 messages per pull (maxTransferCountOnMessageInMemory)


@attrs.frozen
class Chunk:
    """What one pull brought of a range: the records (back to back, as a pull reply
    holds them) in the range and, with a selector, those the broker selected (it
    matches tags by hash: a tag sharing the hash of one asked for is the reader's to
    drop)."""

    records: bytes
    count: int


class Puller(Protocol):
    async def pull(
        self,
        topic: str,
        broker_name: str,
        queue_id: int,
        offset: int,
        count: int,
        until: int,
        selector: MessageSelector | None,
    ) -> PullResult: ...

    async def forget_route(self, topic: str) -> None: ...


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


async def read_joined(
    puller: Puller, topic: str, queue: QueueRange, rows: int, max_bytes: int, **options
) -> AsyncIterator[Chunk]:
    """read_range's chunks joined until they hold `rows` messages or `max_bytes` of
    records (the last may hold less): the unit a reader converts and hands on at once.
    The byte bound keeps big messages from piling up (2,048 of 4 MiB would be 8 GiB)
    and a batch's columns within Arrow's 32-bit offsets."""
    pending: list[bytes] = []
    count = size = 0
    async with contextlib.aclosing(read_range(puller, topic, queue, **options)) as chunks:
        async for chunk in chunks:
            pending.append(chunk.records)
            count += chunk.count
            size += len(chunk.records)
            if count >= rows or size >= max_bytes:
                yield Chunk(b"".join(pending), count)
                pending, count, size = [], 0, 0
    if count:
        yield Chunk(b"".join(pending), count)


async def read_range(
    puller: Puller,
    topic: str,
    queue: QueueRange,
    *,
    fail_on_data_loss: bool,
    timeout_s: float,
    selector: MessageSelector | None = None,
) -> AsyncIterator[Chunk]:
    """Yield the messages of `queue`'s range in offset order, in the chunks pulls return;
    with a filtering `selector` (None: every message), only those it selects."""
    offset = queue.start
    delays = backoff_delays()
    stalled_since: float | None = None
    while offset < queue.end:
        try:
            result = await puller.pull(
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
                columns = RecordColumns._make(DECODE_COLUMNS(result.body or b""))
                offsets = memoryview(columns.queue_offsets).cast("q")
                if selector is None:
                    rows, following = _in_range(queue, offset, offsets, fail_on_data_loss)
                else:
                    rows, following = _selected(queue, offset, offsets, result.next_begin_offset)
                if following > offset:
                    offset, stalled_since, delays = following, None, backoff_delays()
                    if rows:
                        yield _chunk(result.body, columns, rows)
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
        now = trio.current_time()
        if stalled_since is None:
            stalled_since = now
        elif now - stalled_since >= timeout_s:
            raise StalledError(
                f"queue {queue.key} of {topic}: no message at offset {offset} of the range "
                f"[{queue.start}, {queue.end}) for {timeout_s:.0f} s; last: {why}"
            )
        log.info("queue %s at %d: %s; retrying with a fresh route", queue.key, offset, why)
        await puller.forget_route(topic)
        await trio.sleep(next(delays))


def _chunk(body: bytes, columns: RecordColumns, rows: list[int]) -> Chunk:
    """The records `rows` (ascending) of `body`, whose `columns` say where each begins."""
    if len(rows) == columns.rows:
        return Chunk(body, len(rows))
    starts = memoryview(columns.record_starts).cast("i")
    view = memoryview(body)
    return Chunk(b"".join(view[starts[row] : starts[row + 1]] for row in rows), len(rows))


def _in_range(
    queue: QueueRange, offset: int, offsets: Sequence[int], fail_on_data_loss: bool
) -> tuple[list[int], int]:
    """The rows of a pull (their queue `offsets`) inside [offset, end), gaps reported,
    and the next offset."""
    rows = []
    for row, at in enumerate(offsets):
        if at < offset:
            continue
        if at >= queue.end:
            break
        if at > offset:
            _lost(queue, offset, at, fail_on_data_loss)
        rows.append(row)
        offset = at + 1
    return rows, offset


def _selected(
    queue: QueueRange, offset: int, offsets: Sequence[int], next_begin_offset: int
) -> tuple[list[int], int]:
    """The rows a filtering pull returned inside [offset, end) (the gaps between them
    are messages the selector skipped), and the next offset: past what the broker
    examined, within the range."""
    rows = [row for row, at in enumerate(offsets) if offset <= at < queue.end]
    following = max(next_begin_offset, offsets[rows[-1]] + 1 if rows else offset)
    return rows, min(following, queue.end)


def _lost(queue: QueueRange, start: int, end: int, fail_on_data_loss: bool) -> None:
    loss = f"queue {queue.key}: offsets {start}..{end - 1} were deleted before they were read"
    if fail_on_data_loss:
        raise DataLossError([loss])
    log.warning("%s; skipped (failOnDataLoss=false)", loss)
