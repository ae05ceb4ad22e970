"""Hypothesis profiles, and the tools some tests need from outside Python.

Hypothesis: `ci` (bounded, the default) and `long`; RAFTMQ_HYPOTHESIS_PROFILE selects one.

`@pytest.mark.requires("node", ...)` names the tools a test needs (`tests.helpers.TOOLS`):
where one is missing the test is skipped, and under CI it fails instead.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

for name, max_examples in (("ci", 25), ("long", 2000)):
    settings.register_profile(
        name,
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
        print_blob=True,
    )
settings.load_profile(os.environ.get("RAFTMQ_HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)  # before the fixtures start servers for a test that cannot run
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        from tests.helpers import require_tools  # only where a test needs a tool

        require_tools(mark.args)
