"""What every raftmq package may import, itself importing none of them.

Byte-stream plumbing shared by `dledger.net` and `remoting`, which must not import
each other: a batching writer and a timeout reaper for pipelined calls; and, for the
servers' command lines, reading a trio exception group (`groups`).

The text of configuration, read in one place for the name server, the broker, DLedger
and the clients: Java properties (`properties`), host:port addresses and DLedger's
peers string (`address`), and the table-driven loader of config keys (`config_keys`).

Nothing here knows a frame format; each protocol keeps its own framing.
"""
