"""Hostile input against a real group: `python -m jepsen.fuzz [--time-limit S] [--seed N]`.

Starts a name server and a 3-member DLedger broker group as processes
(`raftmq.tools.broker_local.LocalCluster`) and, for `--time-limit` seconds, sends
every port — the brokers' remoting ports, their DLedger peer ports, the name
server's — random bytes and well-formed frames that are cut short, bit-flipped or
given a false length (a RocketMQ command, a peer message, a DLedger RPC), several
connections at a time. Then a storm: on every port, connections that each declare a
frame and send half of it, held open together.

Checked, per input: the port answers only with well-formed responses (a RocketMQ
response on remoting ports, an RPC answer on the peer port) or closes the connection,
within a few seconds. At the end: every process is alive, none grew its resident
memory by more than the storm's declared bytes and a margin, and the group still
serves (a send to the master is acknowledged and a pull returns it). Exit status 0
when all of that holds, 1 when not. Everything it saw goes to `DIR/fuzz.json`.

Peer-port inputs name members as senders too, and come from the members' host, so
forged votes and pushes are part of what a run sends; what a member's forged bytes
can do (and what they cannot) is in docs/security.md, "The DLedger peer port".
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import msgpack
import trio
import trio.testing
from raftmq.dledger.codes import PushType, VoteResult
from raftmq.dledger.core.messages import HeartBeatRequest, PushRequest, VoteRequest, VoteResponse
from raftmq.dledger.net.codec import FrameError, RpcCode, decode_rpc, encode_message, encode_rpc
from raftmq.dledger.net.frames import PEER, RPC, FrameReader, pack_frame

from raftmq.config.address import parse_address
from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import RemotingCommand, RequestCode, ResponseCode
from raftmq.remoting.codec import encode
from raftmq.remoting.command import FLAG_ONEWAY, FLAG_RESPONSE
from raftmq.remoting.errors import RemotingError
from raftmq.remoting.frames import FrameDecoder
from raftmq.tools.broker_local import LocalCluster

ANSWER_WITHIN_S = 5.0
STORM_CONNECTIONS = 64  # per port
STORM_DECLARED_BYTES = 256 * 1024
RSS_MARGIN_BYTES = 96 << 20  # Python's own churn over a run

# Requests that change what a broker or the name server serves, by design: refusing
# them to strangers is access control's job, not the parser's.
ADMINISTRATIVE = frozenset(
    {
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.WIPE_WRITE_PERM_OF_BROKER,
        RequestCode.ADD_WRITE_PERM_OF_BROKER,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.DELETE_TOPIC_IN_NAMESRV,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.REGISTER_BROKER,
        RequestCode.UPDATE_NAMESRV_CONFIG,
        RequestCode.TRIGGER_DELETE_FILES,
        RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
        RequestCode.CLEAN_UNUSED_TOPIC,
    }
)
_REQUEST_CODES = sorted(set(RequestCode) - ADMINISTRATIVE)
_HEADER_KEYS = (
    "topic", "queueId", "queueOffset", "maxMsgNums", "consumerGroup", "producerGroup",
    "sysFlag", "properties", "suspendTimeoutMillis", "commitOffset", "offset", "key",
)  # fmt: skip
_IDS = ("n0", "n1", "n2", "stranger")


# ---------------------------------------------------------------- inputs


class Inputs:
    """Hostile inputs drawn from one seeded generator (a run is replayed by its seed)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def _int(self) -> int:
        r = self.rng
        return r.choice((r.randint(-2, 20), r.randint(0, 2**31), r.randint(-(2**63), 2**63 - 1)))

    def _text(self) -> str:
        r = self.rng
        return "".join(chr(r.randint(32, 0x2FF)) for _ in range(r.randint(0, 12)))

    def remoting_frame(self) -> bytes:
        r = self.rng
        code = r.choice(_REQUEST_CODES) if r.random() < 0.8 else r.randint(-3, 500)
        if code in ADMINISTRATIVE:
            code = RequestCode.GET_BROKER_RUNTIME_INFO
        ext = {r.choice(_HEADER_KEYS): r.choice((self._text(), str(self._int()))) for _ in range(4)}
        command = RemotingCommand(
            code=code,
            ext_fields=ext,
            body=r.randbytes(r.randint(0, 200)),
            flag=r.choice((0, 0, FLAG_ONEWAY, FLAG_RESPONSE)),
            opaque=r.randint(0, 2**31 - 1),
        )
        return encode(command)

    def peer_frame(self) -> bytes:
        r = self.rng
        ids = [r.choice(_IDS) for _ in range(3)]
        kind = r.randrange(6)
        if kind == 0:
            msg = VoteRequest(
                "RaftNode00", *ids, self._int(), self._int(), self._int(), self._int()
            )
        elif kind == 1:
            msg = HeartBeatRequest("RaftNode00", *ids, self._int(), self._int())
        elif kind == 2:
            msg = VoteResponse(
                "RaftNode00", *ids, self._int(), r.choice(list(VoteResult)), self._int()
            )
        elif kind == 3:
            msg = PushRequest(
                "RaftNode00", *ids, self._int(), r.choice(list(PushType)), self._int(),
                self._int(), self._int(), r.randbytes(r.randint(0, 100)), self._int(),
            )  # fmt: skip
        elif kind == 4:
            request = {"code": r.choice([int(c) for c in RpcCode]), "opaque": self._int()}
            for key in r.sample(("group", "index", "bodies"), r.randint(0, 3)):
                request[key] = r.choice((self._text(), self._int(), [r.randbytes(8)]))
            return pack_frame(RPC, encode_rpc(request))
        else:
            items = [r.choice((self._int(), self._text())) for _ in range(r.randint(0, 9))]
            return pack_frame(r.randrange(256), msgpack.packb(items))
        try:
            return pack_frame(PEER, encode_message(msg))
        except (OverflowError, ValueError):  # an int msgpack cannot carry
            return pack_frame(PEER, b"")

    def mutate(self, frame: bytes) -> bytes:
        """`frame` whole, cut short, with bytes changed, or with a false declared length."""
        r = self.rng
        choice = r.randrange(4)
        if choice == 0 or not frame:
            return frame
        if choice == 1:
            return frame[: r.randrange(len(frame))]
        if choice == 2:
            data = bytearray(frame)
            for _ in range(r.randint(1, 4)):
                data[r.randrange(len(data))] = r.randrange(256)
            return bytes(data)
        length = r.choice((0, 1, len(frame) + 100, 16 * 1024 * 1024 + 1, 2**31, 2**32 - 1))
        return length.to_bytes(4, "big") + frame[4:]

    def draw(self, frame) -> bytes:
        """Random bytes, or one to three (mutated) frames made by `frame()`, back to back."""
        r = self.rng
        if r.random() < 0.2:
            return r.randbytes(r.randint(0, 600))
        return b"".join(self.mutate(frame()) for _ in range(r.randint(1, 3)))


# ---------------------------------------------------------------- oracles


def remoting_answer_problem(data: bytes) -> str | None:
    decoder = FrameDecoder()
    try:
        commands = decoder.feed(data)
        decoder.end_of_stream()
    except RemotingError as exc:
        return f"malformed answer: {exc}"
    for command in commands:
        if not command.flag & FLAG_RESPONSE:
            return f"a request, not a response: code {command.code}"
    return None


async def peer_answer_problem(data: bytes) -> str | None:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(data)
    stream.put_eof()
    try:
        async for channel, payload in FrameReader(stream):
            if channel != RPC:
                return f"a frame on channel {channel} on an incoming connection"
            decode_rpc(payload)
    except FrameError as exc:
        return f"malformed answer: {exc}"
    return None


async def exchange(host: str, port: int, data: bytes) -> tuple[bytes | None, str]:
    """Send `data`, end our half, read until the port closes: (bytes, "") or (None, why)."""
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        return None, f"cannot connect: {exc!r}"
    received = bytearray()
    async with stream:
        try:
            await stream.send_all(data)
            await stream.send_eof()
        except trio.BrokenResourceError:
            pass  # it closed on us mid-input: allowed
        with trio.move_on_after(ANSWER_WITHIN_S):
            try:
                while chunk := await stream.receive_some(65536):
                    received += chunk
            except trio.BrokenResourceError:
                pass
            return bytes(received), ""
    return None, f"neither closed nor stopped within {ANSWER_WITHIN_S} s"


# ---------------------------------------------------------------- a run


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Tally:
    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.problems: list[str] = []

    def record(self, port_name: str, problem: str | None, data: bytes) -> None:
        self.sent[port_name] = self.sent.get(port_name, 0) + 1
        if problem is not None and len(self.problems) < 50:
            self.problems.append(f"{port_name}: {problem} (input {data[:64].hex()}...)")


async def _fuzz_port(tally, name, address, draw, judge, until_s) -> None:
    host, port = parse_address(address)
    while trio.current_time() < until_s:
        data = draw()
        received, why = await exchange(host, port, data)
        if received is None:
            tally.record(name, why, data)
        else:
            problem = judge(received)
            if not isinstance(problem, str | None):
                problem = await problem
            tally.record(name, problem, data)


async def _storm(address: str) -> list:
    host, port = parse_address(address)
    held = []
    half = STORM_DECLARED_BYTES.to_bytes(4, "big") + b"\0" * (STORM_DECLARED_BYTES // 2)
    for _ in range(STORM_CONNECTIONS):
        try:
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(half)
        except (OSError, trio.BrokenResourceError):
            continue  # refused past the cap: allowed
        held.append(stream)
    return held


async def still_serving(cluster: LocalCluster) -> str | None:
    """None if a send to the master is acknowledged and a pull returns it, else why not."""
    master = await cluster.wait_master(timeout_s=30.0)
    body = f"fuzz-check-{time.time_ns()}".encode()
    ext = send_header_v2("FuzzPG", "FuzzCheck", 0, born_timestamp_ms=int(time.time() * 1000))
    sent = await cluster.broker_call(master, RequestCode.SEND_MESSAGE_V2, ext, body)
    if sent.code != ResponseCode.SUCCESS:
        return f"send refused: {sent.code} {sent.remark}"
    pull = {
        "consumerGroup": "FuzzCG", "topic": "FuzzCheck", "queueId": 0,
        "queueOffset": sent.ext_fields["queueOffset"], "maxMsgNums": 32, "sysFlag": 0,
        "commitOffset": 0, "suspendTimeoutMillis": 1000, "subscription": "*", "subVersion": 0,
    }  # fmt: skip
    pulled = await cluster.broker_call(master, RequestCode.PULL_MESSAGE, pull)
    if pulled.code != ResponseCode.SUCCESS or body not in pulled.body:
        return f"pull did not return the message: {pulled.code} {pulled.remark}"
    return None


async def fuzz(run_dir: Path, seed: int, time_limit_s: float, concurrency: int = 2) -> dict:
    rng = random.Random(seed)
    inputs = Inputs(rng)
    tally = Tally()
    async with LocalCluster(run_dir) as cluster:
        await cluster.create_topic("FuzzCheck", queues=1)
        ports = {"namesrv": (cluster.namesrv_addr, inputs.remoting_frame, remoting_answer_problem)}
        for node in cluster.ids:
            ports[f"{node}.remoting"] = (
                cluster.broker_addrs[node], inputs.remoting_frame, remoting_answer_problem
            )  # fmt: skip
            ports[f"{node}.peer"] = (
                cluster.peer_addrs[node],
                inputs.peer_frame,
                peer_answer_problem,
            )
        rss_before = {name: rss_bytes(cluster.pid(name)) for name in cluster.procs}
        until = trio.current_time() + time_limit_s
        async with trio.open_nursery() as nursery:
            for name, (address, frame, judge) in ports.items():
                draw = lambda f=frame: inputs.draw(f)  # noqa: E731 - one per port
                for _ in range(concurrency):
                    nursery.start_soon(_fuzz_port, tally, name, address, draw, judge, until)
        held = [s for address, _, _ in ports.values() for s in await _storm(address)]
        await trio.sleep(0.5)
        rss_storm = {name: rss_bytes(cluster.pid(name)) for name in cluster.procs}
        for stream in held:
            await trio.aclose_forcefully(stream)
        dead = [name for name, proc in cluster.procs.items() if proc.poll() is not None]
        storm_bytes = 2 * STORM_CONNECTIONS * STORM_DECLARED_BYTES  # a broker has two ports
        grew = {
            name: rss_storm[name] - rss_before[name]
            for name in rss_storm
            if rss_storm[name] - rss_before[name] > storm_bytes + RSS_MARGIN_BYTES
        }
        serving = None if dead else await still_serving(cluster)
    results = {
        "seed": seed,
        "time_limit_s": time_limit_s,
        "inputs": tally.sent,
        "problems": tally.problems,
        "dead": dead,
        "rss_before": rss_before,
        "rss_during_storm": rss_storm,
        "rss_grew_too_much": grew,
        "not_serving": serving,
    }
    results["valid"] = not (tally.problems or dead or grew or serving)
    (run_dir / "fuzz.json").write_text(json.dumps(results, indent=2))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jepsen.fuzz", description=__doc__)
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds of fuzzing")
    parser.add_argument("--seed", type=int, default=None, help="the inputs' seed (default: random)")
    parser.add_argument("--dir", type=Path, default=None, help="run directory (default: runs/...)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    run_dir = args.dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-fuzz-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    results = trio.run(fuzz, run_dir, seed, args.time_limit)
    print(json.dumps({k: v for k, v in results.items() if not k.startswith("rss")}, indent=2))
    print(f"run directory: {run_dir}")
    return 0 if results["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
