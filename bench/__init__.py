"""Benchmarks for raftmq and the peers it is compared with."""
