"""Byte-stream plumbing shared by `dledger.net` and `remoting`, which must not import
each other: a batching writer and a timeout reaper for pipelined calls.

Nothing here knows a frame format; each protocol keeps its own framing.
"""
