"""Stores both ways with Apache RocketMQ's own 4.9 Java broker.

The migration off Java brokers is: stop them, start raftmq on the same disks. So
raftmq must open a store RocketMQ 4.9's BrokerStartup wrote (bench/java_brokers.py)
and serve every message where the Java broker put it, at the same queue offsets,
commit-log offsets and msgIds, with its tags, keys and properties, and then append
after it; and the way back, RocketMQ's broker opening what raftmq wrote: raftmq
leaves RocketMQ's tables (config/topics.json and its kin) at a clean stop, and its
ConsumeQueue files, which RocketMQ refuses unless each is its full preallocated size,
are removed first (RocketMQ's broker rebuilds its queues from the CommitLog at start).
In DLedger mode the way back goes through `mqbroker --convertForJava` on each stopped
member: a raftmq leader's NOOP entries (magic 2, empty body) are not entries to the
DLedger 0.3.1.2 RocketMQ embeds, whose recovery ends the log at the first one, so the
conversion folds them into the messages around them (docs/replica.md).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from bench.java_brokers import JavaMembers, MixedClassicGroup, MixedDLedgerGroup
from raftmq.client import Producer
from raftmq.client.producer import SendStatus
from tests.helpers import pull_all

pytestmark = [pytest.mark.processes, pytest.mark.requires("rocketmq-java"), pytest.mark.untimed]

FILE_BYTES = 1 << 20  # small CommitLog files (mappedFileSizeCommitLog): several fill up
QUEUES = 2


MQBROKER = str(Path(sys.executable).parent / "mqbroker")
ABSORBED = re.compile(r"(\d+) entries that were not messages absorbed")
MOVED = re.compile(r"moved: .* msgId ([0-9A-F]+) is now ([0-9A-F]+)")
FIRST = re.compile(r"converted: \d+ messages from index (\d+)")

SENDERS = 8  # sends in flight: a synchronous DLedger group commits each in milliseconds


async def send_varied(producer: Producer, topic: str, count: int, start: int = 0) -> list:
    """`count` messages with tags, keys and a user property each, every result SEND_OK."""
    results = []

    async def sender(first: int) -> None:
        for n in range(first, start + count, SENDERS):
            results.append(
                await producer.send(
                    topic,
                    f"{n:06d}".encode().ljust(200 + n % 300, b"."),
                    tags=f"Tag{n % 3}",
                    keys=[f"key-{n}", f"order-{n % 7}"],
                    properties={"n": str(n)},
                )
            )

    async with trio.open_nursery() as nursery:
        for first in range(start, start + SENDERS):
            nursery.start_soon(sender, first)
    assert len(results) == count
    assert {r.status for r in results} == {SendStatus.SEND_OK}, results[-1]
    return results


async def pulled(
    group: JavaMembers, topic: str, node: str = "n0", first_offsets=(0,) * QUEUES
) -> list:
    messages = []
    for queue_id, first in zip(range(QUEUES), first_offsets, strict=True):
        address = group.broker_addrs[node]
        messages += await pull_all(address, topic, queue_id, group.broker_name, first)
    return messages


def assert_served(messages: list, results: list, renamed: dict[str, str]) -> None:
    """Every sent message, once, at the queue and offsets its send result gave (its
    offset msgId the one in `renamed` if there), with its tags, keys and property."""
    by_id = {m.msg_id: m for m in messages}
    assert len(by_id) == len(messages) == len(results)
    for result in results:
        message = by_id[renamed.get(result.offset_msg_id, result.offset_msg_id)]
        assert message.queue_id == result.message_queue.queue_id
        assert message.queue_offset == result.queue_offset
        assert message.properties["UNIQ_KEY"] == result.msg_id
        number = int(message.body[:6])
        assert message.properties["n"] == str(number)
        assert message.properties["TAGS"] == f"Tag{number % 3}"
        assert message.properties["KEYS"] == f"key-{number} order-{number % 7}"
    assert len({int(r.offset_msg_id[16:], 16) for r in results}) == len(results)


async def served_across(
    group: JavaMembers, switch: Callable[[], Awaitable[dict[str, str] | None]]
) -> None:
    """Messages sent to `group` as it is, then `switch` (the same stores, the other
    broker; it returns the offset msgIds it changed, old to new, if any): every message
    served by every running member at the offsets and msgIds it was sent at, and new
    sends after them."""
    await group.create_topic("Moved", queues=QUEUES)
    # a Java slave copies its master's topics every 10 s, from the master address its
    # last registration brought back: one made before the master registered has none,
    # and the next is 30 s later
    with trio.fail_after(60):
        for node in group.procs.keys() & set(group.ids):
            while "Moved" not in await group.topics(node):
                await trio.sleep(0.5)
    async with Producer(group.namesrv_addr, send_timeout_s=20) as producer:
        before = await send_varied(producer, "Moved", 2000)
    renamed = await switch() or {}
    master = await group.wait_master(timeout_s=60)
    assert_served(await pulled(group, "Moved", master), before, renamed)
    async with Producer(group.namesrv_addr, send_timeout_s=20) as producer:
        after = await send_varied(producer, "Moved", 500, start=2000)
    if isinstance(group, MixedDLedgerGroup):
        await group.wait_caught_up()
    for node in group.ids if isinstance(group, MixedDLedgerGroup) else [master]:
        assert_served(await pulled(group, "Moved", node), before + after, renamed)


def classic(tmp_path, java: set[str]) -> MixedClassicGroup:
    conf = {"mappedFileSizeCommitLog": str(FILE_BYTES)}
    return MixedClassicGroup(tmp_path, slaves=0, java=java, extra_conf=conf)


async def test_raftmq_serves_a_classic_store_java_wrote(tmp_path):
    async with (group := classic(tmp_path, java={"n0"})):
        await served_across(group, lambda: group.reboot_as("n0", java=False))


async def test_java_serves_a_classic_store_raftmq_wrote(tmp_path):
    async def back_to_java() -> None:
        group.kill("n0", signal.SIGTERM)
        shutil.rmtree(group.store_dir("n0") / "consumequeue")
        await group.reboot_as("n0", java=True)

    async with (group := classic(tmp_path, java=set())):
        await served_across(group, back_to_java)


async def test_raftmq_serves_a_dledger_store_java_wrote(tmp_path):
    """Three Java brokers in DLedger mode write; three raftmq brokers start on their
    stores at once (entries with DLedger's zero CRC fields) and serve the same."""

    async def to_raftmq() -> None:
        group.stop()
        group.java.clear()
        await group.start_namesrv()
        await group.boot(*group.ids)

    async with (group := MixedDLedgerGroup(tmp_path, java={"n0", "n1", "n2"})):
        await served_across(group, to_raftmq)


BEGINS_AT = re.compile(r"this member's begins at (\d+)")


def convert_for_java(group: MixedDLedgerGroup) -> tuple[list[int], list[str]]:
    """`mqbroker --convertForJava` on every stopped member as an operator runs it: once
    without an anchor, which writes nothing and says where each member's log begins,
    then each with the largest of those; the beginnings, and each conversion's output."""
    commands = [
        [MQBROKER, "-c", str(group.conf_path(node)), "--convertForJava"] for node in group.ids
    ]
    begins = []
    for command in commands:
        run = subprocess.run(command, capture_output=True, text=True, check=False)
        assert run.returncode == 2, run.stdout + run.stderr
        begins.append(int(BEGINS_AT.search(run.stderr).group(1)))
    anchor = str(max(begins))
    outputs = []
    for command in commands:
        run = subprocess.run([*command, "--convertAnchorIndex", anchor], capture_output=True,
                             text=True, check=False)  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert int(FIRST.search(run.stdout).group(1)) <= int(anchor)
        outputs.append(run.stdout)
    return begins, outputs


async def test_java_serves_a_dledger_store_raftmq_wrote_once_converted(tmp_path):
    """Three raftmq brokers write; `mqbroker --convertForJava` rewrites each stopped
    member's store (every log begins with its first leader's NOOP, which DLedger
    0.3.1.2 cannot read, and a master killed before the stop leaves another after
    messages); three Java brokers in DLedger mode start on the stores and
    serve the same, every message at its queue offset and commit-log offset but those
    the conversion says it moved, and take new sends after them."""

    async def to_java() -> dict[str, str]:
        # a second leader, whose NOOP follows messages (the first leader's is the log's
        # first entry): the conversion pads the message before it
        old_master = await group.wait_master()
        group.kill(old_master)
        await group.wait_master(not_node=old_master)
        await group.restart(old_master)
        await group.wait_caught_up()
        group.stop()
        renamed = {}
        begins, outputs = convert_for_java(group)
        assert begins == [0, 0, 0]
        for stdout in outputs:
            lines = stdout.splitlines()
            assert lines[-1].startswith("converted: "), stdout
            # each log's first entry is a NOOP, and the message after it moves back
            assert int(ABSORBED.search(lines[-1]).group(1)) >= 2, lines[-1]
            for line in lines[:-1]:
                old, new = MOVED.fullmatch(line).groups()
                assert renamed.setdefault(old, new) == new, "the members agree"
        group.java.update(group.ids)
        await group.start_namesrv()
        await group.boot(*group.ids)
        return renamed

    async with (group := MixedDLedgerGroup(tmp_path, java=set())):
        await served_across(group, to_java)


TRIMMED = {"mappedFileSizeCommitLog": str(FILE_BYTES)}  # 1 MiB data files: several fill up


class OneMemberTrims(MixedDLedgerGroup):
    """n0's retention deletes a data file a second after its last write, looking twice a
    second; n1 and n2 keep theirs three days (RocketMQ's default), so their logs still
    begin where the group's did."""

    def _broker_conf(self, node: str) -> dict[str, str]:
        conf = super()._broker_conf(node)
        if node == "n0":
            conf.update(fileReservedHours="0.0003", cleanResourceInterval="500")
        return conf


def commitlog_offset(msg_id: str) -> int:
    return int(msg_id[16:], 16)


async def test_java_serves_dledger_stores_trimmed_at_different_places_once_converted(tmp_path):
    """Three raftmq brokers write 1 MiB data files; one member's retention deletes its
    first ones while they run, the others' keep everything. Once stopped,
    `--convertForJava` says where each log begins and converts each from the same
    anchor, the largest beginning, so the members number alike though they hold
    different spans; three Java brokers in DLedger mode serve what each log holds, at
    the offsets and msgIds it was sent at, and take new sends after it."""
    async with (group := OneMemberTrims(tmp_path, java=set(), extra_conf=TRIMMED)):
        await group.create_topic("Kept", queues=QUEUES)
        async with Producer(group.namesrv_addr, send_timeout_s=20) as producer:
            results = []
            for start in range(0, 4000, 1000):
                results += await send_varied(producer, "Kept", 1000, start=start)
        data_dirs = {node: group.store_dir(node) / f"dledger-{node}" / "data" for node in group.ids}
        with trio.fail_after(60):  # the ConsumeQueues' checkpoint, then retention
            while (data_dirs["n0"] / f"{0:020d}").exists():
                await trio.sleep(0.5)
        await group.wait_caught_up()
        group.stop()
        first_file = {node: min(int(p.name) for p in d.iterdir()) for node, d in data_dirs.items()}
        assert first_file["n0"] > 0 and first_file["n1"] == first_file["n2"] == 0
        begins, outputs = convert_for_java(group)
        assert begins[0] > 0 and begins[1:] == [0, 0]
        renamed = {}  # the untrimmed logs begin with a NOOP: their first message moves
        for stdout in outputs:
            for line in stdout.splitlines()[:-1]:
                old, new = MOVED.fullmatch(line).groups()
                assert renamed.setdefault(old, new) == new, "the members agree"
        group.java.update(group.ids)
        await group.start_namesrv()
        await group.boot(*group.ids)
        master = await group.wait_master(timeout_s=60)

        def held(node: str) -> list:
            """What `node`'s log holds: the messages from its first data file on."""
            return [
                r
                for r in results
                if commitlog_offset(renamed.get(r.offset_msg_id, r.offset_msg_id))
                >= first_file[node]
            ]

        # the master serves its log from each queue's head (a trimmed one says where
        # that is), every message to each queue's end, none lost between
        served = await pulled(group, "Kept", master)
        assert 0 < len(held("n0")) < len(results)
        assert_served(served, held(master), renamed)
        for queue_id in range(QUEUES):
            offsets = [m.queue_offset for m in served if m.queue_id == queue_id]
            sent = [r.queue_offset for r in results if r.message_queue.queue_id == queue_id]
            assert offsets == list(range(offsets[0], max(sent) + 1)), queue_id
        async with Producer(group.namesrv_addr, send_timeout_s=20) as producer:
            after = await send_varied(producer, "Kept", 500, start=4000)
        await group.wait_caught_up()
        for node in group.ids:
            # from its own first file on (a slave, pulled below a queue's head, does
            # not say where it begins: the pull starts there)
            own = held(node)
            firsts = [
                min(r.queue_offset for r in own if r.message_queue.queue_id == q)
                for q in range(QUEUES)
            ]
            messages = await pulled(group, "Kept", node, firsts)
            assert_served(messages, [*own, *after], renamed)
            if first_file[node]:  # the first message of its first file comes first
                first = min(commitlog_offset(m.msg_id) for m in messages)
                assert first_file[node] <= first < first_file[node] + 1024, (node, first)
