"""Leadership transfer, seen from the old leader and from the transferee, and the
preferred leader that asks for it (DLedger's LEADERSHIP_TRANSFER and TakeLeadershipTask).

The old leader stops taking appends and asks the transferee to take over once it has
caught up to the leader's end; the transferee then campaigns in the next term with
short vote gaps, and answers the old leader when the campaign is decided.
"""

from __future__ import annotations

import attrs
from raftmq.dledger.codes import Code, Role
from raftmq.dledger.core.messages import LeadershipTransferRequest, LeadershipTransferResponse
from raftmq.dledger.core.output import Completion


@attrs.define(slots=True)
class Transfer:
    """A leadership transfer in progress, seen from the old leader or from the transferee."""

    transferee: str
    deadline_ms: float
    handle: int | None = None  # the admin request on the leader side
    reply_to: str | None = None  # transferee side: the old leader waiting for our answer
    reply_seq: int = 0
    take_index: int = -1  # transferee side: catch up to this index first
    target_term: int = -1  # transferee side: the term we campaign in


class LeadershipTransfer:
    """Part of `Replica`: `transfer` (the one in progress) and `term_to_take_leadership`."""

    def transfer_leadership(self, handle: int, transferee: str, now_ms: float) -> Code:
        """Admin: hand leadership to `transferee` (DLedger's LEADERSHIP_TRANSFER at the leader)."""
        if self.role is not Role.LEADER:
            return Code.NOT_LEADER
        if transferee not in self.peers:
            return Code.UNKNOWN_MEMBER if transferee != self.self_id else Code.SUCCESS
        if self.transfer is not None:
            return Code.LEADER_TRANSFERRING
        behind = self.store.end_index - self.progress[transferee].match_index
        if behind >= self.config.max_leadership_transfer_wait_index:
            return Code.FALL_BEHIND_TOO_MUCH
        timeout = self.config.leadership_transfer_wait_timeout_ms
        self.transfer = Transfer(
            transferee, now_ms + 3 * timeout + self._election_span_ms(), handle=handle
        )
        self._send(
            LeadershipTransferRequest(
                self.config.group,
                self.self_id,
                transferee,
                self.self_id,
                self.term,
                transfer_id=self.self_id,
                transferee_id=transferee,
                take_leadership_ledger_index=self.store.end_index,
                seq=self._next_seq(),
            )
        )
        return Code.SUCCESS

    def _election_span_ms(self) -> float:
        return self.lease_ms + self.config.max_vote_interval_ms

    def _on_transfer_request(self, req: LeadershipTransferRequest, now_ms: float) -> None:
        if req.transferee_id != self.self_id:
            self._answer_transfer(req.local_id, req.seq, Code.UNEXPECTED_ARGUMENT)
            return
        if req.transfer_id != self.leader_id:
            self._answer_transfer(req.local_id, req.seq, Code.INCONSISTENT_LEADER)
            return
        if req.term != self.term:
            self._answer_transfer(req.local_id, req.seq, Code.INCONSISTENT_TERM)
            return
        self.transfer = Transfer(
            self.self_id,
            now_ms + self.config.leadership_transfer_wait_timeout_ms,
            reply_to=req.local_id,
            reply_seq=req.seq,
            take_index=req.take_leadership_ledger_index,
        )
        self._check_transfer(now_ms)

    def _answer_transfer(self, to: str, seq: int, code: Code) -> None:
        self._send(LeadershipTransferResponse(*self._answer_header(to), code, seq=seq))

    def _transfer_due_ms(self) -> float | None:
        """A transfer times out at its deadline; a transferee that has caught up moves on
        at once."""
        t = self.transfer
        if t is None:
            return None
        if t.handle is None and t.target_term < 0 and self.store.end_index >= t.take_index:
            return float("-inf")
        return t.deadline_ms

    def _check_transfer(self, now_ms: float) -> None:
        t = self.transfer
        if t is None:
            return
        if t.handle is not None:  # old leader waiting for the transferee's answer
            if now_ms >= t.deadline_ms:
                self.transfer = None
                self._out.completions.append(Completion(t.handle, Code.TIMEOUT))
            return
        if t.target_term < 0:  # transferee catching up
            if self.store.end_index >= t.take_index:
                t.target_term = self.term + 1
                t.deadline_ms = now_ms + self._election_span_ms() * 3
                self.term_to_take_leadership = t.target_term
                self._change_to_candidate(t.target_term, now_ms)
                self.need_increase_term_immediately = True
            elif now_ms >= t.deadline_ms:
                self.transfer = None
                self._answer_transfer(t.reply_to, t.reply_seq, Code.TAKE_LEADERSHIP_FAILED)
        elif now_ms >= t.deadline_ms:
            self.transfer = None
            self._answer_transfer(t.reply_to, t.reply_seq, Code.TAKE_LEADERSHIP_FAILED)

    def _on_role_change_for_transfer(self, now_ms: float) -> None:
        """DLedger's TakeLeadershipTask.check: answer the old leader once the campaign ends."""
        t = self.transfer
        if t is None or t.handle is not None or t.target_term < 0:
            return
        code = None
        if self.role is Role.LEADER and self.term == t.target_term:
            code = Code.SUCCESS
        elif self.term > t.target_term:
            code = Code.EXPIRED_TERM
        elif self.role is Role.FOLLOWER:
            code = Code.TAKE_LEADERSHIP_FAILED
        if code is not None:
            self.transfer = None
            self._answer_transfer(t.reply_to, t.reply_seq, code)

    def _on_transfer_response(self, resp: LeadershipTransferResponse, now_ms: float) -> None:
        t = self.transfer
        if t is None or t.handle is None or resp.local_id != t.transferee:
            return
        self.transfer = None
        self._out.completions.append(Completion(t.handle, Code(resp.code)))

    def _preferred_check_due_ms(self) -> float:
        return self._next_preferred_check_ms

    def _check_preferred_leader(self, now_ms: float) -> None:
        """Every checkPreferredLeaderInterval: hand over to a preferred peer that is
        alive and close enough behind."""
        self._next_preferred_check_ms = now_ms + self.config.check_preferred_leader_interval_ms
        preferred = self.config.preferred_leader_ids
        if self.transfer is not None or not preferred or self.self_id in preferred:
            return
        best = None
        for peer in preferred:
            prog = self.progress.get(peer)
            if prog is None or now_ms - self.last_ack_ms.get(peer, float("-inf")) > self.lease_ms:
                continue
            lag = self.store.end_index - prog.match_index
            if lag < self.config.max_leadership_transfer_wait_index and (
                best is None or lag < best[0]
            ):
                best = (lag, peer)
        if best is not None:
            self.transfer_leadership(-1, best[1], now_ms)
