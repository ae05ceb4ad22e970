"""A broker on every replica of the DLedger simulator: messages, queue offsets and
consumer offsets checked through leader changes.

The Raft checker (dledger.sim.checks) proves the log safe; users see a broker, so
this model runs the real broker store on each simulated replica and checks what a
producer and consumers see. Each replica has a real `MessageStore` — the
`DLedgerCommitLog` that places records, their queue and physical offsets, on the leader,
ConsumeQueue dispatch up to the commit index, metadata records applied in log order,
RocketMQ's pull status rules, recovery of the ConsumeQueue files after a crash — over
a `SimServer`, the store's replicated-log protocol (`broker.store.replicated_log`,
which `DLedgerServer` implements) carried out by the simulator, and becomes master
through the broker's own `Promotion` (commit and dispatch everything of its term,
hold the lease, rebuild the queue offset table, take brokerId 0). What stands in for
the broker: dispatch runs a random number of entries after each event of its replica
instead of in a task, and a master becomes a slave when its replica no longer leads
in the master's term, where `BrokerController` is told by a role-change callback.
ConsumeQueue files live in a temporary directory; every crash is a power cut for them
as for the log: each file keeps what the last dispatch checkpoint fsynced plus a
random part of what came after (the store's recovery cuts the queues back to the
checkpoint and the recovered log).

The workload: a producer sends batches (several messages to one queue per append, as
SEND_BATCH_MESSAGE does, and several appends in flight) to a master, each message
acknowledged with (queue, queue offset) only once committed; two consumer groups
pull per queue from any replica, commit offsets
through the master (acknowledged once applied there, as `MetaWriter.write` is) and
read them back from the current leader. Checked as it happens: every pulled message
was sent, is committed, sits at the offset it was pulled from, and no offset ever
shows two messages (a pull exposing an entry that later disappears); two
acknowledgements never share an offset; a new master holds every acknowledged
message and consumer offset; a group's offset read from the leader never goes
backwards. Checked after healing: on every replica the queue offsets of the committed
log are dense, its ConsumeQueues match the log and each other, and every acknowledged
or pulled message is at its offset.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from raftmq.broker.metawriter import meta_message
from raftmq.broker.promotion import Promotion
from raftmq.broker.role import BrokerRole
from raftmq.broker.store.commitlog import BODY_OFFSET
from raftmq.broker.store.consumequeue import ENTRY_SIZE
from raftmq.broker.store.messagestore import GetStatus, MessageStore, parse_delay_levels
from raftmq.broker.store.metadata import builtin_topics
from raftmq.broker.store.replicated_log import ReplicatedLog
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.sim.checks import Checker, InvariantViolation
from raftmq.dledger.sim.schedule import Schedule, run

from raftmq.protocol import message as codec

TOPIC = "SimTopic"
QUEUES = 4
GROUPS = ("g0", "g1")
PULL_BATCH = 8
DISPATCH_CHUNK = (1, 64)  # entries dispatched per event (a step sends ~5): replicas lag a little
SENDS_PER_STEP = (1, 3)  # appends a producer sends per workload step, not waiting for answers
BATCH_MESSAGES = (1, 4)  # messages per append
CHECKPOINT_CHANCE = 0.02  # per workload step: a random replica takes a dispatch checkpoint


class SimServer(ReplicatedLog):
    """The replicated log under one simulated replica's MessageStore: its store and
    core, and appends carried out by the simulator."""

    def __init__(self, cluster, node) -> None:
        self.cluster = cluster
        self.node_id = node.id
        self.store = node.store
        self.replica = node.replica
        self.callbacks: dict[int, object] = {}  # handle -> callback(code, positions)

    def add_commit_handler(self, handler) -> None:
        """Unused: the model dispatches after every event the replica handles."""

    def add_retention_limit(self, limit) -> None:
        """Unused: the simulated log (a MemoryLogStore) has no retention."""

    def append_nowait(self, bodies: list[bytes], callback, *, placed=None) -> None:
        if placed is not None and placed[0] != self.store.end_pos:  # as DLedgerServer refuses
            callback(Code.LEADER_NOT_READY, None)  # (a new term's NOOP came first)
            return
        handle = self.cluster.client_append_batch(self.node_id, bodies)
        outcome = self.cluster.checker.outcomes.get(handle)
        if outcome is None:
            self.callbacks[handle] = callback
        else:  # refused at once
            callback(outcome, None)


class Broker:
    """One replica's broker: the real message store, role and promotion."""

    def __init__(self, cluster, node, root: Path, port: int) -> None:
        self.server = SimServer(cluster, node)
        self.store = MessageStore(
            self.server, root, builtin_topics("sim", "broker-sim", QUEUES), parse_delay_levels("1s")
        )
        replica = node.replica
        slave_id = 1 + cluster.ids.index(node.id)
        self.role = BrokerRole("broker-sim", node.id, slave_id, lambda: replica.leader_id)
        self.promotion = Promotion(self.store, self.role)  # no delayed delivery here
        self.host = ("127.0.0.1", port)
        # acknowledged once applied here: (META_TOPIC offset, group, queue, offset)
        self.commits: list[tuple[int, str, int, int]] = []

    @property
    def is_master(self) -> bool:
        return self.role.is_master

    def close(self) -> None:
        """What a crash leaves: every queue's entries written, not fsynced (the power
        cut that follows takes a random part of what is not durable)."""
        self.store.queues.write()


class RecordingChecker(Checker):
    """The Raft checker, recording violations instead of raising them, so that a
    negative control shows what the broker-level checks catch on their own."""

    def __init__(self, cluster) -> None:
        super().__init__(cluster)
        self.violations: list[str] = []

    def _fail(self, what: str) -> None:
        self.violations.append(f"t={self.cluster.now_ms:.1f}ms: {what}")


class BrokerModel:
    """The workload for `dledger.sim.schedule.run`, and the checks (see the module doc)."""

    def __init__(self, cluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.rng = random.Random(cluster.rng.random())
        self.brokers: dict[str, Broker] = {}
        self.sent: dict[bytes, int] = {}  # body -> queue it was sent to
        self.acked: dict[tuple[int, int], bytes] = {}  # (queue, offset) -> body
        self.acked_bodies: set[bytes] = set()
        self.pulled: dict[tuple[int, int], bytes] = {}  # what any pull exposed there
        self.consumed: dict[tuple[str, int], int] = {
            (g, q): 0 for g in GROUPS for q in range(QUEUES)
        }
        self.committed: dict[tuple[str, int], int] = {}  # highest acknowledged commit
        self.read: dict[tuple[str, int], int] = {}  # highest offset read from a leader
        self.masters = 0
        self.durable: dict[Path, int] = {}  # ConsumeQueue file -> bytes a power cut keeps
        cluster.observers.append(self)
        for node in cluster.nodes.values():
            self._broker(node)

    def _fail(self, what: str) -> None:
        raise InvariantViolation(f"t={self.cluster.now_ms:.1f}ms: broker: {what}")

    def _broker(self, node) -> Broker:
        """The node's broker, started again over the recovered log after a restart."""
        broker = self.brokers.get(node.id)
        if broker is None or broker.server.replica is not node.replica:
            if broker is not None:
                broker.close()
                self._power_cut_queues(node.id)
            port = 10911 + self.cluster.ids.index(node.id)
            broker = self.brokers[node.id] = Broker(self.cluster, node, self.root / node.id, port)
            self._queues_durable(node.id)  # what recovery read and rewrote is on disk
        return broker

    def _queue_files(self, node_id: str) -> list[Path]:
        return sorted((self.root / node_id / "consumequeue").glob("*/*/*"))

    def _queues_durable(self, node_id: str) -> None:
        for path in self._queue_files(node_id):
            self.durable[path] = path.stat().st_size

    def _power_cut_queues(self, node_id: str) -> None:
        """Each queue file keeps its fsynced bytes and a random number of entries after."""
        for path in self._queue_files(node_id):
            kept = self.durable.get(path, 0) // ENTRY_SIZE
            size = path.stat().st_size
            cut = self.rng.randint(min(kept, size // ENTRY_SIZE), size // ENTRY_SIZE)
            if cut * ENTRY_SIZE < size:
                with path.open("r+b") as file:
                    file.truncate(cut * ENTRY_SIZE)

    def checkpoint(self, node_id: str, broker: Broker) -> None:
        """A dispatch checkpoint, carried out at once (a broker runs it in a thread)."""
        broker.store.checkpoint_work()()
        self._queues_durable(node_id)

    def _serving(self) -> list[tuple[str, Broker]]:
        return [
            (node.id, self._broker(node))
            for node in self.cluster.nodes.values()
            if node.alive and not node.paused
        ]

    # ------------------------------------------------------------------ simulator hooks
    def after_event(self, node) -> None:
        broker = self._broker(node)
        store = broker.store
        store.dispatch_some(self.rng.randint(*DISPATCH_CHUNK))
        replica, role = node.replica, broker.role
        if role.is_master:
            if replica.role is not Role.LEADER or replica.term != role.term:
                role.become_slave(replica.term)  # the broker's role-change callback
        elif broker.promotion.try_lead(replica, replica.term, self.cluster.now_ms):
            self.masters += 1
            self._check_new_master(node.id, broker)
        if broker.commits:
            applied = store.metadata.applied_meta_offset
            for meta_offset, group, queue, offset in broker.commits:
                if meta_offset < applied:
                    key = (group, queue)
                    self.committed[key] = max(self.committed.get(key, 0), offset)
            broker.commits = [c for c in broker.commits if c[0] >= applied]

    def completed(self, node_id: str, handle: int, code: Code, positions) -> None:
        broker = self.brokers.get(node_id)
        callback = broker and broker.server.callbacks.pop(handle, None)
        if callback:
            callback(code, positions)

    # ------------------------------------------------------------------ workload
    def step(self) -> None:
        for _ in range(self.rng.randint(*SENDS_PER_STEP)):
            self.send(self._masters())
        serving = self._serving()
        if serving:
            node_id, broker = self.rng.choice(serving)
            self.pull(node_id, broker, self.rng.choice(GROUPS), self.rng.randrange(QUEUES))
        if self.rng.random() < 0.25:
            self.commit_offset(self.rng.choice(GROUPS), self.rng.randrange(QUEUES))
        if self.rng.random() < 0.25:
            self.read_offsets(self.rng.choice(GROUPS))
        if serving and self.rng.random() < CHECKPOINT_CHANCE:
            self.checkpoint(*self.rng.choice(serving))

    def probe(self, node_id: str):
        broker = self._broker(self.cluster.nodes[node_id])
        bodies = self.send([broker] if broker.is_master else [])
        return lambda: bool(bodies) and all(body in self.acked_bodies for body in bodies)

    def _masters(self) -> list[Broker]:
        """Every broker that believes it is master: a zombie among them, clients may pick."""
        return [b for _id, b in self._serving() if b.is_master]

    def send(self, masters: list[Broker]) -> list[bytes]:
        """Send a batch of new messages to one queue of one of `masters`, as one append;
        returns their bodies (none: no master)."""
        if not masters:
            return []
        broker = self.rng.choice(masters)
        queue = self.rng.randrange(QUEUES)
        now_ms = int(self.cluster.now_ms)
        bodies = []
        records = []
        for _ in range(self.rng.randint(*BATCH_MESSAGES)):
            body = f"m{len(self.sent)}".encode()
            self.sent[body] = queue
            bodies.append(body)
            msg = codec.MessageExt(
                topic=TOPIC,
                body=body,
                queue_id=queue,
                born_timestamp=now_ms,
                store_timestamp=now_ms,
                born_host=("10.0.0.1", 5000),
                store_host=broker.host,
            )
            records.append(codec.encode(msg))

        def done(code: Code, placed) -> None:
            if code is Code.SUCCESS:
                offsets = [offset for _phys, offset in placed]
                if offsets != list(range(offsets[0], offsets[0] + len(bodies))):
                    self._fail(f"a batch to queue {queue} acknowledged at offsets {offsets}")
                for body, offset in zip(bodies, offsets, strict=True):
                    self._acknowledged(body, queue, offset)

        broker.store.commitlog.put_nowait(records, done)
        return bodies

    def _acknowledged(self, body: bytes, queue: int, offset: int) -> None:
        other = self.acked.setdefault((queue, offset), body)
        if other != body:
            self._fail(f"{body!r} and {other!r} both acknowledged at queue {queue} offset {offset}")
        shown = self.pulled.get((queue, offset))
        if shown not in (None, body):
            self._fail(f"{body!r} acknowledged at {queue}@{offset}, where a pull saw {shown!r}")
        self.acked_bodies.add(body)

    def pull(self, node_id: str, broker: Broker, group: str, queue: int) -> None:
        offset = self.consumed[(group, queue)]
        result = broker.store.get_message(TOPIC, queue, offset, PULL_BATCH)
        if result.status != GetStatus.FOUND:
            return
        node = self.cluster.nodes[node_id]
        for k, record in enumerate(result.records):
            msg, _size = codec.decode(record)
            where = f"a pull of {queue}@{offset + k} from {node_id}"
            if msg.body not in self.sent:
                self._fail(f"{where} returned {msg.body!r}, which was never sent")
            if (msg.topic, msg.queue_id, msg.queue_offset) != (TOPIC, queue, offset + k):
                self._fail(f"{where} returned {msg.topic}/{msg.queue_id}@{msg.queue_offset}")
            # committed by the group, not necessarily known here yet: a restarted
            # replica serves the queues it dispatched before the crash at once
            index = broker.store.first_index_at(msg.physical_offset - BODY_OFFSET)
            chain = self.cluster.checker.committed_chains.get(index)
            if chain is None:
                self._fail(f"{where} exposed index {index}, which no replica has committed")
            if chain != node.store.chain_at(index):
                self._fail(f"{where} exposed index {index}, which is not the committed entry")
            shown = self.pulled.setdefault((queue, offset + k), msg.body)
            if shown != msg.body:
                self._fail(f"{where} returned {msg.body!r}; an earlier pull returned {shown!r}")
            acked = self.acked.get((queue, offset + k))
            if acked not in (None, msg.body):
                self._fail(f"{where} returned {msg.body!r}; {acked!r} was acknowledged there")
        self.consumed[(group, queue)] = result.next_begin_offset

    def commit_offset(self, group: str, queue: int) -> None:
        masters = self._masters()
        if not masters:
            return
        broker = self.rng.choice(masters)
        offset = self.consumed[(group, queue)]
        record = meta_message(
            "offsets",
            int(self.cluster.now_ms),
            broker.host,
            entries=[[group, TOPIC, queue, offset]],
        )

        def done(code: Code, placed) -> None:
            if code is Code.SUCCESS:
                [(_phys, meta_offset)] = placed
                broker.commits.append((meta_offset, group, queue, offset))

        broker.store.commitlog.put_nowait([record], done)

    def read_offsets(self, group: str) -> None:
        """Read the group's offsets from the current leader (the highest term), once it is
        master, as a consumer does after a rebalance; it continues from them."""
        leader = self.cluster.leader()
        if leader is None or leader.paused:
            return
        broker = self._broker(leader)
        if not broker.is_master:
            return
        offsets = broker.store.metadata.offsets
        for queue in range(QUEUES):
            key = (group, queue)
            value = offsets.get((group, TOPIC, queue), 0)
            floor = max(self.read.get(key, 0), self.committed.get(key, 0))
            if value < floor:
                self._fail(
                    f"{group} offset of queue {queue} read from leader {leader.id}"
                    f" (term {leader.replica.term}) is {value}, below {floor} seen or acknowledged"
                )
            self.read[key] = value
            self.consumed[key] = max(self.consumed[key], value)

    # ------------------------------------------------------------------ checks
    def _message_at(self, broker: Broker, queue: int, offset: int) -> bytes | None:
        result = broker.store.get_message(TOPIC, queue, offset, 1)
        if result.status != GetStatus.FOUND:
            return None
        return codec.decode(result.records[0])[0].body

    def _check_holds(self, node_id: str, broker: Broker, what: str) -> None:
        """Every acknowledged message and consumer offset is on this broker."""
        for (queue, offset), body in self.acked.items():
            found = self._message_at(broker, queue, offset)
            if found != body:
                self._fail(
                    f"{what} {node_id} lost acknowledged {body!r} at queue {queue} offset"
                    f" {offset} (holds {found!r})"
                )
        offsets = broker.store.metadata.offsets
        for (group, queue), value in self.committed.items():
            if offsets.get((group, TOPIC, queue), 0) < value:
                self._fail(f"{what} {node_id} lost {group}'s acknowledged offset {value}")

    def _check_new_master(self, node_id: str, broker: Broker) -> None:
        self._check_holds(node_id, broker, f"new master (term {broker.role.term})")

    def check_final(self) -> None:
        """After healing: dense offsets in every committed log, queues equal to the log and
        to each other, every acknowledged or exposed message in place."""
        queues = {}
        for node in self.cluster.nodes.values():
            broker = self._broker(node)
            store = broker.store
            store.dispatch_some(1 << 30)
            queues[node.id] = self._queues_from_log(node, broker)
            self._check_holds(node.id, broker, "replica")
            for (queue, offset), body in self.pulled.items():
                found = self._message_at(broker, queue, offset)
                if found != body:
                    self._fail(
                        f"{node.id} holds {found!r} at {queue}@{offset}; a pull saw {body!r}"
                    )
        first, *others = queues.items()
        for node_id, table in others:
            for key in set(table) | set(first[1]):
                a, b = first[1].get(key, []), table.get(key, [])
                n = min(len(a), len(b))
                if a[:n] != b[:n]:
                    self._fail(f"queue {key} differs between {first[0]} and {node_id}")

    def _queues_from_log(self, node, broker: Broker) -> dict:
        """Each queue's entries as the committed log orders them, checked dense from 0 and
        equal to what the ConsumeQueue holds."""
        store = broker.store
        table: dict[tuple[str, int], list] = {}
        for index, request in store.commitlog.scan(node.store.begin_index, store.dispatched_index):
            if request is None:
                continue
            key = (request.topic, request.queue_id)
            entries = table.setdefault(key, [])
            if request.queue_offset != len(entries):
                self._fail(
                    f"{node.id}: index {index} holds {key} offset {request.queue_offset},"
                    f" expected {len(entries)}"
                )
            entries.append((request.physical_offset, request.size, request.tags_code))
        for key, entries in table.items():
            queue = store.queues.find(*key)
            held = [] if queue is None else list(queue.entries(0, len(entries) + 1))
            if held != entries:
                self._fail(f"{node.id}: ConsumeQueue {key} does not match the committed log")
        return table

    def close(self) -> None:
        for broker in self.brokers.values():
            broker.close()


def run_broker(
    schedule: Schedule, seed: int, variant=None, raft_checks: bool = True
) -> BrokerModel:
    """Play `schedule` with a broker per replica; raises InvariantViolation on a broken
    property. `raft_checks=False` records the Raft checker's findings instead of raising
    them (`cluster.checker.violations`). The seed and schedule replay a run exactly."""
    models = []

    def workload(cluster):
        if not raft_checks:
            cluster.checker = RecordingChecker(cluster)
        models.append(BrokerModel(cluster, Path(tmp)))
        return models[0]

    with tempfile.TemporaryDirectory(prefix="sim-broker-") as tmp:
        try:
            run(schedule, random.Random(seed), variant, workload)
        finally:
            for model in models:
                model.close()
    return models[0]
