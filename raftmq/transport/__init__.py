"""Byte streams shared by the remoting protocol and the DLedger peer protocol, which must not
import each other: the batching writer, deadlines for pipelined calls, idle and capped
connections, TLS. Nothing here knows a frame's header; each protocol keeps its own."""
