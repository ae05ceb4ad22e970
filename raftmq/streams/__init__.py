"""Byte-stream plumbing shared by `dledger.net` and `remoting`, which must not import
each other: a batching writer and a timeout reaper for pipelined calls; and, for the
servers' command lines, reading a trio exception group (`groups`).

Nothing here knows a frame format; each protocol keeps its own framing.
"""
