"""Retention: deleting the data segments at the front of the log that nobody needs.

DLedger's CleanSpaceService deletes files by age alone; here a segment goes only
when it is old enough *and* every entry in it is below the index the caller keeps
from, so retention never cuts off a follower or the broker's own recovery.
"""

from __future__ import annotations

import logging
import time

from raftmq.dledger.store.segments import INDEX_SIZE

log = logging.getLogger(__name__)


def delete_expired(
    store, keep_from_index: int, older_than_s: float, now_s: float | None = None
) -> int:
    """Delete whole data segments holding only entries below `keep_from_index` whose
    files were last written more than `older_than_s` seconds ago; returns how many.

    Only a prefix of segments goes, never the one the log ends in. The new
    beginning is saved before any file is deleted, so a crash in between leaves
    files that the next recovery finishes deleting. Unlike DLedger's
    CleanSpaceService this honours `keep_from_index` (the caller's
    min(committed, slowest follower's match)): no follower is cut off by it.
    """
    now_s = time.time() if now_s is None else now_s
    seg_size = store.segment_size
    tail_start = store.end_pos - store.end_pos % seg_size
    doomed = []
    for start in sorted(store.data_segments):
        if start >= tail_start:
            break
        if store.first_index_from(start + seg_size) - 1 >= keep_from_index:
            break
        if now_s - store.fs.mtime(store.data_segments[start].path) < older_than_s:
            break
        doomed.append(start)
    if not doomed:
        return 0
    store.move_begin(doomed[-1] + seg_size)
    assert store.begin_index <= keep_from_index, (store.begin_index, keep_from_index)
    for start in doomed:
        store.delete_data_segment(start)
    first_index_byte = INDEX_SIZE * store.begin_index
    for start in sorted(store.index_segments):
        if start + store.index_segment_size <= first_index_byte:
            store.delete_index_segment(start)
    log.info(
        "retention deleted %d data segments; the log now begins at %d",
        len(doomed),
        store.begin_index,
    )
    return len(doomed)
