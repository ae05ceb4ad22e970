"""What the tests share: the 3-peer group and a `Replica` of it to feed by hand, and the
hypothesis strategy for the simulator's fault lists."""

import random

from hypothesis import strategies as st

from raftmq.dledger.codes import EntryType
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.core.replica import Replica
from raftmq.dledger.sim.schedule import Fault
from raftmq.dledger.store.memory import MemoryLogStore

GROUP = "g"
PEERS = {"n0": "127.0.0.1:40911", "n1": "127.0.0.1:40912", "n2": "127.0.0.1:40913"}


def make_replica(
    self_id="n0", term=0, vote_for=None, log_terms=(), *, store=None, peers=None, **overrides
) -> Replica:
    """A replica of the group (`PEERS` unless `peers`) on `store` (default: a new memory
    store), after appending one entry per term in `log_terms` to it."""
    config = DLedgerConfig(group=GROUP, self_id=self_id, peers=dict(peers or PEERS), **overrides)
    if store is None:
        store = MemoryLogStore()
    for n, t in enumerate(log_terms):
        store.append_leader(t, [(EntryType.NORMAL, f"e{n}".encode())])
    return Replica(config, store, random.Random(0), term, vote_for)


def fault_lists(kinds, size: int, until_ms: int, max_nodes: int, max_faults: int):
    """Lists of up to `max_faults` faults of `kinds`, each at a whole ms up to `until_ms`
    against 1..`max_nodes` distinct members of a group of `size`."""
    return st.lists(
        st.builds(
            Fault,
            at_ms=st.integers(0, until_ms).map(float),
            kind=st.sampled_from(kinds),
            nodes=st.lists(
                st.integers(0, size - 1), min_size=1, max_size=max_nodes, unique=True
            ).map(tuple),
            keep_unsynced=st.integers(0, 3),
        ),
        max_size=max_faults,
    )
