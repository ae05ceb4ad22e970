"""The per-message work of the data path, compiled where the build allows.

`raftmq.hotpath._compiled` is one Cython extension, built by `pip install` (setup.py).
Every function in it has a pure-Python twin in the layer that owns the work, held to
the same results and errors by property tests (tests/test_hotpath.py):

    remoting.frames            split_frames           the frames of a receive buffer
                               split_requests         likewise, with the hot path's
                                                      requests left raw
    remoting.codec             plain_json_fields      a JSON header's fields
                               plain_request          a request's fields, read from
                                                      its header's bytes
    broker.send_encoding       send_fields            a send's header
                               send_values            a raw send's header
                               send_record            a sent message's CommitLog record
                               send_responses         a batch's answers, as one write
    broker.send                take_raw_sends         a read's plain sends, checked, as
                                                      records
    broker.store.commitlog     place_record           a record's queue and physical offsets
                               place_records          a leader append's, as a batch
                               dispatch_rows          a batch of entries for the ConsumeQueues
                                                      and the key index
                               queue_runs             the plain rows of a batch as
                                                      ConsumeQueue entries, a run per queue
                               pull_body              a pull's records, as one body
    broker.store.indexfile     recover_slots          a recovered IndexFile's hash slots
    protocol.message           read_dispatch_fields   a record's dispatch fields
                               properties_index_keys  a record's UNIQ_KEY and KEYS
                               java_string_hash       a key index key's hash
    protocol.columns           decode_columns         a pull reply's records as Arrow
                                                      buffers (the Spark source)
    dledger.store.entry        encode_entry           an entry with its CRCs (memory store)
                               encode_entries         a leader append's entries and index
                                                      entries, as one span each
                               index_entries          a received batch's index entries
    dledger.store.base         validate_continuation  a received batch checked (a follower)
    disk.fsync_thread          FsyncThread            group commit's fsyncs, on a thread
                                                      that never takes the GIL

The owning layer asks `compiled_or(name, twin)` which one to run: the compiled one,
unless `RAFTMQ_NO_EXTENSIONS=1` is set (aiokafka's convention) or the extension cannot
be imported, in which case a warning says so once and the twins run — slower, not
different. This package imports nothing else of raftmq's, so every layer may import it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

__all__ = ["COMPILED", "compiled_or"]


def _load():
    if os.environ.get("RAFTMQ_NO_EXTENSIONS"):
        return None
    try:
        from raftmq.hotpath import _compiled
    except ImportError as exc:
        warnings.warn(
            f"raftmq: the compiled hot path is unavailable ({exc}); running the pure-Python "
            "one (reinstall with a C compiler to build it)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return _compiled


_compiled = _load()
COMPILED = _compiled is not None


def compiled_or(name: str, twin: Callable) -> Callable:
    """The compiled `name` if in use (its fallbacks call `twin`), else `twin` itself."""
    if _compiled is None:
        return twin
    _compiled.TWINS[name] = twin
    return getattr(_compiled, name)
