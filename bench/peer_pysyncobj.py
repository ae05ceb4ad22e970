"""PySyncObj 0.3.17 as the comparison peer for the DLedger benchmark.

Why PySyncObj: it is the Raft library a Python user would reach for instead of raftmq, so
it answers "what does an existing pure-Python Raft deliver on this machine?".  Like the
raftmq benchmark it runs 3 replicas as 3 real OS processes on 127.0.0.1, sharing the two
cores with the load generator, so the figures can be put side by side.

Shape of the measurement:

* Each replica is ``python -m bench.peer_pysyncobj node ...``: a ``SyncObj`` whose only
  replicated method is ``append(value)``.  The state machine keeps a counter and a byte
  total, never the values, so memory does not grow with the run; the payload still
  travels through PySyncObj's log, its pickling and its replication messages, which is
  the cost we want to see.
* Next to the SyncObj the node runs a tiny control server (plain socket threads, because
  that is how an application embeds PySyncObj: it calls replicated methods from its own
  threads and PySyncObj's tick thread fires the callbacks).  Commit callbacks are queued
  and flushed once per PySyncObj tick via ``addOnTickCallback`` so a burst of commits
  costs one ``sendall``, not one per entry.
* The load generator in the caller's process keeps ``concurrency`` appends in flight on
  one connection to the leader and refills the window after every received chunk
  (one ``sendall`` per refill).  It is a plain blocking socket: a single connection
  needs no event loop, and it keeps the generator's own CPU cost (which competes with
  the three replicas for two cores) as low as Python allows.

Three configurations, because PySyncObj makes you choose between throughput and latency
(its docs: batching "improves overall performance", disabling it "improves single
request speed"):

* throughput (``THROUGHPUT_CONF``): batching on; the leader ships entries only when its
  append-entries period elapses, so the 100 ms default period would make any window
  smaller than thousands of requests measure the timer, not the library.  We shorten it.
* single (``SINGLE_CONF``): batching off, so each command is shipped at once; this is the
  configuration a latency-sensitive user picks, and the one peers.md quotes.
* failover (``FAILOVER_CONF``): all defaults (election timeout 0.4-1.4 s, heartbeat
  0.1 s), so the figure compares with peers.md's failover table.  The leader is killed
  after the cluster has been up a few seconds, which matters: see ``STEADY_SETTLE_S``.

Durability caveat: PySyncObj has no fsync option, and we give it no journal file, so
every figure here is for an in-memory log.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

SYSTEM = "PySyncObj 0.3.17"

#: Request frame: op, request id, body length, then the body.
_REQ = struct.Struct("<BII")
#: Response frame: op, request id, PySyncObj FAIL_REASON code (0 = success), body length.
_RESP = struct.Struct("<BIBI")
OP_APPEND = ord("A")
OP_STATUS = ord("S")

#: Throughput: batching on (the default) with entries shipped every 1 ms instead of every
#: 100 ms.  Both knobs are needed: with batching on, a queued command does not wake the
#: tick thread, and an idle leader sleeps ``autoTickPeriod`` (50 ms) in its poll, so the
#: effective shipping period is the larger of the two.  At 256 in flight the defaults
#: give ~2k appends/s at ~125 ms (the timer, not the library); 5 ms/5 ms gave ~9k/s for
#: 1 KiB; 1 ms/1 ms ~10.7k/s.  Election timeouts stay at their defaults (0.4-1.4 s), so
#: the heartbeat stays far below them as PySyncObj requires.
THROUGHPUT_CONF: dict[str, Any] = {
    "appendEntriesUseBatch": True,
    "appendEntriesPeriod": 0.001,
    "autoTickPeriod": 0.001,
}
#: Single-request latency: batching off, which ships each command as soon as it is queued
#: (PySyncObj wakes its tick thread through a pipe in this mode).
SINGLE_CONF: dict[str, Any] = {"appendEntriesUseBatch": False}
#: Failover: PySyncObj's defaults, to be comparable with peers.md.
FAILOVER_CONF: dict[str, Any] = {}
#: Diagnostic failover variant, reported only in ``notes``: defaults except that an idle
#: connection is never declared dead (see ``STEADY_SETTLE_S``), which isolates the
#: election itself.  Safe here because kill -9 on loopback closes the sockets at once.
NO_IDLE_DROP_CONF: dict[str, Any] = {"connectionTimeout": 3600.0}

_REPO_ROOT = Path(__file__).resolve().parents[1]
#: A node kills itself after this long even if nobody tells it to, so no run can leave
#: replicas behind for long (the parent also kills them, and they exit when it dies).
_NODE_MAX_LIFETIME_S = 600.0


# --------------------------------------------------------------------------- node side


class _CtlConn:
    """One control connection inside a node.

    Commit callbacks run on PySyncObj's tick thread and append to ``done``; the tick
    callback flushes it, so a batch of commits costs one ``sendall``.  With ``immediate``
    (used when batching is off, i.e. for the 1-outstanding latency run) a callback sends
    at once instead: flushing at the end of the tick would add the time the leader then
    spends shipping the new commit index to the followers.  Status replies are sent from
    the reader thread, so sends take ``lock``.
    """

    def __init__(self, sock: socket.socket, immediate: bool) -> None:
        self.sock = sock
        self.immediate = immediate
        self.lock = threading.Lock()
        self.done: deque[bytes] = deque()
        self.alive = True

    def send(self, data: bytes) -> None:
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.alive = False

    def flush(self) -> None:
        done = self.done
        if not done:
            return
        parts = []
        with contextlib.suppress(IndexError):
            while True:
                parts.append(done.popleft())
        self.send(b"".join(parts))


def _on_commit(conn: _CtlConn, rid: int, _res: object, err: int) -> None:
    if conn.immediate:
        conn.send(_RESP.pack(OP_APPEND, rid, err, 0))
    else:
        conn.done.append(_RESP.pack(OP_APPEND, rid, err, 0))


def _make_log_class() -> type:
    """Build the replicated state machine (imports PySyncObj only inside node processes)."""
    from pysyncobj import SyncObj, replicated

    class AppendLog(SyncObj):
        # Class-level defaults: instance values appear on the first append, after
        # SyncObj.__init__, so PySyncObj includes them in its snapshots.
        count = 0
        nbytes = 0

        @replicated
        def append(self, value: bytes) -> int:
            self.count += 1
            self.nbytes += len(value)
            return self.count

    return AppendLog


def _node_status(obj: Any) -> dict[str, Any]:
    leader = obj._getLeader()
    return {
        "is_leader": obj._isLeader(),
        "leader": getattr(leader, "address", None) if leader is not None else None,
        "term": obj.raftCurrentTerm,
        "commit": obj.raftCommitIndex,
        "applied": obj.raftLastApplied,
        "ready": obj.isReady(),
        "connected": sum(obj.isNodeConnected(n) for n in obj.otherNodes),
        "count": obj.count,
    }


def _serve_conn(conn: _CtlConn, obj: Any) -> None:
    """Read request frames and hand appends to PySyncObj without waiting for them."""
    buf = bytearray()
    sock = conn.sock
    append = obj.append
    hdr = _REQ.size
    while conn.alive:
        try:
            chunk = sock.recv(1 << 20)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
        pos, n = 0, len(buf)
        while n - pos >= hdr:
            op, rid, blen = _REQ.unpack_from(buf, pos)
            end = pos + hdr + blen
            if end > n:
                break
            body = bytes(buf[pos + hdr : end])
            pos = end
            if op == OP_APPEND:
                append(body, callback=functools.partial(_on_commit, conn, rid))
            elif op == OP_STATUS:
                reply = json.dumps(_node_status(obj)).encode()
                conn.send(_RESP.pack(OP_STATUS, rid, 0, len(reply)) + reply)
        del buf[:pos]
    conn.alive = False
    with contextlib.suppress(OSError):
        sock.close()


def run_node(
    self_addr: str,
    partners: list[str],
    ctl_port: int,
    conf: dict[str, Any],
    parent_pid: int,
    max_lifetime_s: float,
) -> None:
    """Host one replica until the parent goes away or the lifetime runs out."""
    from pysyncobj import SyncObjConf

    obj = _make_log_class()(self_addr, partners, SyncObjConf(**conf))
    conns: list[_CtlConn] = []
    immediate = not conf.get("appendEntriesUseBatch", True)

    def flush_all() -> None:
        for c in conns:
            c.flush()
        if any(not c.alive for c in conns):
            conns[:] = [c for c in conns if c.alive]

    obj.addOnTickCallback(flush_all)
    listener = socket.create_server(("127.0.0.1", ctl_port))

    def accept_loop() -> None:
        while True:
            sock, _ = listener.accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(10.0)  # a client that stops reading must not wedge the tick
            conn = _CtlConn(sock, immediate)
            conns.append(conn)
            threading.Thread(target=_serve_conn, args=(conn, obj), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    deadline = time.monotonic() + max_lifetime_s
    while time.monotonic() < deadline and os.getppid() == parent_pid:
        time.sleep(0.2)
    os._exit(0)


# ------------------------------------------------------------------------- client side


class _Ctl:
    """Blocking request/response client for one node's control port."""

    def __init__(self, port: int, timeout: float = 2.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.rid = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def request(self, op: int, body: bytes, timeout: float) -> tuple[int, bytes]:
        """Send one request and wait for its reply, skipping late replies to older ones."""
        self.rid = (self.rid + 1) & 0xFFFFFFFF
        rid = self.rid
        deadline = time.perf_counter() + timeout
        self.sock.settimeout(timeout)
        self.sock.sendall(_REQ.pack(op, rid, len(body)) + body)
        hdr = _RESP.size
        while True:
            while len(self.buf) >= hdr:
                rop, rrid, code, blen = _RESP.unpack_from(self.buf)
                if len(self.buf) < hdr + blen:
                    break
                reply = bytes(self.buf[hdr : hdr + blen])
                del self.buf[: hdr + blen]
                if rrid == rid and rop == op:
                    return code, reply
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError("no reply")
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("node closed the control connection")
            self.buf += chunk

    def status(self, timeout: float = 1.0) -> dict[str, Any]:
        _, reply = self.request(OP_STATUS, b"", timeout)
        return json.loads(reply)

    def append(self, body: bytes, timeout: float) -> int:
        return self.request(OP_APPEND, body, timeout)[0]


class _Cluster:
    """Three node processes in a temp dir under ``workdir``; killed and removed on exit."""

    def __init__(self, workdir: Path, conf: dict[str, Any]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="pysyncobj-", dir=workdir))
        # Imported here, in the caller's process only: node processes import this module
        # too, and should not pay for trio and the dledger client they never use.
        from raftmq.tools.dledger_local import free_ports

        ports = free_ports(6)
        self.raft = [f"127.0.0.1:{p}" for p in ports[:3]]
        self.ctl_ports = ports[3:]
        self.conf = conf
        self.procs: list[subprocess.Popen[bytes] | None] = [None, None, None]

    def __enter__(self) -> _Cluster:
        try:
            for i in range(3):
                self._start(i)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, i: int) -> None:
        cmd = [
            sys.executable, "-m", "bench.peer_pysyncobj", "node",
            "--self", self.raft[i],
            "--partners", *[a for j, a in enumerate(self.raft) if j != i],
            "--ctl-port", str(self.ctl_ports[i]),
            "--conf", json.dumps(self.conf),
            "--parent-pid", str(os.getpid()),
            "--max-lifetime", str(_NODE_MAX_LIFETIME_S),
        ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
        with open(self.dir / f"node{i}.log", "wb") as log:
            self.procs[i] = subprocess.Popen(
                cmd, cwd=_REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def close(self) -> None:
        for i in range(3):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)

    def connect(self, i: int, timeout: float = 15.0) -> _Ctl:
        """Connect to node ``i``'s control port, retrying while the process starts up."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.procs[i]
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"node {i} exited with {proc.returncode}: {self._log_tail(i)}")
            try:
                return _Ctl(self.ctl_ports[i])
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _log_tail(self, i: int) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / f"node{i}.log").read_text(errors="replace")[-2000:]
        return ""

    def wait_leader(self, ctls: list[_Ctl], timeout: float = 20.0) -> int:
        """Index of the leader once all three nodes agree on it and have caught up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sts = [c.status() for c in ctls]
            leaders = [i for i, s in enumerate(sts) if s["is_leader"]]
            if len(leaders) == 1:
                addr = self.raft[leaders[0]]
                # Full mesh too: PySyncObj retries a failed connect only every
                # connectionRetryTime (5 s), and a follower that started before its peer
                # was listening is not yet connected to it, so killing the leader then
                # would measure that retry, not an election.
                if all(s["leader"] == addr and s["ready"] and s["connected"] == 2 for s in sts):
                    return leaders[0]
            time.sleep(0.02)
        raise TimeoutError("PySyncObj cluster elected no stable leader")


def _pct(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def _windowed_load(
    port: int, payload: bytes, concurrency: int, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    """Keep ``concurrency`` appends in flight; count and time those completing in the window.

    Only completions between ``warmup_s`` and ``warmup_s + duration_s`` count, so the
    connection set-up and the first, empty batches do not dilute the rate.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pack = _REQ.pack
    blen = len(payload)
    sent: dict[int, float] = {}
    rid = 0
    ok = errors = stalls = 0
    lat: list[float] = []
    buf = bytearray()
    hdr = _RESP.size
    unpack_from = _RESP.unpack_from

    def submit(k: int) -> None:
        nonlocal rid
        parts = []
        for _ in range(k):
            rid += 1
            parts.append(pack(OP_APPEND, rid, blen))
            parts.append(payload)
        t = time.perf_counter()
        for r in range(rid - k + 1, rid + 1):
            sent[r] = t
        sock.sendall(b"".join(parts))

    try:
        t_begin = time.perf_counter()
        t_measure = t_begin + warmup_s
        t_end = t_measure + duration_s
        submit(concurrency)
        while True:
            now = time.perf_counter()
            if now >= t_end:
                break
            wait = min(1.0, t_end - now)
            sock.settimeout(wait)
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                stalls += wait == 1.0  # a full second without a single commit
                continue
            if not chunk:
                raise ConnectionError("leader closed the control connection")
            t = time.perf_counter()
            buf += chunk
            pos, n = 0, len(buf)
            done = 0
            counting = t_measure <= t <= t_end
            while n - pos >= hdr:
                _, r, code, _ = unpack_from(buf, pos)
                pos += hdr
                t0 = sent.pop(r, None)
                if t0 is None:
                    continue
                done += 1
                if code != 0:
                    errors += 1
                elif counting:
                    ok += 1
                    lat.append(t - t0)
            del buf[:pos]
            if done and t < t_end:
                submit(done)
    finally:
        sock.close()
    lat_ms = sorted(x * 1000.0 for x in lat)
    return {
        "ok": ok,
        "errors": errors,
        "stalls": stalls,
        "appends_per_s": ok / duration_s,
        "p50_ms": _pct(lat_ms, 0.50),
        "p99_ms": _pct(lat_ms, 0.99),
    }


def _single_load(ctl: _Ctl, payload: bytes, duration_s: float) -> dict[str, Any]:
    """One append in flight at a time, for ``duration_s``; latency is submit to callback."""
    lat: list[float] = []
    errors = 0
    t_end = time.perf_counter() + duration_s
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        code = ctl.append(payload, timeout=5.0)
        t1 = time.perf_counter()
        if code == 0:
            lat.append(t1 - t0)
        else:
            errors += 1
    lat_ms = sorted(x * 1000.0 for x in lat)
    return {
        "n": len(lat),
        "errors": errors,
        "p50_ms": _pct(lat_ms, 0.5),
        "p99_ms": _pct(lat_ms, 0.99),
    }


def _connect_all(cluster: _Cluster) -> list[_Ctl]:
    return [cluster.connect(i) for i in range(3)]


def _throughput_run(
    workdir: Path, conf: dict[str, Any], payload: bytes, duration_s: float, concurrency: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Windowed run, then a short 1-outstanding run on the same cluster and conf."""
    with _Cluster(workdir, conf) as cluster:
        ctls = _connect_all(cluster)
        try:
            leader = cluster.wait_leader(ctls)
            warmup = min(1.0, max(0.2, duration_s * 0.2))
            load = _windowed_load(
                cluster.ctl_ports[leader], payload, concurrency, warmup, duration_s
            )
            single = _single_load(ctls[leader], payload, min(1.0, duration_s))
        finally:
            for c in ctls:
                c.close()
    return load, single


def _single_run(workdir: Path, conf: dict[str, Any], payload: bytes, duration_s: float) -> dict:
    with _Cluster(workdir, conf) as cluster:
        ctls = _connect_all(cluster)
        try:
            leader = cluster.wait_leader(ctls)
            _single_load(ctls[leader], payload, 0.3)  # warm-up
            return _single_load(ctls[leader], payload, duration_s)
        finally:
            for c in ctls:
                c.close()


#: How long a failover cluster serves light traffic before its leader is killed.  It must
#: exceed PySyncObj's connectionTimeout (3.5 s) so the trial sees a cluster in its steady
#: state: followers never talk to each other, and PySyncObj checks a connection's
#: last-read time only when it next sends on it, so once the cluster has been up longer
#: than that, the candidate's first RequestVote finds the follower-follower connection
#: "timed out", drops it, and the election waits for a reconnect and a second election
#: timeout.  Killing right after start-up would sometimes dodge that (depending on how
#: long start-up took), which makes the figure depend on luck rather than on the system.
STEADY_SETTLE_S = 4.0


def _failover_trial(
    workdir: Path, conf: dict[str, Any], payload: bytes, settle_s: float
) -> tuple[float | None, float | None]:
    """kill -9 the leader; return (ms to a new leader, ms to first committed append there).

    Before the kill the leader commits one append every 50 ms for ``settle_s`` (at least
    20 appends), so the followers' logs are current.  Times start just before the kill.
    The client polls both survivors' status every few ms and sends appends only to a
    survivor that says it leads at a higher term: an append given to a follower would be
    forwarded to the dead leader and lost.
    """
    with _Cluster(workdir, conf) as cluster:
        ctls = _connect_all(cluster)
        try:
            leader = cluster.wait_leader(ctls)
            settle_end = time.perf_counter() + settle_s
            for i in range(10_000):
                if i >= 20 and time.perf_counter() >= settle_end:
                    break
                ctls[leader].append(payload, timeout=5.0)
                if settle_s:
                    time.sleep(0.05)
            old_term = ctls[leader].status()["term"]
            survivors = [i for i in range(3) if i != leader]
            t0 = time.perf_counter()
            cluster.kill(leader)
            elected: float | None = None
            deadline = t0 + 20.0
            while time.perf_counter() < deadline:
                new = None
                for i in survivors:
                    with contextlib.suppress(OSError, TimeoutError, ValueError):
                        st = ctls[i].status(timeout=0.5)
                        if st["is_leader"] and st["term"] > old_term:
                            new = i
                if new is None:
                    time.sleep(0.005)
                    continue
                if elected is None:
                    elected = (time.perf_counter() - t0) * 1000.0
                try:
                    code = ctls[new].append(payload, timeout=2.0)
                except (OSError, TimeoutError):
                    continue
                if code == 0:
                    return elected, (time.perf_counter() - t0) * 1000.0
                time.sleep(0.005)
            return elected, None
        finally:
            for c in ctls:
                c.close()


def _spread(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return f"{min(xs):.0f} / {statistics.median(xs):.0f} / {max(xs):.0f}"


def _measure(
    payload_bytes: int,
    duration_s: float,
    concurrency: int,
    failover_trials: int,
    workdir: Path,
    throughput_conf: dict[str, Any],
) -> dict[str, Any]:
    workdir = Path(workdir)
    # Random bytes: PySyncObj zlib-compresses every message, so a repetitive payload would
    # flatter it (and cost it less CPU) in a way raftmq's uncompressed log does not get.
    payload = os.urandom(payload_bytes)
    # Other work on the two cores skews every figure; record how busy the machine was.
    load_before = os.getloadavg()[0]
    load, single_batched = _throughput_run(
        workdir, throughput_conf, payload, duration_s, concurrency
    )
    single = _single_run(workdir, SINGLE_CONF, payload, min(3.0, duration_s))

    # "default" gives failover_ms; "no-idle-drop" shows what the election alone costs.
    variants = {"default": FAILOVER_CONF, "no-idle-drop": NO_IDLE_DROP_CONF}
    fo: dict[str, dict[str, list[float]]] = {
        kind: {"elected": [], "write": [], "failed": []} for kind in variants
    }
    for _ in range(failover_trials):
        for kind, fconf in variants.items():
            e, w = _failover_trial(workdir, fconf, payload, STEADY_SETTLE_S)
            if e is not None:
                fo[kind]["elected"].append(e)
            if w is None:
                fo[kind]["failed"].append(1.0)
            else:
                fo[kind]["write"].append(w)
    write_ms = fo["default"]["write"]

    notes = (
        f"3 OS processes on 127.0.0.1 (+ load generator), in-memory log, no fsync "
        f"(PySyncObj has no fsync option); os.urandom payloads (PySyncObj zlib-compresses "
        f"every message, so compressible data would run faster); 1-min load average "
        f"before the run {load_before:.2f}. Throughput: SyncObjConf({_fmt_conf(throughput_conf)}), "
        f"one control connection to the leader with {concurrency} appends in flight, "
        f"{duration_s:g} s after a warm-up; {load['ok']} ok, {load['errors']} failed callbacks, "
        f"{load['stalls']} 1 s stalls. single_p50_ms: SyncObjConf({_fmt_conf(SINGLE_CONF)}), "
        f"1 outstanding, {single['n']} appends, p99 {single['p99_ms']:.2f} ms, "
        f"{single['errors']} failed; with the throughput conf 1 outstanding gives "
        f"p50 {single_batched['p50_ms']:.2f} ms. Failover: SyncObjConf() defaults "
        f"(raftMinTimeout 0.4, raftMaxTimeout 1.4, appendEntriesPeriod 0.1, "
        f"connectionTimeout 3.5), a new cluster per trial serving 1 append per 50 ms for "
        f"{STEADY_SETTLE_S:g} s before kill -9 of the leader, {failover_trials} trials; "
        f"min/median/max ms to a new leader {_spread(fo['default']['elected'])}, to the "
        f"first committed append there {_spread(fo['default']['write'])} (failover_ms is "
        f"that median). Most of it is not the election: PySyncObj declares the idle "
        f"follower-follower connection dead (no read for > connectionTimeout) when the "
        f"candidate first sends RequestVote on it, so a reconnect and a second election "
        f"timeout follow. Diagnostic, same but connectionTimeout=3600: new leader "
        f"{_spread(fo['no-idle-drop']['elected'])}, first append "
        f"{_spread(fo['no-idle-drop']['write'])}"
        f"{_failed_note(fo)}."
    )
    return {
        "system": SYSTEM,
        "payload": payload_bytes,
        "appends_per_s": float(load["appends_per_s"]),
        "p50_ms": float(load["p50_ms"]),
        "p99_ms": float(load["p99_ms"]),
        "single_p50_ms": float(single["p50_ms"]),
        "failover_ms": float(statistics.median(write_ms)) if write_ms else None,
        "notes": notes,
    }


def _failed_note(fo: dict[str, dict[str, list[float]]]) -> str:
    failed = {k: len(v["failed"]) for k, v in fo.items() if v["failed"]}
    if not failed:
        return ""
    return "; trials with no committed append within 20 s: " + ", ".join(
        f"{k} {n}" for k, n in failed.items()
    )


def _fmt_conf(conf: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in conf.items())


def measure(
    payload_bytes: int, duration_s: float, concurrency: int, failover_trials: int, workdir: Path
) -> dict:
    """Measure PySyncObj 0.3.17 with 3 local processes; see the module docstring for how."""
    return _measure(
        payload_bytes, duration_s, concurrency, failover_trials, workdir, THROUGHPUT_CONF
    )


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_pysyncobj", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the benchmark and print the result as JSON")
    m.add_argument("--payload", type=int, default=1024)
    m.add_argument("--duration", type=float, default=5.0)
    m.add_argument("--concurrency", type=int, default=256)
    m.add_argument("--failover-trials", type=int, default=3)
    m.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    m.add_argument(
        "--throughput-conf",
        type=json.loads,
        default=None,
        help="JSON SyncObjConf kwargs replacing THROUGHPUT_CONF (for exploring settings)",
    )
    n = sub.add_parser("node", help="internal: one replica (started by measure)")
    n.add_argument("--self", dest="self_addr", required=True)
    n.add_argument("--partners", nargs="+", required=True)
    n.add_argument("--ctl-port", type=int, required=True)
    n.add_argument("--conf", type=json.loads, default={})
    n.add_argument("--parent-pid", type=int, default=None)
    n.add_argument("--max-lifetime", type=float, default=_NODE_MAX_LIFETIME_S)
    args = parser.parse_args(argv)
    if args.cmd == "node":
        parent = args.parent_pid if args.parent_pid is not None else os.getppid()
        run_node(args.self_addr, args.partners, args.ctl_port, args.conf, parent, args.max_lifetime)
    else:
        # Turn SIGTERM into SystemExit so the clusters' cleanup (kill, rmtree) still runs.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        conf = THROUGHPUT_CONF if args.throughput_conf is None else args.throughput_conf
        result = _measure(
            args.payload, args.duration, args.concurrency, args.failover_trials, args.workdir, conf
        )
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    _main()
