"""The group's members: who votes, who only follows (a learner), and where each listens.

A configuration travels through the log as a NOOP entry whose body is `MEMBERS_PREFIX`
and the configuration's text, so the on-disk and wire entry format stays DLedger's
(DLedger writes NOOPs with an empty body; a reader that skips NOOPs, as the broker's
dispatch and DLedger do, skips configurations too). Each entry holds the whole
configuration, not a delta, so a member that receives only the latest one knows it all.

The scheme is Raft's single-step change (etcd-raft's, and the Raft dissertation's
section 4.1): one voter added or removed per entry, which keeps any quorum of the old
set and any quorum of the new one overlapping, so no joint configuration is needed. A
member uses a configuration as soon as it appends it, not when it commits; the leader
starts no change while the last one is uncommitted, so only the last configuration in
any log can be uncommitted and a truncation goes back at most one configuration
(`MemberState.truncated`).
"""

from __future__ import annotations

import enum

import attrs

from raftmq.config.address import parse_peers

MEMBERS_PREFIX = b"raftmq-members:"


class Change(enum.Enum):
    """An operator's change of one member."""

    ADD_LEARNER = "add"  # joins, replicates, does not vote
    PROMOTE = "promote"  # a caught-up learner becomes a voter
    REMOVE = "remove"  # a voter or a learner leaves


@attrs.frozen(slots=True)
class Members:
    """One configuration: voters and learners in order, each id's address, and the log
    index of the entry that set it (-1: the one the member was started with)."""

    voters: tuple[str, ...]
    learners: tuple[str, ...]
    addresses: tuple[tuple[str, str], ...]
    index: int = -1

    def __attrs_post_init__(self) -> None:
        """ValueError for a configuration no group can have (it may come from a file)."""
        if not self.voters:
            raise ValueError("a configuration needs a voter")
        if not set(self.voters).isdisjoint(self.learners):
            raise ValueError("a member is both a voter and a learner")
        if set(self.voters) | set(self.learners) != set(dict(self.addresses)):
            raise ValueError("every member, and only they, has an address")

    @classmethod
    def initial(cls, peers: dict[str, str], learners: tuple[str, ...] = ()) -> Members:
        """The configuration of `peers` (DLedger's dLegerPeers), `learners` not voting."""
        voters = tuple(p for p in peers if p not in learners)
        return cls(voters, tuple(learners), tuple(peers.items()))

    @property
    def ids(self) -> tuple[str, ...]:
        return self.voters + self.learners

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def address(self, member: str) -> str | None:
        return dict(self.addresses).get(member)

    def is_quorum(self, members) -> bool:
        """Whether `members` (ids, any others ignored) are a quorum of the voters."""
        return len(set(members).intersection(self.voters)) >= self.quorum

    def changed(self, change: Change, member: str, address: str, index: int) -> Members:
        """This configuration with `change` applied, set by the entry at `index`.
        ValueError (the operator's mistake, said in one line) when it does not apply."""
        voters, learners, addresses = list(self.voters), list(self.learners), dict(self.addresses)
        if change is Change.ADD_LEARNER:
            if member in addresses:
                raise ValueError(f"{member} is already a member")
            parse_peers(f"{member}-{address}")  # raises on a bad id or address
            learners.append(member)
            addresses[member] = address
        elif change is Change.PROMOTE:
            if member not in learners:
                raise ValueError(f"{member} is not a learner")
            learners.remove(member)
            voters.append(member)
        else:
            if member not in addresses:
                raise ValueError(f"{member} is not a member")
            if voters == [member]:
                raise ValueError(f"{member} is the last voter")
            (voters if member in voters else learners).remove(member)
            del addresses[member]
        return Members(tuple(voters), tuple(learners), tuple(addresses.items()), index)

    # ------------------------------------------------------------------ text and entries
    def text(self) -> str:
        """`index|voters|learners`, each list in DLedger's peers form (id-host:port;...)."""
        addresses = dict(self.addresses)

        def peers(ids):
            return ";".join(f"{p}-{addresses[p]}" for p in ids)

        return f"{self.index}|{peers(self.voters)}|{peers(self.learners)}"

    @classmethod
    def from_text(cls, text: str) -> Members:
        """Inverse of `text`; ValueError on anything else."""
        index, voters_text, learners_text = text.split("|")
        voters = parse_peers(voters_text)
        learners = parse_peers(learners_text) if learners_text else {}
        return cls(
            tuple(voters), tuple(learners), tuple({**voters, **learners}.items()), int(index)
        )

    def body(self) -> bytes:
        """The body of the NOOP entry that carries this configuration."""
        return MEMBERS_PREFIX + self.text().encode()

    @classmethod
    def from_body(cls, body: bytes, index: int) -> Members | None:
        """The configuration a NOOP's body carries (set by the entry at `index`), or None
        for a plain NOOP."""
        if not body.startswith(MEMBERS_PREFIX):
            return None
        members = cls.from_text(body[len(MEMBERS_PREFIX) :].decode())
        return attrs.evolve(members, index=index)


@attrs.frozen(slots=True)
class MemberState:
    """The configuration in force and the one before it: what a member persists with its
    term and vote. The prior one is committed (the leader changed nothing while it was
    not), so it is where a truncation of the current one's entry goes back to."""

    current: Members
    prior: Members

    def appended(self, members: Members) -> MemberState:
        return MemberState(members, self.current)

    def truncated(self, new_end: int) -> MemberState:
        """What is in force once the log ends at `new_end`."""
        if self.current.index <= new_end:
            return self
        return MemberState(self.prior, self.prior)

    def text(self) -> str:
        return f"{self.current.text()}\n{self.prior.text()}"

    @classmethod
    def from_text(cls, text: str) -> MemberState:
        current, prior = text.split("\n")
        return cls(Members.from_text(current), Members.from_text(prior))
