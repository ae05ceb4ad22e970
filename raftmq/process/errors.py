"""Exception groups as a command reports them."""

from __future__ import annotations


def first_leaf(group: BaseException) -> BaseException:
    """The first exception inside `group`: trio's nested nurseries nest the groups, and a
    command line tool says what went wrong in one line, not as a tree."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group
