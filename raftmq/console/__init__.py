"""`mqconsole`: a web console for a raftmq cluster, RocketMQ Dashboard's everyday pages.

    mqconsole -n 127.0.0.1:9876 [--listen 127.0.0.1:8080] [--prometheus URL]

The cluster at a glance (every DLedger group, its members' role, term, ledger end and
committed index, the master the name servers route to, live through a failover),
topics with their queues and put rates, consumer groups with their lag per queue,
message lookup by key, unique key, msgId or queue offset, the topic and
subscription-group actions of `mqadmin`, and charts of TPS, lag, commit lag and
elections over time (sampled into memory, `history.py` and `sampler.py`, or read from
Prometheus). It talks to the cluster only through the
client library (`raftmq.client.admin`, the mqadmin verbs' functions); the broker and
name server know nothing of it.
"""

from raftmq.console.cli import main

__all__ = ["main"]
