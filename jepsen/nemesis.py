"""Fault schedules (data, from a seed) and the nemesis that plays them on a cluster.

A schedule is a list of `Step`s drawn from one `random.Random(seed)`, so the same
seed gives the same faults at the same times against the same kinds of target. Who
the "leader" is gets decided at run time, and is recorded with each fault.

Faults never overlap: each step starts, lasts its duration, is healed, and the group
gets a quiet gap before the next, so the history's unavailability windows can be
attributed to one fault. Composition comes from the kinds themselves (a coordinated
power cut is a kill of all nodes plus lost unsynced writes; a zombie leader is a
pause longer than the election timeout).
"""

from __future__ import annotations

import os
import random
import signal

import attrs
import trio
from raftmq.dledger.client import ClientError, DLedgerClient

from jepsen import disk, partitions
from jepsen.cluster import CLIENT, EXIT_DISK, SLAVES, JepsenCluster, RefusedToStart
from jepsen.history import Recorder
from raftmq.client.errors import MQClientError

MEMBERSHIP = "membership"
# kind -> (targets, variants, duration range in seconds)
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[float, float]]] = {
    "kill": (("leader", "one", "minority", "majority", "all"), ("sigkill",), (1.0, 5.0)),
    "pause": (("leader", "one", "minority"), ("sigstop",), (1.0, 5.0)),
    "partition": (
        ("isolate-leader", "isolate-one", "halves", "ring", "bridge", "one-way-leader"),
        ("blackhole",),
        (2.0, 7.0),
    ),
    "disk": (
        ("leader", "one", "minority", "all"),
        ("lose-unsynced", "torn-tail", "truncate", "bitflip", "fsync-eio"),
        (1.0, 4.0),
    ),
    "net": (("all",), ("latency", "reset", "cut-mid-frame"), (2.0, 5.0)),
    "client": (("leader", "all"), ("blackhole", "latency", "reset", "cut-mid-frame"), (2.0, 5.0)),
    "restart": (("rolling",), ("sigterm", "sigkill"), (0.5, 1.5)),
    "transfer": (("leader", "transferee"), ("kill-during-transfer",), (1.0, 3.0)),
    "disk-full": (("leader", "follower", "all"), ("over-ratio", "no-room"), (3.0, 6.0)),
    "slow-disk": (("leader", "follower"), ("fsync-delay",), (4.0, 8.0)),
    # the member set aside joins (a learner, then a voter), and after the step's duration
    # the target is removed, stopped and set aside with its store emptied
    MEMBERSHIP: (("leader", "one"), ("replace",), (1.0, 3.0)),
}
# Kinds a run injects only when asked (--faults): a full disk needs each store on a
# filesystem of its own (root, to mount it), a slow one strace attached to a broker.
ON_REQUEST = frozenset({"disk-full", "slow-disk"})
# disk-full over-ratio: the ballast leaves this share of the filesystem free, over the
# brokers' diskSpaceWarningLevelRatio (90); no-room leaves nothing.
OVER_RATIO_FREE = 0.04
SLOW_FSYNC_MS = (20, 50, 100)
# Classic master/slave only: the master's machine gone for good (SIGKILL, never
# restarted, its disk counted lost); nothing promotes the slave. slave-cut-off first
# blackholes the HA link for the duration, so the slave falls behind.
LOSE_MASTER = {"lose-master": (("leader",), ("sigkill", "slave-cut-off"), (1.0, 3.0))}
# The kinds each topology takes: a classic group has no peer links to cut and no
# DLedger log to damage, so its faults act on processes and client links.
TOPOLOGY_KINDS: dict[str, tuple[str, ...]] = {
    "dledger": tuple(KINDS),
    "ms-sync": ("kill", "pause", "restart", "client", *LOSE_MASTER),
    "ms-async": ("kill", "pause", "restart", "client", *LOSE_MASTER),
    # a DLedger group over a classic store: its stores are not tmpfs, which disk-full needs
    "upgraded": tuple(kind for kind in KINDS if kind not in ("disk-full", MEMBERSHIP)),
    "controller": ("kill", "pause", "partition", "restart", "disk", "slow-disk", *LOSE_MASTER),
    "controller-async": (
        "kill",
        "pause",
        "partition",
        "restart",
        "disk",
        "slow-disk",
        *LOSE_MASTER,
    ),
}
DEFAULT_FAULTS = {
    "dledger": ("kill", "pause", "partition", "disk"),
    "ms-sync": ("kill", "pause", "restart"),
    "ms-async": ("kill", "pause", "restart"),
    "upgraded": ("kill", "pause", "partition"),
    "controller": ("kill", "pause", "partition", "restart", "disk", "lose-master"),
    "controller-async": ("kill", "pause", "partition", "restart", "disk", "lose-master"),
}
# A controller-mode group's own targets and variants, instead of KINDS': faults on the
# brokers (the master is the "leader") and on the controllers; its peer links are the
# brokers' to the controllers, the controllers' to each other and the slaves' to each
# broker's HA listener. A classic store keeps
# no record of what it fsynced, so its disk faults are fsync failures. A lost master
# cut off from its slaves first (`slave-cut-off`) must be killed before it notices (4 s
# without an ack), or its set shrinks to itself and no other may be elected.
CONTROLLER_TARGETS = {
    "kill": ("leader", "one", "all", "controller-leader", "controller-one"),
    "pause": ("leader", "one", "controller-leader", "controller-one"),
    "partition": (
        "master-from-controllers",
        "master-from-slaves",
        "isolate-controller-leader",
        "isolate-controller-one",
    ),
}
CONTROLLER_VARIANTS = {"disk": ("fsync-eio",), "lose-master": ("sigkill", "slave-cut-off")}
TOPOLOGY_TARGETS = {"controller": CONTROLLER_TARGETS, "controller-async": CONTROLLER_TARGETS}
TOPOLOGY_VARIANTS = {"controller": CONTROLLER_VARIANTS, "controller-async": CONTROLLER_VARIANTS}
# Damage to synced data (or fsync failing) is survivable on a minority only.
MINORITY_ONLY = {"truncate", "bitflip", "fsync-eio"}
QUIET_S = (2.0, 4.0)
# lose-master in a controller-mode group: how long it waits for the slaves to be in sync
IN_SYNC_WAIT_S = 10.0


@attrs.frozen
class Step:
    at_s: float  # after the workload starts
    kind: str
    target: str
    variant: str
    duration_s: float
    seed: int  # for the choices made while playing it (which node, how many bytes)


def targets_for(kind: str, nodes: int, topology: str = "dledger") -> tuple[str, ...]:
    targets = TOPOLOGY_TARGETS.get(topology, {}).get(kind) or (KINDS | LOSE_MASTER)[kind][0]
    if nodes < 5:  # a ring of 3 is full connectivity
        targets = tuple(t for t in targets if t != "ring")
    if nodes < 3:  # a master and its slave: no minority but none, no majority but all
        targets = tuple(t for t in targets if t not in ("minority", "majority"))
    return targets


def variants_for(kind: str, topology: str = "dledger") -> tuple[str, ...]:
    return TOPOLOGY_VARIANTS.get(topology, {}).get(kind) or (KINDS | LOSE_MASTER)[kind][1]


def plan(
    seed: int, kinds: list[str], time_limit_s: float, nodes: int, topology: str = "dledger"
) -> list[Step]:
    """The schedule for `seed`: faults separated by quiet gaps until `time_limit_s`.
    `lose-master` ends a classic master for good, so it comes once, last: the other
    kinds fill the first three quarters of the run."""
    unknown = sorted(set(kinds) - set(KINDS) - set(LOSE_MASTER))
    if unknown:
        known = ", ".join([*KINDS, *LOSE_MASTER])
        raise ValueError(f"unknown fault kinds {unknown}; known: {known}")
    rng = random.Random(seed)
    others = [kind for kind in kinds if kind not in LOSE_MASTER]
    if len(others) == len(kinds):
        return _faults(rng, kinds, time_limit_s, nodes, topology)
    lose_at_s = round(time_limit_s * 0.75, 2)
    steps = _faults(rng, others, lose_at_s - QUIET_S[0], nodes, topology) if others else []
    _, _, (low, high) = LOSE_MASTER["lose-master"]
    variants = variants_for("lose-master", topology)
    variant, duration_s = rng.choice(variants), round(rng.uniform(low, high), 2)
    seed = rng.randrange(1 << 32)
    return [*steps, Step(lose_at_s, "lose-master", "leader", variant, duration_s, seed)]


def _faults(
    rng: random.Random, kinds: list[str], time_limit_s: float, nodes: int, topology: str
) -> list[Step]:
    steps: list[Step] = []
    t = rng.uniform(*QUIET_S)
    while True:
        kind = rng.choice(kinds)
        _, _, (low, high) = KINDS[kind]
        variant = rng.choice(variants_for(kind, topology))
        target = rng.choice(targets_for(kind, nodes, topology))
        if variant in MINORITY_ONLY:
            target = rng.choice(("leader", "one"))
        duration = round(rng.uniform(low, high), 2)
        if t + duration > time_limit_s:
            return steps
        steps.append(Step(round(t, 2), kind, target, variant, duration, rng.randrange(1 << 32)))
        t += duration + rng.uniform(*QUIET_S)


class Nemesis:
    """Plays steps against `cluster` and records each fault's start and stop."""

    def __init__(self, cluster: JepsenCluster, history: Recorder) -> None:
        self.cluster = cluster
        self.history = history
        # the group's members (a member set aside for the membership fault is not one)
        self.nodes = [node for node in cluster.ids if node not in cluster.out]
        self.started_with = sorted(self.nodes)
        self.quorum = len(self.nodes) // 2 + 1
        self.controllers = list(cluster.controllers)
        self.injected: list[dict] = []  # what each step actually did, for the report
        # Process errors (a node that would not restart, a wrong exit status): each fails the run.
        self.errors: list[str] = []
        self.active: str | None = None  # for the progress line
        self.lost: set[str] = set()  # members gone for good (lose-master): never restarted
        self._ids = 0

    async def run(self, steps: list[Step], started_at: float, time_limit_s: float) -> None:
        """Play the steps at their times; a step whose time has come after the time
        limit (slow restarts delay the rest) is not started."""
        for step in steps:
            await trio.sleep_until(started_at + step.at_s)
            if trio.current_time() - started_at >= time_limit_s:
                return
            await self.play(step)

    async def play(self, step: Step) -> None:
        rng = random.Random(step.seed)
        self._ids += 1
        fault_id = self._ids
        handler = getattr(self, "_" + step.kind.replace("-", "_"))
        self.active = f"{step.kind}:{step.variant} {step.target}"
        try:
            await handler(step, rng, fault_id)
        finally:
            self.active = None

    # ------------------------------------------------------------------ recording
    def _start(self, fault_id, step, targets, detail, majority_ok) -> None:
        self.history.fault(step.kind, "start", targets, detail, majority_ok, fault_id)
        self.injected.append(
            {"id": fault_id, "kind": step.kind, "variant": step.variant, "targets": targets,
             "detail": detail, "majority_ok": majority_ok}
        )  # fmt: skip

    def _stop(self, fault_id, step, targets, detail="healed") -> None:
        self.history.fault(step.kind, "stop", targets, detail, True, fault_id)

    # ------------------------------------------------------------------ targets
    async def _leader_or_any(self, rng: random.Random) -> str:
        return await self.cluster.leader() or rng.choice(self.nodes)

    async def _nodes(self, target: str, rng: random.Random) -> list[str]:
        n = len(self.nodes)
        if target == "controller-leader":
            return [await self._controller_leader_or_any(rng)]
        if target == "controller-one":
            return [rng.choice(self.controllers)]
        if target == "leader":
            return [await self._leader_or_any(rng)]
        if target == "one":
            return [rng.choice(self.nodes)]
        if target == "minority":
            return sorted(rng.sample(self.nodes, (n - 1) // 2))
        if target == "majority":
            return sorted(rng.sample(self.nodes, self.quorum))
        if target == "follower":
            leader = await self.cluster.leader()
            return [rng.choice([n for n in self.nodes if n != leader])]
        return list(self.nodes)

    async def _controller_leader_or_any(self, rng: random.Random) -> str:
        return await self.cluster.controller_leader() or rng.choice(self.controllers)

    def _majority_ok(self, targets: list[str]) -> bool:
        """Whether a majority of the brokers, and of the controllers, is left."""
        brokers = [t for t in targets if t in self.nodes]
        controllers = [t for t in targets if t in self.controllers]
        return (
            len(self.nodes) - len(brokers) >= self.quorum
            and len(self.controllers) - len(controllers) >= len(self.controllers) // 2 + 1
        )

    # ------------------------------------------------------------------ process faults
    async def _kill(self, step: Step, rng: random.Random, fault_id: int) -> None:
        targets = await self._nodes(step.target, rng)
        majority_ok = self._majority_ok(targets)
        self._start(fault_id, step, targets, f"SIGKILL {step.target}", majority_ok)
        self.cluster.crash(targets)
        await trio.sleep(step.duration_s)
        detail = await self.restart_all(targets)
        self._stop(fault_id, step, targets, detail)

    async def _pause(self, step: Step, rng: random.Random, fault_id: int) -> None:
        targets = await self._nodes(step.target, rng)
        majority_ok = self._majority_ok(targets)
        self._start(fault_id, step, targets, f"SIGSTOP {step.target}", majority_ok)
        for node in targets:
            self.cluster.pause(node)
        await trio.sleep(step.duration_s)
        for node in targets:
            self.cluster.resume(node)
        self._stop(fault_id, step, targets, "SIGCONT")

    async def _lose_master(self, step: Step, rng: random.Random, fault_id: int) -> None:
        """A master lost for good, with the slave's lag (the master's own
        account, `slaveFallBehindBytes`) just before: an ASYNC_MASTER loses at most
        what its slave had not received, a SYNC_MASTER nothing it answered SEND_OK.

        `slave-cut-off`: the HA link is blackholed for the step's duration first (the
        master goes on taking sends), and reset as the master dies, so what the link
        held never arrives: the slave is left as far behind as the cut made it."""
        if self.controllers:
            # A controller elects from the SyncStateSet only: the master lost is one whose
            # slaves are back in it (else nothing may replace it, and the group waits).
            await self._until_in_sync()
        master = await self.cluster.leader()
        if master is None or master in self.lost:
            self._start(fault_id, step, [], "skipped: no master to lose", True)
            self._stop(fault_id, step, [], "skipped")
            return
        net = self.cluster.net
        assert net is not None
        ha_links = self.cluster.ha_links(master)
        cut = step.variant == "slave-cut-off"
        detail = f"SIGKILL {master} for good"
        if cut:
            detail = f"HA link cut for {step.duration_s:g} s, then SIGKILL {master} for good"
        self._start(fault_id, step, [master], detail, False)
        if cut:
            for src, dst in ha_links:
                net.one_way(src, dst)
            await trio.sleep(step.duration_s)
        try:
            lag = (await self.cluster.member_state(master)).get("slaveFallBehindBytes", "?")
        except (OSError, ValueError, KeyError):
            lag = "?"
        self.cluster.crash([master])
        self.lost.add(master)
        self.injected[-1]["slave_behind_bytes"] = lag
        if cut:
            net.reset(ha_links)
            await trio.sleep(0.1)
            net.heal()
        else:
            await trio.sleep(step.duration_s)
        self._stop(fault_id, step, [master], f"not restarted; slave was {lag} bytes behind")

    async def _restart(self, step: Step, rng: random.Random, fault_id: int) -> None:
        """Rolling restart: one node at a time, waiting for a master in between."""
        sig = signal.SIGTERM if step.variant == "sigterm" else signal.SIGKILL
        order = list(self.nodes)
        rng.shuffle(order)
        self._start(fault_id, step, order, f"rolling {step.variant}", True)
        details = []
        for node in order:
            self.cluster.kill(node, sig)
            await trio.sleep(step.duration_s)
            details.append(await self.restart_all([node]))
            with trio.move_on_after(10):
                await self.cluster.wait_master()
        self._stop(fault_id, step, order, "; ".join(details))

    def changed(self) -> bool:
        """Whether a membership change was attempted."""
        return any(fault["kind"] == MEMBERSHIP for fault in self.injected)

    async def _membership(self, step: Step, rng: random.Random, fault_id: int) -> None:
        """Replace a member (the leader, or any): the member set aside is started as a
        learner and added (`mqadmin addDLedgerPeer`'s two changes), then, after the
        step's duration, the target is removed (`removeDLedgerPeer`; a leader hands
        over), stopped and set aside with its store emptied. Each change is recorded
        with its history times; one that fails is a process error."""
        [old] = await self._nodes(step.target, rng)
        [new] = sorted(self.cluster.out)
        self._start(fault_id, step, [new, old], f"add {new}, then remove {old}", True)
        changes = self.injected[-1]["changes"] = []
        notes = []
        for change, member in (("add", new), ("remove", old)):
            start = self.history.elapsed()
            try:
                if change == "add":
                    await self.cluster.add_member(member)
                    self.nodes.append(member)
                else:
                    await self.cluster.remove_member(member)
                    self.nodes.remove(member)
            except (OSError, MQClientError, trio.TooSlowError, RefusedToStart) as exc:
                self.errors.append(f"{change} {member} failed: {exc}")
                notes.append(f"{change} {member} failed")
                break  # the configuration is not what a second change expects
            changes.append(
                {"change": change, "member": member, "start": start, "end": self.history.elapsed()}
            )
            took_s = changes[-1]["end"] - start
            notes.append(f"{member} {'added' if change == 'add' else 'removed'} in {took_s:.2f} s")
            if change == "add":
                await trio.sleep(step.duration_s)
        self._stop(fault_id, step, [new, old], "; ".join(notes))

    async def restart_all(self, nodes: list[str]) -> str:
        """Start each node; one that refuses its store is rebuilt from its peers (its log
        wiped, its term and vote kept) — what an operator does with a damaged disk. A
        node that fails to start otherwise is a finding: recorded in `errors`, left
        down (heal_all tries again at the end), and the run goes on."""
        notes = []
        for node in nodes:
            if self.cluster.running(node) or node in self.lost:
                continue
            try:
                try:
                    await self.cluster.start(node)
                    notes.append(f"{node} restarted")
                except RefusedToStart as exc:
                    if not exc.disk:
                        raise
                    disk.wipe_log(self.cluster.log_dir(node))
                    await self.cluster.start(node)
                    notes.append(f"{node} refused its store (clean), rebuilt from peers")
            except RefusedToStart as exc:
                self.errors.append(str(exc))
                notes.append(f"{node} failed to start")
        return "; ".join(notes) or "nothing to restart"

    async def _transfer(self, step: Step, rng: random.Random, fault_id: int) -> None:
        """Ask the leader to hand leadership to a random follower (DLedger's
        LEADERSHIP_TRANSFER) and SIGKILL the leader or the transferee a few
        milliseconds later, while the hand-over is under way."""
        leader = await self._leader_or_any(rng)
        transferee = rng.choice([n for n in self.nodes if n != leader])
        victim = leader if step.target == "leader" else transferee
        delay_s = rng.uniform(0.0, 0.05)
        detail = f"{leader} -> {transferee}, SIGKILL {victim} after {delay_s * 1000:.0f} ms"
        self._start(fault_id, step, [victim], detail, True)
        outcome = ["transfer not answered"]

        async def transfer() -> None:
            client = DLedgerClient(
                self.cluster.broker_name, {leader: self.cluster.peer_addrs[leader]}, 2.0
            )
            with trio.move_on_after(3.0):
                try:
                    async with client:
                        await client.leadership_transfer(leader, transferee)
                    outcome[0] = "transfer done"
                except (ClientError, OSError) as exc:  # RpcUnavailable/RpcTimeout are OSErrors
                    outcome[0] = f"transfer failed: {exc}"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(transfer)
            await trio.sleep(delay_s)
            self.cluster.crash([victim])
        await trio.sleep(step.duration_s)
        restarted = await self.restart_all([victim])
        self._stop(fault_id, step, [victim], f"{outcome[0]}; {restarted}")

    # ------------------------------------------------------------------ disk faults
    async def _disk(self, step: Step, rng: random.Random, fault_id: int) -> None:
        targets = await self._nodes(step.target, rng)
        if step.variant == "fsync-eio":
            await self._fsync_eio(step, rng, fault_id, targets[0])
            return
        majority_ok = len(self.nodes) - len(targets) >= self.quorum
        self._start(fault_id, step, targets, f"{step.variant} {step.target}", majority_ok)
        reports = {}
        self.cluster.crash(targets)
        for node in targets:
            log_dir = self.cluster.log_dir(node)
            if step.variant in ("truncate", "bitflip"):
                reports[node] = disk.corrupt(log_dir, rng, step.variant)
            else:
                lost = disk.lose_unsynced(log_dir, rng, torn=step.variant == "torn-tail")
                reports[node] = {
                    "files": len(lost),
                    "bytes_lost": sum(
                        f["written"] - f["synced"] - f["kept"] for f in lost.values()
                    ),
                    "queue_entries_lost": disk.lose_unsynced_queues(
                        self.cluster.store_dir(node), rng
                    ),
                }
        await trio.sleep(step.duration_s)
        detail = await self.restart_all(targets)
        self.injected[-1]["disk"] = reports
        self._stop(fault_id, step, targets, detail)

    async def _fsync_eio(self, step: Step, rng: random.Random, fault_id: int, node: str) -> None:
        if not self.cluster.strace_available():
            self._start(fault_id, step, [node], "skipped: strace not installed", True)
            self._stop(fault_id, step, [node], "skipped")
            return
        after = rng.randint(5, 200)
        self._start(fault_id, step, [node], f"fsync EIO from call {after}", True)
        self.cluster.start_failing_fsync(node, after)
        await trio.sleep(step.duration_s)
        status = self.cluster.exit_status(node)
        self.cluster.kill(node)
        outcome = "still running" if status is None else f"exited with status {status}"
        self.injected[-1]["exit_status"] = status
        if status not in (None, EXIT_DISK):
            self.errors.append(f"{node} under fsync EIO {outcome}, not {EXIT_DISK}")
        detail = await self.restart_all([node])
        self._stop(fault_id, step, [node], f"{outcome}; {detail}")

    async def _disk_full(self, step: Step, rng: random.Random, fault_id: int) -> None:
        """Fill the stores' filesystems of `targets` with a ballast file (over the
        brokers' diskSpaceWarningLevelRatio, or to the last byte), hold, delete it.
        A full leader refuses sends (DISK_FULL, SERVICE_NOT_AVAILABLE to clients) and a
        full follower stops acknowledging, so only a full follower leaves progress. No
        broker may stop over it: one that did is a process error."""
        targets = await self._nodes(step.target, rng)
        if not self.cluster.mounted:
            self._start(fault_id, step, targets, "skipped: the stores are not mounted", True)
            self._stop(fault_id, step, targets, "skipped")
            return
        ballast = {}
        for node in targets:
            store = self.cluster.store_dir(node)
            st = os.statvfs(store)
            leave = int(st.f_blocks * st.f_frsize * OVER_RATIO_FREE)
            leave = leave if step.variant == "over-ratio" else 0
            ballast[node] = disk.fill(store, leave)
        sizes = ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in ballast.items())
        detail = f"{step.variant}: ballast {sizes}"
        self._start(fault_id, step, targets, detail, step.target == "follower")
        self.injected[-1]["ballast_bytes"] = ballast
        await trio.sleep(step.duration_s)
        for node in targets:
            disk.free(self.cluster.store_dir(node))
        exited = [n for n in targets if not self.cluster.running(n)]
        for node in exited:
            status = self.cluster.exit_status(node)
            self.errors.append(f"{node} exited with status {status} while its disk was full")
        detail = "ballast deleted"
        if exited:
            detail += "; " + await self.restart_all(exited)
        self._stop(fault_id, step, targets, detail)

    async def _slow_disk(self, step: Step, rng: random.Random, fault_id: int) -> None:
        """Delay every fsync of one broker (the leader's, or a follower's) by tens of
        milliseconds for the fault's duration, with strace attached to it."""
        [node] = await self._nodes(step.target, rng)
        if not self.cluster.strace_available():
            self._start(fault_id, step, [node], "skipped: strace not installed", True)
            self._stop(fault_id, step, [node], "skipped")
            return
        delay_ms = rng.choice(SLOW_FSYNC_MS)
        detail = f"fsync +{delay_ms} ms on {step.target} {node}"
        self._start(fault_id, step, [node], detail, True)
        self.injected[-1]["fsync_delay_ms"] = delay_ms
        self.cluster.slow_fsync(node, delay_ms)
        await trio.sleep(step.duration_s)
        delayed = self.cluster.stop_slowing_fsync(node)
        self.injected[-1]["fsyncs_delayed"] = delayed
        self._stop(fault_id, step, [node], f"strace detached after delaying {delayed} fsyncs")

    # ------------------------------------------------------------------ network faults
    async def _partition(self, step: Step, rng: random.Random, fault_id: int) -> None:
        net = self.cluster.net
        assert net is not None
        if step.target == "one-way-leader":
            leader = await self._leader_or_any(rng)
            others = [n for n in self.nodes if n != leader]
            self._start(fault_id, step, [leader], f"{leader} cannot reach {others}", True)
            for other in others:
                net.one_way(leader, other)
            targets = [leader]
        elif step.target in CONTROLLER_TARGETS["partition"]:
            if step.target == "master-from-slaves":  # in sync first, or the cut may not bite
                await self._until_in_sync()
            grudge = await self._controller_grudge(step.target, rng)
            targets = sorted(n for n, dropped in grudge.items() if dropped)
            self._start(fault_id, step, targets, partitions.describe(grudge), True)
            self.injected[-1]["sync_state_set"] = [await self._sync_state_set()]
            net.apply(grudge)
        else:
            grudge = await self._grudge(step.target, rng)
            targets = sorted(n for n, dropped in grudge.items() if dropped)
            majority_ok = partitions.majority_connected(self.nodes, grudge)
            self._start(fault_id, step, targets, partitions.describe(grudge), majority_ok)
            net.apply(grudge)
        await trio.sleep(step.duration_s)
        detail = "healed"
        if step.target in CONTROLLER_TARGETS["partition"]:
            before_heal = await self._sync_state_set()
            self.injected[-1]["sync_state_set"].append(before_heal)
            detail = f"healed; SyncStateSet before: {before_heal}"
        net.heal()
        self._stop(fault_id, step, targets, detail)

    async def _until_in_sync(self) -> None:
        """Until every broker not lost is in the master's SyncStateSet, IN_SYNC_WAIT_S
        at most."""
        with trio.move_on_after(IN_SYNC_WAIT_S):
            await self.cluster.wait_in_sync(len(set(self.nodes) - self.lost))

    async def _sync_state_set(self) -> str:
        """The master's SyncStateSet (brokerIds), as it reports it, "n0's {1,2}"; "?" when
        none answers. A controller partition records it as it begins and ends."""
        master = await self.cluster.leader()
        if master is None:
            return "?"
        try:
            members = (await self.cluster.member_state(master))["syncStateSet"]
        except (OSError, ValueError, KeyError):
            return "?"
        return f"{master}'s {{{members}}}"

    async def _controller_grudge(self, target: str, rng: random.Random) -> dict[str, set[str]]:
        """A controller-mode group's partitions: the master cut from every controller
        (the brokers still reach each other), or from its slaves (their HA links), or
        one controller (the leader, or any) cut from the other controllers and from
        the brokers."""
        if target == "master-from-controllers":
            return {await self._leader_or_any(rng): set(self.controllers)}
        if target == "master-from-slaves":  # its HA listener (`SLAVES`' links)
            return {await self._leader_or_any(rng): {SLAVES}}
        if target == "isolate-controller-leader":
            cut = await self._controller_leader_or_any(rng)
        else:
            cut = rng.choice(self.controllers)
        return {cut: {n for n in [*self.nodes, *self.controllers] if n != cut}}

    async def _grudge(self, target: str, rng: random.Random) -> dict[str, set[str]]:
        if target == "isolate-leader":
            return partitions.isolate(self.nodes, await self._leader_or_any(rng))
        if target == "isolate-one":
            return partitions.isolate(self.nodes, rng.choice(self.nodes))
        if target == "halves":
            return partitions.halves(self.nodes, rng)
        if target == "ring":
            return partitions.majorities_ring(self.nodes, rng)
        return partitions.bridge(self.nodes, rng)

    async def _net(self, step: Step, rng: random.Random, fault_id: int) -> None:
        net = self.cluster.net
        assert net is not None
        links = list(self.cluster.peer_links())
        if step.variant == "latency":
            ms = rng.choice((20, 50, 100))
            self._start(fault_id, step, self.nodes, f"latency {ms}±{ms // 2} ms", True)
            net.set_latency(ms, ms // 2)
        elif step.variant == "reset":
            self._start(fault_id, step, self.nodes, "reset every peer connection", False)
            net.reset(links)
        else:
            node = rng.choice(self.nodes)
            links = [link for link in links if link[0] == node]
            nbytes = rng.randint(1, 4096)
            self._start(fault_id, step, [node], f"cut {node}'s links after {nbytes} B", True)
            cuts_before = net.cuts(links)
            net.cut_after(links, nbytes)
        await trio.sleep(step.duration_s)
        detail = "healed"
        if step.variant == "cut-mid-frame":
            detail = self._record_cuts(net.cuts(links) - cuts_before)
        net.heal()
        self._stop(fault_id, step, self.nodes, detail)

    async def _client(self, step: Step, rng: random.Random, fault_id: int) -> None:
        """Faults on the links from producers and consumers to the leader's broker or to
        every broker; the group itself sees nothing. A blackhole or a reset stops the
        clients of the nodes it hits (they stay master or slave), so those two are not
        expected to leave progress; latency and a single cut are."""
        clients = self.cluster.clients
        assert clients is not None
        targets = await self._nodes(step.target, rng)
        links = [(CLIENT, node) for node in targets]
        if step.variant == "blackhole":
            self._start(fault_id, step, targets, f"clients cut off {targets}", False)
            clients.apply({CLIENT: set(targets)})
        elif step.variant == "latency":
            ms = rng.choice((20, 50, 100))
            self._start(fault_id, step, targets, f"client latency {ms}±{ms // 2} ms", True)
            clients.set_latency(ms, ms // 2, links)
        elif step.variant == "reset":
            self._start(fault_id, step, targets, "reset and refuse client connections", False)
            clients.reset(links)
        else:
            nbytes = rng.randint(1, 4096)
            self._start(fault_id, step, targets, f"cut client requests after {nbytes} B", True)
            cuts_before = clients.cuts(links)
            clients.cut_after(links, nbytes)
        await trio.sleep(step.duration_s)
        detail = "healed"
        if step.variant == "cut-mid-frame":
            detail = self._record_cuts(clients.cuts(links) - cuts_before)
        clients.heal()
        self._stop(fault_id, step, targets, detail)

    def _record_cuts(self, cut: int) -> str:
        """A cut bites only if a frame crosses a link while it is armed: say whether one did."""
        self.injected[-1]["cut_connections"] = cut
        if not cut:
            return "healed; no frame crossed the links, nothing was cut"
        return f"healed; {cut} connection(s) cut inside a frame"

    # ------------------------------------------------------------------ healing
    async def heal_all(self) -> str:
        """Undo everything: links healed, paused nodes resumed, disks emptied and at
        full speed, dead nodes started."""
        for net in (self.cluster.net, self.cluster.clients):
            if net is not None:
                net.heal()
        for node in list(self.cluster.slowing):
            self.cluster.stop_slowing_fsync(node)
        for store in self.cluster.mounted:
            disk.free(store)
        processes = [*self.nodes, *self.controllers]
        for node in processes:
            self.cluster.resume(node)
        return await self.restart_all(processes)
