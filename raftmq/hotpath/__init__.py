"""The per-message work of the data path, compiled where the build allows.

`raftmq.hotpath._compiled` is one Cython extension, built by `pip install` (setup.py);
`raftmq.hotpath.python` holds a pure-Python twin of each of its functions, held to
the same bytes and errors by property tests. The compiled ones are used unless
`RAFTMQ_NO_EXTENSIONS=1` is set (aiokafka's convention) or the extension cannot be
imported, in which case a warning says so once and the twins run: slower, not different.

    split_frames    where the remoting frames in a receive buffer start and end
    send_record     one sent message's CommitLog record
    send_responses  the SUCCESS responses to a batch of sends, as one buffer of frames
"""

from __future__ import annotations

import os
import warnings

from raftmq.hotpath import python

__all__ = ["COMPILED", "send_record", "send_responses", "split_frames"]


def _implementation():
    if os.environ.get("RAFTMQ_NO_EXTENSIONS"):
        return python, False
    try:
        from raftmq.hotpath import _compiled
    except ImportError as exc:
        warnings.warn(
            f"raftmq: the compiled hot path is unavailable ({exc}); running the pure-Python "
            "one (reinstall with a C compiler to build it)",
            RuntimeWarning,
            stacklevel=2,
        )
        return python, False
    return _compiled, True


_impl, COMPILED = _implementation()
split_frames = _impl.split_frames
send_record = _impl.send_record
send_responses = _impl.send_responses
