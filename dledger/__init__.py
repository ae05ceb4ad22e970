"""A trio implementation of OpenMessaging DLedger: a Raft log with DLedger's election
rules, wire vocabulary and on-disk format, acknowledging only what a quorum has fsynced."""
