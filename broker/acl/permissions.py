"""What a request needs, and what an account has: RocketMQ's `Permission` and the
request-code rules of `PlainAccessValidator.parse`.

Permissions are RocketMQ's bits: DENY 1, ANY 2, PUB 4, SUB 8. A group is checked as
its retry topic `%RETRY%group`, so a resource is a topic or a retry topic, and
`groupPerms` entries are stored under the retry topic's name, as RocketMQ stores them.

Where we differ from RocketMQ 4.9 (each is a hole in its rules):

- SEND_BATCH_MESSAGE (320) needs PUB on its topic like any send; RocketMQ checks
  nothing but the signature for it.
- A send to a retry topic `%RETRY%G` needs SUB on group G itself; RocketMQ checks the
  producer group's retry topic (SEND_MESSAGE_V2) or nothing (SEND_MESSAGE, which has
  no `group` field).
- The ACL requests (50-54) are admin-only: RocketMQ lets any signed account rewrite
  the ACL file or read every secret key with them.

RocketMQ 4.9 has no POP requests; here each needs what a pull needs, SUB on its topic
and its group, and BATCH_ACK_MESSAGE that for every topic and group its body names.
"""

from __future__ import annotations

import json

from raftmq.broker.store.metadata import RETRY_PREFIX

from raftmq.remoting import RemotingCommand, RequestCode

DENY, ANY, PUB, SUB = 1, 2, 4, 8

_BY_NAME = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"  # TopicValidator.RMQ_SYS_TRACE_TOPIC: anyone may PUB

ADMIN_CODES = frozenset(
    {
        # RocketMQ's Permission.ADMIN_CODE
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        # and the ACL's own requests
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
        RequestCode.DELETE_ACL_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO,
        RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
    }
)


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    names = [n for n, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit]
    return "|".join(names) or "ANY"


def parse_perm(text: str | None, what: str) -> int:
    """`Permission.parsePermFromString`, except that a value it would quietly read as
    DENY (a typo) is an error naming `what`; absent is DENY, as in RocketMQ."""
    if text is None:
        return DENY
    perm = _BY_NAME.get(str(text).strip())
    if perm is None:
        raise ValueError(f"{what}: {text!r} is not one of PUB, SUB, PUB|SUB, SUB|PUB, DENY")
    return perm


def parse_resource_perms(entries, is_topic: bool) -> dict[str, int]:
    """`topicPerms`/`groupPerms` (["name=PERM", ...]) as {resource: perm}; a group is
    stored as its retry topic."""
    if entries is None:
        return {}
    what = "topicPerms" if is_topic else "groupPerms"
    if not isinstance(entries, list):
        raise ValueError(f"{what}: expected a list of name=PERM, not {entries!r}")
    perms = {}
    for entry in entries:
        name, sep, perm = str(entry).partition("=")
        name = name.strip()
        if not sep or not name or "=" in perm:
            raise ValueError(f"{what}: {entry!r}: expected name=PERM, for example topicA=SUB")
        perms[name if is_topic else RETRY_PREFIX + name] = parse_perm(perm, f"{what} {entry!r}")
    return perms


def check_permission(needed: int, owned: int) -> bool:
    """`Permission.checkPermission`."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def describe(resource: str) -> str:
    """`PlainAccessResource.printStr`: topic:T or group:G."""
    if resource.startswith(RETRY_PREFIX):
        return f"group:{resource[len(RETRY_PREFIX) :]}"
    return f"topic:{resource}"


def _retry(group: str | None) -> str | None:
    return None if not group else RETRY_PREFIX + group


def _send(topic: str | None) -> list[tuple[str | None, int]]:
    if topic is not None and topic.startswith(RETRY_PREFIX):
        return [(topic, SUB)]
    return [(topic, PUB)]


def _name(value) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"a group or topic name is a {type(value).__name__}")
    return value


def _heartbeat(body: bytes) -> list[tuple[str | None, int]]:
    try:
        data = json.loads(body or b"{}")
        needed = []
        for consumer in data.get("consumerDataSet") or ():
            needed.append((_retry(_name(consumer.get("groupName"))), SUB))
            for subscription in consumer.get("subscriptionDataSet") or ():
                needed.append((_name(subscription.get("topic")), SUB))
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"cannot read the heartbeat body: {exc}") from None
    return needed


# The POP requests (broker.pop): a pop reads like a pull, an ack or a change of
# invisibility settles what a pull read.
POP_CODES = frozenset(
    {
        RequestCode.POP_MESSAGE,
        RequestCode.PEEK_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        RequestCode.NOTIFICATION,
        RequestCode.POLLING_INFO,
    }
)


def _batch_ack(body: bytes) -> list[tuple[str | None, int]]:
    try:
        needed = []
        for ack in json.loads(body or b"{}").get("acks") or ():
            needed += [(_name(ack.get("t")), SUB), (_retry(_name(ack.get("c"))), SUB)]
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"cannot read the batch ack body: {exc}") from None
    return needed


def needed_resources(request: RemotingCommand) -> dict[str, int]:
    """{resource: permission} the request needs (`PlainAccessValidator.parse`, with the
    differences in the module docstring). ValueError when the request cannot be read."""
    ext = request.ext_fields
    code = request.code
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        needed = _send(ext.get("b"))
    elif code == RequestCode.SEND_MESSAGE:
        needed = _send(ext.get("topic"))
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        needed = [(_retry(ext.get("group")), SUB)]
    elif code in POP_CODES or code in (
        RequestCode.PULL_MESSAGE,
        RequestCode.UPDATE_CONSUMER_OFFSET,
    ):
        needed = [(ext.get("topic"), SUB), (_retry(ext.get("consumerGroup")), SUB)]
    elif code == RequestCode.QUERY_MESSAGE:
        needed = [(ext.get("topic"), SUB)]
    elif code == RequestCode.HEART_BEAT:
        needed = _heartbeat(request.body)
    elif code == RequestCode.BATCH_ACK_MESSAGE:
        needed = _batch_ack(request.body)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        needed = [(_retry(ext.get("consumerGroup")), SUB)]
    else:
        return {}
    return {resource: perm for resource, perm in needed if resource}
