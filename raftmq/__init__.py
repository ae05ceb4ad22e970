"""raftmq: a RocketMQ-compatible message broker whose CommitLog is a DLedger (Raft) log.

One import package holds the whole distribution so that installing it adds no
generic top-level name (``broker``, ``client``, ``streams``) to site-packages.
Dependencies point one way; ``tests/test_import_contract.py`` keeps them so:

    streams                  imported by all, importing none: byte-stream plumbing and the
                             text of configs (Java properties, host:port, the config keys)
    remoting                 the RocketMQ wire protocol (imports streams)
    protocol                 what client and broker both speak: message codec, msgId, headers
    dledger                  the replicated log; knows nothing of messages
    namesrv                  the route registry
    broker                   the message store and request processors
    client                   producer, consumers, admin, the Spark source
    tools                    local clusters, drills, demos (nothing in the package imports them)
"""
