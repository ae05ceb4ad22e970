"""Raft's safety properties, checked after every simulated event.

Election safety (one leader per term), log matching (equal terms at an index mean
equal logs up to it, checked through chainCrc), leader completeness (a leader holds
every entry committed in an earlier term), state-machine safety (no two replicas
commit different entries at one index) and, the property users care about, every
acknowledged append is in the log of every leader of a later term.

"Earlier" is Raft's own statement of leader completeness: a candidate that collected
its votes in term T and was paused before counting them may lead T long after later
terms committed entries it lacks. Such a leader is stale, not unsafe: every quorum
has moved past T, so it can commit nothing and steps down at the first answer.
"""

from __future__ import annotations

from raftmq.dledger.codes import Code, Role


class InvariantViolation(AssertionError):
    pass


class Checker:
    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.leaders_by_term: dict[int, str] = {}
        self.committed_chains: dict[int, int] = {}  # index -> chainCrc, across all replicas
        # index -> the lowest term a replica was in when it saw the index committed
        self.committed_terms: dict[int, int] = {}
        self._seen_commit: dict[str, int] = {}  # node -> committed index at its last check
        self.reported_commit: dict[str, int] = {}
        self.acked: dict[int, tuple[int, int]] = {}  # handle -> (index, chainCrc)
        self.outcomes: dict[int, Code] = {}
        self.leader_changes = 0

    def _fail(self, what: str) -> None:
        raise InvariantViolation(f"t={self.cluster.now_ms:.1f}ms: {what}")

    # ------------------------------------------------------------------ events
    def role_changed(self, node_id: str, term: int, role: Role) -> None:
        if role is not Role.LEADER:
            return
        other = self.leaders_by_term.get(term)
        if other is not None and other != node_id:
            self._fail(f"two leaders in term {term}: {other} and {node_id}")
        self.leaders_by_term[term] = node_id
        self.leader_changes += 1
        store = self.cluster.nodes[node_id].store
        for index, chain in self.committed_chains.items():
            if self._committed_before(index, term) and not self._holds(store, index, chain):
                self._fail(f"leader {node_id} of term {term} lacks committed index {index}")
        for handle, (index, chain) in self.acked.items():
            if self._committed_before(index, term) and not self._holds(store, index, chain):
                self._fail(
                    f"leader {node_id} of term {term} lacks acknowledged append {handle} at {index}"
                )

    def committed(self, node_id: str, index: int) -> None:
        store = self.cluster.nodes[node_id].store
        start = self.reported_commit.get(node_id, -1) + 1
        for i in range(max(start, store.begin_index), index + 1):
            chain = store.chain_at(i)
            known = self.committed_chains.setdefault(i, chain)
            if known != chain:
                self._fail(f"{node_id} committed a different entry at index {i}")
        self.reported_commit[node_id] = index

    def crashed(self, node_id: str) -> None:
        self.reported_commit.pop(node_id, None)
        self._seen_commit.pop(node_id, None)

    def completed(self, node_id: str, handle: int, code: Code, positions) -> None:
        if handle not in self.cluster.appends:
            return  # an admin request (a leadership transfer), not a client append
        self.outcomes[handle] = code
        if code is not Code.SUCCESS:
            return
        index = positions[-1][0]
        store = self.cluster.nodes[node_id].store
        if store.get(index).body != self.cluster.appends[handle]:
            self._fail(f"append {handle} acknowledged at {index}, which holds another body")
        self.acked[handle] = (index, store.chain_at(index))

    # ------------------------------------------------------------------ after every event
    def check(self, node) -> None:
        """After `node` handled an event: only its log can have changed."""
        for other in self.cluster.nodes.values():
            if other is not node and other.alive:
                self._check_matching(node, other)
        r, store = node.replica, node.store
        if r.role is Role.LEADER and r.committed_index > self._seen_commit.get(node.id, -1):
            self._check_commit_quorum(node)
        self._note_commit_terms(node.id, r, store)
        if r.committed_index > store.end_index:
            self._fail(f"{node.id} committed {r.committed_index} beyond its end {store.end_index}")
        committed = r.committed_index
        if committed >= store.begin_index:
            known = self.committed_chains.get(committed)
            if known is not None and known != store.chain_at(committed):
                self._fail(f"{node.id} changed committed entry {committed}")

    def _check_commit_quorum(self, leader) -> None:
        """A leader's commit index just moved: a quorum of the voters of its configuration
        holds the entry there (a removed member or a learner never counts)."""
        if self.cluster.variant.ack_before_fsync:
            return  # acks of entries a crash then took: that control's failure is elsewhere
        r = leader.replica
        index = r.committed_index
        chain = leader.store.chain_at(index)
        holders = [
            n
            for n in r.members.current.voters
            if self._holds(self.cluster.nodes[n].store, index, chain)
        ]
        if not r.members.current.is_quorum(holders):
            self._fail(
                f"leader {leader.id} committed {index} held by {holders} only, "
                f"not a quorum of voters {r.members.current.voters}"
            )

    def _note_commit_terms(self, node_id: str, replica, store) -> None:
        """Read from the replica itself, not from its (possibly held back) outputs, so the
        term is the one it was in when the index became committed."""
        seen = self._seen_commit.get(node_id, -1)
        committed, term = replica.committed_index, replica.term
        for i in range(max(seen + 1, store.begin_index), committed + 1):
            if self.committed_terms.get(i, term) >= term:
                self.committed_terms[i] = term
        self._seen_commit[node_id] = committed

    def _committed_before(self, index: int, term: int) -> bool:
        """Committed in a term before `term` (not known yet: assume so, the stricter check)."""
        return self.committed_terms.get(index, -1) < term

    def _check_matching(self, a, b) -> None:
        sa, sb = a.store, b.store
        i = min(sa.end_index, sb.end_index)
        low = max(sa.begin_index, sb.begin_index)
        while i >= low and sa.term_at(i) != sb.term_at(i):
            i -= 1
        if i >= low and sa.chain_at(i) != sb.chain_at(i):
            self._fail(f"log matching: {a.id} and {b.id} agree on the term at {i} but not the log")

    @staticmethod
    def _holds(store, index: int, chain: int) -> bool:
        """The entry at `index` is in `store`, or below its beginning: retention deleted
        it, which deletes only entries committed and applied (an application's state, or
        the snapshot a follower restarted past them installed, holds them)."""
        if index < store.begin_index:
            return True
        return index <= store.end_index and store.chain_at(index) == chain

    # ------------------------------------------------------------------ at the end
    def check_final(self) -> None:
        """After healing and converging: every live member holds every acknowledged append."""
        for node in (self.cluster.nodes[n] for n in self.cluster.members()):
            if not node.alive:
                continue
            for handle, (index, chain) in self.acked.items():
                if not self._holds(node.store, index, chain):
                    self._fail(f"{node.id} lacks acknowledged append {handle} at index {index}")
