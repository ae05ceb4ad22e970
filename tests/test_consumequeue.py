"""ConsumeQueue files: what a dispatch checkpoint fsyncs, and the cut recovery makes."""

from __future__ import annotations

import os

from broker.store.consumequeue import ENTRY_SIZE, ConsumeQueueTable


def test_a_checkpoint_fsyncs_only_the_queues_written_since_the_last_one(tmp_path):
    """A broker with thousands of quiet queues must not fsync each of them every 5 s."""
    table = ConsumeQueueTable(tmp_path)
    busy, quiet = table.find_or_create("T", 0), table.find_or_create("T", 1)
    busy.append(0, 100, 50, 0)
    quiet.append(0, 150, 50, 0)
    first = [queue.sync_work() for queue in (busy, quiet)]
    assert all(fd is not None and dirs for fd, dirs in first)  # new files: their dirs too
    busy.append(1, 200, 50, 0)
    (busy_fd, busy_dirs), (quiet_fd, quiet_dirs) = (q.sync_work() for q in (busy, quiet))
    assert busy_fd is not None and quiet_fd is None
    assert busy_dirs == quiet_dirs == []
    table.sync_plan()()  # nothing written since: nothing to do, and no error
    for fd, _dirs in (*first, (busy_fd, busy_dirs)):
        os.close(fd)
    table.close()


def test_recovery_cuts_a_queue_back_to_a_position_and_the_cut_is_on_disk(tmp_path):
    table = ConsumeQueueTable(tmp_path)
    queue = table.find_or_create("T", 0)
    for k in range(5):
        queue.append(k, 100 * k, 100, 0)  # messages at [100k, 100k + 100)
    table.close()
    reopened = ConsumeQueueTable(tmp_path).find_or_create("T", 0)
    reopened.truncate_physical(300)  # keeps the messages ending at or before 300
    assert reopened.max_offset == 3
    files = list((tmp_path / "T" / "0").iterdir())
    assert [f.stat().st_size for f in files] == [3 * ENTRY_SIZE]
    reopened.close()
