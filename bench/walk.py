"""`python -m bench walk`: the files one send passes through on the master, in order.

One SEND_MESSAGE_V2 to an existing topic, after warm-up, on the master of an
in-process 3-member DLedger broker group (the wiring tests/inprocess_broker.py
runs; all members, the name server and the client share one trio loop). Python's
profiler (`sys.setprofile`, the loop's thread) records every call from the moment
the master's reader resumes with the request's bytes to the moment its writer hands
the response to the socket (trio's `send_all`).

How a call is counted:

- Only code in the project's files counts (dledger/, broker/, namesrv/, raftmq/),
  and the compiled hot path when it runs. A compiled function is its pure-Python
  twin compiled (raftmq.hotpath), so a call into it counts as entering the twin's
  file, the layer that owns the work: the walk is the same with and without the
  extension, and says where the work belongs, not how it was built. (Cython
  functions raise no profile event: while walking, the modules' references to them
  are wrapped in a Python function that the profiler sees.) Stdlib, trio and
  msgpack calls are someone else's code and count for nothing.
- Only the master's work counts. A call belongs to the master when its `self` is
  reachable from the master's BrokerController (its attributes, containers, bound
  methods' and closures' objects, followed to any depth, but not into classes,
  modules or plain functions' globals); a call with another replica's, the name
  server's or the client's `self` is theirs; a call with no `self`, or with an
  object made after the walk began, belongs to whoever called it.
- A coroutine or generator resumed (trio's scheduler waking a task, an iterator's
  next item) is the same call continuing: not an entry. A callback run by trio
  (`run_sync_soon`) or by another file is an entry.
- The walk is the sequence of entries: a call into file F whose nearest calling
  project frame is in another file (or in no project file: a callback from trio).
  A re-entry is an entry into a file the walk entered before.

The fsync of a group commit on an idle log runs on the loop (DLedgerServer's
inline group commit), so it is seen; a group commit on a worker thread would not be.
Timers of the master that fire inside the window (a heartbeat) are its work too and
are counted: each of several sends is walked and the shortest walk is reported, with
the spread of the others.
"""

from __future__ import annotations

import collections
import contextlib
import dis
import functools
import gc
import os
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
PROJECT_DIRS = tuple(str(ROOT / name) + "/" for name in ("dledger", "broker", "namesrv", "raftmq"))
COMPILED_MODULE = "raftmq.hotpath._compiled"
COMPILED_FILE = "raftmq/hotpath/_compiled.pyx"
_RESUME = dis.opmap["RESUME"]


def project_file(filename: str) -> str | None:
    """`filename` relative to the repository, if it is one of the project's files."""
    if filename.startswith(PROJECT_DIRS):
        return filename[len(str(ROOT)) + 1 :]
    return None


def reachable(root: object) -> set[int]:
    """ids of the project's objects reachable from `root` through their attributes,
    containers, bound methods' selves and closures' cells. Other objects (trio's
    tasks, nurseries and streams, which reach every task of the loop; classes;
    modules) end the search."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        if isinstance(obj, types.MethodType):
            stack.append(obj.__self__)
        elif isinstance(obj, types.FunctionType):
            stack += [cell.cell_contents for cell in obj.__closure__ or () if _full(cell)]
        elif isinstance(obj, functools.partial):
            stack += [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            stack += list(obj)
        elif type(obj).__module__.startswith("raftmq.") and not isinstance(obj, type):
            stack += gc.get_referents(obj)
        else:
            continue
        seen.add(id(obj))
    return seen


def _resumed(frame: types.FrameType) -> bool:
    """Whether a "call" event is a generator or coroutine resumed: its frame stands at a
    RESUME whose argument is not 0 (0 is a function's start; 1-3 follow a yield or an
    await: CPython 3.11's bytecode)."""
    code = frame.f_code.co_code
    lasti = frame.f_lasti
    return code[lasti] == _RESUME and code[lasti + 1] != 0


def _full(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _reentries(sequence: list[str]) -> int:
    """How many items of `sequence` repeat one before them."""
    return len(sequence) - len(set(sequence))


def _compiled_call(function, twin_file, *args, **kwargs):
    """A call into the compiled hot path, made visible to the profiler."""
    return function(*args, **kwargs)


def _twin_files() -> dict[str, str]:
    """name -> the project file defining the pure-Python twin of the compiled function
    of that name (raftmq.hotpath's table: the layer that owns the work)."""
    twins = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("raftmq.") or name == COMPILED_MODULE:
            continue
        for value in vars(module).values():
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                file = project_file(value.__code__.co_filename)
                if file is not None:
                    twins.setdefault(value.__name__, file)
    return twins


@contextlib.contextmanager
def compiled_calls_seen():
    """While inside, every module-level reference of ours to a compiled function calls
    it through `_compiled_call`."""
    replaced = []
    twins = _twin_files()
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("raftmq.") or name == COMPILED_MODULE:
            continue
        for attr, value in list(vars(module).items()):
            compiled = getattr(value, "__module__", None) == COMPILED_MODULE
            if compiled and callable(value) and not isinstance(value, type):
                twin = twins.get(value.__name__, COMPILED_FILE)
                setattr(module, attr, functools.partial(_compiled_call, value, twin))
                replaced.append((module, attr, value))
    try:
        yield len(replaced)
    finally:
        for module, attr, value in replaced:
            setattr(module, attr, value)


@dataclass
class Entry:
    """One entry into a project file: the file, the function, and the file it came from."""

    file: str
    function: str
    caller: str | None  # the calling project file; None for a callback from outside


@dataclass
class Walk:
    entries: list[Entry] = field(default_factory=list)
    resumptions: set[int] = field(default_factory=set)  # len(entries) when trio resumed a task
    unattributed: int = 0  # calls with no owner found (no self of a known object, no caller)

    @property
    def files(self) -> list[str]:
        """The distinct files entered, in the order first entered."""
        return list(dict.fromkeys(e.file for e in self.entries))

    @property
    def reentries(self) -> int:
        """Entries into a file entered before."""
        return _reentries([e.file for e in self.entries])

    @property
    def layers(self) -> list[str]:
        """The layers (a file's directory: broker/store, dledger/core, raftmq/remoting)
        in the order control moves between them, consecutive repeats merged."""
        moves = [str(Path(e.file).parent) for e in self.entries]
        return [layer for k, layer in enumerate(moves) if k == 0 or moves[k - 1] != layer]

    def events(self) -> list[list[Entry]]:
        """The walk cut where trio hands control to the master (a task of its resumed, a
        callback run): each part is what one event does, e.g. the request's bytes read,
        a follower's ack received, an fsync finished."""
        entries = self.entries
        cuts = [
            k
            for k, e in enumerate(entries)
            if k == 0
            or (k in self.resumptions and entries[k - 1].caller is not None)
            or (e.caller is None and entries[k - 1].caller is not None)
        ]
        return [entries[a:b] for a, b in zip(cuts, [*cuts[1:], len(entries)], strict=True)]

    def reentries_by_layer_pair(self) -> collections.Counter:
        """(calling layer, layer re-entered) -> how many re-entries: where the back and
        forth is. A callback from outside the project calls from "(callback)"."""
        pairs: collections.Counter = collections.Counter()
        seen: set[str] = set()
        for e in self.entries:
            if e.file in seen:
                caller = str(Path(e.caller).parent) if e.caller else "(callback)"
                pairs[caller, str(Path(e.file).parent)] += 1
            seen.add(e.file)
        return pairs

    def render(self) -> str:
        lines = [
            f"{len(self.files)} files, {len(self.entries)} entries, {self.reentries} re-entries"
            f" ({self.unattributed} calls unattributed)"
        ]
        seen: set[str] = set()
        for e in self.entries:
            mark = "  again" if e.file in seen else ""
            seen.add(e.file)
            lines.append(f"  {e.file}:{e.function}  <- {e.caller or '(callback)'}{mark}")
        return "\n".join(lines)


class Recorder:
    """The profile function: records the master's entries between `begin` and `end`.

    `begin(frame)` says whether a resumed frame is the master's reader receiving the
    request; `end(frame, event, arg)` whether a call is the master's writer handing the
    response to the kernel."""

    def __init__(self, master: set[int], others: set[int], begin, end) -> None:
        self.master = master
        self.others = others
        self.begin = begin
        self.end = end
        self.owner: dict[types.FrameType, str | None] = {}  # frames seen: "master", "other"
        self.started = False
        self.done = False
        self.walk = Walk()

    def _owner(self, frame: types.FrameType) -> str | None:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            me = id(frame.f_locals.get("self"))
            if me in self.master:
                return "master"
            if me in self.others:
                return "other"
        caller = self._project_caller(frame)
        return None if caller is None else self.owner.get(caller)

    def _project_caller(self, frame: types.FrameType) -> types.FrameType | None:
        back = frame.f_back
        while back is not None and project_file(back.f_code.co_filename) is None:
            back = back.f_back
        return back

    def __call__(self, frame: types.FrameType, event: str, arg) -> None:
        if self.done:
            return
        if self.started and self.end(frame, event, arg):
            self.done = True
            return
        if event != "call":
            return
        if not self.started:
            if self.begin(frame):
                self.started = True
                self._arrive(frame)
            return
        if frame.f_code is _compiled_call.__code__:
            caller = self._project_caller(frame)
            if caller is not None and self.owner.get(caller) == "master":
                file = frame.f_locals["twin_file"]
                caller_file = project_file(caller.f_code.co_filename)
                if file != caller_file:
                    self._enter(file, frame.f_locals["function"].__name__, caller_file)
            return
        file = project_file(frame.f_code.co_filename)
        if file is None:
            return
        owner = self._owner(frame)
        self.owner[frame] = owner  # held: a frame is not reused while referenced here
        if _resumed(frame):  # a coroutine or generator resumed: the same call continuing
            if owner == "master" and self._project_caller(frame) is None:
                self.walk.resumptions.add(len(self.walk.entries))  # trio resumed it
            return
        if owner is None:
            self.walk.unattributed += 1
        if owner != "master":
            return
        caller = self._project_caller(frame)
        caller_file = None if caller is None else project_file(caller.f_code.co_filename)
        if caller_file != file:
            self._enter(file, frame.f_code.co_qualname, caller_file)

    def _arrive(self, frame: types.FrameType) -> None:
        """The request's bytes reach the master's reader: the walk begins in the files of
        the project frames it resumes, outermost first (the read loop, the reader)."""
        loop = self._project_caller(frame)
        for resumed in (loop, frame):
            if resumed is not None:
                self.owner[resumed] = "master"
                self._enter(
                    project_file(resumed.f_code.co_filename), resumed.f_code.co_qualname, None
                )

    def _enter(self, file: str, function: str, caller: str | None) -> None:
        self.walk.entries.append(Entry(file, function, caller))


async def walk_sends(master, others: list, client, request_factory, sends: int) -> list[Walk]:
    """The walk of each of `sends` sends on `master` (a BrokerController) through `client`
    (a connected RemotingClient); `others` are the objects whose calls are not the
    master's (the other members, the name server, the client)."""
    local = client.connection.local_address
    (served,) = [c for c in master.server.connections if c.remote_address == local]
    reader, writer = served._reader, served._writer
    master_ids = reachable(master)
    other_ids = set().union(*(reachable(o) for o in others)) - master_ids
    walks = []
    for _ in range(sends):
        await trio.sleep(0.05)  # let the last send's commit, dispatch and acks settle

        def begin(frame, reader=reader) -> bool:
            return frame.f_code.co_name == "receive_batch" and frame.f_locals.get("self") is reader

        def end(frame, event: str, arg, writer=writer) -> bool:
            """The writer hands bytes to the kernel: at once (`os.writev` in its
            write-through) or from its task (trio's `send_all`)."""
            if event == "c_call":
                return arg is os.writev and frame.f_locals.get("self") is writer
            back = frame.f_back
            return (
                event == "call"
                and frame.f_code.co_name == "send_all"
                and back is not None
                and back.f_locals.get("self") is writer
            )

        recorder = Recorder(master_ids, other_ids, begin, end)
        request = request_factory()
        with compiled_calls_seen():
            sys.setprofile(recorder)
            try:
                response = await client.invoke(request, 10.0)
            finally:
                sys.setprofile(None)
        assert response.code == 0, (response.code, response.remark)
        assert recorder.started and recorder.done, (recorder.started, recorder.done)
        walks.append(recorder.walk)
    return walks


async def measure(base: Path, sends: int = 7) -> list[Walk]:
    """Walks of `sends` sends on a fresh in-process group under `base`."""
    from raftmq.protocol.headers import send_header_v2
    from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode
    from tests.inprocess_broker import InProcessGroup

    def request() -> RemotingCommand:
        ext = send_header_v2("PG", "WalkTopic", 0, born_timestamp_ms=int(time.time() * 1000))
        return RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, ext_fields=ext, body=b"x" * 128)

    async with trio.open_nursery() as nursery:
        group = await InProcessGroup(nursery, base).start()
        master = await group.wait_master()
        async with RemotingClient(master.address) as client:
            for _ in range(8):  # warm-up: the topic is made, caches filled
                response = await client.invoke(request(), 10.0)
                assert response.code == 0, (response.code, response.remark)
            others = [b for b in group.brokers.values() if b is not master]
            walks = await walk_sends(
                master, [*others, group.namesrv, client], client, request, sends
            )
        nursery.cancel_scope.cancel()
    return walks


def shortest(walks: list[Walk]) -> Walk:
    return min(walks, key=lambda w: (len(w.entries), w.reentries))


def report(walks: list[Walk]) -> str:
    best = shortest(walks)
    files = sorted(len(w.files) for w in walks)
    again = sorted(w.reentries for w in walks)
    lines = [
        best.render(),
        f"over {len(walks)} sends: files {files} (median {statistics.median(files)}),"
        f" re-entries {again} (median {statistics.median(again)})",
        "files in order: " + " -> ".join(best.files),
        f"layers, as control moves ({len(set(best.layers))} layers,"
        f" {_reentries(best.layers)} re-entries): " + " -> ".join(best.layers),
        "re-entries by layer pair (caller -> re-entered): "
        + ", ".join(
            f"{caller} -> {layer} {count}"
            for (caller, layer), count in best.reentries_by_layer_pair().most_common()
        ),
        f"per event ({len(best.events())} events, each begun by trio): "
        + "; ".join(
            f"{part[0].file}:{part[0].function} {len({e.file for e in part})} files"
            f" {_reentries([e.file for e in part])} re-entries"
            for part in best.events()
        ),
    ]
    return "\n".join(lines)


def main(sends: int) -> int:
    import tempfile

    from raftmq.hotpath import COMPILED

    with tempfile.TemporaryDirectory(prefix="bench-walk-") as tmp:
        walks = trio.run(measure, Path(tmp), sends)
    print(f"compiled hot path: {'yes' if COMPILED else 'no (RAFTMQ_NO_EXTENSIONS)'}")
    print(report(walks))
    return 0
