"""The blocking facades, called from a worker thread while the test's loop serves the
name server and an in-process broker member."""

from __future__ import annotations

import time

import pytest
import trio

from raftmq.client import (
    BlockingProducer,
    BlockingPullConsumer,
    MessageQueue,
    PullConsumer,
    PullStatus,
    SendError,
)
from tests.helpers import client_group

MQ = MessageQueue("T", "broker-a", 0)


async def test_blocking_producer_and_pull_consumer(nursery, tmp_path):
    namesrv = (await client_group(nursery, tmp_path)).namesrv_addr

    def script() -> list[bytes]:
        with BlockingProducer(namesrv, send_timeout_s=0.5) as producer:
            producer.send("T", b"one", queue=MQ)
            producer.send_batch("T", [b"two", b"three"])
            with pytest.raises(SendError):
                producer.send("missing", b"x")
        with BlockingPullConsumer(namesrv, "CG") as consumer:
            bodies = []
            for mq in consumer.fetch_queues("T"):
                result = consumer.pull(mq, 0)
                assert result.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
                bodies += [m.body for m in result.messages]
            consumer.update_offset(MQ, 1)
            assert consumer.query_offset(MQ) == 1
            return sorted(bodies)

    with trio.fail_after(10):
        assert await trio.to_thread.run_sync(script) == [b"one", b"three", b"two"]


def test_a_client_that_cannot_start_raises_on_enter():
    with pytest.raises(ValueError, match="no name server"), BlockingProducer(""):
        pass


async def test_iterate_runs_an_async_generator_in_the_loop_ahead_of_the_caller(nursery, tmp_path):
    """Items cross one at a time, at most `ahead` made before they are taken; what the
    generator raises is raised to the caller; leaving early cancels and closes it."""
    namesrv = (await client_group(nursery, tmp_path)).namesrv_addr
    made, closed = [], []

    async def counting(consumer, count: int, fail: bool):
        assert isinstance(consumer, PullConsumer)
        try:
            for n in range(count):
                made.append(n)
                yield n
            if fail:
                raise RuntimeError("no more")
        finally:
            closed.append(count)

    def script() -> None:
        with BlockingPullConsumer(namesrv, "CG") as consumer:
            assert list(consumer.iterate(counting, 5, False)) == [0, 1, 2, 3, 4]
            with pytest.raises(RuntimeError, match="no more"):
                list(consumer.iterate(counting, 2, True))
            made.clear()
            items = consumer.iterate(counting, 1000, False, ahead=2)
            assert next(items) == 0
            time.sleep(0.2)  # the loop runs ahead meanwhile, but only so far
            assert len(made) <= 4  # taken 1, 2 in the channel, 1 waiting to be sent
            items.close()
        assert closed == [5, 2, 1000]

    with trio.fail_after(10):
        await trio.to_thread.run_sync(script)
