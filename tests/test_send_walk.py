"""One send's walk on the master (bench/walk.py): the files it enters, in order, from
the request's bytes on the master's socket to its response handed to the kernel."""

from __future__ import annotations

from bench import walk


async def test_the_log_never_calls_the_broker_while_it_appends(tmp_path):
    """The broker hands DLedger finished records, placed where the leader writes them:
    nothing in the DLedger store calls back into the broker mid-append (as the append
    hook assigned into the store did)."""
    walks = await walk.measure(tmp_path, sends=2)
    best = walk.shortest(walks)
    from_store = [
        e
        for e in best.entries
        if e.file.startswith("broker/") and (e.caller or "").startswith("dledger/store/")
    ]
    assert not from_store, best.render()
