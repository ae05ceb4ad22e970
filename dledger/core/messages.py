"""Peer-to-peer messages, named and shaped after DLedger's protocol classes.

Every message carries DLedger's base fields: `group`, `local_id` (sender),
`remote_id` (receiver), `leader_id` and `term`; responses add `code`. A request
carries a `seq` chosen by its sender that the response echoes, so a stale answer
(for an earlier vote round or a push that was already resent) is recognised.
"""

from __future__ import annotations

import attrs
from raftmq.dledger.codes import Code, PushType, RequestCode, VoteResult


@attrs.define(slots=True)
class _Header:
    """DLedger's base fields, first in every message: the group, the sender, the
    receiver, the leader the sender knows (None: none) and the sender's term."""

    group: str
    local_id: str
    remote_id: str
    leader_id: str | None
    term: int


@attrs.define(slots=True)
class _FromLeader:
    """The base fields of what a leader (or a candidate) sends: `leader_id` is itself."""

    group: str
    local_id: str
    remote_id: str
    leader_id: str
    term: int


@attrs.define(slots=True)
class VoteRequest(_FromLeader):
    KIND = RequestCode.VOTE
    ledger_end_index: int
    ledger_end_term: int
    seq: int = 0


@attrs.define(slots=True)
class VoteResponse(_Header):
    KIND = -RequestCode.VOTE  # `term`: the voter's
    vote_result: VoteResult
    seq: int = 0
    code: Code = Code.SUCCESS


@attrs.define(slots=True)
class HeartBeatRequest(_FromLeader):
    KIND = RequestCode.HEART_BEAT
    seq: int = 0


@attrs.define(slots=True)
class HeartBeatResponse(_Header):
    """DLedger's answer (code and term) and, ours, how far the follower knows its log
    agrees with the leader's (`FollowerReplication.leader_verified_index`): a follower
    that restarted knows nothing, and the leader compares again (`Progress.forgotten`);
    and how slow its own fsyncs are, which a leader with slow ones hands over by."""

    KIND = -RequestCode.HEART_BEAT
    code: Code
    seq: int = 0
    verified_index: int = -1
    fsync_p99_us: int = -1  # ours: the follower's own fsyncs (core.fsync_health), -1 unknown


@attrs.define(slots=True)
class PushRequest(_FromLeader):
    """COMPARE / TRUNCATE / APPEND / COMMIT from the leader to one follower.

    APPEND carries `entries`, encoded DLedger entries concatenated (first index
    `pre_log_index + 1`). COMPARE asks whether the follower holds `pre_log_term`
    at `pre_log_index`. TRUNCATE carries `term_runs`, the leader's [(first index,
    term)] covering `(pre_log_index, leader end]`, so the follower cuts only from
    its first entry that disagrees, never a matching (possibly committed) one.
    """

    KIND = RequestCode.PUSH
    type: PushType
    pre_log_index: int
    pre_log_term: int
    commit_index: int
    entries: bytes = b""
    count: int = 0
    term_runs: list = attrs.Factory(list)
    leader_end_index: int = -1
    reset_pos: int = -1  # TRUNCATE: restart the follower's log at pre_log_index + 1, at this pos
    seq: int = 0
    # With a reset: the leader's configuration in force at pre_log_index (MemberState's
    # text), whose entries the follower will never receive; "": every one is to come.
    members: str = ""


@attrs.define(slots=True)
class PushResponse(_Header):
    KIND = -RequestCode.PUSH
    code: Code
    type: PushType
    index: int  # APPEND: last index covered; COMPARE: pre_log_index; TRUNCATE: new end
    begin_index: int = 0
    end_index: int = -1
    x_term: int = -1
    x_index: int = -1
    seq: int = 0


@attrs.define(slots=True)
class LeadershipTransferRequest(_Header):
    KIND = RequestCode.LEADERSHIP_TRANSFER
    transfer_id: str
    transferee_id: str
    take_leadership_ledger_index: int = -1
    seq: int = 0


@attrs.define(slots=True)
class LeadershipTransferResponse(_Header):
    KIND = -RequestCode.LEADERSHIP_TRANSFER
    code: Code
    seq: int = 0


@attrs.define(slots=True)
class InstallSnapshotRequest(_FromLeader):
    """One chunk of the application's snapshot as of log entry `index`, from the leader
    to a follower whose next entry the leader no longer holds (etcd's MsgSnap, sent in
    chunks): `data` lies at byte `offset` of a snapshot of `total_bytes`."""

    KIND = RequestCode.INSTALL_SNAPSHOT
    index: int
    total_bytes: int
    offset: int
    data: bytes = b""
    seq: int = 0


@attrs.define(slots=True)
class InstallSnapshotResponse(_Header):
    """`offset`: the bytes of snapshot `index` the follower holds, so where the next
    chunk starts; `total_bytes` once it is installed."""

    KIND = -RequestCode.INSTALL_SNAPSHOT
    code: Code
    index: int
    offset: int
    seq: int = 0


MESSAGE_TYPES = (
    VoteRequest,
    VoteResponse,
    HeartBeatRequest,
    HeartBeatResponse,
    PushRequest,
    PushResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
)
REQUESTS = (
    VoteRequest,
    HeartBeatRequest,
    PushRequest,
    LeadershipTransferRequest,
    InstallSnapshotRequest,
)
