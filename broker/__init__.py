"""The RocketMQ-compatible broker: message store (CommitLog codec, DLedger CommitLog,
ConsumeQueue, offsets), request processors and role change."""
