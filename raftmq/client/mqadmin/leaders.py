"""Where DLedger groups lead: transferDLedgerLeader and balanceDLedgerLeaders (ours).

With N broker groups spread over N machines, each machine should lead one group: a
leader does the appends, fsyncs and pushes of its group, so two leaders on one machine
halve what that machine gives each. After restarts, elections put leaders wherever
they land (DLedger's `preferredLeaderIds` pins one member per group, which operators set
by hand). `balanceDLedgerLeaders` reads every group's members and leader, plans the
fewest moves that leave no host leading more than its share (`raftmq.placement`), and
asks each group to hand leadership over (DLEDGER_MEMBERS with change `lead`).
"""

from __future__ import annotations

import argparse

from raftmq.client.admin import Admin
from raftmq.client.mqadmin.commands import UsageError, option, print_row, verb
from raftmq.placement.leaders import GroupLeader, group_leader, leader_moves
from raftmq.remoting.codes import DLEDGER_LEAD_CHANGE


async def group_leaders(admin: Admin, cluster: str) -> list[GroupLeader]:
    """Every DLedger group of `cluster` with a master, as its master reports it."""
    found = []
    for broker in (await admin.cluster_info()).broker_datas(cluster):
        if broker.master is None:
            continue
        members = await admin.dledger_members(broker.master)
        found.append(group_leader(broker.broker_name, broker.master, members))
    return found


@verb(
    "transferDLedgerLeader",
    "Hand a DLedger group's leadership (its master) to one of its voters",
    option("-b", "brokerAddr", "a broker of the group", required=True),
    option("-m", "member", "the voter's dLegerSelfId", required=True),
)
async def transfer_dledger_leader(admin: Admin, args: argparse.Namespace) -> None:
    """Returns once `member` leads (its broker is then the group's master)."""
    address, member = args.brokerAddr.strip(), args.member.strip()
    members = await admin.dledger_members(address, DLEDGER_LEAD_CHANGE, member)
    print(f"{member} leads {address}'s group (leaderId {members['leaderId']})")


@verb(
    "balanceDLedgerLeaders",
    "Move DLedger leaders so that no host leads more than its share of a cluster's groups",
    option("-c", "clusterName", "the cluster", required=True),
    option("--dryRun", "dryRun", "print the moves without making them", action="store_true"),
)
async def balance_dledger_leaders(admin: Admin, args: argparse.Namespace) -> None:
    cluster = args.clusterName.strip()
    if not cluster:
        raise UsageError("-c: a cluster name is needed")
    moves = leader_moves(await group_leaders(admin, cluster))
    print_row("%-20s  %-12s  %-12s  %s", "#Group", "#From", "#To", "#Result")
    for move in moves:
        result = "planned"
        if not args.dryRun:
            await admin.dledger_members(move.broker_addr, DLEDGER_LEAD_CHANGE, move.to)
            result = "moved"
        print_row("%-20s  %-12s  %-12s  %s", move.group, move.leader, move.to, result)
    if not moves:
        print(f"balanced: no host of {cluster} leads more than its share")
