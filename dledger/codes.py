"""DLedger's enumerations, by the names and numbers DLedger uses.

Response codes travel on the wire and appear in CLI output, so their numbers are
DLedger's (`DLedgerResponseCode`). Vote results and parse results are the
election's vocabulary (`VoteResponse.RESULT`, `DLedgerLeaderElector.VoteResponse.ParseResult`).
"""

from enum import IntEnum


class Role(IntEnum):
    UNKNOWN = 0
    CANDIDATE = 1
    LEADER = 2
    FOLLOWER = 3


class EntryType(IntEnum):
    """The entry header's first field (DLedger HEAD calls it magic)."""

    BLANK = -1
    NORMAL = 1
    NOOP = 2


class Code(IntEnum):
    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_RANGE = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_REQUEST = 412
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FALL_BEHIND_TOO_MUCH = 417
    TAKE_LEADERSHIP_FAILED = 418
    INDEX_LESS_THAN_LOCAL_BEGIN = 419
    REQUEST_WITH_EMPTY_BODYS = 420
    PUSH_REQUEST_IS_FULL = 421
    INTERNAL_ERROR = 500
    TERM_CHANGED = 501
    WAIT_QUORUM_ACK_TIMEOUT = 502
    LEADER_PENDING_FULL = 503
    ILLEGAL_MEMBER_STATE = 504
    LEADER_NOT_READY = 505
    LEADER_TRANSFERRING = 506


# The codes an append is refused with before any of it is written (the leader's
# admission, a full disk, entries placed for a position the log no longer ends at);
# an append that was written fails, if it fails, with TERM_CHANGED or
# WAIT_QUORUM_ACK_TIMEOUT. A writer that put positions or counters into its entries
# (the broker's queue offsets) takes them back on these codes only.
NOT_APPENDED = frozenset(
    {
        Code.NOT_LEADER,
        Code.LEADER_TRANSFERRING,
        Code.REQUEST_WITH_EMPTY_BODYS,
        Code.LEADER_PENDING_FULL,
        Code.DISK_FULL,
        Code.LEADER_NOT_READY,
    }
)


class VoteResult(IntEnum):
    UNKNOWN = 0
    ACCEPT = 1
    REJECT_UNKNOWN_LEADER = 2
    REJECT_UNEXPECTED_LEADER = 3
    REJECT_EXPIRED_VOTE_TERM = 4
    REJECT_ALREADY_VOTED = 5
    REJECT_ALREADY_HAS_LEADER = 6
    REJECT_TERM_NOT_READY = 7
    REJECT_TERM_SMALL_THAN_LEDGER = 8
    REJECT_EXPIRED_LEDGER_TERM = 9
    REJECT_SMALL_LEDGER_END_INDEX = 10
    REJECT_TAKING_LEADERSHIP = 11


class ParseResult(IntEnum):
    WAIT_TO_REVOTE = 0
    REVOTE_IMMEDIATELY = 1
    PASSED = 2
    WAIT_TO_VOTE_NEXT = 3


class PushType(IntEnum):
    APPEND = 0
    COMMIT = 1
    COMPARE = 2
    TRUNCATE = 3


class RequestCode(IntEnum):
    """DLedgerRequestCode: the first three serve clients, the rest run between peers."""

    METADATA = 50000
    APPEND = 50001
    GET = 50002
    VOTE = 51001
    HEART_BEAT = 51002
    PULL = 51003
    PUSH = 51004
    LEADERSHIP_TRANSFER = 51005
    # ours: a snapshot of the application's state, in chunks (core.snapshot). DLedger
    # 0.4 has an INSTALL_SNAPSHOT of its own (51006, the whole snapshot in one request),
    # which RocketMQ's 0.3.1.2 lacks; ours is numbered apart, as it is not that one.
    INSTALL_SNAPSHOT = 59100
