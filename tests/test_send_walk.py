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


# The walk as it stands (bench walk, 2026-11-28): files entered and re-entries, with the
# compiled hot path and without it. A change that lengthens it fails here; one that
# shortens it should lower these.
BOUNDS = {True: (32, 54), False: (34, 66)}


async def test_one_send_walks_no_further_than_it_does_today(tmp_path):
    """One send's walk on the master stays within today's files and re-entries (the
    shortest of five sends, so a heartbeat firing inside one does not count)."""
    from raftmq.hotpath import COMPILED

    max_files, max_reentries = BOUNDS[COMPILED]
    best = walk.shortest(await walk.measure(tmp_path, sends=5))
    assert len(best.files) <= max_files and best.reentries <= max_reentries, best.render()
