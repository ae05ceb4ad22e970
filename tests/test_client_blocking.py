"""The blocking facades, called from a worker thread while the test's loop serves the
name server and an in-process broker member."""

from __future__ import annotations

import pytest
import trio

from raftmq.client import (
    BlockingProducer,
    BlockingPullConsumer,
    MessageQueue,
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
