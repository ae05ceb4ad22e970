"""A deterministic simulation of a DLedger group: the real `Replica` core, a simulated
network, disk and clock, and faults.

Every nondeterministic choice (message delay, drop, duplication, fsync latency,
what a crash keeps) comes from one `random.Random`, and events are ordered by
(virtual time, sequence number), so a schedule and a seed replay exactly.

Durability is modelled the way a power cut treats a real machine: a crash keeps the
hard state its last completed save wrote and whatever the store's last completed
fsync covered — optionally plus a prefix of the writes since, as a page cache that
flushed part of its dirty data would. With `stores=sim.disk.FileStores` each log is the
real file store over a simulated disk, and a crash tears its files and runs its
recovery. After every event the simulator takes the replica's `Ready`, as the trio
server does, and carries it out in the same order; the core holds every message in
it behind a save of the term and vote it depends on. Given `hard_state_fsync_ms`,
those saves take simulated time, during which a crash loses them along with what they
held.

Group commits follow the server's `GroupCommitSchedule`, fed the fsync durations the
simulated disk draws: given `slow_fsync_chance`, now and then one is slow (past the
inline threshold), which moves the next ones off the loop as it does in production.
An fsync the schedule runs inline blocks its node: events reaching it meanwhile wait
until the fsync ends, as they wait in a socket behind a blocked loop. Deliveries a
node finds waiting at once (the next event is another delivery to it at the same
time, as after such a wait) are a chunk, as one read returns every frame buffered:
the fsync they ask for starts after the last of them, as the server's does
(`DLedgerServer._on_chunk_end`).
"""

from __future__ import annotations

import collections
import heapq
import random

import attrs
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.config import PAGE_CACHE, DLedgerConfig
from raftmq.dledger.core import snapshot
from raftmq.dledger.core.group_commit import INLINE_FSYNC_MAX_S, Fsync, GroupCommitSchedule
from raftmq.dledger.core.membership import Change, MemberState
from raftmq.dledger.core.messages import REQUESTS
from raftmq.dledger.core.output import Ready
from raftmq.dledger.core.replica import Replica
from raftmq.dledger.sim.checks import Checker, InvariantViolation
from raftmq.dledger.sim.disk import MemoryStores
from raftmq.dledger.store.base import LogStore

LIVELOCK_EVENTS = 20000  # events without virtual time moving: the replicas are spinning
# Page-cache mode's flush interval in the ack_before_fsync control. DLedger's own 10 ms,
# counted from the end of the last flush as the server counts it, has flushed what a
# workload stepping every 10 ms acknowledged before a crash at a step (12 of 12 seeds of
# the broker control saw nothing); at 200 ms the controls catch the loss in 12 of 12
# and 10 of 12 seeds, and the group still flushes its first entry before a burst.
NEGATIVE_CONTROL_FLUSH_MS = 200
# A slow fsync: past the threshold over which the schedule keeps fsyncs off the loop.
SLOW_FSYNC_MS = (1.2 * INLINE_FSYNC_MAX_S * 1000, 2.5 * INLINE_FSYNC_MAX_S * 1000)


@attrs.define
class NetworkConditions:
    drop: float = 0.0  # probability a message is lost
    duplicate: float = 0.0  # probability a message is delivered twice
    min_delay_ms: float = 0.1
    max_delay_ms: float = 1.0  # independent delays per message reorder them


@attrs.define
class Variant:
    """Deliberately broken variants: the negative controls the checks must catch."""

    ack_before_fsync: bool = False  # page-cache acks (DLedger's default) under power loss
    forget_vote_on_crash: bool = False  # a replica whose vote does not survive a restart
    send_before_hard_state: bool = False  # messages leave while their term/vote is being saved


class SimNode:
    def __init__(
        self, node_id: str, replica: Replica, store: LogStore, hard_state, now_ms: float
    ) -> None:
        self.id = node_id
        self.replica = replica
        self.store = store
        self.hard_state = hard_state  # (term, vote) as durable on disk
        self.members: MemberState | None = replica.members  # saved with them
        self.alive = True
        self.paused = False
        self.group_commit = GroupCommitSchedule(
            replica.config.ack_after_fsync, replica.config.flush_file_interval_ms, now_ms
        )
        self.busy_until_ms = 0.0  # an fsync on the node's own thread blocks it until then
        self.fsync_held = False  # one asked for in a chunk of deliveries, not yet started
        self.tick_version = 0
        self.held: list = []  # events that arrived while paused
        self.readies: collections.deque[Ready] = collections.deque()  # taken, not carried out
        self.carrying_out = False


class SimCluster:
    def __init__(
        self,
        size: int,
        rng: random.Random,
        conditions: NetworkConditions | None = None,
        variant: Variant | None = None,
        fsync_ms: tuple[float, float] = (0.2, 2.0),
        slow_fsync_chance: float = 0.0,
        segment_size: int = 4096,
        config_overrides: dict | None = None,
        stores=MemoryStores,
        hard_state_fsync_ms: tuple[float, float] | None = None,
        spares: int = 0,
    ) -> None:
        self.rng = rng
        self.conditions = conditions or NetworkConditions()
        self.variant = variant or Variant()
        self.fsync_ms = fsync_ms
        self.slow_fsync_chance = slow_fsync_chance  # of an fsync taking SLOW_FSYNC_MS
        self.hard_state_fsync_ms = hard_state_fsync_ms  # None: term and vote save at once
        self.segment_size = segment_size
        self.ids = [f"n{i}" for i in range(size)]  # every node booted, a joined spare too
        # `spares` more nodes, not started, that `add_member` starts and adds
        self.spare_ids = [f"n{i}" for i in range(size, size + spares)]
        self.addresses = {f"n{i}": f"127.0.0.1:{40911 + i}" for i in range(size + spares)}
        peers = {node_id: self.addresses[node_id] for node_id in self.ids}
        self._peers_of: dict[str, dict[str, str]] = {}  # dLegerPeers of a node that joined
        self._config_kwargs = dict(group="sim", peers=peers, **(config_overrides or {}))
        if self.variant.ack_before_fsync:
            self._config_kwargs["flush_disk_type"] = PAGE_CACHE
            self._config_kwargs["flush_file_interval_ms"] = NEGATIVE_CONTROL_FLUSH_MS
        self.now_ms = 0.0
        self._events_at_now = 0
        self._queue: list = []
        self._seq = 0
        self.blocked: set[tuple[str, str]] = set()  # (src, dst) links that lose everything
        self.checker = Checker(self)
        self.nodes: dict[str, SimNode] = {}
        self._handles = 0
        self.appends: dict[int, bytes] = {}  # handle -> body as placed in the log
        self.member_changes: dict[int, Code | None] = {}  # handle -> outcome, None until known
        # Models layered on the group (a broker per replica): `after_event(node)` once a
        # live node has handled an event, `completed(node_id, handle, code, positions)`
        # for every client append's outcome.
        self.observers: list = []
        # An application per node, kept across its crashes (`set_state_machine`)
        self.state_machines: dict[str, object] = {}
        # What each log is kept in and what a crash leaves of it (`sim.disk`).
        self.stores = stores(rng, segment_size)
        for node_id in self.ids:
            self.nodes[node_id] = self._boot(node_id, self.stores.fresh(node_id), (0, None))

    # ------------------------------------------------------------------ nodes
    def _boot(
        self, node_id: str, store: LogStore, hard_state, members: MemberState | None = None
    ) -> SimNode:
        kwargs = self._config_kwargs
        if node_id in self._peers_of:
            kwargs = {**kwargs, "peers": self._peers_of[node_id], "join_as_learner": True}
        config = DLedgerConfig(self_id=node_id, **kwargs)
        replica = Replica(
            config,
            store,
            random.Random(self.rng.random()),
            hard_state[0],
            hard_state[1],
            self.now_ms,
            members,
        )
        machine = self.state_machines.get(node_id)
        if machine is not None:
            replica.snapshot_source = machine.snapshot
        node = SimNode(node_id, replica, store, hard_state, self.now_ms)
        self.nodes[node_id] = node
        self._schedule_tick(node)
        return node

    def set_state_machine(self, node_id: str, machine) -> None:
        """The application on `node_id`, as `DLedgerServer.set_state_snapshots` gives the
        server one: `machine.snapshot()` is its state as of an entry it applied, (index,
        bytes), `machine.install(index, data)` replaces it with one (core.snapshot), at
        once. What it applies, and when, is its own (an observer's `after_event`)."""
        self.state_machines[node_id] = machine
        self.nodes[node_id].replica.snapshot_source = machine.snapshot

    def add_member(self, peers: tuple[str, ...] | None = None) -> str | None:
        """Start the next spare node as a learner and ask the leader to add it; its id,
        or None when no spare or no leader is left. Its dLegerPeers are `peers` and
        itself (an operator's conf may name a group that has changed since), by default
        the leader's configuration."""
        leader = self.leader()
        if not self.spare_ids or leader is None or leader.paused:
            return None
        node_id = self.spare_ids.pop(0)
        if peers is None:
            peers = leader.replica.members.current.ids
        self._peers_of[node_id] = {p: self.addresses[p] for p in (*peers, node_id)}
        self.ids.append(node_id)
        self._boot(node_id, self.stores.fresh(node_id), (0, None))
        self.change_members(Change.ADD_LEARNER, node_id)
        return node_id

    def change_members(self, change: Change, member: str) -> int | None:
        """Ask the current leader to make one change of its members; the request's
        handle (its outcome a completion like an append's), or None when there is no
        leader to ask or the change does not apply."""
        node = self.leader()
        if node is None or node.paused:
            return None
        self._handles += 1
        handle = self._handles
        self.member_changes[handle] = None
        try:
            code = node.replica.change_members(
                handle, change, member, self.addresses[member], self.now_ms
            )
        except ValueError:
            return None
        if code is not Code.SUCCESS:
            self._completed(node.id, handle, code, None)
        self._drain(node)
        return handle

    def members(self) -> tuple[str, ...]:
        """The members of the leader's configuration (all nodes when there is no leader)."""
        leader = self.leader()
        return tuple(self.ids) if leader is None else leader.replica.members.current.ids

    def crash(self, node_id: str, keep_unsynced: int = 0) -> None:
        node = self.nodes[node_id]
        if not node.alive:
            return
        node.alive = False
        node.held.clear()
        node.store = self.stores.crashed(node, keep_unsynced)
        if self.variant.forget_vote_on_crash:
            node.hard_state = (node.hard_state[0], None)
        self.checker.crashed(node_id)

    def restart(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.alive:
            return
        self._boot(node_id, node.store, node.hard_state, node.members)

    def pause(self, node_id: str) -> None:
        self.nodes[node_id].paused = True

    def resume(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if not node.paused:
            return
        node.paused = False
        held, node.held = node.held, []
        for kind, payload in held:
            self._push_event(self.now_ms, kind, (node.id, payload))
        self._schedule_tick(node)

    def partition(self, groups: list[list[str]]) -> None:
        """Only nodes in the same group hear each other."""
        where = {n: g for g, members in enumerate(groups) for n in members}
        self.blocked = {
            (a, b)
            for a in self.ids
            for b in self.ids
            if a != b and where.get(a, -1) != where.get(b, -2)
        }

    def block_one_way(self, src: str, dst: str) -> None:
        self.blocked.add((src, dst))

    def heal(self) -> None:
        self.blocked.clear()

    def leader(self) -> SimNode | None:
        leaders = [n for n in self.nodes.values() if n.alive and n.replica.role is Role.LEADER]
        return max(leaders, key=lambda n: n.replica.term) if leaders else None

    def run_until_leader(
        self, limit_ms: float = 2000.0, not_id: str | None = None, settle_ms: float = 0.0
    ) -> tuple[SimNode, float]:
        """Step virtual time 1 ms at a time until a live leader other than `not_id` exists.

        Then run `settle_ms` more (time for the followers to hear of it) and return the
        leader as it stands then, with the ms it took to appear (settling not counted).
        No leader is a liveness failure of the caller's scenario, not a safety violation,
        so it raises a plain AssertionError, never the checker's InvariantViolation that
        negative-control tests expect.
        """
        start = self.now_ms
        while self.now_ms - start < limit_ms:
            self.run_until(self.now_ms + 1.0)
            leader = self.leader()
            if leader is not None and leader.id != not_id:
                elapsed = self.now_ms - start
                if settle_ms:
                    self.run_until(self.now_ms + settle_ms)
                    leader = self.leader()
                    if leader is None:
                        raise AssertionError(f"the leader was lost within {settle_ms} ms")
                return leader, elapsed
        raise AssertionError(f"no leader within {limit_ms} ms")

    # ------------------------------------------------------------------ clients
    def client_append(self, node_id: str | None = None, body: bytes | None = None) -> int | None:
        """Send one append to `node_id` (default: the current leader); returns its handle."""
        return self.client_append_batch(node_id, None if body is None else [body])

    def client_append_batch(
        self, node_id: str | None = None, bodies: list[bytes] | None = None
    ) -> int | None:
        """Send one append of `bodies`, an entry each, to `node_id` (default: the current
        leader); returns its handle. Its acknowledgment is checked at its last entry."""
        node = self.nodes[node_id] if node_id else self.leader()
        if node is None or not node.alive or node.paused:
            return None
        self._handles += 1
        handle = self._handles
        bodies = bodies if bodies is not None else [f"v{handle}".encode()]
        self.appends[handle] = bodies[-1]
        code = node.replica.append(handle, bodies, self.now_ms)
        if code is not Code.SUCCESS:
            self._completed(node.id, handle, code, None)
        self._drain(node)
        return handle

    # ------------------------------------------------------------------ event loop
    def _push_event(self, when: float, kind: str, payload) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, kind, payload))

    def _schedule_tick(self, node: SimNode) -> None:
        node.tick_version += 1
        when = max(self.now_ms, min(node.replica.next_deadline_ms(), node.group_commit.deadline_ms))
        self._push_event(when, "tick", (node.id, node.tick_version))

    def run_until(self, until_ms: float) -> None:
        while self._queue and self._queue[0][0] <= until_ms:
            when, _seq, kind, payload = heapq.heappop(self._queue)
            if when > self.now_ms:
                self.now_ms = when
                self._events_at_now = 0
            self._events_at_now += 1
            if self._events_at_now > LIVELOCK_EVENTS:
                raise InvariantViolation(
                    f"livelock: {LIVELOCK_EVENTS} events at t={self.now_ms}ms ({kind})"
                )
            node = self.nodes[payload[0]]
            if not node.alive:
                continue
            if node.paused:
                if kind != "tick":
                    node.held.append((kind, payload[1]))
                continue
            if node.busy_until_ms > when:  # in an fsync on its own thread: later, in order
                self._push_event(node.busy_until_ms, kind, payload)
                continue
            self._dispatch(node, kind, payload[1])
            self.checker.check(node)
            for observer in self.observers:
                observer.after_event(node)
        self.now_ms = max(self.now_ms, until_ms)

    def _dispatch(self, node: SimNode, kind: str, data) -> None:
        replica = node.replica
        if kind == "tick":
            if data != node.tick_version:
                return
            if self.now_ms >= replica.next_deadline_ms():  # not only the group commit's deadline
                replica.tick(self.now_ms)
        elif kind == "deliver":
            replica.receive(data, self.now_ms)
        elif kind == "send_failed":
            replica.send_failed(data, self.now_ms)
        elif kind == "synced":
            schedule, plan, took_ms = data
            if schedule is node.group_commit:  # not an fsync from before a crash
                plan.run()
                schedule.finished(took_ms / 1000.0, plan.syncs, self.now_ms)
                replica.persisted(plan.end_index, plan.generation, self.now_ms)
        elif kind == "hard_state_saved":
            saved_by, hard_state, members = data
            if saved_by is replica:  # not a save from before a crash
                node.hard_state = hard_state
                node.members = members or node.members
                if not self.variant.send_before_hard_state:
                    replica.hard_state_saved()
        self._drain(node)

    def _drain(self, node: SimNode) -> None:
        """Carry out the replica's Ready, start the fsync its group-commit schedule says
        is due (one asked for while the last ran, or page-cache mode's flush), then arm
        its next tick."""
        self._take_ready(node)
        replica = node.replica
        if node.fsync_held and not self._chunk_goes_on(node):
            node.fsync_held = False
            self._want_fsync(node)
        self._start_fsync(
            node,
            node.group_commit.next(
                node.store.end_index,
                replica.committed_index,
                self.now_ms,
                following=replica.following,
            ),
        )
        self._schedule_tick(node)

    def _take_ready(self, node: SimNode) -> None:
        """Take the replica's Ready and carry it out; one taken while another is being
        carried out (an effect fed the replica) waits until that one is done."""
        node.readies.append(node.replica.ready())
        if node.carrying_out:
            return
        node.carrying_out = True
        try:
            while node.readies:
                self._carry_out(node, node.readies.popleft())
        finally:
            node.carrying_out = False

    def _carry_out(self, node: SimNode, ready: Ready) -> None:
        """Do what `ready` lists, in its order (see `Ready`), with simulated I/O."""
        for out in ready.outputs:
            for msg in out.messages:
                self._send(node.id, msg)
            if out.needs_sync:
                if node.fsync_held or self._chunk_goes_on(node):
                    node.fsync_held = True  # `_drain` starts it once the chunk ends
                else:
                    self._want_fsync(node)
            for term, role in out.role_changes:
                self.checker.role_changed(node.id, term, role)
            if out.committed_index is not None:
                self.checker.committed(node.id, out.committed_index)
            for completion in out.completions:
                self._completed(node.id, completion.handle, completion.code, completion.positions)
            if out.snapshot is not None:
                self._install(node, *out.snapshot)
        if ready.save is not None:
            self._save_hard_state(node, ready.save, ready.members)

    def _install(self, node: SimNode, index: int, data: bytes) -> None:
        """The node's application installs the leader's snapshot at once (the server
        gives it a task; an install taking time is a delay the simulator leaves out)."""
        machine = self.state_machines.get(node.id)
        ok = True
        if machine is not None:
            try:
                machine.install(index, data)
            except snapshot.INSTALL_ERRORS:
                ok = False
        node.replica.snapshot_installed(index, ok)
        self._take_ready(node)

    def _save_hard_state(
        self, node: SimNode, hard_state: tuple[int, str | None], members: MemberState | None
    ) -> None:
        """Save (term, vote), and the configuration when it changed, at once or after a
        drawn `hard_state_fsync_ms`; the outputs that waited for it go out with the
        replica's next Ready."""
        if self.hard_state_fsync_ms is None:
            node.hard_state = hard_state
            node.members = members or node.members
            node.replica.hard_state_saved()
            self._take_ready(node)
            return
        delay = self.rng.uniform(*self.hard_state_fsync_ms)
        self._push_event(
            self.now_ms + delay,
            "hard_state_saved",
            (node.id, (node.replica, hard_state, members)),
        )
        if self.variant.send_before_hard_state:
            node.replica.hard_state_saved()
            self._take_ready(node)

    def _completed(self, node_id: str, handle: int, code: Code, positions) -> None:
        if handle in self.member_changes:
            self.member_changes[handle] = code
        self.checker.completed(node_id, handle, code, positions)
        for observer in self.observers:
            observer.completed(node_id, handle, code, positions)

    def _chunk_goes_on(self, node: SimNode) -> bool:
        """Whether the next event is another delivery to `node` at this time."""
        if not self._queue:
            return False
        when, _seq, kind, payload = self._queue[0]
        return when == self.now_ms and kind == "deliver" and payload[0] == node.id

    def _want_fsync(self, node: SimNode) -> None:
        replica = node.replica
        fsync = node.group_commit.wanted(
            node.store.end_index, replica.committed_index, self.now_ms, following=replica.following
        )
        self._start_fsync(node, fsync)

    def _start_fsync(self, node: SimNode, fsync: Fsync | None) -> None:
        """Start `fsync`, the group commit the node's schedule says is due, if any; one it
        runs inline blocks the node until it ends."""
        if fsync is None:
            return
        plan = node.store.sync_plan()
        assert plan.end_index == fsync.end_index, "the plan covers what the schedule decided"
        if self.slow_fsync_chance and self.rng.random() < self.slow_fsync_chance:
            took_ms = self.rng.uniform(*SLOW_FSYNC_MS)
        else:
            took_ms = self.rng.uniform(*self.fsync_ms)
        if fsync.inline:
            node.busy_until_ms = self.now_ms + took_ms
        synced = (node.group_commit, plan, took_ms)
        self._push_event(self.now_ms + took_ms, "synced", (node.id, synced))

    def _send(self, src: str, msg) -> None:
        dst = msg.remote_id
        if dst not in self.nodes:
            return
        cond = self.conditions
        if (
            not self.nodes[dst].alive
            and isinstance(msg, REQUESTS)
            and (src, dst) not in self.blocked
        ):
            # a crashed process refuses connections: the sender learns at once
            self._push_event(self.now_ms + cond.min_delay_ms, "send_failed", (src, msg))
            return
        if (src, dst) in self.blocked or self.rng.random() < cond.drop:
            return
        copies = 2 if self.rng.random() < cond.duplicate else 1
        for _ in range(copies):
            delay = self.rng.uniform(cond.min_delay_ms, cond.max_delay_ms)
            self._push_event(self.now_ms + delay, "deliver", (dst, msg))
