"""`python -m bench.pull_bench [--messages N] [--size B] [--batch K]`: the broker's cost per
pulled message, on this machine's store, without a cluster or a socket.

A DLedger file store is filled with N messages of B bytes in one queue (message n tagged
TagA when n is even, else TagB, with the properties a = n % 12 and n, and a UNIQ_KEY as
producers set one), dispatched to its ConsumeQueue, and then read through in pulls of K,
as PULL_MESSAGE reads it: `MessageStore.get_message` and the response the pull processor
builds around its body. Prints CPU µs per pulled message, for every message, for a TagA
subscription and for the SQL92 subscriptions `a > 5` (12 values, each evaluated once and
then cached) and `n >= N/2` (a value per message, evaluated each time); each of the last
three takes half the messages, scanning two entries per message taken.
`RAFTMQ_NO_EXTENSIONS=1` measures the pure-Python path.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import types
from pathlib import Path

from raftmq.broker.pull import PullProcessor, subscription_codes
from raftmq.broker.sql92 import compile_sql92
from raftmq.broker.store.messagestore import MessageStore, parse_delay_levels
from raftmq.broker.store.metadata import builtin_topics
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store.file import FileLogStore

from raftmq import hotpath
from raftmq.protocol import message as codec
from raftmq.remoting import RemotingCommand

TOPIC = "PullBench"
FILL_BATCH = 1000  # messages per appended batch while filling


class CommittedLog:
    """The replicated-log face of a store filled here: what it holds is committed."""

    def __init__(self, store: FileLogStore) -> None:
        self.store = store
        self.replica = types.SimpleNamespace(committed_index=store.end_index)

    def add_commit_handler(self, handler) -> None:
        """The log does not grow after the fill: no commit to announce."""

    def add_retention_limit(self, limit) -> None:
        """No retention runs here."""


def filled_store(root: Path, messages: int, size_bytes: int) -> MessageStore:
    """A message store over a new file log holding `messages` of `size_bytes`, dispatched."""
    log = CommittedLog(FileLogStore(root / "dledger", segment_size=256 << 20))
    store = MessageStore(log, root / "broker", builtin_topics("C", "b", 1), parse_delay_levels(""))
    body = b"x" * size_bytes
    for first in range(0, messages, FILL_BATCH):
        records = []
        for n in range(first, min(messages, first + FILL_BATCH)):
            properties = {
                "TAGS": "TagA" if n % 2 == 0 else "TagB",
                "a": str(n % 12),
                "n": str(n),
                "UNIQ_KEY": f"7F00000100002A9F0000{n:012X}",
            }
            msg = codec.MessageExt(topic=TOPIC, body=body, properties=properties)
            records.append((EntryType.NORMAL, codec.encode(msg)))
        log.store.append_leader(1, records)  # the CommitLog's hook places each record
    log.replica.committed_index = log.store.end_index
    while store.dispatch_some(1 << 16):
        pass
    return store


def pull_cost_us(store: MessageStore, batch: int, codes, matches, taken: int) -> float:
    """CPU µs per message taken to read the queue through once in pulls of `batch`, by the
    tag codes `codes` or the SQL92 filter `matches` (`taken` messages pass it)."""
    request = RemotingCommand(code=11, opaque=1)
    end = store.queues.find(TOPIC, 0).max_offset
    offset = 0
    start = time.process_time()
    while offset < end:
        result = store.get_message(TOPIC, 0, offset, batch, codes, matches)
        PullProcessor._response(request, result, 0)
        offset = result.next_begin_offset
    return (time.process_time() - start) * 1e6 / taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--batch", type=int, default=32, help="messages per pull")
    parser.add_argument("--rounds", type=int, default=3, help="passes; the best is shown")
    args = parser.parse_args()
    path = "compiled" if hotpath.COMPILED else "pure Python"
    count, half = args.messages, args.messages // 2
    cases = [  # (subscription, tag codes, SQL92 filter, messages taken)
        ("*", None, None, count),
        ("TagA", subscription_codes("TagA"), None, (count + 1) // 2),
        ("SQL92 a > 5", None, "a > 5", sum(1 for n in range(count) if n % 12 > 5)),
        (f"SQL92 n >= {half}", None, f"n >= {half}", count - half),
    ]
    with tempfile.TemporaryDirectory(prefix="pull-bench-") as tmp:
        store = filled_store(Path(tmp), args.messages, args.size)
        for subscription, codes, expression, taken in cases:
            matches = None if expression is None else compile_sql92(expression).matches_properties
            best = min(
                pull_cost_us(store, args.batch, codes, matches, taken) for _ in range(args.rounds)
            )
            print(
                f"{path:11} {count} x {args.size} B, pulls of {args.batch}, "
                f"{subscription:18}: {best:5.2f} CPU µs per message"
            )


if __name__ == "__main__":
    main()
