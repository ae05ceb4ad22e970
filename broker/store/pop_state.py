"""POP consumption's replicated state: what each group popped, until when, and what
it acknowledged, applied from META_TOPIC records on every replica in log order.

Apache RocketMQ writes a checkpoint (CK) and ack records as timer messages to
`rmq_sys_REVIVE_LOG_<cluster>`, keeps FIFO order info in `consumerOrderInfo.json`
(which slaves do not copy), and finds what to redeliver by scanning the revive
queues. Here a pop, an ack, an invisibility change and a redelivery are each one
metadata record, and the state they build holds only what is in flight:

- `offsets`: per (group, topic, queueId) the next offset a pop reads;
- `inflight`: per queue, offset -> (popTime, invisibleTime, reviveQid) of each popped
  message not yet acknowledged or redelivered; an ack removes it;
- `orders`: per FIFO queue, the one batch in flight (its offsets, consumed counts,
  next-visible times, acks, attemptId); the last ack removes it.

So memory is proportional to the messages in flight plus one offset per queue, and a
new master (every replica applied the same records) redelivers exactly what was not
acknowledged, FIFO batches included, where Apache loses the FIFO block state at a
failover and redelivers the batch at once.

Records (`op`, then fields), all keyed by group `c`, topic `t`, queueId `q`:
`popCk` {cks: [{c, t, q, pt, it, rq, o: [offsets], n: next pop offset, order,
a: attemptId}]} (one pop's checkpoints, one per queue it read);
`popAck` {e: [[c, t, q, offset, pt]]}; `popChange` {c, t, q, o, pt, npt, it};
`popRevive` {e: [[c, t, q, offset, pt]], dlq: count of those dead-lettered}.
A record naming a popTime that is no longer the entry's (a stale handle) changes
nothing, as Apache's ack of a checkpoint that was already revived does nothing.
"""

from __future__ import annotations

import math

import attrs

Key = tuple[str, str, int]  # group, topic (the queue's: origin or retry), queueId
POP_OPS = ("popCk", "popAck", "popChange", "popRevive")


@attrs.define
class InFlight:
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int

    @property
    def visible_at_ms(self) -> int:
        return self.pop_time_ms + self.invisible_ms


@attrs.define
class OrderBatch:
    """The FIFO batch of one queue in flight (Apache's OrderInfo)."""

    offsets: list[int]
    pop_time_ms: int
    attempt_id: str
    counts: dict[int, int]  # offset -> deliveries before the latest
    visible_at_ms: dict[int, int]  # offset -> when it may be popped again
    acked: set[int] = attrs.field(factory=set)

    def blocks(self, now_ms: int) -> bool:
        """checkBlock: an un-acked message of the batch is still invisible."""
        return any(self.visible_at_ms[o] > now_ms for o in self.offsets if o not in self.acked)

    def pending(self) -> list[int]:
        return [o for o in self.offsets if o not in self.acked]


class PopState:
    def __init__(self) -> None:
        self.offsets: dict[Key, int] = {}
        self.inflight: dict[Key, dict[int, InFlight]] = {}
        self.orders: dict[Key, OrderBatch] = {}
        self.revived = 0  # messages redelivered through a retry topic (applied here)
        self.dead_lettered = 0
        # No non-order entry becomes visible before this (a lower bound: entries only
        # lower it when added, and acks and redeliveries leave it low), so `expired`
        # scans the table only when something may be due. Derived, not replicated.
        self._none_due_before_ms = -math.inf

    def in_flight_count(
        self, group: str | None = None, topic: str | None = None, queue_id: int | None = None
    ) -> int:
        """Messages popped and not yet acknowledged or redelivered (of `group`, `topic`,
        `queue_id` when given)."""
        return sum(
            count
            for (g, t, q), count in self.in_flight_by_queue().items()
            if (group is None or g == group)
            and (topic is None or t == topic)
            and (queue_id is None or q == queue_id)
        )

    def in_flight_by_queue(self) -> dict[Key, int]:
        """(group, topic, queueId) -> messages in flight there."""
        counts = {key: len(entries) for key, entries in self.inflight.items()}
        for key, batch in self.orders.items():
            counts[key] = counts.get(key, 0) + len(batch.pending())
        return counts

    def apply(self, op: str, record: dict) -> None:
        if op == "popCk":
            for checkpoint in record["cks"]:
                self._checkpoint(checkpoint)
        elif op == "popAck":
            for group, topic, queue_id, offset, pop_time_ms in record["e"]:
                self._ack((group, topic, int(queue_id)), int(offset), int(pop_time_ms))
        elif op == "popChange":
            self._change(record)
        elif op == "popRevive":
            for group, topic, queue_id, offset, pop_time_ms in record["e"]:
                entries = self.inflight.get((group, topic, int(queue_id)), {})
                found = entries.get(int(offset))
                if found is not None and found.pop_time_ms == int(pop_time_ms):
                    self._forget((group, topic, int(queue_id)), int(offset))
                    self.revived += 1
            self.dead_lettered += int(record.get("dlq", 0))

    def _checkpoint(self, r: dict) -> None:
        key = (str(r["c"]), str(r["t"]), int(r["q"]))
        pop_time_ms, invisible_ms = int(r["pt"]), int(r["it"])
        offsets = [int(o) for o in r["o"]]
        self.offsets[key] = max(self.offsets.get(key, 0), int(r["n"]))
        if r.get("order"):
            if not offsets:  # all filtered out, or the batch's messages are gone
                self.orders.pop(key, None)
                return
            old = self.orders.get(key)
            before = {} if old is None else old.counts
            counts = {o: before.get(o, -1) + 1 for o in offsets}
            self.orders[key] = OrderBatch(
                offsets,
                pop_time_ms,
                str(r.get("a") or ""),
                counts,
                dict.fromkeys(offsets, pop_time_ms + invisible_ms),
            )
            return
        if offsets:  # none when the filter skipped everything read: the offset moved alone
            entries = self.inflight.setdefault(key, {})
            for offset in offsets:
                entries[offset] = InFlight(pop_time_ms, invisible_ms, int(r["rq"]))
            self._none_due_before_ms = min(self._none_due_before_ms, pop_time_ms + invisible_ms)

    def _ack(self, key: Key, offset: int, pop_time_ms: int) -> None:
        batch = self.orders.get(key)
        if batch is not None and offset in batch.counts and batch.pop_time_ms == pop_time_ms:
            batch.acked.add(offset)
            if not batch.pending():
                del self.orders[key]
            return
        found = self.inflight.get(key, {}).get(offset)
        if found is not None and found.pop_time_ms == pop_time_ms:
            self._forget(key, offset)

    def _change(self, r: dict) -> None:
        key = (str(r["c"]), str(r["t"]), int(r["q"]))
        offset, old_pt = int(r["o"]), int(r["pt"])
        new_pt, invisible_ms = int(r["npt"]), int(r["it"])
        batch = self.orders.get(key)
        if batch is not None and offset in batch.counts and batch.pop_time_ms == old_pt:
            batch.visible_at_ms[offset] = new_pt + invisible_ms
            return
        found = self.inflight.get(key, {}).get(offset)
        if found is not None and found.pop_time_ms == old_pt:
            self.inflight[key][offset] = InFlight(new_pt, invisible_ms, found.revive_qid)
            self._none_due_before_ms = min(self._none_due_before_ms, new_pt + invisible_ms)

    def _forget(self, key: Key, offset: int) -> None:
        entries = self.inflight[key]
        del entries[offset]
        if not entries:
            del self.inflight[key]

    def expired(self, now_ms: int) -> list[tuple[Key, int, InFlight]]:
        """Non-order messages whose invisible time has passed, oldest first. The revive
        check calls it every tick; it scans the table only once something may be due."""
        if now_ms < self._none_due_before_ms:
            return []
        due, earliest_ms = [], math.inf
        for key, entries in self.inflight.items():
            for offset, entry in entries.items():
                if entry.visible_at_ms <= now_ms:
                    due.append((key, offset, entry))
                else:
                    earliest_ms = min(earliest_ms, entry.visible_at_ms)
        # what is due now stays in flight until its redelivery record: keep it due
        self._none_due_before_ms = min([earliest_ms, *(e.visible_at_ms for _k, _o, e in due)])
        due.sort(key=lambda d: d[2].visible_at_ms)
        return due

    # ------------------------------------------------------------------ snapshot
    def to_json(self) -> dict:
        """The state as the snapshot holds it; sorted, so equal states give equal JSON."""
        return {
            "offsets": sorted([*k, o] for k, o in self.offsets.items()),
            "inflight": sorted(
                [*k, o, e.pop_time_ms, e.invisible_ms, e.revive_qid]
                for k, entries in self.inflight.items()
                for o, e in entries.items()
            ),
            "orders": [
                [
                    *k,
                    b.offsets,
                    b.pop_time_ms,
                    b.attempt_id,
                    [[o, b.counts[o], b.visible_at_ms[o]] for o in b.offsets],
                    sorted(b.acked),
                ]
                for k, b in sorted(self.orders.items())
            ],
            "revived": self.revived,
            "deadLettered": self.dead_lettered,
        }

    def load(self, data: dict) -> None:
        for g, t, q, o in data.get("offsets", []):
            self.offsets[(g, t, int(q))] = int(o)
        for g, t, q, o, pt, it, rq in data.get("inflight", []):
            self.inflight.setdefault((g, t, int(q)), {})[int(o)] = InFlight(pt, it, rq)
        for g, t, q, offsets, pt, attempt, per_offset, acked in data.get("orders", []):
            self.orders[(g, t, int(q))] = OrderBatch(
                list(offsets),
                int(pt),
                str(attempt),
                {int(o): int(c) for o, c, _v in per_offset},
                {int(o): int(v) for o, _c, v in per_offset},
                set(acked),
            )
        self.revived = int(data.get("revived", 0))
        self.dead_lettered = int(data.get("deadLettered", 0))
