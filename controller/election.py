"""Choosing a group's new master (`DefaultElectPolicy`).

Candidates are the SyncStateSet's members that are alive; when none is and unclean
election is enabled, every known member that is alive. The old master, if alive and no
one is designated, stays. A designated broker (`mqadmin electMaster`) is chosen if it
is a live candidate, else no one. Otherwise the candidate with the highest epoch, then
the highest maxOffset, then the lowest electionPriority, then the lowest brokerId wins.

RocketMQ's comparator casts the difference of two long offsets to int, so two members
2 GiB or more apart can be ordered the wrong way round; offsets here are compared as
numbers. The last tie-break (lowest id) is what RocketMQ's TreeSet does in practice:
equal members collapse into the first inserted, and a HashSet of small Longs iterates
in ascending order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from raftmq.controller.liveness import BrokerLiveInfo

__all__ = ["elect", "rank"]


def rank(broker_id: int, info: BrokerLiveInfo | None) -> tuple[int, int, int, int]:
    """The sort key: smaller is better."""
    if info is None:  # alive by another controller's word only: knows nothing of it
        return (1, 0, 0, broker_id)
    return (-info.epoch, -info.max_offset, info.election_priority, broker_id)


def _try(
    brokers: Iterable[int],
    old_master: int | None,
    designated: int | None,
    alive: Callable[[int], bool],
    live_info: Callable[[int], BrokerLiveInfo | None],
) -> int | None:
    live = {b for b in brokers if alive(b)}
    if not live:
        return None
    if old_master in live and designated in (None, old_master):
        return old_master
    if designated is not None:
        return designated if designated in live else None
    return min(live, key=lambda b: rank(b, live_info(b)))


def elect(
    sync_state_set: Iterable[int],
    all_replicas: Iterable[int] | None,
    old_master: int | None,
    designated: int | None,
    alive: Callable[[int], bool],
    live_info: Callable[[int], BrokerLiveInfo | None],
) -> int | None:
    """The new master's brokerId, or None; `all_replicas` is None unless unclean
    election is enabled."""
    chosen = _try(sync_state_set, old_master, designated, alive, live_info)
    if chosen is None and all_replicas is not None:
        chosen = _try(all_replicas, old_master, designated, alive, live_info)
    return chosen
