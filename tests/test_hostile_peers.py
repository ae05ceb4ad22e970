"""Forged peer traffic on the unauthenticated DLedger peer port.

What a stranger who can reach a replica's peer port can do, and what it must not:

- A message naming a sender that is not a configured peer, or a connection that
  changes sender, or (with `checkPeerHosts`) that comes from another host than the
  sender's configured one, is dropped with its connection (`dledger.net.tcp`).
- Whatever passes those checks is still only a peer's word: a TRUNCATE, reset or
  APPEND that would cut a committed entry is refused with INCONSISTENT_LEADER, an
  answer vouching for entries the leader does not hold is ignored, and no sequence of
  messages from members makes a replica raise (a remote-triggered condition is a
  refusal; an assertion is only for what the local code guarantees).
- A forged vote or push against a running group neither makes the forger a leader
  nor loses a committed message, and the group goes on committing.
"""

from __future__ import annotations

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from raftmq.broker.config import load_broker_config
from raftmq.dledger.codes import Code, PushType, Role, VoteResult
from raftmq.dledger.core.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    PushRequest,
    PushResponse,
    VoteRequest,
    VoteResponse,
)
from raftmq.dledger.core.replica import Replica
from raftmq.dledger.net.codec import encode_message
from raftmq.dledger.net.frames import PEER, pack_frame
from raftmq.dledger.net.tcp import PeerTransport
from raftmq.dledger.store.memory import MemoryLogStore

from raftmq.remoting import ResponseCode
from raftmq.tools.dledger_local import free_ports
from tests.helpers import GROUP, create_topic, make_replica, wait_for
from tests.inprocess_broker import InProcessGroup

# ---------------------------------------------------------------- a replica fed by hand


def committed_follower() -> Replica:
    """n1 following n0 in term 1, holding entries 0..2 of term 1, all committed."""
    r = make_replica("n1", term=1, log_terms=(1, 1, 1))
    r.receive(PushRequest(GROUP, "n0", "n1", "n0", 1, PushType.COMPARE, 2, 1, 2), 0.0)
    r.receive(PushRequest(GROUP, "n0", "n1", "n0", 1, PushType.COMMIT, 2, 1, 2), 1.0)
    r.take_output()
    assert r.role is Role.FOLLOWER and r.committed_index == 2
    return r


def follow_forger(r: Replica, forger: str, term: int, now_ms: float) -> None:
    """A push from `forger` in a newer term: the replica adopts the term at its next step."""
    r.receive(
        PushRequest(GROUP, forger, r.self_id, forger, term, PushType.COMMIT, -1, -1, -1), now_ms
    )
    r.tick(now_ms + 1)
    r.take_output()
    assert r.term == term


def push_answers(r: Replica) -> list[PushResponse]:
    return [m for m in r.take_output().messages if isinstance(m, PushResponse)]


def answer_to_forged_push(forger: str, push_type: PushType, pre: int, pre_term: int, **fields):
    """A committed follower that took `forger`'s term 2, and its answer to one push."""
    r = committed_follower()
    follow_forger(r, forger, 2, 2.0)
    push = PushRequest(GROUP, forger, "n1", forger, 2, push_type, pre, pre_term, 2, seq=4, **fields)
    r.receive(push, 4.0)
    [answer] = push_answers(r)
    return r, answer


def test_a_forged_truncate_below_the_commit_index_is_refused_not_asserted():
    r, answer = answer_to_forged_push(
        "n2", PushType.TRUNCATE, 0, 1, term_runs=[(1, 2)], leader_end_index=2
    )
    assert answer.code == Code.INCONSISTENT_LEADER
    assert r.store.end_index == 2 and [r.store.term_at(i) for i in range(3)] == [1, 1, 1]
    assert r.committed_index == 2


def test_a_forged_reset_below_the_commit_index_is_refused_not_asserted():
    r, answer = answer_to_forged_push(
        "n2", PushType.TRUNCATE, 1, 7, term_runs=[(2, 2)], leader_end_index=2, reset_pos=4096
    )
    assert answer.code == Code.INCONSISTENT_LEADER
    assert r.store.begin_index == 0 and r.store.end_index == 2


@pytest.mark.parametrize(
    "members",
    ["not a configuration", "9|n0-h:1|\n9|n0-h:1|", "3|n0-h:1|n0-h:1\n3|n0-h:1|"],
    ids=["garbage", "set-past-the-reset", "voter-and-learner"],
)
def test_a_reset_carrying_a_configuration_no_leader_sends_is_refused(members):
    """A reset's configuration is the leader's at the entry before its beginning: one
    that does not parse, or set by an entry past the reset, is refused before the log
    is touched."""
    r, answer = answer_to_forged_push(
        "n2",
        PushType.TRUNCATE,
        5,
        2,
        term_runs=[(6, 2)],
        leader_end_index=6,
        reset_pos=4096,
        members=members,
    )
    assert answer.code == Code.UNEXPECTED_ARGUMENT
    assert r.store.begin_index == 0 and r.store.end_index == 2
    assert r.members.current.index == -1


def test_a_forged_append_that_disagrees_with_committed_entries_is_refused():
    r, answer = answer_to_forged_push("n2", PushType.APPEND, 1, 2, count=1)
    assert answer.code == Code.INCONSISTENT_STATE
    assert [r.store.term_at(i) for i in range(3)] == [1, 1, 1]


def test_an_append_whose_count_overstates_its_entries_vouches_only_for_what_it_holds():
    """`count` is the peer's word: a push of one entry claiming four, with a commit
    index past it, made the follower vouch for and commit entries it does not hold
    (its commit assertion ended the connection on a peer's bytes)."""
    r = committed_follower()
    source = make_replica("n0", log_terms=(1, 1, 1, 1)).store  # the same entries, and one more
    blob, one = source.read_encoded(3, 1 << 20)
    assert one == 1
    push = PushRequest(GROUP, "n0", "n1", "n0", 1, PushType.APPEND, 2, 1, 6, blob, 4, seq=9)
    r.receive(push, 5.0)
    r.persisted(r.store.end_index, r.store.generation, 6.0)
    [answer] = push_answers(r)
    assert answer.code == Code.SUCCESS and answer.index == 3 == r.store.end_index
    assert r.committed_index == 3


def test_a_truncate_whose_leader_log_ends_before_its_compare_point_is_refused():
    """A reset past our end followed by a cut computed from a log ending before the
    reset point: the store refused the cut with IndexError, out of the replica."""
    r, answer = answer_to_forged_push(
        "n0", PushType.TRUNCATE, 3, 0, leader_end_index=2, reset_pos=0
    )
    assert answer.code == Code.UNEXPECTED_ARGUMENT
    assert r.store.begin_index == 0 and r.store.end_index == 2


def test_votes_from_strangers_do_not_count():
    """Two ACCEPTs from ids outside the group would have been a quorum of three."""
    r = make_replica("n0", term=1, log_terms=(1, 1, 1))
    r.tick(1000.0)
    requests = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    while not requests:
        r.tick(r.next_deadline_ms())
        requests = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    req = requests[0]
    for stranger in ("x1", "x2", "n0"):
        forged = VoteResponse(GROUP, stranger, "n0", None, req.term, VoteResult.ACCEPT, seq=req.seq)
        r.receive(forged, 1001.0)
    assert r.role is Role.CANDIDATE


def test_beats_answered_by_strangers_do_not_hold_a_leaders_lease():
    """A leader that hears only strangers loses its lease as if it heard no one."""
    r = elected_leader()
    now_ms = 1001.0
    while r.role is Role.LEADER and now_ms < 5000.0:
        now_ms += 50.0
        r.tick(now_ms)
        for beat in [m for m in r.take_output().messages if isinstance(m, HeartBeatRequest)]:
            for stranger in ("x1", "x2"):
                answer = HeartBeatResponse(GROUP, stranger, "n0", "n0", r.term, Code.SUCCESS)
                r.receive(attrs.evolve(answer, seq=beat.seq), now_ms)
    assert r.role is not Role.LEADER


@pytest.mark.parametrize("late", [False, True])
def test_answers_read_after_a_pause_renew_no_lease(late):
    """A leader stopped for longer than its lease reads, on waking, its followers'
    answers to the beats it sent before: they prove nothing about now (a newer leader
    may have been elected meanwhile), so they do not renew the lease. Read in time,
    the same answers do."""
    r = elected_leader()
    now_ms = 1001.0
    while not (beats := [m for m in r.take_output().messages if isinstance(m, HeartBeatRequest)]):
        now_ms = r.next_deadline_ms()
        r.tick(now_ms)
    woke = now_ms + (10 * r.lease_ms if late else 1.0)
    for beat in beats:
        answer = HeartBeatResponse(GROUP, beat.remote_id, "n0", "n0", r.term, Code.SUCCESS)
        r.receive(attrs.evolve(answer, seq=beat.seq), woke)
    assert r.holds_lease(woke) is not late
    r.tick(woke)
    assert (r.role is Role.LEADER) is not late


def elected_leader() -> Replica:
    """n0, just elected leader of the 3-peer group with n1's vote, holding 0..2 of term 1."""
    r = make_replica("n0", term=1, log_terms=(1, 1, 1))
    r.persisted(r.store.end_index, r.store.generation, 0.0)
    r.tick(1000.0)
    requests = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    while not requests:  # the first round re-votes in term 1, where we voted for no one
        r.tick(r.next_deadline_ms())
        requests = [m for m in r.take_output().messages if isinstance(m, VoteRequest)]
    req = requests[0]
    r.receive(
        VoteResponse(GROUP, "n1", "n0", None, req.term, VoteResult.ACCEPT, seq=req.seq), 1001.0
    )
    assert r.role is Role.LEADER
    return r  # its output holds the first pushes to each follower


def test_an_answer_vouching_for_entries_the_leader_does_not_hold_is_ignored():
    """Forged SUCCESS answers (claiming index 10**9) to every push: a TRUNCATE's used to
    trip an assertion in the leader, the other answers are only the forger's word."""
    r = elected_leader()
    assert r.append(1, [b"x"], 1100.0) is Code.SUCCESS
    now_ms = 1100.0
    for _ in range(4):
        pushes = [m for m in r.take_output().messages if isinstance(m, PushRequest)]
        for push in pushes:
            forged = PushResponse(
                GROUP, push.remote_id, "n0", "n0", r.term, Code.SUCCESS, push.type,
                10**9, 0, 10**9, seq=push.seq,
            )  # fmt: skip
            r.receive(forged, now_ms)
        now_ms += 1.0
    assert r.role is Role.LEADER
    assert all(p.match_index <= r.store.end_index for p in r.replication.progress.values())


def test_a_compare_answer_claiming_a_log_beginning_past_the_leaders_end_is_ignored():
    """A forged INCONSISTENT_STATE answer to a COMPARE saying the follower's log begins
    at 50: the leader compared there next and read the term of an entry it does not
    hold (IndexError out of the replica, on a peer's bytes)."""
    r = elected_leader()
    [compare] = [
        m for m in r.take_output().messages if isinstance(m, PushRequest) and m.remote_id == "n1"
    ]
    assert compare.type == PushType.COMPARE
    forged = PushResponse(
        GROUP, "n1", "n0", "n0", r.term, Code.INCONSISTENT_STATE, compare.type,
        compare.pre_log_index, 50, 60, seq=compare.seq,
    )  # fmt: skip
    r.receive(forged, 1002.0)
    r.tick(r.next_deadline_ms())
    assert r.role is Role.LEADER
    assert r.replication.progress["n1"].next_index <= r.store.end_index + 1


# Ranges near the replicas' own state, where the checks are.
_ids = st.sampled_from(["n0", "n1", "n2"])
_terms = st.integers(0, 4)
_indexes = st.integers(-1, 7)
_seqs = st.integers(0, 12)
_term_runs = st.lists(st.tuples(st.integers(0, 7), _terms), max_size=3).map(sorted)


def _entries():
    """Encoded DLedger entries (maybe of other terms or positions than ours) or junk."""
    store = MemoryLogStore()
    for n, t in enumerate((1, 1, 2, 2, 3, 3)):
        store.append_leader(t, [(1, f"f{n}".encode())])
    blobs = [store.read_encoded(i, 1 << 20)[0] for i in range(6)]
    return st.one_of(st.sampled_from(blobs), st.binary(max_size=64))


_messages = st.one_of(
    st.builds(VoteRequest, st.just(GROUP), _ids, _ids, _ids, _terms, _indexes, _terms, _seqs),
    st.builds(
        VoteResponse, st.just(GROUP), _ids, _ids, st.none() | _ids, _terms,
        st.sampled_from(VoteResult), _seqs,
    ),
    st.builds(HeartBeatRequest, st.just(GROUP), _ids, _ids, _ids, _terms, _seqs),
    st.builds(
        HeartBeatResponse, st.just(GROUP), _ids, _ids, st.none() | _ids, _terms,
        st.sampled_from(Code), _seqs,
    ),
    st.builds(
        PushRequest, st.just(GROUP), _ids, _ids, _ids, _terms, st.sampled_from(PushType),
        _indexes, _terms, _indexes, _entries(), st.integers(0, 3), _term_runs, _indexes,
        st.sampled_from([-1, -1, 0, 48, 4096]), _seqs,
    ),
    st.builds(
        PushResponse, st.just(GROUP), _ids, _ids, st.none() | _ids, _terms,
        st.sampled_from(Code), st.sampled_from(PushType), _indexes, _indexes, _indexes,
        _seqs, _terms, _indexes,
    ),
)  # fmt: skip

_steps = st.lists(
    st.one_of(
        _messages,
        st.just("tick"),
        st.just("persist"),
        st.just("append"),
    ),
    max_size=40,
)


@pytest.mark.parametrize("make", [committed_follower, elected_leader])
@given(steps=_steps)
def test_no_sequence_of_member_messages_crashes_a_replica_or_cuts_its_committed_log(make, steps):
    r = make()
    committed = {i: r.store.term_at(i) for i in range(r.store.begin_index, r.committed_index + 1)}
    now_ms = 1001.0
    for step in steps:
        now_ms += 7.0
        if step == "tick":
            now_ms = max(now_ms, min(r.next_deadline_ms(), now_ms + 500.0))
            r.tick(now_ms)
        elif step == "persist":
            r.persisted(r.store.end_index, r.store.generation, now_ms)
        elif step == "append":
            r.append(int(now_ms), [b"x"], now_ms)
        elif step.remote_id == r.self_id and step.local_id != r.self_id:
            r.receive(attrs.evolve(step), now_ms)
        r.take_output()
        low = max(r.store.begin_index, min(committed, default=0))
        for i in range(low, max(committed, default=-1) + 1):
            assert r.store.term_at(i) == committed[i], f"committed entry {i} was replaced"


# ---------------------------------------------------------------- the transport's checks


class Listener:
    """A PeerTransport for `a` that records what it delivers."""

    def __init__(self, peers: dict[str, str], **kw) -> None:
        self.received: list = []
        self.transport = PeerTransport("a", peers, self.received.append, print, **kw)


def vote_frame(sender: str, to: str = "a", term: int = 50) -> bytes:
    return pack_frame(PEER, encode_message(VoteRequest(GROUP, sender, to, sender, term, 99, 9)))


async def send_from(source_ip: str, port: int, *frames: bytes) -> bool:
    """Send `frames` to 127.0.0.1:`port` from `source_ip`; True if the port then closed
    the connection (rather than keep reading)."""
    sock = trio.socket.socket()
    await sock.bind((source_ip, 0))
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    async with stream:
        for frame in frames:
            await stream.send_all(frame)
        with trio.move_on_after(1.0):
            try:
                return await stream.receive_some(1) == b""
            except trio.BrokenResourceError:
                return True
    return False


def two_member_peers(b_host: str = "127.0.0.1") -> dict[str, str]:
    a_port, b_port = free_ports(2)
    return {"a": f"127.0.0.1:{a_port}", "b": f"{b_host}:{b_port}"}


async def test_a_stranger_or_a_misaddressed_message_is_dropped_with_its_connection(nursery):
    node = Listener(two_member_peers())
    port = await nursery.start(node.transport.serve)
    assert await send_from("127.0.0.1", port, vote_frame("stranger"))
    assert await send_from("127.0.0.1", port, vote_frame("a"))  # our own id, from outside
    assert await send_from("127.0.0.1", port, vote_frame("b", to="b"))  # not for us
    assert node.received == []


async def test_a_connection_speaks_for_one_member_only(nursery):
    node = Listener({**two_member_peers(), "c": "127.0.0.1:1"})
    port = await nursery.start(node.transport.serve)
    assert await send_from("127.0.0.1", port, vote_frame("b"), vote_frame("c", term=51))
    assert [m.local_id for m in node.received] == ["b"]


async def test_a_member_claimed_from_another_host_is_dropped(nursery):
    """b is configured at 127.0.0.2: a connection from 127.0.0.1 that claims b is not b."""
    node = Listener(two_member_peers(b_host="127.0.0.2"))
    port = await nursery.start(node.transport.serve)
    assert await send_from("127.0.0.1", port, vote_frame("b"))
    assert node.received == []
    assert not await send_from("127.0.0.2", port, vote_frame("b"))
    assert [m.local_id for m in node.received] == ["b"]


async def test_a_member_named_by_a_name_of_this_machine_may_use_any_loopback_address(nursery):
    """A host name that resolves to a loopback address (Debian maps the machine's name
    to 127.0.1.1) while local connections come from 127.0.0.1: both are this machine."""
    node = Listener(two_member_peers(b_host="localhost"))
    port = await nursery.start(node.transport.serve)
    assert not await send_from("127.0.0.2", port, vote_frame("b"))
    assert [m.local_id for m in node.received] == ["b"]


async def test_the_host_check_can_be_turned_off(nursery):
    node = Listener(two_member_peers(b_host="127.0.0.2"), check_peer_hosts=False)
    port = await nursery.start(node.transport.serve)
    assert not await send_from("127.0.0.1", port, vote_frame("b"))
    assert [m.local_id for m in node.received] == ["b"]


def test_a_broker_config_can_turn_the_host_check_off():
    base = {"enableDLegerCommitLog": "true", "dLegerPeers": "n0-127.0.0.1:1", "dLegerSelfId": "n0"}
    assert load_broker_config(None, overrides=base)[0].dledger_config().check_peer_hosts
    off = {**base, "checkPeerHosts": "false"}
    assert not load_broker_config(None, overrides=off)[0].dledger_config().check_peer_hosts


# ---------------------------------------------------------------- against a running group


def _peer_port(g: InProcessGroup, node: str) -> int:
    return int(dict(p.split("-", 1) for p in g.dledger_peers.split(";"))[node].rsplit(":", 1)[1])


async def _sent_and_pulled(g: InProcessGroup, topic: str, bodies: list[bytes]) -> None:
    master = await g.wait_master()
    response = await g.pull(master, topic, 0, 0)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.body.count(b"hostile-") >= len(bodies)


async def test_forged_votes_and_truncates_from_a_member_host_lose_nothing(nursery, tmp_path):
    """From the members' own host (the host check passes), a forger claiming a member
    sends a follower a vote in a much higher term, then, as that term's leader, TRUNCATEs
    cutting the whole log. The follower refuses them (it used to cut its log and die on
    an assertion); the group elects a real member, loses nothing, and keeps serving."""
    g = await InProcessGroup(nursery, tmp_path).start()
    await create_topic(g, "T")
    sent = [f"hostile-{n}".encode() for n in range(5)]
    for body in sent:
        assert (await g.send(g.master(), "T", body)).code == ResponseCode.SUCCESS
    master = g.master()
    group = master.dledger.config.group
    victim = next(n for n in g.ids if n != master.config.dleger_self_id)
    claimed = next(n for n in g.ids if n not in (master.config.dleger_self_id, victim))
    term = master.dledger.replica.term + 10
    vote = VoteRequest(group, claimed, victim, claimed, term, 10**6, term)
    truncate = PushRequest(
        group, claimed, victim, claimed, term, PushType.TRUNCATE, -1, -1, 10**6,
        term_runs=[(0, term)], leader_end_index=10**6,
    )  # fmt: skip
    async with await trio.open_tcp_stream("127.0.0.1", _peer_port(g, victim)) as stream:
        await stream.send_all(pack_frame(PEER, encode_message(vote)))
        for seq in range(30):
            await trio.sleep(0.01)
            forged = attrs.evolve(truncate, seq=seq)
            await stream.send_all(pack_frame(PEER, encode_message(forged)))
    new_master = await g.wait_master()
    assert (await g.send(new_master, "T", b"hostile-after")).code == ResponseCode.SUCCESS
    await _sent_and_pulled(g, "T", [*sent, b"hostile-after"])
    replicas = [b.dledger.replica for b in g.brokers.values()]
    await wait_for(lambda: all(r.committed_index == replicas[0].committed_index for r in replicas))
    for r in replicas:
        assert r.store.begin_index == 0
        for i in range(r.committed_index + 1):
            assert r.store.term_at(i) == replicas[0].store.term_at(i)


async def test_forged_votes_from_a_stranger_host_do_not_reach_the_group(nursery, tmp_path):
    g = await InProcessGroup(nursery, tmp_path).start()
    master = g.master()
    term = master.dledger.replica.term
    leader_id = master.config.dleger_self_id
    for node in g.ids:
        claimed = next(n for n in g.ids if n != node)
        vote = VoteRequest(master.config.broker_name, claimed, node, claimed, term + 5, 10**6, 9)
        assert await send_from(
            "127.0.0.2", _peer_port(g, node), pack_frame(PEER, encode_message(vote))
        )
    await trio.sleep(0.3)
    assert g.master() is master and master.config.dleger_self_id == leader_id
    assert all(b.dledger.replica.term == term for b in g.brokers.values())
