"""Latency-based broker avoidance (RocketMQ's sendLatencyFaultEnable): the tables, the
clock, a new master ending an avoidance, and a producer against fake broker groups, one
of which answers slowly (one that refuses: test_client_producer)."""

from __future__ import annotations

import pytest
import trio

from raftmq.client import Producer
from raftmq.client.latency_fault import LatencyFaultTolerance
from raftmq.remoting import RequestCode
from tests.helpers import relayed_group, start_namesrv

TOPIC = "T"


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.mark.parametrize(
    ("latency_ms", "avoided_ms"),
    [(0, 0), (49, 0), (50, 0), (549, 0), (550, 30000), (999, 30000), (1000, 60000),
     (2000, 120000), (3000, 180000), (14999, 180000), (15000, 600000), (90000, 600000)],
)  # fmt: skip
def test_rocketmqs_tables_map_latency_to_an_avoidance(latency_ms, avoided_ms):
    assert LatencyFaultTolerance().not_available_ms(latency_ms) == avoided_ms


def test_a_failure_avoids_the_group_ten_minutes_on_that_master_only():
    clock = Clock()
    fault = LatencyFaultTolerance(clock=clock)
    assert fault.available("a", "m1:1")  # never measured
    fault.update("a", "m1:1", 3.0, failed=False)
    assert fault.available("a", "m1:1")
    fault.update("a", "m1:1", 3.0, failed=True)
    assert not fault.available("a", "m1:1")
    clock.now_s += 599.9
    assert not fault.available("a", "m1:1")
    assert fault.available("a", "m2:1"), "a new master in the route is not the one measured"
    clock.now_s += 0.1
    assert fault.available("a", "m1:1")


def test_the_least_bad_group_is_available_soonest_then_fastest():
    clock = Clock()
    fault = LatencyFaultTolerance(clock=clock)
    fault.update("a", "a:1", 0, failed=True)  # 600 s
    fault.update("b", "b:1", 600, failed=False)  # 30 s
    fault.update("c", "c:1", 700, failed=False)  # 30 s, slower
    assert fault.least_bad(["a", "b", "c"]) == "b"
    assert fault.least_bad(["a"]) == "a"
    assert fault.least_bad(["d"]) is None


def test_tables_are_checked():
    with pytest.raises(ValueError, match="differ in length"):
        LatencyFaultTolerance((50, 100), (0,))
    with pytest.raises(ValueError, match="increasing"):
        LatencyFaultTolerance((100, 50), (0, 0))
    custom = LatencyFaultTolerance((0, 200), (10, 2000))
    assert (custom.not_available_ms(10), custom.not_available_ms(250)) == (10, 2000)


async def test_a_slow_group_is_avoided_and_the_default_is_off(nursery, tmp_path):
    namesrv = await start_namesrv(nursery)
    _, (slow,) = await relayed_group(nursery, tmp_path, namesrv, "broker-a")
    await relayed_group(nursery, tmp_path, namesrv, "broker-b")

    async def slowly(request, connection):
        await trio.sleep(0.6)  # 550 ms or more: avoided for 30 s
        return await slow.forward(request, connection)

    slow.answer(RequestCode.SEND_MESSAGE_V2, slowly)
    with trio.fail_after(20):
        async with Producer(namesrv, send_latency_fault_enable=True) as producer:
            brokers = [(await producer.send(TOPIC, b"x")).message_queue.broker_name
                       for _ in range(12)]  # fmt: skip
        assert brokers.count("broker-a") <= 1, brokers
        async with Producer(namesrv) as producer:  # RocketMQ's default: off
            brokers = [(await producer.send(TOPIC, b"y")).message_queue.broker_name
                       for _ in range(8)]  # fmt: skip
        assert brokers.count("broker-a") == 4, brokers
