"""Hypothesis profiles, the tools some tests need from outside Python, and Ctrl-C.

Hypothesis: `ci` (bounded, the default) and `long`; RAFTMQ_HYPOTHESIS_PROFILE selects one.

`@pytest.mark.requires("node", ...)` names the tools a test needs (`tests.helpers.TOOLS`):
where one is missing the test is skipped, and under CI it fails instead.

Ctrl-C: a suite started as a background job (`./run.sh test &` in a script) ignores
SIGINT, as a shell makes every background command do, and an ignored signal stays
ignored across exec: the tools the tests start would ignore the SIGINT of the tests
that press Ctrl-C, and never stop. Restoring Python's handler here gives every child
the default disposition again (a handled signal is reset to the default on exec).
"""

from __future__ import annotations

import os
import signal

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

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before the fixtures start servers for a test that cannot run
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        from tests.helpers import require_tools  # only where a test needs a tool

        require_tools(mark.args)
