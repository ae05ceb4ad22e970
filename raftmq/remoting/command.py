"""`RemotingCommand`: one request or response, the unit of the RocketMQ protocol.

Mirrors `org.apache.rocketmq.remoting.protocol.RemotingCommand`. The same type is a
request or a response depending on bit 0 of `flag`, and bit 1 marks a oneway request
(no response is sent). `opaque` is the request id a response echoes; clients match
responses by it alone, so requests on one connection may be answered in any order.

`ext_fields` is Java's `extFields`, the flattened "custom header" (`topic`,
`queueId`, ...). On the wire every value is a string; values put here may also be
ints or bools, which the codec writes with Java's spelling (`5`, `true`), the way
Java's `makeCustomHeaderToNet` fills the map with `String.valueOf`.

Defaults: `language` PYTHON (Java parses the name as an enum, and every client
checked ignores it), `version` V4_9_8, the `MQVersion.CURRENT_VERSION` a 4.9.8 client
or broker sends (a namesrv answers `version >= V4_9_4` in standard JSON).

The command is mutable, as Java's is: a processor fills in a response step by step,
and the transport stamps `opaque`, `flag` and `serialize_type` on what it sends.
"""

from __future__ import annotations

import attrs

from raftmq.remoting.codes import LanguageCode, MQVersion, SerializeType

__all__ = ["FLAG_ONEWAY", "FLAG_RESPONSE", "RemotingCommand"]

FLAG_RESPONSE = 1 << 0  # RemotingCommand.RPC_TYPE
FLAG_ONEWAY = 1 << 1  # RemotingCommand.RPC_ONEWAY


@attrs.define(slots=True, eq=True, repr=False)
class RemotingCommand:
    code: int = 0
    language: LanguageCode = LanguageCode.PYTHON
    version: int = MQVersion.V4_9_8
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.Factory(dict)
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def make_response(
        self,
        code: int,
        remark: str | None = None,
        *,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """A response to this request: same opaque, same serialize type, response flag.

        Java answers in the request's serialize type
        (`setSerializeTypeCurrentRPC(cmd.getSerializeTypeCurrentRPC())`), which is
        what lets `ali-ons` and the C++ client, who read the header length unmasked,
        work at all: they send JSON and must get JSON back.
        """
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields={} if ext_fields is None else ext_fields,
            body=body,
            serialize_type=self.serialize_type,
        )

    def __repr__(self) -> str:
        # The body can be megabytes; show its size, as Java's toString leaves it out.
        kind = "response" if self.is_response else "request"
        oneway = " oneway" if self.is_oneway else ""
        return (
            f"RemotingCommand({kind}{oneway} code={self.code} opaque={self.opaque} "
            f"remark={self.remark!r} ext_fields={self.ext_fields!r} "
            f"body={len(self.body)}B language={getattr(self.language, 'name', self.language)} "
            f"version={self.version} "
            f"serialize_type={getattr(self.serialize_type, 'name', self.serialize_type)})"
        )
