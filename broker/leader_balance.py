"""Automatic leader balancing (ours; off by default, `enableAutoLeaderBalance=true`):
after restarts, a DLedger group's leader hands leadership over by itself when the
cluster's leaders crowd a host, as `mqadmin balanceDLedgerLeaders` would.

Who decides: every group's leader, each for its own group alone. Every
`autoLeaderBalanceIntervalMs` a leading broker reads its cluster's groups from a name
server and each group's members and leader from its master (DLEDGER_MEMBERS), and
computes the plan `mqadmin balanceDLedgerLeaders` carries out (`raftmq.placement`).
The plan is deterministic, so leaders that see the same cluster agree on which groups
move, and a group moves only by its own leader's act: two deciders never move the same
group, and a second group on a crowded host stays put when the plan moves the first.

Hold-off: a leader acts only when it has found the same cluster (every group's leader)
and the same move for its group at two checks an interval apart, in one term of its
own. A group without a master or a leader (an election or failover in progress), a
leader elected since the last check, or any other leader change anywhere starts the
wait again, so a balancing move never lands in the middle of a failover.
"""

from __future__ import annotations

import json
import logging

import attrs
import trio
from raftmq.dledger.codes import Role
from raftmq.dledger.server import DLedgerError, DLedgerServer

from raftmq.placement.leaders import GroupLeader, Move, group_leader, leader_moves
from raftmq.remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode
from raftmq.remoting.codes import ResponseCode
from raftmq.transport.tls import ClientTls

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 3.0
MASTER_ID = "0"  # brokerAddrs' key of a group's master in GET_BROKER_CLUSTER_INFO


class Unsettled(Exception):
    """The cluster cannot be read whole, or a group has no master or leader: no move."""


def cluster_masters(body: bytes, cluster: str) -> dict[str, str]:
    """brokerName -> its master's address for every group of `cluster`, from a
    GET_BROKER_CLUSTER_INFO body; Unsettled if a group has no master."""
    try:
        doc = json.loads(body)
        names = doc["clusterAddrTable"].get(cluster) or ()
        addrs = {n: (doc["brokerAddrTable"].get(n) or {}).get("brokerAddrs") or {} for n in names}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Unsettled(f"a malformed cluster info: {exc!r}") from None
    masterless = sorted(n for n, a in addrs.items() if MASTER_ID not in a)
    if masterless:
        raise Unsettled(f"no master in {', '.join(masterless)}")
    return {n: str(a[MASTER_ID]) for n, a in addrs.items()}


@attrs.define
class AutoLeaderBalance:
    cluster: str
    group: str  # our brokerName
    namesrv_addrs: tuple[str, ...]
    dledger: DLedgerServer
    interval_s: float
    tls: ClientTls | None = None
    # (term, every group's leader, our move) at the last check that found a move
    _pending: tuple | None = None

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.check()
            except (Unsettled, RemotingError, OSError) as exc:
                self._pending = None
                log.debug("leader balance of %s: nothing done: %s", self.cluster, exc)

    async def check(self) -> Move | None:
        """One check; the move made, if any."""
        replica = self.dledger.replica
        if replica.role is not Role.LEADER:
            self._pending = None
            return None
        term = replica.term
        groups = await self._groups()
        move = next((m for m in leader_moves(groups) if m.group == self.group), None)
        seen = (term, tuple((g.group, g.leader) for g in groups), move)
        if move is None or seen != self._pending:
            self._pending = None if move is None else seen
            return None
        self._pending = None
        log.warning(
            "leadership of %s moves from %s to %s: no host of %s then leads more than its"
            " share (enableAutoLeaderBalance)",
            self.group, move.leader, move.to, self.cluster,
        )  # fmt: skip
        try:
            await self.dledger.transfer_leadership_at_leader(move.to)
        except (DLedgerError, ValueError) as exc:
            log.warning("%s: leadership of %s did not move: %s", move.leader, self.group, exc)
            return None
        return move

    async def _groups(self) -> list[GroupLeader]:
        """Every group of our cluster, its members and leader as its master answers."""
        masters = cluster_masters(
            await self._ask(self.namesrv_addrs, RequestCode.GET_BROKER_CLUSTER_INFO),
            self.cluster,
        )
        groups = []
        for name, address in sorted(masters.items()):
            body = await self._ask((address,), RequestCode.DLEDGER_MEMBERS)
            try:
                groups.append(group_leader(name, address, json.loads(body)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise Unsettled(f"{address} answered malformed members: {exc!r}") from None
            if groups[-1].leader is None:
                raise Unsettled(f"{name} has no leader")
        return groups

    async def _ask(self, addresses: tuple[str, ...], code: int) -> bytes:
        """The body of the first of `addresses` to answer `code` with SUCCESS."""
        failures = []
        for address in addresses:
            try:
                async with RemotingClient(address, tls=self.tls) as client:
                    answer = await client.invoke(RemotingCommand(code=code), REQUEST_TIMEOUT_S)
            except (RemotingError, OSError) as exc:
                failures.append(f"{address}: {exc}")
                continue
            if answer.code == ResponseCode.SUCCESS:
                return answer.body or b""
            failures.append(f"{address}: code {answer.code} {answer.remark}")
        raise Unsettled("; ".join(failures) or "no address to ask")
