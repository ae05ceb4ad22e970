"""Apache RocketMQ's official 5.x Python client (PyPI `rocketmq-python-client`,
unchanged) as a test peer, run with the interpreter of tests/python5/.venv.

    python peer.py produce ENDPOINTS TOPIC KIND INTERVAL_S
    python peer.py transaction ENDPOINTS TOPIC
    python peer.py timer ENDPOINTS TOPIC
    python peer.py simple ENDPOINTS TOPIC GROUP
    python peer.py push ENDPOINTS TOPIC GROUP

`produce` starts a Producer on TOPIC and sends bodies "0", "1", ... one every
INTERVAL_S at most, KIND `normal` or `fifo` (message group "g<n mod 4>"), and prints
per send one JSON line {"event": "sent" or "failed", "n", "start", "end", "msg_id",
"offset" or "error"}. `transaction` sends three transactional messages and
ends them: body "commit" committed, "rollback" rolled back, "orphan" left open, which
the producer's checker then commits when the server asks ({"event": "checked",
"msg_id", "body"}); it prints {"event": "half", "body", "msg_id"} per half message.
`timer` sends ten timer messages, body "n" due at the whole second `due` (epoch
seconds: the client's delivery_timestamp is in seconds) 2 to 4 s ahead, printing
{"event": "sent", "n", "due", "msg_id"}, and recalls message 0 once it is sent
({"event": "recalled", "msg_id"}).

`simple` receives with a SimpleConsumer (16 at a time, 15 s invisible, 5 s long poll)
and acknowledges each; `push` runs a PushConsumer whose listener returns SUCCESS. Both
print per message {"event": "consumed", "msg_id", "body", "attempt", "t", "wall"} as it
is delivered (`simple` acknowledges it next: an ack the proxy applied but could not
answer, as when it is killed, fails here and yet the message is not delivered again).
All print {"event": "started"} once their client has started, and run until stdin
closes. Times are `time.monotonic()`.

A process of its own: the client's package is named `rocketmq`, as the C++ client's
that the test suite's own venv holds.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for peer_lines
from peer_lines import emit, stop_at_end_of_stdin


def produce(endpoints: str, topic: str, kind: str, interval_s: float) -> None:
    producer = Producer(ClientConfiguration(endpoints, Credentials()), (topic,))
    producer.startup()
    emit(event="started")
    stop = stop_at_end_of_stdin()
    try:
        for number in itertools.count():
            if stop.is_set():
                break
            message = Message()
            message.topic = topic
            message.body = str(number).encode()
            message.tag = "peer"
            if kind == "fifo":
                message.message_group = f"g{number % 4}"
            start = time.monotonic()
            try:
                receipt = producer.send(message)
            except Exception as exc:  # noqa: BLE001 - the client raises a class per code
                emit(event="failed", n=number, start=start, end=time.monotonic(), error=str(exc))
            else:
                emit(
                    event="sent",
                    n=number,
                    start=start,
                    end=time.monotonic(),
                    msg_id=receipt.message_id,
                    offset=receipt.offset,
                )
            stop.wait(interval_s)
    finally:
        producer.shutdown()


class CommitOrphans(TransactionChecker):
    def check(self, message):
        emit(event="checked", msg_id=message.message_id, body=message.body.decode())
        return TransactionResolution.COMMIT


def transaction(endpoints: str, topic: str) -> None:
    producer = Producer(
        ClientConfiguration(endpoints, Credentials()), (topic,), checker=CommitOrphans()
    )
    producer.startup()
    emit(event="started")
    stop = stop_at_end_of_stdin()
    try:
        for body in ("commit", "rollback", "orphan"):
            message = Message()
            message.topic = topic
            message.body = body.encode()
            transaction = producer.begin_transaction()
            receipt = producer.send(message, transaction)
            emit(event="half", body=body, msg_id=receipt.message_id)
            if body == "commit":
                transaction.commit()
            elif body == "rollback":
                transaction.rollback()
        stop.wait()
    finally:
        producer.shutdown()


def _consumed(message) -> None:
    emit(
        event="consumed",
        msg_id=message.message_id,
        body=message.body.decode(),
        attempt=message.delivery_attempt,
        t=time.monotonic(),
        wall=time.time(),
    )


def timer(endpoints: str, topic: str) -> None:
    producer = Producer(ClientConfiguration(endpoints, Credentials()), (topic,))
    producer.startup()
    emit(event="started")
    stop = stop_at_end_of_stdin()
    try:
        for number in range(10):
            message = Message()
            message.topic = topic
            message.body = str(number).encode()
            # the one recalled is due later: its send, the client's first (a route to
            # fetch), must leave its recall time before it is due, even on a busy machine
            due = int(time.time()) + (5 if number == 0 else 2 + number % 3)
            message.delivery_timestamp = due
            receipt = producer.send(message)
            emit(event="sent", n=number, due=due, msg_id=receipt.message_id)
            if number == 0:
                producer.recall_message(topic, receipt.recall_handle)
                emit(event="recalled", msg_id=receipt.message_id)
        stop.wait()
    finally:
        producer.shutdown()


def simple(endpoints: str, topic: str, group: str) -> None:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoints, Credentials()),
        group,
        {topic: FilterExpression()},
        await_duration=5,
    )
    consumer.startup()
    emit(event="started")
    stop = stop_at_end_of_stdin()
    try:
        while not stop.is_set():
            try:
                messages = consumer.receive(16, 15)
            except Exception as exc:  # noqa: BLE001 - the client raises a class per code
                emit(event="receive_failed", error=str(exc), t=time.monotonic())
                stop.wait(0.1)
                continue
            for message in messages:
                _consumed(message)
                try:
                    consumer.ack(message)
                except Exception as exc:  # noqa: BLE001
                    emit(event="ack_failed", msg_id=message.message_id, error=str(exc))
    finally:
        consumer.shutdown()


class Record(MessageListener):
    def consume(self, message):
        _consumed(message)
        return ConsumeResult.SUCCESS


def push(endpoints: str, topic: str, group: str) -> None:
    consumer = PushConsumer(
        ClientConfiguration(endpoints, Credentials()), group, Record(), {topic: FilterExpression()}
    )
    consumer.startup()
    emit(event="started")
    try:
        stop_at_end_of_stdin().wait()
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "produce":
        produce(args[0], args[1], args[2], float(args[3]))
    elif role == "transaction":
        transaction(args[0], args[1])
    elif role == "timer":
        timer(args[0], args[1])
    elif role == "simple":
        simple(args[0], args[1], args[2])
    elif role == "push":
        push(args[0], args[1], args[2])
    else:
        sys.exit(f"unknown role {role!r}")
