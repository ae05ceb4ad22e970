"""A broken invariant (an AssertionError) inside one of the broker's loops stops the
broker, with exit status 6 from `mqbroker`: the delayed-delivery and consumer-offset
loops retried every exception at their next round, so a bug kept the broker running,
logging the same warning for ever, on state it could no longer trust."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio
from raftmq.broker import cli

from tests.helpers import group, one_node_broker_conf

# mqbroker with the delivery of delayed messages broken by a failing invariant
_BROKEN_SCHEDULE = """
import sys
from raftmq.broker import cli
from raftmq.broker.schedule import ScheduleService

async def deliver_due(self, level):
    raise AssertionError(f"injected: level {level}'s queue is behind its progress")

ScheduleService._deliver_due = deliver_due
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.processes
def test_a_broken_invariant_in_delayed_delivery_stops_mqbroker_with_status_6(tmp_path):
    conf, _root = one_node_broker_conf(tmp_path)
    try:
        stopped = subprocess.run(
            [sys.executable, "-c", _BROKEN_SCHEDULE, "-c", str(conf)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mqbroker ran on past a broken invariant: {exc.stderr[-600:]!r}")
    assert stopped.returncode == cli.EXIT_INVARIANT, stopped.stderr
    last = stopped.stderr.splitlines()[-1]
    assert last == "mqbroker: broken invariant: injected: level 1's queue is behind its progress"
    assert "Traceback" in stopped.stderr  # a bug: where it broke


async def test_a_broken_invariant_in_the_offset_commit_loop_stops_the_broker(tmp_path, monkeypatch):
    async def write(op: str, **fields) -> None:
        raise AssertionError(f"injected: {op} record out of order")

    with pytest.raises(BaseExceptionGroup) as stopped:
        async with trio.open_nursery() as nursery:
            g = await group(nursery, tmp_path, nodes=1)
            master = g.master()
            monkeypatch.setattr(master.offsets.meta, "write", write)
            master.offsets.commit("CG", "T", 0, 5)
            with trio.fail_after(5):  # it retried every 0.2 s for ever
                await trio.sleep_forever()
    assert stopped.value.subgroup(AssertionError) is not None, stopped.value
    assert stopped.value.subgroup(trio.TooSlowError) is None, stopped.value
