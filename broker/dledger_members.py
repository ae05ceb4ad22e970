"""DLEDGER_MEMBERS (259001, ours): a DLedger broker group's members, listed or changed
by `mqadmin getDLedgerPeers`, `addDLedgerPeer` and `removeDLedgerPeer`, and its
leadership moved by `transferDLedgerLeader` and `balanceDLedgerLeaders`.

Without a `change` field the broker answers its DLedger member's view of the
configuration in force, `{"voters", "learners", "peers", "leaderId"}`. With one (add,
promote or remove, `memberId`, and `address` to add) it asks its group's DLedger
leader, itself or over the peer port, and answers once the change has committed
(docs/membership.md); with `lead`, the leader hands leadership to voter `memberId` and
the answer comes once that member leads.
"""

from __future__ import annotations

import attrs
from raftmq.broker.headers import BadRequest, json_body, text
from raftmq.dledger.server import DLedgerError, DLedgerServer

from raftmq.remoting import Connection, RemotingCommand, ResponseCode


@attrs.define
class DLedgerMembers:
    dledger: DLedgerServer

    async def members(self, request: RemotingCommand, connection: Connection):
        change = text(request, "change", "")
        members = self.dledger.members()
        if change:
            try:
                members = await self.dledger.change_at_leader(
                    change, text(request, "memberId"), text(request, "address", "")
                )
            except ValueError as exc:
                raise BadRequest(str(exc), ResponseCode.INVALID_PARAMETER) from None
            except DLedgerError as exc:
                return request.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        return request.make_response(ResponseCode.SUCCESS, body=json_body(members))
