"""Fault injection against real raftmq broker groups: record a history, inject faults, check it."""
