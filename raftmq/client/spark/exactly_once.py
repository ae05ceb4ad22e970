"""The sink's exactly-once mode: what a half message carries, the record of a committed
micro-batch, and the decisions taken from those records (pure, so tested alone).

A micro-batch's rows are sent as transactional half messages, which consumers do not
see. Each carries the query's name, the batch id and the id of the task attempt that
sent it (a fresh one per `write` call: a task Spark runs again sends new halves under
a new id). When Spark commits batch N, the driver first records it durably: one
message in the records topic naming the query, N and the task attempts whose halves
make the batch (the ones whose results Spark handed to `commit`). Only then does it
end the halves. Whoever decides about a half later, the driver ending a re-run batch or
any writer of the producer group answering the broker's check-back, reads the records:

- batch N recorded: COMMIT if the half's task attempt is in the record, else ROLLBACK
  (a failed attempt, or a re-run of a batch a crashed driver had recorded);
- N not recorded but a later batch is: ROLLBACK (Spark commits batches in order, so N
  was never committed: an attempt that failed, or a batch with nothing to record);
- neither: not known yet (UNKNOW): the batch may still be committing, or its query is
  down and will run it again on restart, and the broker asks again.

A message in a topic rather than a consumer offset: the record must name the task
attempts, not only the batch id, and a message is stored through the same replicated
log, read by any client with a pull, and shows what happened (`mqadmin queryMsgByKey`
with the key `<query>:<batch>`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import attrs

from raftmq.client.transaction import LocalTransactionState

__all__ = [
    "PROPERTY_BATCH",
    "PROPERTY_QUERY",
    "PROPERTY_TASK",
    "RECORDS_TOPIC",
    "Record",
    "decide",
    "decide_half",
    "half_properties",
    "record_key",
    "recorded",
]

PROPERTY_QUERY = "SPARK_QUERY"
PROPERTY_BATCH = "SPARK_BATCH"
PROPERTY_TASK = "SPARK_TASK"
RECORDS_TOPIC = "RMQ_SPARK_SINK_BATCHES"  # the default of option recordsTopic

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


def record_key(query: str, batch: int) -> str:
    return f"{query}:{batch}"


@attrs.frozen
class Record:
    """Batch `batch` of `query` committed with the halves of `tasks`."""

    query: str
    batch: int
    tasks: frozenset[str]

    def encode(self) -> bytes:
        doc = {"query": self.query, "batch": self.batch, "tasks": sorted(self.tasks)}
        return json.dumps(doc).encode()

    @classmethod
    def decode(cls, body: bytes) -> Record | None:
        """The record in `body`; None for a message that is not one (the topic is
        shared, a stranger's message must not stop the decisions)."""
        try:
            doc = json.loads(body)
            return cls(str(doc["query"]), int(doc["batch"]), frozenset(map(str, doc["tasks"])))
        except (ValueError, TypeError, KeyError):
            return None


def recorded(records: Iterable[Record], query: str) -> dict[int, frozenset[str]]:
    """Batch id -> its committed task attempts, for `query`; the first record of a
    batch wins (a driver that recorded twice, racing a restart, chose with the first)."""
    found: dict[int, frozenset[str]] = {}
    for record in records:
        if record.query == query:
            found.setdefault(record.batch, record.tasks)
    return found


def decide(batches: Mapping[int, frozenset[str]], batch: int, task: str) -> LocalTransactionState:
    """The fate of a half of `batch` sent by task attempt `task`, given the query's
    recorded batches (see the module's rules)."""
    tasks = batches.get(batch)
    if tasks is not None:
        return COMMIT if task in tasks else ROLLBACK
    if any(later > batch for later in batches):
        return ROLLBACK
    return UNKNOW


def half_properties(query: str, batch: int, task: str) -> dict[str, str]:
    return {PROPERTY_QUERY: query, PROPERTY_BATCH: str(batch), PROPERTY_TASK: task}


def decide_half(
    batches: Mapping[int, frozenset[str]], properties: Mapping[str, str]
) -> LocalTransactionState:
    """The fate of a half from its properties, given its query's recorded batches. A
    half without the sink's properties is not ours to decide: UNKNOW."""
    query = properties.get(PROPERTY_QUERY)
    batch = properties.get(PROPERTY_BATCH, "")
    task = properties.get(PROPERTY_TASK)
    if query is None or task is None or not batch.isdigit():
        return UNKNOW
    return decide(batches, int(batch), task)
