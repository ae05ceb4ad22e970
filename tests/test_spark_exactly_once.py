"""The Spark sink's exactly-once decisions: the rules alone, then the sink's session
against a one-member in-process broker whose check-back runs every 100 ms, through a
driver crash between recording a batch and ending its halves, a failed task attempt,
a batch re-run after the crash, a batch still committing and an aborted one."""

from __future__ import annotations

import pytest
import trio

from raftmq.client.spark.exactly_once import (
    COMMIT,
    RECORDS_TOPIC,
    ROLLBACK,
    UNKNOW,
    Record,
    decide,
    decide_half,
    half_properties,
    recorded,
)
from raftmq.client.spark.session import Outgoing, SinkSession
from tests.helpers import create_topic, group, stored, wait_for

FAST_CHECKS = {"transactionTimeOut": "100", "transactionCheckInterval": "100"}


@pytest.mark.parametrize(
    ("batch", "task", "state"),
    [
        (3, "a", COMMIT),  # recorded with its attempt
        (3, "x", ROLLBACK),  # recorded without it: a failed attempt, or a re-run's
        (2, "a", ROLLBACK),  # not recorded, a later batch is: never committed
        (5, "a", UNKNOW),  # not recorded, nothing later: may be committing still
    ],
)
def test_a_half_is_decided_by_the_record_of_its_batch(batch, task, state):
    batches = {3: frozenset({"a", "b"}), 4: frozenset({"c"})}
    assert decide(batches, batch, task) is state
    assert decide_half(batches, half_properties("q", batch, task)) is state


def test_records_of_other_queries_and_strangers_do_not_count():
    first, again = Record("q", 1, frozenset({"a"})), Record("q", 1, frozenset({"b"}))
    other = Record("other", 2, frozenset({"c"}))
    assert Record.decode(first.encode()) == first
    assert Record.decode(b"not a record") is None
    assert Record.decode(b'{"query": "q"}') is None
    assert recorded([first, other, again], "q") == {1: frozenset({"a"})}  # the first wins
    assert decide_half({}, {"SPARK_QUERY": "q"}) is UNKNOW  # not the sink's half


def rows(prefix: str, count: int) -> list[Outgoing]:
    return [
        Outgoing("Out", b"%s-%d" % (prefix.encode(), i), None, None, None) for i in range(count)
    ]


@pytest.mark.slow
async def test_a_driver_crash_and_a_rerun_commit_each_row_once(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1, **FAST_CHECKS)
    await create_topic(g, "Out", 2)
    await create_topic(g, RECORDS_TOPIC, 1)

    def session() -> SinkSession:
        return SinkSession(g.namesrv_addr, "spark-sink", 3.0, RECORDS_TOPIC)

    async def bodies() -> list[bytes]:
        return sorted(m.body for m in await stored(g, "Out", 2))

    # The crashed run: a task attempt failed after sending (x), its retry (a) succeeded,
    # and the driver recorded batch 0 with a, then died before any END_TRANSACTION.
    async with session() as crashed:
        await crashed.send_halves(rows("x", 3), 8, half_properties("q", 0, "x"))
        await crashed.send_halves(rows("a", 5), 8, half_properties("q", 0, "a"))
        record = Record("q", 0, frozenset({"a"}))
        await crashed.producer.send(RECORDS_TOPIC, record.encode())
    assert await bodies() == []  # nothing ended: nothing visible

    # The restarted query's writer, same producer group: the check-back asks it.
    async with session() as restarted:
        with trio.fail_after(10):
            while len(await bodies()) < 5:
                await trio.sleep(0.05)
        # Spark runs batch 0 again (its commit was not in the checkpoint): new halves,
        # rolled back, as the record names the crashed run's attempt.
        rerun = await restarted.send_halves(rows("b", 4), 8, half_properties("q", 0, "b"))
        await restarted.commit_batch("q", 0, [("b", rerun)], 8)
        # Batch 1 is sent; while it commits, a check-back leaves its halves open.
        sent = await restarted.send_halves(rows("c", 2), 8, half_properties("q", 1, "c"))
        await trio.sleep(0.5)  # several check runs
        assert await bodies() == sorted(b"a-%d" % i for i in range(5))
        await restarted.commit_batch("q", 1, [("c", sent)], 8)
        # Batch 2 fails: Spark aborts it.
        aborted = await restarted.send_halves(rows("d", 3), 8, half_properties("q", 2, "d"))
        await restarted.roll_back(aborted, 8)
        await wait_for(lambda: g.master().store.max_offset("Out", 0)
                       + g.master().store.max_offset("Out", 1) == 7)  # fmt: skip
        await trio.sleep(0.5)  # the failed attempt's and the re-run's halves stay out
        assert await restarted.recorded_batches("q") == {0: frozenset({"a"}), 1: frozenset({"c"})}
    expected = [b"a-%d" % i for i in range(5)] + [b"c-%d" % i for i in range(2)]
    assert await bodies() == sorted(expected)
