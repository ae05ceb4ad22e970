"""Hypothesis strategies for fault schedules, so a failing real-process run shrinks
to fewer and simpler faults. Needs hypothesis (the `dev` extra); the runner does not
import this module."""

from __future__ import annotations

from hypothesis import strategies as st

from jepsen.nemesis import KINDS, MINORITY_ONLY, ON_REQUEST, QUIET_S, Step, targets_for


@st.composite
def step_specs(draw, nodes: int, kinds: tuple[str, ...]):
    kind = draw(st.sampled_from(kinds))
    _, variants, (low, high) = KINDS[kind]
    variant = draw(st.sampled_from(variants))
    if variant in MINORITY_ONLY:
        target = draw(st.sampled_from(("leader", "one")))
    else:
        target = draw(st.sampled_from(targets_for(kind, nodes)))
    duration = draw(st.integers(int(low * 10), int(high * 10))) / 10
    gap = draw(st.integers(int(QUIET_S[0] * 10), int(QUIET_S[1] * 10))) / 10
    seed = draw(st.integers(0, (1 << 32) - 1))
    return kind, target, variant, duration, gap, seed


@st.composite
def schedules(
    draw,
    nodes: int,
    time_limit_s: float,
    kinds: tuple[str, ...] = tuple(k for k in KINDS if k not in ON_REQUEST),
):
    """Steps laid end to end with quiet gaps; those that would end past the time
    limit are dropped, so shrinking the list shortens the schedule."""
    specs = draw(st.lists(step_specs(nodes, kinds), min_size=1, max_size=6))
    steps = []
    t = QUIET_S[0]
    for kind, target, variant, duration, gap, seed in specs:
        if t + duration > time_limit_s:
            break
        steps.append(Step(round(t, 2), kind, target, variant, duration, seed))
        t += duration + gap
    return tuple(steps)
