"""The master's writer of replicated metadata (see broker.store.metadata).

`MetaWriter.write` appends one META_TOPIC record and returns once every replica
could apply it (committed) and this node has (dispatched). The managers of topics,
subscription groups and consumer offsets and the delayed-delivery service write
through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftmq.broker.store.metadata import META_TOPIC, encode_record

from raftmq.protocol import message as codec
from raftmq.protocol.message import MessageExt

if TYPE_CHECKING:
    from raftmq.broker.address import BrokerAddress
    from raftmq.broker.store.messagestore import MessageStore


def meta_message(op: str, now_ms: int, host: tuple[str, int], **fields) -> bytes:
    """The CommitLog record of one metadata change, written by the master at `host`."""
    msg = MessageExt(
        topic=META_TOPIC,
        body=encode_record(op, **fields),
        store_timestamp=now_ms,
        born_timestamp=now_ms,
        born_host=host,
        store_host=host,
    )
    return codec.encode(msg)


class MetaWriter:
    def __init__(self, store: MessageStore, address: BrokerAddress) -> None:
        self.store = store
        self.address = address

    async def write(self, op: str, **fields) -> None:
        """Append a metadata record; raises dledger's DLedgerError when not committed."""
        store = self.store
        record = meta_message(op, store.now_ms(), self.address.store_host, **fields)
        [(_phys, meta_offset)] = await store.commitlog.put([record])
        await store.wait_applied(meta_offset)
