"""RocketMQ 5's controller (RIP-44): per broker group, who the members are, which is
master, and the SyncStateSet it may be replaced from; replicated by a DLedger group.

Installed as `raftmq.controller` (setup.py maps the directory). `replicas` is the state
machine, sans-IO; `events` its log entries; `election` the choice of a new master;
`liveness` the brokers' heartbeats; `server` runs all of it on a `DLedgerServer` behind
RocketMQ's remoting requests; `cli` is `mqcontroller`.
"""
