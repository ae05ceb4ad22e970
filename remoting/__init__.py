"""RocketMQ remoting protocol: frames, JSON and ROCKETMQ header codecs, codes, trio server/client.

Byte-compatible with RocketMQ 4.x (`org.apache.rocketmq.remoting`), so stock clients —
Java, C++, `ali-ons` — talk to a raftmq namesrv or broker, and raftmq's own clients
talk to stock servers. Modules, smallest first:

- `codes`: request/response codes, LanguageCode, SerializeType, MQVersion
- `command`: RemotingCommand
- `codec`: one frame to and from bytes (`encode`, `decode`); RemotingError
- `frames`: streams of frames (sans-IO FrameDecoder; trio FrameReader, FrameWriter)
- `processor`: the processor signature and ProcessorTable
- `connection`: one connection, either end (requests both ways, opaque matching)
- `server`, `client`: RemotingServer and RemotingClient
"""

from remoting.client import RemotingClient, parse_address
from remoting.codec import MAX_FRAME_BYTES, decode, encode
from remoting.codes import LanguageCode, MQVersion, RequestCode, ResponseCode, SerializeType
from remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from remoting.connection import Connection
from remoting.errors import RemotingConnectError, RemotingError, RemotingTimeoutError
from remoting.frames import FrameDecoder
from remoting.processor import Processor, ProcessorTable, not_supported
from remoting.server import RemotingServer, listen_host

__all__ = [
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "MAX_FRAME_BYTES",
    "Connection",
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
    "SerializeType",
    "decode",
    "encode",
    "listen_host",
    "not_supported",
    "parse_address",
]
