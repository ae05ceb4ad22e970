"""raftmq: a RocketMQ-compatible message broker whose CommitLog is a DLedger (Raft) log.

One import package holds the whole distribution so that installing it adds no
generic top-level name (``broker``, ``client``, ``config``) to site-packages; the
repository keeps ``dledger/``, ``broker/`` and ``namesrv/`` at its top and setup.py
installs them as ``raftmq.dledger``, ``raftmq.broker`` and ``raftmq.namesrv``.
Dependencies point one way; ``tests/test_import_contract.py`` keeps them so:

    config, transport,       imported by all, importing none above them: the text of
    process                  configs, byte streams and TLS, what server processes share
    disk                     durable writes and the file layer under both CommitLogs
    remoting                 the RocketMQ wire protocol
    protocol                 what client and broker both speak: message codec, msgId, headers
    dledger                  the replicated log; knows nothing of messages
    namesrv                  the route registry
    broker                   the message store and request processors
    client                   producer, consumers, admin, the Spark source
    tools                    local clusters, drills, demos (nothing in the package imports them)
"""
