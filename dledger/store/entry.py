"""DLedger's data entry and index entry, byte for byte, with the CRCs filled in.

A data entry is a 48-byte big-endian header followed by the body:

    0 magic (entry type)  4 size (48 + bodyLen)  8 index  16 term  24 pos
    32 channel  36 chainCrc  40 bodyCrc  44 bodyLen  48 body

DLedger leaves chainCrc and bodyCrc at zero. We fill them: bodyCrc is crc32c of
the body, and chainCrc is crc32c over the previous entry's chainCrc, this
header's first 36 bytes and bodyCrc. A torn or flipped entry then fails its own
bodyCrc, and two replicas whose entries at index i carry the same chainCrc hold
the same log up to i (which makes log matching checkable in O(1)).

An entry whose two CRC fields are both zero is taken as DLedger wrote it, unchecked
(the chain restarts after it from zero): what lets raftmq open a log Apache
RocketMQ's DLedger wrote. A real entry has both zero with odds of 2^-64; a
zeroed tail fails the magic check first.

An index entry is 32 bytes: magic(4) pos(8) size(4) index(8) term(8); entry i
sits at index-file offset 32*i.
"""

from __future__ import annotations

import itertools
import struct

import attrs
from crc32c import crc32c
from raftmq.dledger.codes import EntryType

from raftmq.hotpath import compiled_or

HEADER = struct.Struct(">iiqqqiIIi")
HEADER_SIZE = HEADER.size  # 48: DLedger's BODY_OFFSET
POS_OFFSET = 24
CHAIN_OFFSET = 36
INDEX_ENTRY = struct.Struct(">iqiqq")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 32
BLANK_HEADER = struct.Struct(">ii")  # magic = -1, size = bytes to the end of the segment
MIN_BLANK_SIZE = 8
_CRC = struct.Struct(">I")
_ENTRY_TYPES = frozenset((int(EntryType.NORMAL), int(EntryType.NOOP)))


class CorruptEntry(ValueError):
    """Bytes that do not decode to a valid entry; the message names what failed."""


@attrs.frozen(slots=True)
class Entry:
    index: int
    term: int
    pos: int
    type: EntryType
    body: bytes
    chain_crc: int = 0

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.body)


def chain_crc(prev_chain: int, header_prefix: bytes, body_crc: int) -> int:
    """The chainCrc of an entry: header bytes 0..36 and bodyCrc, seeded with the previous chain."""
    return crc32c(_CRC.pack(body_crc), crc32c(header_prefix, prev_chain))


def encode(
    entry_type: int, index: int, term: int, pos: int, body: bytes, prev_chain: int
) -> tuple[bytes, int]:
    """Encode one entry; returns (bytes, chainCrc)."""
    size = HEADER_SIZE + len(body)
    body_crc = crc32c(body)
    prefix = struct.pack(">iiqqqi", entry_type, size, index, term, pos, 0)
    chain = chain_crc(prev_chain, prefix, body_crc)
    tail = _CRC.pack(chain) + _CRC.pack(body_crc) + struct.pack(">i", len(body))
    return prefix + tail + body, chain


# `encode`, compiled where the build allows (raftmq.hotpath): the memory store's append.
ENCODE = compiled_or("encode_entry", encode)


def encode_entries(
    entry_type: int, bodies: list, index: int, term: int, pos: int, prev_chain: int
) -> tuple[bytes, bytes, int]:
    """Entries of one type from `index` on, back to back from `pos` (the caller keeps
    them in one segment): (their bytes, their index entries, the last chainCrc).
    Compiled where the build allows (ENCODE_ENTRIES): the file store's leader append."""
    parts, index_parts = [], []
    for body in bodies:
        blob, prev_chain = encode(entry_type, index, term, pos, body, prev_chain)
        parts.append(blob)
        index_parts.append(INDEX_ENTRY.pack(entry_type, pos, len(blob), index, term))
        index += 1
        pos += len(blob)
    return b"".join(parts), b"".join(index_parts), prev_chain


ENCODE_ENTRIES = compiled_or("encode_entries", encode_entries)


def check(buf, offset: int, prev_chain: int | None) -> tuple[int, int, int, int, int]:
    """Validate the entry at `offset` of `buf`; returns (type, size, index, term, chainCrc).

    `prev_chain` is the previous entry's chainCrc, or None when it is unknown (the
    first entry after a log's beginning), in which case the chain is taken as is.
    Raises CorruptEntry naming the first check that failed. Followers run this on
    every entry they receive, so it avoids copies: pass a memoryview when checking
    many entries of one buffer.
    """
    if len(buf) - offset < HEADER_SIZE:
        raise CorruptEntry("short header")
    magic, size, index, term, _pos, _channel, chain, body_crc, body_len = HEADER.unpack_from(
        buf, offset
    )
    if magic not in _ENTRY_TYPES:
        raise CorruptEntry(f"bad magic {magic}")
    if size != HEADER_SIZE + body_len or body_len < 0:
        raise CorruptEntry(f"size {size} does not match bodyLen {body_len}")
    end = offset + size
    if end > len(buf):
        raise CorruptEntry("entry runs past the end of the data")
    if chain == 0 and body_crc == 0:  # as DLedger writes it: nothing to check
        return magic, size, index, term, chain
    view = buf if type(buf) is memoryview else memoryview(buf)
    if crc32c(view[offset + HEADER_SIZE : end]) != body_crc:
        raise CorruptEntry(f"bodyCrc mismatch at index {index}")
    if prev_chain is not None and chain != crc32c(
        _CRC.pack(body_crc), crc32c(view[offset : offset + CHAIN_OFFSET], prev_chain)
    ):
        raise CorruptEntry(f"chainCrc mismatch at index {index}")
    return magic, size, index, term, chain


def decode(buf, offset: int = 0) -> Entry:
    """Decode (without chain verification) the entry at offset."""
    magic, _size, index, term, pos, _c, chain, _bc, body_len = HEADER.unpack_from(buf, offset)
    body = bytes(buf[offset + HEADER_SIZE : offset + HEADER_SIZE + body_len])
    return Entry(index, term, pos, EntryType(magic), body, chain)


def iter_entries(blob):
    """Yield (offset, type, size, index, term, pos, chain) for each entry in a concatenation.

    Raises CorruptEntry on a trailing partial header or a size below the header's,
    which would otherwise surface as struct.error or never advance.
    """
    offset = 0
    end = len(blob)
    while offset < end:
        if end - offset < HEADER_SIZE:
            raise CorruptEntry(f"short header at offset {offset}")
        magic, size, index, term, pos, _c, chain, _bc, _bl = HEADER.unpack_from(blob, offset)
        if size < HEADER_SIZE:
            raise CorruptEntry(f"size {size} below the header size at offset {offset}")
        yield offset, magic, size, index, term, pos, chain
        offset += size


def places(end_pos: int, sizes: list[int], segment_size: int) -> list[int]:
    """Where entries of `sizes` bytes go, one after another, when the log ends at
    `end_pos` (`place` for each): back to back, without placing each one, when they
    all fit in the rest of the current segment (the common case)."""
    positions = list(itertools.accumulate(sizes, initial=end_pos))
    if positions[-1] - end_pos + MIN_BLANK_SIZE <= segment_size - end_pos % segment_size:
        del positions[-1]
        return positions
    positions = []
    for size in sizes:
        pos = place(end_pos, size, segment_size)
        positions.append(pos)
        end_pos = pos + size
    return positions


def index_entries(blob) -> bytes:
    """The index entries of the entries in `blob`, as `iter_entries` walks them (and
    with its errors): what a follower writes to the index file for a validated push.
    Compiled where the build allows (INDEX_ENTRIES)."""
    return b"".join(
        INDEX_ENTRY.pack(magic, pos, size, index, term)
        for _o, magic, size, index, term, pos, _c in iter_entries(blob)
    )


INDEX_ENTRIES = compiled_or("index_entries", index_entries)


def place(end_pos: int, size: int, segment_size: int) -> int:
    """Where the next entry of `size` bytes goes when the log ends at `end_pos`.

    An entry never spans segments: if it does not fit with room for a BLANK header
    after it, it starts at the next segment boundary (DLedger's preAppend rule).
    Both leader and followers use this, so positions agree on every replica.
    """
    if size + MIN_BLANK_SIZE > segment_size:
        raise ValueError(f"entry of {size} bytes does not fit a {segment_size}-byte segment")
    offset_in_segment = end_pos % segment_size
    if offset_in_segment + size + MIN_BLANK_SIZE > segment_size:
        return end_pos - offset_in_segment + segment_size
    return end_pos
