"""Peer transport: msgpack frames over trio TCP, and the client RPC channel."""
