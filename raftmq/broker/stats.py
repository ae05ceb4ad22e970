"""The broker's message counters, as GET_BROKER_RUNTIME_INFO reports them
(msgPutTotalTodayNow, msgGetTotalTodayNow; since start, not since midnight)."""

from __future__ import annotations

import attrs


@attrs.define
class BrokerStats:
    put_messages: int = 0  # messages stored by sends
    got_messages: int = 0  # messages returned by pulls
