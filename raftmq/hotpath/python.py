"""The pure-Python implementation of every function `raftmq.hotpath` exports.

Each is the reference its compiled twin (`_compiled.pyx`) is held to, byte for byte
and error for error, by tests/test_hotpath.py; each is written with the codecs the
rest of the broker uses, so what the batched path stores and answers is what the
message-at-a-time path would. The compiled twin takes its fast path for the input
clients send and calls back into these for anything unusual, which is how the two
raise the same errors.
"""

from __future__ import annotations

from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageConst, MessageExt
from raftmq.protocol.msgid import message_id_from_bytes, unpack_ip
from raftmq.remoting.codec import check_frame_length, encode
from raftmq.remoting.codes import ResponseCode
from raftmq.remoting.command import FLAG_RESPONSE, RemotingCommand

__all__ = ["send_record", "send_responses", "split_frames"]

_LENGTH_BYTES = 4


def split_frames(src, max_frame_bytes: int) -> tuple[list[tuple[int, int]], int]:
    """The complete remoting frames at the start of `src`: ([(payload start, payload
    end)], bytes they take). Each length is checked (`check_frame_length`) as soon as
    it is read, so a hostile one raises RemotingError before anything waits for it."""
    size = len(src)
    frames = []
    pos = 0
    while size - pos >= _LENGTH_BYTES:
        length = int.from_bytes(src[pos : pos + _LENGTH_BYTES], "big")
        check_frame_length(length, max_frame_bytes)
        end = pos + _LENGTH_BYTES + length
        if end > size:
            break
        frames.append((pos + _LENGTH_BYTES, end))
        pos = end
    return frames, pos


def _host(packed: bytes) -> tuple[str, int]:
    """(ip, port) of a store or born host packed as a record holds it (8 or 20 bytes)."""
    return unpack_ip(packed[:-4]), int.from_bytes(packed[-4:], "big")


def send_record(
    store_timestamp_ms: int,
    born_host: bytes,
    store_host: bytes,
    cluster: str,
    topic: str,
    queue_id: int,
    flag: int,
    sysflag: int,
    born_timestamp_ms: int,
    reconsume_times: int,
    properties: str,
    body: bytes,
) -> bytes:
    """The CommitLog record of one sent message, as the send processor stores it: the
    client's properties (wire text) without WAIT, with the broker's CLUSTER; hosts
    packed as the record holds them. MessageFormatError for what a record cannot hold."""
    props = codec.string_to_properties(properties)
    props.pop(MessageConst.PROPERTY_WAIT_STORE_MSG_OK, None)
    props[MessageConst.PROPERTY_CLUSTER] = cluster
    msg = MessageExt(
        topic=topic,
        body=body,
        properties=props,
        queue_id=queue_id,
        flag=flag,
        sysflag=sysflag,
        born_timestamp=born_timestamp_ms,
        born_host=_host(born_host),
        store_timestamp=store_timestamp_ms,
        store_host=_host(store_host),
        reconsume_times=reconsume_times,
    )
    return codec.encode(msg)


def send_responses(sends: list[tuple[int, int, int, int, int]], store_host: bytes) -> bytes:
    """The SUCCESS responses to a batch of single-message sends, as frames back to back.

    `sends` holds (opaque, serialize type, queue id, queue offset, physical offset)
    per request; each response is what `SendProcessor` answers one send with, stamped
    as `Connection.respond` stamps it.
    """
    frames = []
    for opaque, serialize_type, queue_id, queue_offset, physical_offset in sends:
        ext = {
            "msgId": message_id_from_bytes(store_host, physical_offset),
            "queueId": str(queue_id),
            "queueOffset": str(queue_offset),
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        }
        response = RemotingCommand(
            code=ResponseCode.SUCCESS,
            opaque=opaque,
            flag=FLAG_RESPONSE,
            ext_fields=ext,
            serialize_type=serialize_type,
        )
        frames.append(encode(response))
    return b"".join(frames)
