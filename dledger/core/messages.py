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
class VoteRequest:
    KIND = RequestCode.VOTE
    group: str
    local_id: str
    remote_id: str
    leader_id: str  # the candidate
    term: int
    ledger_end_index: int
    ledger_end_term: int
    seq: int = 0


@attrs.define(slots=True)
class VoteResponse:
    KIND = -RequestCode.VOTE
    group: str
    local_id: str
    remote_id: str
    leader_id: str | None
    term: int  # the voter's term
    vote_result: VoteResult
    seq: int = 0
    code: Code = Code.SUCCESS


@attrs.define(slots=True)
class HeartBeatRequest:
    KIND = RequestCode.HEART_BEAT
    group: str
    local_id: str
    remote_id: str
    leader_id: str
    term: int
    seq: int = 0


@attrs.define(slots=True)
class HeartBeatResponse:
    KIND = -RequestCode.HEART_BEAT
    group: str
    local_id: str
    remote_id: str
    leader_id: str | None
    term: int
    code: Code
    seq: int = 0


@attrs.define(slots=True)
class PushRequest:
    """COMPARE / TRUNCATE / APPEND / COMMIT from the leader to one follower.

    APPEND carries `entries`, encoded DLedger entries concatenated (first index
    `pre_log_index + 1`). COMPARE asks whether the follower holds `pre_log_term`
    at `pre_log_index`. TRUNCATE carries `term_runs`, the leader's [(first index,
    term)] covering `(pre_log_index, leader end]`, so the follower cuts only from
    its first entry that disagrees, never a matching (possibly committed) one.
    """

    KIND = RequestCode.PUSH
    group: str
    local_id: str
    remote_id: str
    leader_id: str
    term: int
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


@attrs.define(slots=True)
class PushResponse:
    KIND = -RequestCode.PUSH
    group: str
    local_id: str
    remote_id: str
    leader_id: str | None
    term: int
    code: Code
    type: PushType
    index: int  # APPEND: last index covered; COMPARE: pre_log_index; TRUNCATE: new end
    begin_index: int = 0
    end_index: int = -1
    x_term: int = -1
    x_index: int = -1
    seq: int = 0


@attrs.define(slots=True)
class LeadershipTransferRequest:
    KIND = RequestCode.LEADERSHIP_TRANSFER
    group: str
    local_id: str
    remote_id: str
    leader_id: str | None
    term: int
    transfer_id: str
    transferee_id: str
    take_leadership_ledger_index: int = -1
    seq: int = 0


@attrs.define(slots=True)
class LeadershipTransferResponse:
    KIND = -RequestCode.LEADERSHIP_TRANSFER
    group: str
    local_id: str
    remote_id: str
    leader_id: str | None
    term: int
    code: Code
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
)
REQUESTS = (VoteRequest, HeartBeatRequest, PushRequest, LeadershipTransferRequest)
