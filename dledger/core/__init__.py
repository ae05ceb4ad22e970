"""The sans-IO replica: election, replication and commit as a deterministic state machine."""
