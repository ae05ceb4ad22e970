"""The frames of RocketMQ 5's AutoSwitch HA (controller-mode replication, 5.1.1 and
later), without I/O: bytes in, frames out, and frames to bytes.

Every frame begins with its sender's state, an int32 (the ordinal of Java's
`HAConnectionState`); integers are big-endian.

    slave -> master  handshake   16 bytes  state=HANDSHAKE, int16 isSyncFromLastFile,
                                           int16 isAsyncLearner, int64 slave brokerId
    master -> slave  reply       20 + 12n  state=HANDSHAKE, int32 body size, int64 max
                                           offset, int32 last epoch; n x (int32 epoch,
                                           int64 startOffset), oldest first
    master -> slave  transfer    36 + n    state=TRANSFER, int32 body size, int64 offset
                                           of the body, int32 epoch, int64 its start,
                                           int64 confirmOffset; the CommitLog bytes
                                           (size 0: a heartbeat)
    slave -> master  ack         12 bytes  state=TRANSFER, int64 slave max offset

A reader takes the bytes as they come, split anywhere, and returns whole frames. A
frame whose state is not the one the reader is in ends the connection (RocketMQ's
slave skips it and drops the connection; its master changes state to whatever the
slave sent). RocketMQ 5.0.0 and 5.1.0 slaves sent their address instead of a
brokerId (a 12-byte header and up to 50 bytes of address): refused with a message
saying so (OldHandshake), as those versions and 5.1.1 do not work together. They
are told apart by bytes 8-11, the old address length (1 to 50) or the high half of
the new brokerId: a controller assigns brokerIds from 1 on, so a brokerId from 2**32
on would be taken for an old handshake.
RocketMQ's slave reads at most 1000 epoch entries in a reply; these readers take any
number.
"""

from __future__ import annotations

import enum
import struct

import attrs
from raftmq.broker.store.epoch_file import EpochEntry


class State(enum.IntEnum):
    """HAConnectionState, by ordinal."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


HANDSHAKE = struct.Struct(">ihhq")
REPLY = struct.Struct(">iiqi")
EPOCH = struct.Struct(">iq")
TRANSFER = struct.Struct(">iiqiqq")
ACK = struct.Struct(">iq")
OLD_HANDSHAKE_MAX_ADDRESS_BYTES = 50  # 5.0.0/5.1.0: the slave's address after 12 bytes


class WireError(ValueError):
    """Bytes that are not the next frame of this protocol: the connection ends."""


class OldHandshake(WireError):
    """A RocketMQ 5.0.0/5.1.0 slave's handshake (it names its address, not a brokerId)."""


@attrs.frozen
class Handshake:
    sync_from_last_file: bool
    async_learner: bool
    broker_id: int

    def encode(self) -> bytes:
        return HANDSHAKE.pack(
            State.HANDSHAKE, self.sync_from_last_file, self.async_learner, self.broker_id
        )


@attrs.frozen
class HandshakeReply:
    max_offset: int
    epochs: tuple[EpochEntry, ...]

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1].epoch if self.epochs else -1

    def encode(self) -> bytes:
        body = b"".join(EPOCH.pack(e.epoch, e.start_offset) for e in self.epochs)
        return REPLY.pack(State.HANDSHAKE, len(body), self.max_offset, self.last_epoch) + body


@attrs.frozen
class Transfer:
    offset: int
    epoch: int
    epoch_start: int
    confirm_offset: int
    body: bytes = b""

    def encode(self) -> bytes:
        header = TRANSFER.pack(
            State.TRANSFER,
            len(self.body),
            self.offset,
            self.epoch,
            self.epoch_start,
            self.confirm_offset,
        )
        return header + self.body


@attrs.frozen
class Ack:
    offset: int

    def encode(self) -> bytes:
        return ACK.pack(State.TRANSFER, self.offset)


def _check_state(sent: int, expected: State) -> None:
    if sent != expected:
        name = State(sent).name if sent in State._value2member_map_ else str(sent)
        raise WireError(f"a frame in state {name} while this side is in {expected.name}")


class _Reader:
    def __init__(self) -> None:
        self._pending = bytearray()
        self.state = State.HANDSHAKE

    def feed(self, data: bytes) -> list:
        """The frames completed by `data`, in order; WireError on bytes that cannot be."""
        self._pending += data
        frames = []
        while (frame := self._next()) is not None:
            frames.append(frame)
        return frames

    def _next(self):
        raise NotImplementedError


class MasterReader(_Reader):
    """What a master reads from a slave: one handshake, then acks."""

    def _next(self) -> Handshake | Ack | None:
        pending = self._pending
        if len(pending) < 4:
            return None
        (state,) = struct.unpack_from(">i", pending)
        if self.state is State.HANDSHAKE:
            _check_state(state, State.HANDSHAKE)
            if len(pending) < 12:
                return None
            (address_bytes,) = struct.unpack_from(">i", pending, 8)
            if 0 < address_bytes <= OLD_HANDSHAKE_MAX_ADDRESS_BYTES:
                raise OldHandshake(
                    "the slave sent a RocketMQ 5.0.0/5.1.0 handshake (an address of"
                    f" {address_bytes} bytes, no brokerId): upgrade it to 5.1.1 or later"
                )
            if len(pending) < HANDSHAKE.size:
                return None
            _state, last_file, learner, broker_id = HANDSHAKE.unpack_from(pending)
            del pending[: HANDSHAKE.size]
            if last_file not in (0, 1) or learner not in (0, 1) or broker_id < 0:
                raise WireError(f"a handshake with flags {last_file}, {learner}, id {broker_id}")
            self.state = State.TRANSFER
            return Handshake(bool(last_file), bool(learner), broker_id)
        _check_state(state, State.TRANSFER)
        if len(pending) < ACK.size:
            return None
        _state, offset = ACK.unpack_from(pending)
        del pending[: ACK.size]
        if offset < 0:
            raise WireError(f"an ack of offset {offset}")
        return Ack(offset)


class SlaveReader(_Reader):
    """What a slave reads from its master: one handshake reply, then transfers.
    `max_body_bytes` bounds a transfer's body (haTransferBatchSize or more)."""

    def __init__(self, max_body_bytes: int) -> None:
        super().__init__()
        self.max_body_bytes = max_body_bytes

    def _next(self) -> HandshakeReply | Transfer | None:
        pending = self._pending
        if len(pending) < 4:
            return None
        (state,) = struct.unpack_from(">i", pending)
        if self.state is State.HANDSHAKE:
            _check_state(state, State.HANDSHAKE)
            if len(pending) < REPLY.size:
                return None
            _state, size, max_offset, last_epoch = REPLY.unpack_from(pending)
            if size < 0 or size % EPOCH.size:
                raise WireError(f"a handshake reply of {size} bytes of epochs")
            if len(pending) < REPLY.size + size:
                return None
            epochs = tuple(
                EpochEntry(*EPOCH.unpack_from(pending, REPLY.size + at))
                for at in range(0, size, EPOCH.size)
            )
            del pending[: REPLY.size + size]
            reply = HandshakeReply(max_offset, epochs)
            if reply.last_epoch != last_epoch or max_offset < 0:
                raise WireError(f"a handshake reply with last epoch {last_epoch}: {reply}")
            self.state = State.TRANSFER
            return reply
        _check_state(state, State.TRANSFER)
        if len(pending) < TRANSFER.size:
            return None
        _state, size, offset, epoch, epoch_start, confirm = TRANSFER.unpack_from(pending)
        if not 0 <= size <= self.max_body_bytes:
            raise WireError(f"a transfer of {size} bytes (at most {self.max_body_bytes})")
        if offset < 0 or epoch_start < 0 or epoch_start > offset:
            raise WireError(f"a transfer at offset {offset} of epoch {epoch} from {epoch_start}")
        if len(pending) < TRANSFER.size + size:
            return None
        body = bytes(pending[TRANSFER.size : TRANSFER.size + size])
        del pending[: TRANSFER.size + size]
        return Transfer(offset, epoch, epoch_start, confirm, body)
