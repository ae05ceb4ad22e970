"""The three ways a remoting call goes wrong, as three exception types.

They mirror RocketMQ's `RemotingCommandException` (bad bytes),
`RemotingConnectException` / `RemotingSendRequestException` (no connection) and
`RemotingTimeoutException` (no answer in time), so a caller can tell "the peer sent
garbage" from "the peer is gone" from "the peer is slow" without parsing messages.
"""

from __future__ import annotations

__all__ = ["RemotingConnectError", "RemotingError", "RemotingTimeoutError"]


class RemotingError(ValueError):
    """Bytes that are not a valid remoting frame, or a command that cannot be encoded.

    Decoding untrusted input raises this and nothing else; anything else escaping the
    codec is a bug (the tests fuzz for it).
    """


class RemotingConnectError(ConnectionError):
    """The peer could not be reached, or the connection ended before the answer came."""


class RemotingTimeoutError(TimeoutError):
    """No response within the call's timeout (the request may still take effect)."""
