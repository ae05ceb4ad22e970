"""What the client raises, so a caller can tell "refused" from "maybe stored".

A chaos checker maps every send outcome conservatively: an acknowledged message must
be consumed later, a refused one must never appear, and one whose fate is unknown may
or may not. `SendError.indeterminate` is that third case; it is False only when every
attempt ended in an answer that proves the message was not stored.
"""

from __future__ import annotations

__all__ = ["MQBrokerError", "MQClientError", "RouteNotFoundError", "SendError"]


class MQClientError(Exception):
    """Base of the client's own errors (remoting errors pass through unchanged)."""


class RouteNotFoundError(MQClientError):
    """No name server knows the topic (GET_ROUTEINFO_BY_TOPIC answered TOPIC_NOT_EXIST
    everywhere), or none could be reached."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"no route for topic {topic!r}: {reason}")
        self.topic = topic


class MQBrokerError(MQClientError):
    """A broker answered a request with a code the call does not expect."""

    def __init__(self, code: int, remark: str | None, broker: str) -> None:
        super().__init__(f"broker {broker} answered code {code}: {remark}")
        self.code = code
        self.remark = remark
        self.broker = broker  # an address, or a brokerName when no member was asked


class SendError(MQClientError):
    """A send that was not acknowledged.

    `code` is the last broker answer's response code (None when the last attempt got
    no answer: a timeout, a lost connection, no route). `indeterminate` is True when
    some attempt may have stored the message: its request left and no answer came, or
    the broker said the outcome is unknown (SYSTEM_ERROR, e.g. a quorum-ack timeout).
    `attempts` counts the requests made.
    """

    def __init__(
        self, message: str, *, code: int | None, indeterminate: bool, attempts: int
    ) -> None:
        outcome = "outcome unknown" if indeterminate else "not stored"
        super().__init__(f"{message} ({outcome}, {attempts} attempts)")
        self.code = code
        self.indeterminate = indeterminate
        self.attempts = attempts
