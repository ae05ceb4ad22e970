"""Segment files: DLedger's data and index files, preallocated and mapped in full
(raftmq.disk.segments); what is DLedger's own in them is here.

Layout under the store's base directory:

    data/<20-digit start offset>    `segment_size` bytes each; entries at their leader-chosen pos
    index/<20-digit start offset>   `index_segment_size` bytes each; entry i at byte 32*i

An entry never
spans data segments: when the next one does not fit, a BLANK filler
`[-1][bytes to the segment end]` marks the rest of the old segment as unused.
"""

from __future__ import annotations

import bisect

from raftmq.dledger.codes import EntryType
from raftmq.dledger.store import entry as codec

BLANK = int(EntryType.BLANK)
ENTRY_TYPES = (int(EntryType.NORMAL), int(EntryType.NOOP))
INDEX = codec.INDEX_ENTRY
INDEX_SIZE = codec.INDEX_ENTRY_SIZE


class SyncFailed(Exception):
    """An fsync failed while the store was being opened (recovery makes its repairs
    durable before anything is served): the disk, not the data, is at fault."""


def first_index_at(pos: int, low: int, high: int, read_entry) -> int:
    """The first index in [low, high) whose index entry's pos is at or after `pos`, else high.

    Positions grow with the index, so this is a binary search over the index file;
    `read_entry(i)` returns index entry i as (magic, pos, size, index, term).
    """
    return low + bisect.bisect_left(range(low, high), pos, key=lambda i: read_entry(i)[1])
