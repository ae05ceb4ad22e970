"""The Go load generator of the broker benchmark (bench/remoting_pub) against a remoting
server in the test: the frames it sends are SEND_MESSAGE_V2 requests raftmq's codec reads,
the window holds, and it counts what the responses say."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest
import trio

from bench import broker_bench
from bench.broker_bench import GO_GENERATOR
from raftmq.remoting import LanguageCode, RequestCode, ResponseCode
from raftmq.remoting.codec import encode
from raftmq.remoting.frames import FrameDecoder

needs_go = pytest.mark.requires("go")


class _Server:
    """Answers every request at once with `code`; keeps what it received."""

    def __init__(self, code: int = ResponseCode.SUCCESS, remark: str | None = None) -> None:
        self.code, self.remark = code, remark
        self.requests = []
        self.connections = 0
        self.most_per_read = 0  # requests decoded from one read: at most the connection's share
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        decoder = FrameDecoder()
        with conn, contextlib.suppress(ConnectionError):  # a generator that fails resets it
            while data := conn.recv(1 << 16):
                requests = decoder.feed(data)
                with self._lock:
                    self.requests += requests
                    self.most_per_read = max(self.most_per_read, len(requests))
                responses = [encode(r.make_response(self.code, self.remark)) for r in requests]
                conn.sendall(b"".join(responses))

    def close(self) -> None:
        self._listener.close()


def _run(server: _Server, **flags) -> dict:
    args = [f"-addr={server.address}", "-warmup=0.1s", "-duration=0.5s", "-deadline=10s"]
    args += [f"-{name}={value}" for name, value in flags.items()]
    return GO_GENERATOR.run(args, timeout_s=60.0)


@needs_go
def test_sends_java_send_message_v2_requests_round_robin_within_the_window():
    server = _Server()
    try:
        started = time.time()
        out = _run(server, topic="T1", queues=3, size=100, window=10, conns=2)
    finally:
        server.close()
    assert out["errors"] == 0 and "first_error" not in out
    assert 0 < out["acked"] <= out["sent"] == len(server.requests)
    assert out["acked_per_s"] == pytest.approx(out["acked"] / 0.5)
    assert 0 < out["p50_ms"] <= out["p99_ms"] <= out["max_ms"]
    assert server.connections == 2
    assert server.most_per_read <= 5  # each connection's share of the window
    queue_ids = [int(r.ext_fields["e"]) for r in server.requests]
    assert set(queue_ids) == {0, 1, 2}
    assert (
        max(queue_ids.count(q) for q in range(3)) - min(queue_ids.count(q) for q in range(3))
        <= len(server.requests) // 10
    )
    for request in server.requests[:50]:
        assert request.code == RequestCode.SEND_MESSAGE_V2
        assert request.language == LanguageCode.JAVA
        fields = request.ext_fields
        assert sorted(fields) == list("abcdefghijkm")
        assert (fields["a"], fields["b"], fields["c"], fields["d"]) == (
            "BENCH_PG",
            "T1",
            "TBW102",
            "3",
        )
        assert (fields["f"], fields["h"], fields["i"], fields["j"]) == ("0", "0", "", "0")
        assert (fields["k"], fields["m"]) == ("false", "false")
        assert abs(int(fields["g"]) / 1000 - started) < 30
        assert len(request.body) == 100
        (born,) = struct.unpack_from(">d", request.body)  # what the consumers read
        assert started - 1 < born < time.time() + 1
    bodies = {r.body[8:] for r in server.requests}
    assert len(bodies) == 1  # one random padding, sent with every message


@needs_go
def test_counts_refused_sends_as_errors_with_the_first_remark():
    server = _Server(ResponseCode.SYSTEM_ERROR, "store is full")
    try:
        out = _run(server, queues=1, size=8, window=4, conns=4)
    finally:
        server.close()
    assert out["acked"] == 0 and out["p50_ms"] is None
    assert out["errors"] == out["sent"] == len(server.requests) > 0
    assert out["first_error"] == f"code {ResponseCode.SYSTEM_ERROR}: store is full"
    assert all(len(r.body) == 8 for r in server.requests)


def test_the_benchmark_falls_back_to_the_python_generator_without_go(monkeypatch):
    def no_go(tool):
        raise RuntimeError("no Go toolchain")

    monkeypatch.setattr(type(GO_GENERATOR), "ensure", no_go)
    chosen, why = broker_bench.generators("auto")
    assert chosen == [broker_bench.PYTHON] and "no Go toolchain" in why
    assert broker_bench.generators("both") == ([broker_bench.GO, broker_bench.PYTHON], None)
    assert broker_bench.generators("python") == ([broker_bench.PYTHON], None)


@needs_go
def test_spreads_the_load_over_topics_named_as_the_benchmark_names_them():
    """-topics N sends to <topic>-0 ... <topic>-(N-1), each of their -queues queues in
    turn, as broker_bench.Spread names them for the Python generator."""
    server = _Server()
    try:
        _run(server, topic="T", topics=3, queues=2, size=16, window=8, conns=2)
    finally:
        server.close()
    spread = broker_bench.Spread(topic="T", topics=3, queues=2)
    pairs = [(r.ext_fields["b"], int(r.ext_fields["e"])) for r in server.requests]
    assert {topic for topic, _ in pairs} == set(spread.names()) == {"T-0", "T-1", "T-2"}
    assert set(pairs) == {(t, q) for t in spread.names() for q in range(2)}
    counts = [pairs.count(p) for p in set(pairs)]
    assert max(counts) - min(counts) <= len(pairs) // 10
    assert all(r.ext_fields["d"] == "2" for r in server.requests)


def test_the_python_generator_spreads_its_load_the_same_way():
    server = _Server()
    spread = broker_bench.Spread(topic="T", topics=3, queues=2)
    try:
        rate, latencies, errors = trio.run(
            broker_bench._produce, server.address, 16, 8, 0.3, spread
        )
    finally:
        server.close()
    assert errors == 0 and rate > 0 and latencies
    pairs = {(r.ext_fields["b"], int(r.ext_fields["e"])) for r in server.requests}
    assert pairs == {(t, q) for t in spread.names() for q in range(2)}
