"""Topic attributes (RocketMQ 5's `TopicConfig.attributes`), and the one raftmq knows:
`message.type` = NORMAL | FIFO | DELAY | TRANSACTION | MIXED, which mqproxy checks
5.x sends against and reports in QueryRoute's accept_message_types.

`mqadmin updateTopic -a +message.type=FIFO` sends UPDATE_AND_CREATE_TOPIC's header
field `attributes` in Apache's syntax (`AttributeParser`): items joined by ',', `+k=v`
adds or replaces, `-k` removes (not when creating). An update without the field keeps
the topic's attributes. An unknown key or value is refused, naming it.
"""

from __future__ import annotations

__all__ = ["MESSAGE_TYPE", "MESSAGE_TYPES", "alter_attributes"]

MESSAGE_TYPE = "message.type"
# TopicMessageType's values (UNSPECIFIED is what Apache reports for an unknown topic).
MESSAGE_TYPES = ("UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
KNOWN = {MESSAGE_TYPE: MESSAGE_TYPES}


def alter_attributes(current: dict[str, str], spec: str, *, creating: bool) -> dict[str, str]:
    """`current` changed by `spec`; ValueError naming what is wrong."""
    result = dict(current)
    seen: set[str] = set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        sign, body = item[0], item[1:]
        if sign not in "+-":
            raise ValueError(f"attribute {item!r} must start with + (add) or - (delete)")
        key, has_value, value = body.partition("=")
        if key in seen:
            raise ValueError(f"attribute {key!r} is given twice")
        seen.add(key)
        if key not in KNOWN:
            raise ValueError(f"unsupported attribute {key!r} (known: {', '.join(KNOWN)})")
        if sign == "-":
            if creating:
                raise ValueError(f"attribute {key!r} cannot be deleted from a topic being created")
            if has_value:
                raise ValueError(f"attribute {item!r}: a deletion takes no value")
            result.pop(key, None)
            continue
        if value not in KNOWN[key]:
            raise ValueError(f"attribute {key}={value!r}: expected one of {', '.join(KNOWN[key])}")
        result[key] = value
    return result
