"""Reading request headers: extFields are strings on the wire, processors want types.

A missing or malformed field is the client's error, answered with a response code
and a remark naming the field (never an exception that ends the connection): the
broker's processors and the controller's read their headers here.

The broker's code is MESSAGE_ILLEGAL, where Java answers a header it cannot decode
with SYSTEM_ERROR: there SYSTEM_ERROR is kept for "the outcome is unknown" (a send
whose quorum acknowledgment timed out, a broker bug), so a client can tell a request
that was refused from one that may have taken effect.
"""

from __future__ import annotations

import json

from raftmq.remoting.codes import ResponseCode
from raftmq.remoting.command import RemotingCommand

__all__ = ["BadRequest", "boolean", "integer", "json_body", "text"]


class BadRequest(Exception):
    """A request answered with `code` and the message as remark."""

    def __init__(self, remark: str, code: int = ResponseCode.MESSAGE_ILLEGAL) -> None:
        super().__init__(remark)
        self.code = code


def text(request: RemotingCommand, name: str, default: str | None = None) -> str:
    value = request.ext_fields.get(name)
    if value is None:
        if default is None:
            raise BadRequest(f"the custom field <{name}> is null")
        return default
    return str(value)


def integer(request: RemotingCommand, name: str, default: int | None = None) -> int:
    value = request.ext_fields.get(name)
    if value is None or value == "":
        if default is None:
            raise BadRequest(f"the custom field <{name}> is null")
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"the custom field <{name}> is not a number: {value!r}") from None


def boolean(request: RemotingCommand, name: str, default: bool = False) -> bool:
    value = request.ext_fields.get(name)
    return default if value is None else str(value).lower() == "true"


def json_body(value) -> bytes:
    """A response body as Java's brokers send it: compact JSON."""
    return json.dumps(value, separators=(",", ":")).encode()
