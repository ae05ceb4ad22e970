"""AutoSwitch HA's four frames (RocketMQ 5.1.1+), byte for byte, read back from any
split of the stream; a frame in the wrong state, or a 5.0/5.1.0 handshake, ends the
connection with a reason."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from raftmq.broker.store.autoswitch_wire import (
    Ack,
    Handshake,
    HandshakeReply,
    MasterReader,
    OldHandshake,
    SlaveReader,
    Transfer,
    WireError,
)
from raftmq.broker.store.epoch_file import EpochEntry

# The frames as AutoSwitchHAClient/AutoSwitchHAConnection put them in their ByteBuffers
HANDSHAKE_BYTES = bytes.fromhex("00000001000100000000000000000002")
REPLY_BYTES = bytes.fromhex(
    "00000001" "00000018" "0000000000001f40" "00000008"
    "00000007" "0000000000001b58" "00000008" "0000000000001f40"
)  # fmt: skip
TRANSFER_BYTES = bytes.fromhex(
    "00000002" "00000003" "0000000000001f40" "00000008" "0000000000001f40" "0000000000001f00"
) + b"abc"  # fmt: skip
ACK_BYTES = bytes.fromhex("000000020000000000001f43")

HANDSHAKE = Handshake(sync_from_last_file=True, async_learner=False, broker_id=2)
REPLY = HandshakeReply(8000, (EpochEntry(7, 7000), EpochEntry(8, 8000)))
TRANSFER = Transfer(8000, 8, 8000, 7936, b"abc")
ACK = Ack(8003)


def test_frames_are_rocketmqs_bytes():
    assert HANDSHAKE.encode() == HANDSHAKE_BYTES and len(HANDSHAKE_BYTES) == 16
    assert REPLY.encode() == REPLY_BYTES and len(REPLY_BYTES) == 20 + 2 * 12
    assert TRANSFER.encode() == TRANSFER_BYTES and len(TRANSFER_BYTES) == 36 + 3
    assert ACK.encode() == ACK_BYTES and len(ACK_BYTES) == 12
    assert Transfer(8003, 8, 8000, 8003).encode()[4:8] == b"\0\0\0\0"  # a heartbeat


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def read_all(reader, pieces: list[bytes]) -> list:
    return [frame for piece in pieces for frame in reader.feed(piece)]


def test_every_single_split_point():
    for stream, reader_of, expected in (
        (HANDSHAKE_BYTES + ACK_BYTES + ACK_BYTES, MasterReader, [HANDSHAKE, ACK, ACK]),
        (REPLY_BYTES + TRANSFER_BYTES, lambda: SlaveReader(32768), [REPLY, TRANSFER]),
    ):
        for cut in range(len(stream) + 1):
            assert read_all(reader_of(), [stream[:cut], stream[cut:]]) == expected, cut


transfers = st.builds(
    Transfer,
    offset=st.integers(1000, 1 << 40),
    epoch=st.integers(0, (1 << 31) - 1),
    epoch_start=st.integers(0, 1000),
    confirm_offset=st.integers(-1, 1 << 40),
    body=st.binary(max_size=300),
)
epochs = st.lists(st.integers(1, 1000), unique=True, max_size=30).map(
    lambda starts: tuple(EpochEntry(i + 1, s) for i, s in enumerate(sorted(starts)))
)


@given(
    reply=st.builds(HandshakeReply, st.integers(0, 1 << 40), epochs),
    frames=st.lists(transfers, max_size=8),
    cuts=st.lists(st.integers(0, 1 << 16), max_size=20),
)
def test_the_slave_reads_any_split_of_the_masters_stream(reply, frames, cuts):
    stream = reply.encode() + b"".join(frame.encode() for frame in frames)
    assert read_all(SlaveReader(300), chunks(stream, cuts)) == [reply, *frames]


@given(
    # brokerIds from 2**32 on whose high half is at most 50 read as a 5.0 handshake
    handshake=st.builds(Handshake, st.booleans(), st.booleans(), st.integers(0, (1 << 32) - 1)),
    acks=st.lists(st.builds(Ack, st.integers(0, 1 << 62)), max_size=10),
    cuts=st.lists(st.integers(0, 1 << 10), max_size=20),
)
def test_the_master_reads_any_split_of_the_slaves_stream(handshake, acks, cuts):
    stream = handshake.encode() + b"".join(ack.encode() for ack in acks)
    assert read_all(MasterReader(), chunks(stream, cuts)) == [handshake, *acks]


def test_a_reply_of_more_than_a_thousand_epochs():
    """RocketMQ's slave reads at most 1000 (its buffer's size)."""
    reply = HandshakeReply(5000 * 10, tuple(EpochEntry(i, i * 10) for i in range(1, 5001)))
    assert SlaveReader(32768).feed(reply.encode()) == [reply]


@pytest.mark.parametrize(
    "reader_of, stream, why",
    [
        (MasterReader, ACK_BYTES, "state TRANSFER while this side is in HANDSHAKE"),
        (MasterReader, HANDSHAKE_BYTES * 2, "state HANDSHAKE while this side is in TRANSFER"),
        (MasterReader, b"\0\0\0\x07" + bytes(12), "state 7 while"),
        (lambda: SlaveReader(100), TRANSFER_BYTES, "TRANSFER while this side is in HANDSHAKE"),
        (lambda: SlaveReader(100), REPLY_BYTES * 2, "HANDSHAKE while this side is in TRANSFER"),
        (lambda: SlaveReader(2), REPLY_BYTES + TRANSFER_BYTES, "3 bytes \\(at most 2\\)"),
        (lambda: SlaveReader(100), REPLY_BYTES[:7] + b"\x0d" + REPLY_BYTES[8:], "13 bytes"),
        (lambda: SlaveReader(100), REPLY_BYTES[:19] + b"\x09" + REPLY_BYTES[20:], "last epoch 9"),
    ],
)
def test_a_frame_out_of_place_ends_the_connection(reader_of, stream, why):
    with pytest.raises(WireError, match=why):
        read_all(reader_of(), [stream])


def test_a_rocketmq_5_0_handshake_is_refused_by_name():
    """5.0.0/5.1.0 slaves: state, two flags, int32 address length, the address."""
    address = b"127.0.0.1:30912"
    old = struct.pack(">ihhi", 1, 0, 0, len(address)) + address
    with pytest.raises(OldHandshake, match=r"5.0.0/5.1.0 handshake .*upgrade it to 5.1.1"):
        MasterReader().feed(old)
