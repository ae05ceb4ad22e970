"""Resident memory of a process, as the kernel counts it (/proc/<pid>/status)."""

from pathlib import Path


def _status_kib(pid: int, fields: tuple[str, ...]) -> dict[str, int] | None:
    """The named `kB` fields of /proc/<pid>/status (None once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        name, _, value = line.partition(":")
        if name in fields:
            found[name] = int(value.split()[0])
    return found


def peak_rss_mib(pid: int) -> float | None:
    kib = _status_kib(pid, ("VmHWM",))
    return round(kib["VmHWM"] / 1024, 1) if kib else None


def rss_split_mib(pid: int) -> dict[str, float] | None:
    """RSS now in its parts: ``anon`` (heap, stacks: what a leak grows) and ``file``
    (pages of mapped files the process touched, which the kernel may drop and read
    again; a broker's mapped log segments). Shared memory is left out."""
    kib = _status_kib(pid, ("RssAnon", "RssFile"))
    if not kib or len(kib) < 2:
        return None
    return {"anon": round(kib["RssAnon"] / 1024, 1), "file": round(kib["RssFile"] / 1024, 1)}
