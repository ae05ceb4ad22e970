"""ConsumeQueue files: what a dispatch checkpoint fsyncs, and the cut recovery makes."""

from __future__ import annotations

from raftmq.broker.store.consumequeue import ENTRY, ENTRY_SIZE, ConsumeQueueTable


def test_a_sync_writes_and_fsyncs_only_the_queues_not_yet_durable(tmp_path):
    """A broker with thousands of quiet queues must not fsync each of them at every
    dispatch checkpoint; and a queue appended to while its sync ran stays for the next."""
    table = ConsumeQueueTable(tmp_path)
    busy, quiet = table.find_or_create("T", 0), table.find_or_create("T", 1)
    busy.append(0, 100, 50, 0)
    quiet.append(0, 150, 50, 0)
    first = [queue.sync_work() for queue in (busy, quiet)]
    assert all(len(sync.files) == 1 and sync.dirs for sync in first)  # new files: dirs too
    table.unsynced = {("T", 0), ("T", 1), ("Half", 0)}  # a key of no queue costs nothing
    table.sync_plan(table.unsynced)()()
    assert busy.durable and quiet.durable and table.unsynced == set()
    busy.append(1, 200, 50, 0)
    assert quiet.sync_work() is None
    sync = busy.sync_work()
    assert (len(sync.files), sync.dirs, [w[1] for w in sync.writes]) == (1, [], [ENTRY_SIZE])
    table.unsynced = {("T", 0), ("T", 1)}
    done = table.sync_plan(table.unsynced)()
    busy.append(2, 250, 50, 0)  # while the sync ran: not in it
    done()
    assert table.unsynced == {("T", 0)} and not busy.durable
    (path,) = (tmp_path / "T" / "0").iterdir()
    assert path.stat().st_size == 2 * ENTRY_SIZE


def test_recovery_cuts_a_queue_back_to_a_position_and_the_cut_is_on_disk(tmp_path):
    table = ConsumeQueueTable(tmp_path)
    queue = table.find_or_create("T", 0)
    for k in range(5):
        queue.append(k, 100 * k, 100, 0)  # messages at [100k, 100k + 100)
    table.write()
    reopened = ConsumeQueueTable(tmp_path).find_or_create("T", 0)
    reopened.truncate_physical(300)  # keeps the messages ending at or before 300
    assert reopened.max_offset == 3
    files = list((tmp_path / "T" / "0").iterdir())
    assert [f.stat().st_size for f in files] == [3 * ENTRY_SIZE]


def _files(directory) -> list[int]:
    """The first queue offset of each file of a queue directory."""
    return sorted(int(f.name) // ENTRY_SIZE for f in directory.iterdir())


def test_a_trimmed_head_drops_whole_files_and_keeps_the_offsets_after_a_reload(tmp_path):
    """Retention deleted the log before physical offset 450: entries 0..4 point there.
    The queue's head moves to 5 and the file holding only 0..3 goes; the offsets of
    what is left do not change, and a reload (which learns the head again from the
    log's beginning) finds the same head."""
    queue = ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0)
    for k in range(10):
        queue.append(k, 100 * k, 100, k)
    assert _files(tmp_path / "T" / "0") == [0, 4, 8]
    queue.trim_head(450)
    assert (queue.min_offset, queue.max_offset, len(queue)) == (5, 10, 5)
    assert queue.get(5) == (500, 100, 5)
    assert _files(tmp_path / "T" / "0") == [4, 8]
    queue.append(10, 1000, 100, 10)
    queue.write()
    reloaded = ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0)
    reloaded.trim_head(450)
    assert (reloaded.min_offset, reloaded.max_offset) == (5, 11)
    assert [e[0] for e in reloaded.entries(5, 100)] == [100 * k for k in range(5, 11)]


def test_a_queue_trimmed_to_nothing_keeps_its_next_offset(tmp_path):
    """The last file stays when every entry is gone: its name and length say which
    offset comes next, so a new master does not hand out old offsets again."""
    queue = ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0)
    for k in range(6):
        queue.append(k, 100 * k, 100, 0)
    queue.trim_head(10_000)
    assert (queue.min_offset, queue.max_offset, len(queue)) == (6, 6, 0)
    assert _files(tmp_path / "T" / "0") == [4]
    queue.write()
    reloaded = ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0)
    reloaded.trim_head(10_000)
    assert (reloaded.min_offset, reloaded.max_offset) == (6, 6)
    reloaded.append(6, 10_000, 100, 0)
    assert reloaded.get(6) == (10_000, 100, 0)


def test_a_file_a_power_cut_shortened_ends_the_queue_at_load(tmp_path):
    """Entries after a shortened file cannot keep their offsets: recovery dispatches
    them again, so loading keeps only the files that continue each other."""
    queue = ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0)
    for k in range(10):
        queue.append(k, 100 * k, 100, 0)
    queue.write()
    middle = tmp_path / "T" / "0" / f"{4 * ENTRY_SIZE:020d}"
    middle.write_bytes(middle.read_bytes()[: 2 * ENTRY_SIZE + 3])
    reloaded = ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0)
    assert reloaded.max_offset == 6
    assert _files(tmp_path / "T" / "0") == [0, 4]
    reloaded.append(6, 600, 100, 0)
    reloaded.write()
    assert middle.stat().st_size == 3 * ENTRY_SIZE  # the torn entry gone, not written behind


def test_recovery_cuts_across_files(tmp_path):
    queue = ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0)
    for k in range(10):
        queue.append(k, 100 * k, 100, 0)
    queue.truncate_physical(500)  # keeps offsets 0..4
    assert queue.max_offset == 5
    directory = tmp_path / "T" / "0"
    assert [(f.name, f.stat().st_size) for f in sorted(directory.iterdir())] == [
        (f"{0:020d}", 4 * ENTRY_SIZE),
        (f"{4 * ENTRY_SIZE:020d}", ENTRY_SIZE),
    ]
    queue.append(5, 500, 100, 0)
    queue.write()
    assert ConsumeQueueTable(tmp_path, file_entries=4).find_or_create("T", 0).max_offset == 6


def test_the_first_sync_after_a_restart_fsyncs_the_directories_of_loaded_files(tmp_path):
    """A file made just before a kill may have a directory entry that no fsync covered;
    once entries are dispatched into it again, a checkpoint that vouches for them must
    make that entry durable too, or a power cut could take the file with them."""
    table = ConsumeQueueTable(tmp_path)
    table.find_or_create("T", 0).append(0, 100, 50, 0)  # its file made, never synced
    reloaded = ConsumeQueueTable(tmp_path).find_or_create("T", 0)
    assert reloaded.max_offset == 0  # the entry never reached the file
    reloaded.append(0, 100, 50, 0)
    sync = reloaded.sync_work()
    assert sync.dirs == [reloaded.directory, reloaded.directory.parent]
    sync.run()
    sync.done()
    reloaded.append(1, 150, 50, 0)
    assert reloaded.sync_work().dirs == []  # once durable, not again


def test_a_zero_filled_file_rocketmq_preallocated_ends_at_its_last_entry(tmp_path):
    """Apache RocketMQ's broker creates a ConsumeQueue file at its full size, zeros
    after its entries: the queue ends at the last entry, and the next append follows
    it in the same file (as RocketMQ's ConsumeQueue.recover reads it)."""
    directory = tmp_path / "T" / "0"
    directory.mkdir(parents=True)
    entries = b"".join(ENTRY.pack(100 * k, 100, 7) for k in range(3))
    first = directory / f"{0:020d}"
    first.write_bytes(entries.ljust(300_000 * ENTRY_SIZE, b"\0"))
    queue = ConsumeQueueTable(tmp_path).find_or_create("T", 0)
    assert queue.max_offset == 3
    assert queue.get(0) == (0, 100, 7)  # physical offset 0 is an entry, size 0 is not
    queue.append(3, 300, 100, 7)
    queue.write()
    assert _files(directory) == [0]
    reloaded = ConsumeQueueTable(tmp_path).find_or_create("T", 0)
    assert reloaded.max_offset == 4 and reloaded.get(3) == (300, 100, 7)


def test_a_dropped_topic_leaves_no_file_and_a_sync_captured_before_skips_it(tmp_path):
    """drop_topic (a deleted topic) forgets the topic's queues and deletes their files,
    returning each one's next offset. A checkpoint's sync captured before the drop runs
    after it without a failure (it names files and directories that are gone), and
    writes nothing into the files of the topic's queue made again after the drop."""
    table = ConsumeQueueTable(tmp_path)
    for queue_id in (0, 1):
        queue = table.find_or_create("Gone", queue_id)
        for k in range(3 + queue_id):
            queue.append(k, 100 * k, 100, 0)
    kept = table.find_or_create("Kept", 0)
    kept.append(0, 900, 100, 0)
    table.unsynced = {("Gone", 0), ("Gone", 1), ("Kept", 0)}
    stale = table.sync_plan(table.unsynced)  # captured on the loop, run in a thread later
    assert table.drop_topic("Gone") == {0: 3, 1: 4}
    assert not (tmp_path / "Gone").exists() and table.topics() == {"Kept"}
    assert table.unsynced == {("Kept", 0)}
    again = table.find_or_create("Gone", 0)
    again.append(3, 500, 100, 0)  # the topic's first message after it was made again
    stale()()  # no DiskFailure for the directories gone
    (path,) = (tmp_path / "Gone" / "0").iterdir()
    assert path.name == f"{3 * ENTRY_SIZE:020d}" and path.stat().st_size == 0
    assert kept.durable


def test_a_drop_a_crash_cut_short_is_finished_at_load(tmp_path):
    table = ConsumeQueueTable(tmp_path)
    table.find_or_create("Gone", 0).append(0, 0, 100, 0)
    table.write()
    (tmp_path / "Gone").rename(tmp_path / "Gone.dropped")  # renamed, not yet removed
    assert ConsumeQueueTable(tmp_path).topics() == set()
    assert not (tmp_path / "Gone.dropped").exists()
