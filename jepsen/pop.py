"""The POP workload (`--workload pop`) and its checks.

Producers are the queue workload's. POPPERS consumers pop instead of pulling (RocketMQ
5's POP_MESSAGE, one group, every queue of the topic and the group's retry topic) from
the master the route names, with a short invisible time. While the producers run, each
popped message is left alone with probability ABANDON_SHARE, so the master (the old one
or, after a failover, the new) must redeliver it through revive once its invisible time
is over; one in ten of the others first has its invisible time extended
(CHANGE_MESSAGE_INVISIBLETIME, a `change` op). The rest of a pop's batch is acknowledged
at once (ACK_MESSAGE for one, BATCH_ACK_MESSAGE for more). Once the faults have healed
the consumers acknowledge everything until every acknowledged send has been
acknowledged by a consumer.

The history records `pop` ops (`ok` with [value, visible_at_ms, reconsume_times] per
message; `info` when the answer was lost: the messages it made invisible come back),
`change` ops (`ok` with the new handle's visible_at_ms) and `ack` ops (invoked with
[value, invisible until] per message, until when it has been invisible since its pop;
`ok` with `at_ms`, the wall clock when the broker's answer arrived; `info` when it did
not). An ack answered more than ACK_MARGIN_MS before a message's invisible-until
committed while the message was still invisible: from then on no pop may return that
message again (`popped_after_ack`). Every acknowledged send must reach a consumer
(`undelivered`) and be acknowledged by one (`unacked`). The log checks that do not read
pulls (the final log, replicas, offsets of acknowledged sends) apply as in the queue
workload.
"""

from __future__ import annotations

import time
from collections import Counter

import trio

from jepsen.checker import (
    EXAMPLES,
    PULL_CHECKS,
    Facts,
    checks_without,
    info,
    send_example,
    verdict,
)
from jepsen.history import Pair, pairs
from jepsen.workload import REQUEST_ERRORS, SEND_TIMEOUT_S, TOPIC, Workload, message_value
from raftmq.client import pop as pop_client
from raftmq.client.instance import ClientInstance

GROUP = "jepsen-pop"
INVISIBLE_MS = 3000  # short, so revive redelivers abandoned messages within the run
ACK_MARGIN_MS = 200  # an ack answered this long before its handle's expiry retired the message
ABANDON_SHARE = 0.2  # popped messages left unacknowledged while the faults run
CHANGE_SHARE = 0.1  # popped messages whose invisibility is extended before their ack
POP_BATCH = 16
POPPERS = 4
POLL_MS = 500


class PopWorkload(Workload):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: set[str] = set()  # values whose send ended ok
        self.acked: set[str] = set()  # values a consumer's ack ended ok or info

    async def _perform(self, client: ClientInstance, op: dict) -> tuple[str, dict]:
        outcome, fields = await super()._perform(client, op)
        if outcome == "ok":
            self.sent.add(op["value"])
        return outcome, fields

    async def consume(self) -> None:
        client = ClientInstance(self.namesrv_addr, rpc_timeout_s=SEND_TIMEOUT_S)
        async with client, trio.open_nursery() as nursery:
            for _ in range(POPPERS):
                nursery.start_soon(self._popper, client)

    async def _popper(self, client: ClientInstance) -> None:
        process = self.processes.new()
        while True:
            if self.drain_to is not None and self.sent <= self.acked:
                self.drained.set()
            connection, master, _why = await self._connect(client)
            if connection is None:
                client.routes.invalidate(TOPIC)
                await trio.sleep(0.1)
                continue
            node = self.node_of.get(master, master)
            self.history.invoke(process, "pop", node=node)
            try:
                result = await pop_client.pop(
                    client.pool, master, self.broker_name, GROUP, TOPIC,
                    max_nums=POP_BATCH, invisible_ms=INVISIBLE_MS, poll_ms=POLL_MS,
                )  # fmt: skip
            except REQUEST_ERRORS as exc:
                self.history.complete("info", process, "pop", node=node, error=str(exc))
                process = self.processes.new()
                client.routes.invalidate(TOPIC)
                await trio.sleep(0.1)
                continue
            popped = [
                [message_value(p.message.body), p.handle.visible_at_ms, p.reconsume_times]
                for p in result.messages
            ]
            self.history.complete("ok", process, "pop", node=node, value=popped)
            process = await self._settle_batch(client, process, master, result.messages)

    async def _settle_batch(self, client, process: int, master: str, messages) -> int:
        """Abandon, change and acknowledge a pop's messages; returns the process."""
        acks = []  # (value, handle, until when it has been invisible since its pop)
        for message in messages:
            value = message_value(message.message.body)
            if self.producing and self.rng.random() < ABANDON_SHARE:
                continue
            handle = message.handle
            invisible_until_ms = handle.visible_at_ms
            if self.rng.random() < CHANGE_SHARE:
                process, changed = await self._change(client, process, master, handle, value)
                if changed is None:
                    break  # the rest of the batch comes back after its invisible time
                if int(time.time() * 1000) < handle.visible_at_ms - ACK_MARGIN_MS:
                    invisible_until_ms = changed.visible_at_ms  # invisible all along
                handle = changed
            acks.append((value, handle, invisible_until_ms))
        if acks:
            process = await self._ack(client, process, master, acks)
        return process

    async def _change(self, client, process: int, master: str, handle, value: str):
        """(process, the new handle or None when the broker did not answer) after
        making the message of `handle` invisible for INVISIBLE_MS from now."""
        node = self.node_of.get(master, master)
        self.history.invoke(process, "change", value=value, node=node)
        try:
            handle = await pop_client.change_invisible_time(
                client.pool, master, GROUP, TOPIC, handle, INVISIBLE_MS
            )
        except REQUEST_ERRORS as exc:
            self.history.complete("info", process, "change", value=value, error=str(exc))
            return self.processes.new(), None
        visible_at_ms = handle.visible_at_ms
        self.history.complete("ok", process, "change", value=value, visible_at_ms=visible_at_ms)
        return process, handle

    async def _ack(self, client, process: int, master: str, acks: list) -> int:
        """Acknowledge `acks` ((value, handle, invisible until) each), one ACK_MESSAGE for
        one message and a BATCH_ACK_MESSAGE for more; returns the process. The `ack` op's
        value is [value, invisible until] per message: the handle's own expiry, or the
        popped one's when a change of invisibility was answered too late to be sure the
        message never became visible in between."""
        node = self.node_of.get(master, master)
        values = [[value, until] for value, _, until in acks]
        handles = [handle for _, handle, _ in acks]
        self.history.invoke(process, "ack", value=values, node=node)
        try:
            if len(handles) == 1:
                await pop_client.ack(client.pool, master, GROUP, TOPIC, handles[0])
            else:
                await pop_client.batch_ack(
                    client.pool, master, self.broker_name, GROUP, TOPIC, handles
                )
        except REQUEST_ERRORS as exc:
            self.history.complete("info", process, "ack", value=values, error=str(exc))
            self.acked.update(value for value, _ in values)  # then they never come back
            return self.processes.new()
        at_ms = int(time.time() * 1000)
        self.history.complete("ok", process, "ack", value=values, at_ms=at_ms)
        self.acked.update(value for value, _ in values)
        return process


def _pops(facts: Facts) -> list[Pair]:
    return [pair for pair in pairs(facts.history) if pair.f == "pop" and pair.ok]


def _acks(facts: Facts) -> list[Pair]:
    return [pair for pair in pairs(facts.history) if pair.f == "ack"]


def check_undelivered(facts: Facts) -> dict:
    """Acknowledged sends no pop returned: with every message acknowledged by the
    consumers at the end, each must have reached one."""
    popped = {value for pair in _pops(facts) for value, _, _ in pair.completion["value"]}
    missing = [pair for value, pair in facts.acked.items() if value not in popped]
    return verdict([send_example(pair) for pair in missing])


def check_unacked(facts: Facts) -> dict:
    """Acknowledged sends no consumer acknowledged (an ack ending ok or info): an
    abandoned message that revive never redelivered, or a drain that did not finish."""
    acked = {
        value
        for pair in _acks(facts)
        if pair.type in ("ok", "info")
        for value, _ in pair.invoke["value"]
    }
    missing = [pair for value, pair in facts.acked.items() if value not in acked]
    return verdict([send_example(pair) for pair in missing])


def check_popped_after_ack(facts: Facts) -> dict:
    """A pop invoked after an ack committed returned the acked message again. An ack
    counts as committed for a message when its answer arrived (`at_ms`) more than
    ACK_MARGIN_MS before the message's invisible-until: the message was still
    invisible, so revive must not have redelivered it, and no later master may."""
    retired: dict[str, float] = {}  # value -> when its ack's answer was recorded
    for pair in _acks(facts):
        for value, invisible_until_ms in pair.invoke["value"] if pair.ok else ():
            if pair.completion["at_ms"] < invisible_until_ms - ACK_MARGIN_MS:
                retired[value] = min(retired.get(value, pair.end), pair.end)
    problems = [
        {"value": value, "acked": retired[value], "popped": pair.start, "process": pair.process}
        for pair in _pops(facts)
        for value, _, _ in pair.completion["value"]
        if value in retired and pair.start > retired[value]
    ]
    return verdict(problems)


def check_pop_redeliveries(facts: Facts) -> dict:
    """Messages popped more than once (informational): abandoned ones coming back after
    their invisible time, and those whose pop's answer or ack was lost to a fault."""
    deliveries = Counter(value for pair in _pops(facts) for value, _, _ in pair.completion["value"])
    again = [{"value": v, "deliveries": n} for v, n in deliveries.items() if n > 1]
    acks = Counter(pair.type for pair in _acks(facts))
    return info(len(again), again[:EXAMPLES], popped=len(deliveries), acks=dict(acks))


POP_CHECKS = {
    **checks_without(*PULL_CHECKS),
    "undelivered": check_undelivered,
    "unacked": check_unacked,
    "popped_after_ack": check_popped_after_ack,
    "pop_redeliveries": check_pop_redeliveries,
}
