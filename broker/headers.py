"""Reading request headers: extFields are strings on the wire, processors want types.

The readers are `raftmq.remoting.fields`' (the controller's too); here is what is the
broker's own: the send header in either of its spellings.
"""

from __future__ import annotations

from raftmq.protocol.headers import from_send_v2, is_send_v2
from raftmq.remoting import RemotingCommand
from raftmq.remoting.fields import BadRequest, boolean, integer, json_body, text

__all__ = ["BadRequest", "boolean", "integer", "json_body", "send_header", "text"]


def send_header(request: RemotingCommand) -> RemotingCommand:
    """A SEND_MESSAGE_V2/SEND_BATCH_MESSAGE request's header under the long names."""
    if is_send_v2(request.ext_fields):
        request.ext_fields = from_send_v2(request.ext_fields)
    return request
