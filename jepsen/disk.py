"""Disk faults, applied to a stopped broker's DLedger files between a kill and a restart.

There is no LazyFS or netem here, so a power cut is simulated after the fact: a
replica started with `recordSyncedLengths=true` keeps `synced.json` (how much of each
data file its last completed fsync covered), and `lose_unsynced` cuts every data file
back to that length once the process is dead. SIGKILL alone loses nothing that was
written — the page cache survives it — so without this step a "crash" never tests
fsync at all.

Only the log's data segments are cut. The index segments are a cache the store
rebuilds and checks against the data at recovery, so leaving them intact is the
harder case (an index that names entries the data no longer holds). The broker's
ConsumeQueue files are fsynced only for its dispatch checkpoint, so
`lose_unsynced_queues` cuts each one, independently, anywhere after the entries the
checkpoint covers.

`mount_tmpfs`, `fill` and `free` are the full disk: each node's store on a small
filesystem of its own, filled by a ballast file and freed again while the broker runs.

`corrupt` damages data that *was* synced — a bad sector, a truncated file — in the
newest segment, which recovery checks entry by entry: the replica must either cut the
damage and fetch the entries again from the leader, or refuse to start, naming the
file. `wipe_log` is the operator's answer to such a refusal: throw the log away but
keep the term and vote, so the replica cannot vote twice in one term.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

from raftmq.broker.store.consumequeue import ENTRY_SIZE, entries_ending_by
from raftmq.broker.store.messagestore import checkpoint_position
from raftmq.dledger.server import SYNCED_LENGTHS_FILE

CHUNK = 1 << 20
BALLAST = "ballast"  # the file that fills a node's filesystem, beside its store


def dledger_dir(store_root: Path, node: str) -> Path:
    """Where a broker with storePathRootDir=`store_root` keeps replica `node`'s log."""
    return Path(store_root) / f"dledger-{node}"


def _data_files(log_dir: Path) -> list[Path]:
    data = log_dir / "data"
    return sorted(data.iterdir()) if data.is_dir() else []


def _written_end(path: Path) -> int:
    """The end of the last non-zero byte: segments are preallocated full of zeros."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - CHUNK)
            f.seek(start)
            chunk = f.read(end - start).rstrip(b"\0")
            if chunk:
                return start + len(chunk)
            end = start
    return 0


def _zero(path: Path, start: int, end: int) -> None:
    with open(path, "r+b") as f:
        pos = start
        while pos < end:
            n = min(CHUNK, end - pos)
            f.seek(pos)
            if f.read(n).count(0) != n:
                f.seek(pos)
                f.write(bytes(n))
            pos += n


def lose_unsynced(log_dir: Path, rng: random.Random, torn: bool) -> dict[str, dict]:
    """Cut each data file back to what its last fsync covered; with `torn`, keep a
    random prefix of the unsynced bytes (a write-back that got part of the way).

    Returns per file {synced, written, kept}. A replica that never recorded anything
    (killed before its first fsync) is left alone: recovery fsynced what it found."""
    record = log_dir / SYNCED_LENGTHS_FILE
    if not record.exists():
        return {}
    synced = json.loads(record.read_text())
    report = {}
    for path in _data_files(log_dir):
        durable = synced.get(str(path), 0)
        written = _written_end(path)
        if written <= durable:
            continue
        kept = rng.randrange(written - durable + 1) if torn else 0
        _zero(path, durable + kept, written)
        report[path.name] = {"synced": durable, "written": written, "kept": kept}
    return report


def lose_unsynced_queues(store_root: Path, rng: random.Random) -> int:
    """Cut each ConsumeQueue file to a random length that keeps at least the entries
    for messages before the dispatch checkpoint's position (those were fsynced before
    it was written); with no checkpoint, anything may go. Returns entries lost."""
    position = checkpoint_position(store_root)
    lost = 0
    for path in sorted((store_root / "consumequeue").glob("*/*/*")):
        data = path.read_bytes()
        entries = len(data) // ENTRY_SIZE
        keep = rng.randint(entries_ending_by(data, position) * ENTRY_SIZE, len(data))
        if keep < len(data):
            with path.open("r+b") as file:
                file.truncate(keep)
            lost += entries - keep // ENTRY_SIZE
    return lost


def corrupt(log_dir: Path, rng: random.Random, mode: str) -> dict:
    """Damage the newest data segment's written tail.

    `truncate` zeroes its last 1..4096 written bytes (a lost, synced tail);
    `bitflip` flips 1..8 bits among its last 64 KiB of written data."""
    files = [p for p in _data_files(log_dir) if _written_end(p) > 0]
    if not files:
        return {"mode": mode, "file": None}
    path = files[-1]
    written = _written_end(path)
    if mode == "truncate":
        cut = min(written, rng.randint(1, 4096))
        _zero(path, written - cut, written)
        return {"mode": mode, "file": path.name, "bytes": cut, "at": written - cut}
    if mode != "bitflip":
        raise ValueError(f"unknown corruption {mode!r}")
    low = max(0, written - (64 << 10))
    flips = sorted(rng.randrange(low, written) for _ in range(rng.randint(1, 8)))
    with open(path, "r+b") as f:
        for pos in flips:
            f.seek(pos)
            byte = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return {"mode": mode, "file": path.name, "at": flips}


def wipe_log(log_dir: Path) -> None:
    """Drop the log (data, index, checkpoint, begin) but keep `currterm`: a replica
    rebuilt from its peers must still remember whom it voted for in its term."""
    for name in ("data", "index"):
        shutil.rmtree(log_dir / name, ignore_errors=True)
    for name in ("checkpoint", "begin", SYNCED_LENGTHS_FILE):
        (log_dir / name).unlink(missing_ok=True)


def mount_tmpfs(path: Path, size_bytes: int) -> None:
    """Mount a tmpfs of `size_bytes` at `path` (root only); CalledProcessError says why not."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )


def unmount(path: Path) -> None:
    """Unmount `path`; lazily if something still holds it, so no mount outlives a run."""
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True)


def fill(directory: Path, leave_bytes: int) -> int:
    """Take all but `leave_bytes` of the free space of `directory`'s filesystem with a
    ballast file (allocated, not sparse); returns its size. The broker keeps writing
    meanwhile, so a size the disk no longer has is tried again a little smaller."""
    ballast = directory / BALLAST
    size = 0
    with open(ballast, "ab") as file:
        for _ in range(64):
            st = os.statvfs(directory)
            want = size + st.f_bavail * st.f_frsize - leave_bytes
            if want <= size:
                break
            try:
                os.posix_fallocate(file.fileno(), 0, want)
                size = want
                break
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size = os.fstat(file.fileno()).st_size
    return size


def free(directory: Path) -> None:
    """Delete the ballast: the space comes back at once."""
    (directory / BALLAST).unlink(missing_ok=True)
