"""A DLedger client: finds the leader, appends, reads, and follows leadership changes.

Like DLedger's `DLedgerClient` it starts from any peer and, on NOT_LEADER, moves to
the leader the answer names (or asks the others) and retries — until a deadline
rather than just once, so a caller rides through an election instead of failing.
Only answers that prove an append was not made (NOT_LEADER, LEADER_TRANSFERRING,
a refused connection before sending) are retried; an append whose outcome is
unknown (a timeout, a connection lost after sending) is reported, never resent,
so nothing is appended twice behind the caller's back.
"""

from __future__ import annotations

import base64

import trio
from raftmq.dledger.codes import Code
from raftmq.dledger.net.codec import RpcCode
from raftmq.dledger.net.rpc_client import RpcClient, RpcTimeout, RpcUnavailable

from raftmq.transport.tls import PeerTls

_RETRYABLE = (
    Code.NOT_LEADER,
    Code.LEADER_TRANSFERRING,
    Code.LEADER_NOT_READY,
    Code.LEADER_PENDING_FULL,
)


class ClientError(Exception):
    """A request that did not succeed; `code` is DLedger's response code."""

    def __init__(self, code: Code, remark: str = "") -> None:
        super().__init__(f"{code.name} ({int(code)}){': ' + remark if remark else ''}")
        self.code = code


def _known_group(response: dict, group: str) -> dict:
    """`response`, unless the member serves another group: then no member will answer
    this client, so waiting for a leader would only end in a misleading NOT_LEADER."""
    if response.get("code") == Code.UNKNOWN_GROUP:
        remark = response.get("remark", "")
        raise ClientError(Code.UNKNOWN_GROUP, f"asked for group {group!r}, {remark}")
    return response


class DLedgerClient:
    def __init__(
        self,
        group: str,
        peers: dict[str, str],
        timeout_s: float = 5.0,
        *,
        tls: PeerTls | None = None,
    ) -> None:
        self.group = group
        self.tls = tls  # the group's peer port is mutual TLS: this client presents a cert
        self.peers = peers
        self.timeout_s = timeout_s
        self.leader_id: str | None = None
        self._conns: dict[str, RpcClient] = {}
        self._nursery_manager = trio.open_nursery()
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> DLedgerClient:
        self._nursery = await self._nursery_manager.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        self._nursery.cancel_scope.cancel()
        await self._nursery_manager.__aexit__(None, None, None)

    async def _conn(self, peer: str) -> RpcClient:
        """The open connection to `peer`; each lives in a task of the client's nursery."""
        conn = self._conns.get(peer)
        if conn is None or conn.closed:
            conn = await self._nursery.start(self._hold, peer)
            self._conns[peer] = conn
        return conn

    async def _hold(self, peer: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with RpcClient(self.peers[peer], connect_timeout_s=0.5, tls=self.tls) as conn:
            task_status.started(conn)
            await trio.sleep_forever()

    async def call(self, peer: str, request: dict, timeout_s: float | None = None) -> dict:
        """One RPC to `peer`; connection problems raise RpcUnavailable / RpcTimeout."""
        request = {"group": self.group, **request}
        conn = await self._conn(peer)
        try:
            response = await conn.call(request, timeout_s=timeout_s or self.timeout_s)
            return _known_group(response, self.group)
        except RpcUnavailable:
            self._conns.pop(peer, None)
            raise

    # ------------------------------------------------------------------ metadata
    async def status(self) -> list[dict]:
        """Every member's view (role, term, leader, ledger end, commit); unreachable ones marked."""
        results: dict[str, dict] = {}
        refusals: list[ClientError] = []

        async def ask(peer: str) -> None:
            try:
                resp = await self.call(peer, {"code": RpcCode.STATUS}, timeout_s=1.0)
                results[peer] = resp
            except (RpcUnavailable, RpcTimeout) as exc:
                results[peer] = {"selfId": peer, "role": "UNREACHABLE", "error": str(exc)}
            except ClientError as exc:  # a member of another group
                refusals.append(exc)

        async with trio.open_nursery() as nursery:
            for peer in self.peers:
                nursery.start_soon(ask, peer)
        if refusals:
            raise refusals[0]
        return [results[p] for p in self.peers]

    async def _leader(self, deadline: float) -> str:
        """The leader last heard of, else `find_leader`: one named by an earlier answer
        that this client has no address for (its peers were narrowed since) is found
        again."""
        if self.leader_id in self.peers:
            return self.leader_id
        return await self.find_leader(deadline)

    async def find_leader(self, deadline: float) -> str:
        """The current leader's id, asking around until `deadline` (trio time)."""
        while True:
            for peer in self._candidates():
                try:
                    resp = await self.call(peer, {"code": RpcCode.METADATA}, timeout_s=0.5)
                except (RpcUnavailable, RpcTimeout):
                    continue
                if resp.get("role") == "LEADER":
                    self.leader_id = peer
                    return peer
                if resp.get("leaderId") in self.peers and resp.get("leaderId") != peer:
                    self.leader_id = resp["leaderId"]
            if trio.current_time() >= deadline:
                raise ClientError(Code.NOT_LEADER, "no leader found before the deadline")
            await trio.sleep(0.02)

    def _candidates(self) -> list[str]:
        peers = list(self.peers)
        if self.leader_id in self.peers:
            peers.remove(self.leader_id)
            peers.insert(0, self.leader_id)
        return peers

    # ------------------------------------------------------------------ data
    async def append(
        self, bodies: list[bytes], timeout_s: float | None = None
    ) -> list[tuple[int, int]]:
        """Append `bodies` as one request; (index, pos) per entry once committed."""
        deadline = trio.current_time() + (timeout_s or self.timeout_s)
        request = {"code": RpcCode.APPEND, "bodies": bodies}
        while True:
            leader = await self._leader(deadline)
            try:
                conn = await self._conn(leader)
            except RpcUnavailable:  # refused before sending: nothing was appended
                self.leader_id = None
                await self._pause(deadline, Code.NOT_LEADER)
                continue
            remaining = max(0.05, deadline - trio.current_time())
            try:
                resp = await conn.call({"group": self.group, **request}, timeout_s=remaining)
                _known_group(resp, self.group)
            except RpcUnavailable as exc:
                self._conns.pop(leader, None)
                self.leader_id = None
                raise ClientError(
                    Code.NETWORK_ERROR, f"connection to {leader} lost: outcome unknown"
                ) from exc
            except RpcTimeout as exc:
                raise ClientError(
                    Code.TIMEOUT, f"no answer from {leader}: outcome unknown"
                ) from exc
            code = Code(resp["code"])
            if code is Code.SUCCESS:
                return [tuple(p) for p in resp["positions"]]
            if code not in _RETRYABLE:
                raise ClientError(code, resp.get("remark", ""))
            self.leader_id = resp.get("leaderId") if resp.get("leaderId") != leader else None
            await self._pause(deadline, code)

    async def _pause(self, deadline: float, code: Code) -> None:
        if trio.current_time() >= deadline:
            raise ClientError(code, "gave up at the deadline")
        await trio.sleep(0.01)

    async def get(self, index: int) -> dict:
        """The committed entry at `index`, from the leader (or any member that has committed it)."""
        deadline = trio.current_time() + self.timeout_s
        last = Code.UNKNOWN
        for peer in [await self.find_leader(deadline), *self.peers]:
            try:
                resp = await self.call(peer, {"code": RpcCode.GET, "index": index}, timeout_s=1.0)
            except (RpcUnavailable, RpcTimeout):
                continue
            last = Code(resp["code"])
            if last is Code.SUCCESS:
                return resp
        raise ClientError(last, f"index {index} not readable")

    # ------------------------------------------------------------------ members
    async def members(self) -> dict:
        """The leader's configuration: {"voters": [...], "learners": [...], "peers":
        {id: address}}; members it names that this client did not know are learned."""
        deadline = trio.current_time() + self.timeout_s
        leader = await self.find_leader(deadline)
        resp = await self.call(leader, {"code": RpcCode.METADATA}, timeout_s=1.0)
        self.peers.update(resp["peers"])
        return {k: resp[k] for k in ("voters", "learners", "peers")}

    async def add_peer(self, member: str, address: str) -> None:
        """Add `member` (started with joinAsLearner) as a learner, wait for it to catch
        up, then promote it to voter: two changes, each committed before the next.
        Idempotent: a step already made is skipped, so a retry after a timeout is safe."""
        if member not in (await self.members())["peers"]:
            await self._change("add", member, address)
        if member in (await self.members())["learners"]:
            await self._change("promote", member)

    async def remove_peer(self, member: str) -> None:
        """Remove `member` (the leader too: it steps down once its removal commits)."""
        if member in (await self.members())["peers"]:
            await self._change("remove", member)

    async def _change(self, change: str, member: str, address: str = "") -> None:
        """One MEMBERS request to the leader, retried (within the client's timeout)
        while the answer proves nothing changed: not the leader, the last change not
        yet committed, or a learner still catching up."""
        deadline = trio.current_time() + self.timeout_s
        request = {"code": RpcCode.MEMBERS, "change": change, "memberId": member}
        if address:
            request["address"] = address
        while True:
            leader = await self._leader(deadline)
            resp = await self.call(
                leader, request, timeout_s=max(0.05, deadline - trio.current_time())
            )
            code = Code(resp["code"])
            if code is Code.SUCCESS:
                return
            if code not in (*_RETRYABLE, Code.FALL_BEHIND_TOO_MUCH):
                raise ClientError(code, resp.get("remark", ""))
            if resp.get("leaderId") and resp.get("leaderAddr"):
                self.peers.setdefault(resp["leaderId"], resp["leaderAddr"])
            self.leader_id = resp.get("leaderId") if resp.get("leaderId") != leader else None
            await self._pause(deadline, code)

    async def leadership_transfer(self, leader: str, transferee: str) -> None:
        resp = await self.call(
            leader,
            {"code": RpcCode.LEADERSHIP_TRANSFER, "leaderId": leader, "transfereeId": transferee},
        )
        if resp["code"] != Code.SUCCESS:
            raise ClientError(Code(resp["code"]), resp.get("remark", ""))


def body_for_json(body: bytes) -> dict:
    """An entry body for JSON output: as text when it is UTF-8, else base64."""
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"bodyBase64": base64.b64encode(body).decode("ascii")}
