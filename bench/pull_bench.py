"""`python -m bench.pull_bench [--messages N] [--size B] [--batch K]`: the broker's cost per
pulled message, on this machine's store, without a cluster or a socket.

A DLedger file store is filled with N messages of B bytes in one queue (every other one
tagged TagA, each with an int property `a` from 0 to 11 and a UNIQ_KEY as producers
set one), dispatched to its ConsumeQueue, and then read through in pulls of K, as
PULL_MESSAGE reads it: `MessageStore.get_message` and the response the pull processor
builds around its body. Prints µs per pulled message, for every message, for a TagA
subscription (which scans two entries per message taken) and for the SQL92 subscription
`a > 5` (half of them, evaluated over each message's properties). `RAFTMQ_NO_EXTENSIONS=1`
measures the pure-Python path. The script uses only what a pull used before the pull was
batched into one call, so a checkout from before that change measures the same way.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import types
from pathlib import Path

from raftmq import hotpath
from raftmq.broker.pull import PullProcessor, subscription_codes
from raftmq.broker.sql92 import compile_sql92
from raftmq.broker.store.messagestore import MessageStore, parse_delay_levels
from raftmq.broker.store.metadata import builtin_topics
from raftmq.dledger.codes import EntryType
from raftmq.dledger.store.file import FileLogStore
from raftmq.protocol import message as codec
from raftmq.remoting import RemotingCommand

TOPIC = "PullBench"
SQL92 = "a > 5"  # matches the messages whose `a` (n % 12) is 6 to 11: half of them
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
                "UNIQ_KEY": f"7F00000100002A9F0000{n:012X}",
            }
            msg = codec.MessageExt(topic=TOPIC, body=body, properties=properties)
            records.append((EntryType.NORMAL, codec.encode(msg)))
        log.store.append_leader(1, records)  # the CommitLog's hook places each record
    log.replica.committed_index = log.store.end_index
    while store.dispatch_some(1 << 16):
        pass
    return store


def pull_cost_us(store: MessageStore, batch: int, subscription: str | None, sql92: bool) -> float:
    """µs per message taken to read the queue through once in pulls of `batch`, by a tag
    `subscription` or, with `sql92`, by the SQL92 expression `subscription`."""
    codes = None if sql92 else subscription_codes(subscription)
    matches = compile_sql92(subscription).matches_record if sql92 else None
    request = RemotingCommand(code=11, opaque=1)
    end = store.queues.find(TOPIC, 0).max_offset
    offset = 0
    start = time.perf_counter()
    while offset < end:
        result = store.get_message(TOPIC, 0, offset, batch, codes, matches)
        PullProcessor._response(request, result, 0)
        offset = result.next_begin_offset
    elapsed = time.perf_counter() - start
    if sql92:
        taken = sum(1 for n in range(end) if n % 12 > 5)
    else:
        taken = end if codes is None else (end + 1) // 2  # TagA: the even ones
    return elapsed * 1e6 / taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--batch", type=int, default=32, help="messages per pull")
    parser.add_argument("--rounds", type=int, default=3, help="passes; the best is shown")
    args = parser.parse_args()
    path = "compiled" if hotpath.COMPILED else "pure Python"
    with tempfile.TemporaryDirectory(prefix="pull-bench-") as tmp:
        store = filled_store(Path(tmp), args.messages, args.size)
        for subscription, sql92 in ((None, False), ("TagA", False), (SQL92, True)):
            best = min(
                pull_cost_us(store, args.batch, subscription, sql92) for _ in range(args.rounds)
            )
            kind = "SQL92" if sql92 else "tag"
            print(
                f"{path:12} {args.messages} x {args.size} B, pulls of {args.batch}, "
                f"{kind:5} subscription {subscription or '*':5}: {best:6.2f} µs per message"
            )


if __name__ == "__main__":
    main()
