"""The disk under both CommitLogs: durable writes and what a failure of each means
(`durable`), the file layer a store asks of the operating system, with its atomic small
files (`filesystem`), and preallocated, mapped segment files named by their start offset
(`segments`). The DLedger log (raftmq.dledger.store), the classic CommitLog and the
message store's ConsumeQueues, index and checkpoints (raftmq.broker.store) stand on it;
it imports nothing of theirs."""
