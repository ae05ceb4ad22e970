"""`free_ports`: the ports the local harnesses give the processes they start."""

from __future__ import annotations

import collections

import pytest

from raftmq.tools import dledger_local
from raftmq.tools.dledger_local import LOCAL_PORTS_ENV, free_ports


def test_a_port_handed_out_and_not_yet_bound_is_not_handed_out_again(monkeypatch):
    """A controller group picks its controllers' ports after its brokers', before any
    of them listens: the second pick must not repeat the first (a broker then failed
    to start, "address already in use"). Here every port of a range of four is free
    to bind, as an unbound pick still is."""
    monkeypatch.setenv(LOCAL_PORTS_ENV, "20000-20003")
    monkeypatch.setattr(dledger_local, "_ephemeral_range", lambda: range(0))
    monkeypatch.setattr(dledger_local, "_bindable", lambda host, port: True)
    monkeypatch.setattr(dledger_local, "_RECENT_PORTS", collections.deque(maxlen=2048))
    first = free_ports(2)
    second = free_ports(2)
    assert sorted(first + second) == [20000, 20001, 20002, 20003]
    with pytest.raises(OSError, match="no 1 free ports"):
        free_ports(1)
