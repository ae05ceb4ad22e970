"""A pull reply's records as columns in Arrow's memory layout, never as MessageExt.

A reader that hands messages on as columns (the Spark source ships Arrow record
batches) pays for a MessageExt per message only to take it apart again: building the
objects and then the lists Arrow converts cost more than the pull. `decode_columns`
reads the records of a pull reply body straight into the buffers Arrow arrays are made
of (`pyarrow.Array.from_buffers`): fixed-width values as native int32/int64, text and
bytes as int32 offsets plus data, nulls as a validity bitmap (bit i of byte i // 8 set
when row i has a value).

The columns say what `decode_all` and `inflate` say of the same bytes, and this
function is their twin: the compiled one (raftmq.hotpath) takes ordinary records and
hands anything else (a V2 record, a compressed body, a malformed record) here, so both
raise the same MessageFormatError. Text is not checked for UTF-8 where decode_all
would not look (keys, tags and property values are checked with the properties).
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

from raftmq.hotpath import compiled_or
from raftmq.protocol.message import MessageFormatError, decode, inflate

__all__ = ["TIMESTAMP_MS_LIMIT", "RecordColumns", "decode_columns"]

# Timestamps are columns of microseconds (int64): milliseconds beyond this do not fit.
TIMESTAMP_MS_LIMIT = (1 << 63) // 1000


class RecordColumns(NamedTuple):
    """Per row: one record of the body, in its order. Offsets buffers hold rows + 1
    int32 values; `property_offsets` counts property pairs, whose names and values
    are two further text columns."""

    rows: int
    queue_ids: bytes  # int32
    queue_offsets: bytes  # int64
    born_us: bytes  # int64, microseconds since the epoch
    store_us: bytes  # int64
    topic_offsets: bytes
    topic_data: bytes
    msg_id_offsets: bytes  # UNIQ_KEY when set, else the offset msgId
    msg_id_data: bytes
    keys_valid: bytes  # KEYS; null when absent
    keys_offsets: bytes
    keys_data: bytes
    tags_valid: bytes  # TAGS; null when absent
    tags_offsets: bytes
    tags_data: bytes
    body_offsets: bytes  # inflated when zlib-compressed, as PullConsumer hands it out
    body_data: bytes
    property_offsets: bytes
    name_offsets: bytes
    name_data: bytes
    value_offsets: bytes
    value_data: bytes
    record_starts: bytes  # int32, rows + 1: where each record begins in the body, and its end


class _Text:
    """A text or bytes column being built: offsets, data and, if nullable, validity."""

    def __init__(self) -> None:
        self.offsets = array("i", [0])
        self.data = bytearray()
        self.valid = bytearray()

    def add(self, row: int, value: bytes | None) -> None:
        if row % 8 == 0:
            self.valid.append(0)
        if value is not None:
            self.valid[row // 8] |= 1 << (row % 8)
            self.data += value
        self.offsets.append(len(self.data))


def _micros(ms: int, what: str, msg) -> int:
    if not -TIMESTAMP_MS_LIMIT <= ms < TIMESTAMP_MS_LIMIT:
        raise MessageFormatError(
            f"{what} {ms} ms of the message at queue offset {msg.queue_offset} is beyond"
            " what a timestamp column holds"
        )
    return ms * 1000


def decode_columns(buf) -> RecordColumns:
    """The records of a pull reply body (`buf`: bytes, bytearray or memoryview) as
    columns; raises MessageFormatError for any malformed record, as decode_all does."""
    view = memoryview(buf).cast("B")
    messages, record_starts = [], array("i", [0])
    while record_starts[-1] < len(view):  # decode_all's walk, keeping where records begin
        msg, size = decode(view, record_starts[-1])
        messages.append(msg)
        record_starts.append(record_starts[-1] + size)
    queue_ids, queue_offsets = array("i"), array("q")
    born_us, store_us = array("q"), array("q")
    topic, msg_id, keys, tags, body = _Text(), _Text(), _Text(), _Text(), _Text()
    property_offsets, names, values = array("i", [0]), _Text(), _Text()
    for row, msg in enumerate(messages):
        inflate(msg)
        queue_ids.append(msg.queue_id)
        queue_offsets.append(msg.queue_offset)
        born_us.append(_micros(msg.born_timestamp, "bornTimestamp", msg))
        store_us.append(_micros(msg.store_timestamp, "storeTimestamp", msg))
        topic.add(row, msg.topic.encode())
        msg_id.add(row, (msg.uniq_key or msg.msg_id).encode())
        keys.add(row, None if msg.keys is None else msg.keys.encode())
        tags.add(row, None if msg.tags is None else msg.tags.encode())
        body.add(row, msg.body)
        for pair, (name, value) in enumerate(msg.properties.items(), len(names.offsets) - 1):
            names.add(pair, name.encode())
            values.add(pair, value.encode())
        property_offsets.append(len(names.offsets) - 1)
    return RecordColumns(
        len(messages),
        queue_ids.tobytes(),
        queue_offsets.tobytes(),
        born_us.tobytes(),
        store_us.tobytes(),
        topic.offsets.tobytes(),
        bytes(topic.data),
        msg_id.offsets.tobytes(),
        bytes(msg_id.data),
        bytes(keys.valid),
        keys.offsets.tobytes(),
        bytes(keys.data),
        bytes(tags.valid),
        tags.offsets.tobytes(),
        bytes(tags.data),
        body.offsets.tobytes(),
        bytes(body.data),
        property_offsets.tobytes(),
        names.offsets.tobytes(),
        bytes(names.data),
        values.offsets.tobytes(),
        bytes(values.data),
        record_starts.tobytes(),
    )


DECODE_COLUMNS = compiled_or("decode_columns", decode_columns)
