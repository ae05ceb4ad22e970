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
    shortest of twelve sends, so a heartbeat firing inside one does not count: on a
    loaded machine, one ran inside each of five)."""
    from raftmq.hotpath import COMPILED

    max_files, max_reentries = BOUNDS[COMPILED]
    best = walk.shortest(await walk.measure(tmp_path, sends=12))
    assert len(best.files) <= max_files and best.reentries <= max_reentries, best.render()


async def test_the_followers_answers_are_an_event_of_their_own(tmp_path):
    """Cut where trio hands the master control, a send is at least two events: the
    request read (appended, pushed) and the followers' answers read (committed,
    answered); the parts together are the whole walk, in order."""
    best = walk.shortest(await walk.measure(tmp_path, sends=3))
    events = best.events()
    assert [e for part in events for e in part] == best.entries
    assert len(events) >= 2, best.render()
    assert events[0][0].function == "Connection._read_loop", best.render()
    answered = [
        k for k, part in enumerate(events) if any("split_frames" in e.function for e in part)
    ]
    assert answered and answered[0] > 0, best.render()
