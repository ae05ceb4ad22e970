"""RocketMQ remoting protocol: frames, JSON and ROCKETMQ header codecs, codes, trio server/client.

Byte-compatible with RocketMQ 4.x (`org.apache.rocketmq.remoting`), so stock clients —
Java, C++, `ali-ons` — talk to a raftmq namesrv or broker, and raftmq's own clients
talk to stock servers. Modules, smallest first:

- `codes`: request/response codes, LanguageCode, SerializeType, MQVersion
- `command`: RemotingCommand
- `codec`: one frame to and from bytes (`encode`, `decode`); RemotingError
- `frames`: streams of frames (sans-IO FrameDecoder; trio FrameReader, FrameWriter)
- `processor`: the processor signature, the Dispatcher protocol, ProcessorTable and
  the SYSTEM_ERROR answer to a failed processor
- `connection`: one connection, either end (requests both ways, opaque matching)
- `server`, `client`: RemotingServer and RemotingClient
"""

from raftmq.remoting.client import RemotingClient
from raftmq.remoting.codec import MAX_FRAME_BYTES, decode, encode
from raftmq.remoting.codes import LanguageCode, MQVersion, RequestCode, ResponseCode, SerializeType
from raftmq.remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from raftmq.remoting.connection import Connection
from raftmq.remoting.errors import RemotingConnectError, RemotingError, RemotingTimeoutError
from raftmq.remoting.frames import FrameDecoder
from raftmq.remoting.processor import (
    Dispatcher,
    Processor,
    ProcessorTable,
    Route,
    as_dispatcher,
    not_supported,
    system_error,
)
from raftmq.remoting.server import RemotingServer, listen_host

__all__ = [
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "MAX_FRAME_BYTES",
    "Connection",
    "Dispatcher",
    "FrameDecoder",
    "LanguageCode",
    "MQVersion",
    "Processor",
    "ProcessorTable",
    "RemotingClient",
    "RemotingCommand",
    "RemotingConnectError",
    "RemotingError",
    "RemotingServer",
    "RemotingTimeoutError",
    "RequestCode",
    "ResponseCode",
    "Route",
    "SerializeType",
    "as_dispatcher",
    "decode",
    "encode",
    "listen_host",
    "not_supported",
    "system_error",
]
