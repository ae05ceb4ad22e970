"""The pull consumer against a real name server and in-process broker members (through
relays that record what it sends, where a test looks): the pull status table, tag
filtering, long polling, offsets, and reads from a replica when the master is gone."""

from __future__ import annotations

import time

import pytest
import trio

from raftmq.client import MessageQueue, MQBrokerError, Producer, PullConsumer, PullStatus
from raftmq.remoting import RequestCode, ResponseCode
from tests.helpers import client_group, relayed_group, start_namesrv

MQ = MessageQueue("T", "broker-a", 1)


async def test_pull_status_table_tags_and_offsets(nursery, tmp_path):
    namesrv = (await client_group(nursery, tmp_path)).namesrv_addr
    big = bytes(range(256)) * 40
    with trio.fail_after(10):
        async with Producer(namesrv) as producer, PullConsumer(namesrv, "CG") as consumer:
            for i in range(5):
                await producer.send("T", b"%d" % i, tags="A" if i % 2 == 0 else "B", queue=MQ)
            await producer.send("T", big, tags="A", queue=MQ)
            assert await consumer.fetch_queues("T") == [
                MessageQueue("T", "broker-a", i) for i in range(4)
            ]

            first = await consumer.pull(MQ, 0, max_nums=3)
            assert first.status is PullStatus.FOUND
            assert [m.body for m in first.messages] == [b"0", b"1", b"2"]
            assert [m.queue_offset for m in first.messages] == [0, 1, 2]
            assert (first.next_begin_offset, first.min_offset, first.max_offset) == (3, 0, 6)
            rest = await consumer.pull(MQ, 3)
            assert [m.body for m in rest.messages] == [b"3", b"4", big]  # inflated
            assert rest.messages[2].sysflag == 0

            tagged = await consumer.pull(MQ, 0, subscription="A")
            assert [m.body for m in tagged.messages] == [b"0", b"2", b"4", big]
            assert tagged.next_begin_offset == 6

            end = await consumer.pull(MQ, 6)
            assert (end.status, end.messages, end.next_begin_offset) == (
                PullStatus.NO_NEW_MSG,
                [],
                6,
            )
            beyond = await consumer.pull(MQ, 9)
            assert (beyond.status, beyond.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, 6)

            assert (await consumer.min_offset(MQ), await consumer.max_offset(MQ)) == (0, 6)
            assert await consumer.search_offset(MQ, 0) == 0
            assert await consumer.search_offset(MQ, int(time.time() * 1000) + 60_000) == 6
            assert await consumer.query_offset(MQ) is None
            await consumer.update_offset(MQ, 4)
            assert await consumer.query_offset(MQ) == 4


async def test_long_poll_returns_when_a_message_arrives(nursery, tmp_path):
    namesrv = (await client_group(nursery, tmp_path)).namesrv_addr
    with trio.fail_after(10):
        async with Producer(namesrv) as producer, PullConsumer(namesrv, "CG") as consumer:
            results = []

            async def wait_for_message():
                results.append(await consumer.pull(MQ, 0, long_poll_s=8))

            async with trio.open_nursery() as inner:
                inner.start_soon(wait_for_message)
                await producer.send("T", b"late", queue=MQ)
            started = trio.current_time()
            assert (await consumer.pull(MQ, 1, long_poll_s=0.2)).status is PullStatus.NO_NEW_MSG
            assert trio.current_time() - started >= 0.2
    assert [m.body for m in results[0].messages] == [b"late"]


async def test_reads_go_to_a_replica_when_the_master_is_gone(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (master, slave) = await relayed_group(nursery, tmp_path, namesrv, members=2)
    with trio.fail_after(10):
        async with (
            Producer(namesrv) as producer,
            PullConsumer(namesrv, "CG", rpc_timeout_s=0.5) as consumer,
        ):
            await producer.send("T", b"kept", queue=MQ)
            await consumer.update_offset(MQ, 1)
            await master.stop()
            result = await consumer.pull(MQ, 0)
            assert [m.body for m in result.messages] == [b"kept"]
            assert await consumer.max_offset(MQ) == 1
            assert await consumer.query_offset(MQ) == 1
            # Writes need a master: none in the route now.
            with pytest.raises(MQBrokerError, match="no master") as caught:
                await consumer.update_offset(MQ, 1)
            assert caught.value.code == 14
    assert any(r.code == 11 for r in slave.requests)


async def test_offset_commit_follows_a_new_master(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (old, new) = await relayed_group(nursery, tmp_path, namesrv, members=2)

    async def deposed(request, connection):  # answers "not master" until the route moves on
        return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "not master: slave")

    with trio.fail_after(10):
        async with PullConsumer(namesrv, "CG") as consumer:
            await consumer.update_offset(MQ, 1)
            old.answer(RequestCode.UPDATE_CONSUMER_OFFSET, deposed)

            async def elect():
                await trio.sleep(0.3)
                await new.register(namesrv, 0, {"T": 4})

            nursery.start_soon(elect)
            await consumer.update_offset(MQ, 2)
            assert await consumer.query_offset(MQ) == 2
    assert any(r.code == RequestCode.UPDATE_CONSUMER_OFFSET for r in new.requests)
