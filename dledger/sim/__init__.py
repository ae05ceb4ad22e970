"""Deterministic simulation of DLedger groups: the real core under simulated time and faults."""
