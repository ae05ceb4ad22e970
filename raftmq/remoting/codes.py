"""RocketMQ's numbers: request and response codes, language and serialize-type bytes.

Names and values are RocketMQ 4.9.x's (`RequestCode`, `ResponseCode` +
`RemotingSysResponseCode`, `LanguageCode`, `SerializeType`, `MQVersion`), so a log
line or a packet capture reads the same as it would against a Java broker. Only codes
whose number is the same across 4.9.x and 5.x are listed: a few slots were reused
(response 29 is FLUSH_DISK_FAILED in 4.9 and INVALID_PARAMETER in 5.x; 209-211
changed meaning), and a wrong name in a log is worse than a bare number. The exception
is the answers to RocketMQ 5's POP requests (29, 209, 210), listed under their 5.x
names: only a POP request, which a 4.9 client never sends, is answered with them.

Codes travel as Java `int`s in a JSON header but as `short`s in a ROCKETMQ binary
header, which is why every code here fits in 16 signed bits, but for RocketMQ 5's POP
requests (200050...), which Apache's clients send with a JSON header only.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["LanguageCode", "MQVersion", "RequestCode", "ResponseCode", "SerializeType"]


class RequestCode(IntEnum):
    """`org.apache.rocketmq.common.protocol.RequestCode` (4.9.x).

    Clients spell 105 `GET_ROUTEINTO_BY_TOPIC`; the value is what matters on the wire.
    39, 40, 220, 307 and 309 travel the other way: the broker asks the client.
    """

    # broker: messages
    SEND_MESSAGE = 10  # long header field names (the C++ client)
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12  # by key
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15  # often oneway
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    TRIGGER_DELETE_FILES = 27
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33  # header `offset` = commit-log offset
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37  # oneway
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39  # broker -> producer, oneway
    NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> consumer, oneway
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46  # Java SQL92 consumers
    GET_CLIENT_CONFIG = 47
    # broker: plain ACL (4.4 to 5.2; ACL 2.0 replaced them and left the numbers unused)
    UPDATE_AND_CREATE_ACL_CONFIG = 50
    DELETE_ACL_CONFIG = 51
    GET_BROKER_CLUSTER_ACL_INFO = 52
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
    GET_BROKER_CLUSTER_ACL_CONFIG = 54  # 4.6 to 4.9.7 and 5.0; gone in 4.9.8
    # namesrv
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    # admin
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    SUSPEND_CONSUMER = 209
    RESUME_CONSUMER = 210
    RESET_CONSUMER_OFFSET_IN_CONSUMER = 211
    RESET_CONSUMER_OFFSET_IN_BROKER = 212
    ADJUST_CONSUMER_THREAD_POOL = 213
    WHO_CONSUME_THE_MESSAGE = 214
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220  # broker -> consumer
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    REGISTER_FILTER_SERVER = 301
    REGISTER_MESSAGE_FILTER_CLASS = 302
    QUERY_CONSUME_TIME_SPAN = 303
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    CLEAN_EXPIRED_CONSUMEQUEUE = 306
    GET_CONSUMER_RUNNING_INFO = 307  # broker -> consumer
    QUERY_CORRECTION_OFFSET = 308
    CONSUME_MESSAGE_DIRECTLY = 309  # broker -> consumer
    SEND_MESSAGE_V2 = 310  # header fields named a..n
    GET_UNIT_TOPIC_LIST = 311
    GET_HAS_UNIT_SUB_TOPIC_LIST = 312
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
    CLONE_GROUP_OFFSET = 314
    VIEW_BROKER_STATS_DATA = 315
    CLEAN_UNUSED_TOPIC = 316
    GET_BROKER_CONSUME_STATS = 317
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    SEND_BATCH_MESSAGE = 320  # V2 header with `m`=true
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_ALL_PRODUCER_INFO = 328
    DELETE_EXPIRED_COMMITLOG = 329
    QUERY_TOPICS_BY_CONSUMER = 343
    QUERY_SUBSCRIPTION_BY_CONSUMER = 345
    GET_TOPIC_CONFIG = 351
    LITE_PULL_MESSAGE = 361
    RECALL_MESSAGE = 370  # RocketMQ 5: a timer message's recall (broker.timer)
    # RocketMQ 5's controller (RIP-44, raftmq.controller); 1007 is asked of a broker
    BROKER_HEARTBEAT = 904  # broker -> every controller, oneway
    GET_BROKER_HA_STATUS = 907  # RocketMQ 5: HARuntimeInfo (`mqadmin haStatus`)
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008  # controller -> broker, oneway
    UPDATE_CONTROLLER_CONFIG = 1009
    GET_CONTROLLER_CONFIG = 1010
    CLEAN_BROKER_DATA = 1011
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013
    # RocketMQ 5: POP consumption (broker.pop)
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    PEEK_MESSAGE = 200052
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    NOTIFICATION = 200054
    POLLING_INFO = 200055
    BATCH_ACK_MESSAGE = 200151
    # ours: a DLedger group's members, listed or changed, on a broker (broker.dledger_members)
    # or a controller (controller.server)
    DLEDGER_MEMBERS = 259001


# DLEDGER_MEMBERS's `change` that moves the group's leadership to `memberId` rather than
# changing its members (add, promote, remove: DLedger's own Change values); the value
# DLedgerServer.change_at_leader takes (LEAD_CHANGE there: remoting is below dledger)
DLEDGER_LEAD_CHANGE = "lead"


class ResponseCode(IntEnum):
    """`ResponseCode` extending `RemotingSysResponseCode` (0-4).

    How clients read a send reply: 0, 10, 12 and 11 are successes (SEND_OK,
    FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE); producers retry on
    17, 14, 1, 16, 204 and 205. A pull reply maps 0 to FOUND, 19 to NO_NEW_MSG, 20 to
    NO_MATCHED_MSG and 21 to OFFSET_ILLEGAL; anything else throws in the client.
    """

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # sic
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    FLOW_CONTROL = 215  # 5.x
    # 5.x only, answers to POP requests (4.9 used 29 for FLUSH_DISK_FAILED, never sent here)
    INVALID_PARAMETER = 29
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    ILLEGAL_OPERATION = 604  # 5.x: RecallMessageProcessor's refusals
    # 5.x: the controller's answers (raftmq.controller)
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014


class LanguageCode(IntEnum):
    """`LanguageCode`: a byte in the ROCKETMQ header, the member's name in a JSON one.

    Java decodes an unknown byte or name to null and carries on; we decode it to OTHER.
    """

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(IntEnum):
    """`SerializeType`: the high byte of a frame's header-length field."""

    JSON = 0
    ROCKETMQ = 1


class MQVersion(IntEnum):
    """Ordinals of `MQVersion.Version` that behaviour depends on, sent as `version`.

    A namesrv answers a route query in standard JSON when `version >= V4_9_4`.
    `ali-ons` sends a fixed 121 and the C++ client V4_6_0, neither listed here.
    """

    V4_0_0 = 213
    V4_5_0 = 313
    V4_9_0 = 393
    V4_9_4 = 401
    V4_9_8 = 409
    V5_0_0 = 413
