"""RocketMQ's C++ client (PyPI `rocketmq`, ctypes over librocketmq.so) as a test peer.

    python tests/cpp_client/peer.py produce NAMESRV TOPIC INTERVAL_S
    python tests/cpp_client/peer.py consume NAMESRV TOPIC GROUP

`produce` sends messages with `send_sync`, bodies "0", "1", ..., one every INTERVAL_S
at most, and prints for each one line of JSON: {"event": "sent" or "failed", "n",
"start", "end", "msg_id" or "error"}. `consume` runs a clustering PushConsumer and
prints {"event": "consumed", "n", "t", "msg_id", "queue_id", "queue_offset"} per
delivery. Each runs until its stdin closes. Times are `time.monotonic()`, the
system-wide CLOCK_MONOTONIC the test reads too.

A process of its own, not a thread of the test: the library keeps one client
factory per process (a producer and a consumer of one process share it, its
connections and its locks) and starts threads no test can stop. It writes its log
under $HOME/logs/rocketmq-cpp, so the test gives it a HOME of its own.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

from rocketmq.client import Message, Producer, PushConsumer, SendStatus

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for peer_lines
from peer_lines import emit, stop_at_end_of_stdin


def produce(namesrv: str, topic: str, interval_s: float) -> None:
    producer = Producer("CppPeerProducer")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    stop = stop_at_end_of_stdin()
    try:
        for number in itertools.count():
            if stop.is_set():
                break
            message = Message(topic)
            message.set_body(str(number).encode())
            start = time.monotonic()
            try:
                result = producer.send_sync(message)
            except Exception as exc:  # noqa: BLE001 - the library raises a class per error code
                emit(event="failed", n=number, start=start, end=time.monotonic(), error=str(exc))
            else:
                sent = result.status == SendStatus.OK
                emit(
                    event="sent" if sent else "failed", n=number, start=start,
                    end=time.monotonic(), msg_id=result.msg_id, error=str(result.status),
                )  # fmt: skip
            time.sleep(max(0.0, start + interval_s - time.monotonic()))
    finally:
        producer.shutdown()


def consume(namesrv: str, topic: str, group: str) -> None:
    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)

    def on_message(message) -> None:
        emit(
            event="consumed", n=int(message.body), t=time.monotonic(), msg_id=message.id,
            queue_id=message.queue_id, queue_offset=message.queue_offset,
        )  # fmt: skip

    consumer.subscribe(topic, on_message)
    consumer.start()
    emit(event="started")
    try:
        sys.stdin.read()  # until the test closes it
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "produce":
        produce(args[0], args[1], float(args[2]))
    elif role == "consume":
        consume(*args)
    else:
        sys.exit(f"unknown role {role!r}: produce or consume")
