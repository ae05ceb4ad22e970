"""Hypothesis profiles, the tools some tests need from outside Python, Ctrl-C, and a
header with what the machine had free when the run began (a full disk or a loaded machine
shows up as timeouts far from its cause).

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
import shutil
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from raftmq.tools.dledger_local import LOCAL_PORTS_ENV

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

# Tests run two at a time (pytest-xdist) pick ports for their servers from ranges of
# their own (raftmq.tools.dledger_local.LOCAL_PORTS_ENV); a collision between two
# workers once stopped a broker with "Address already in use".
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and LOCAL_PORTS_ENV not in os.environ:
    _count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _width = (32768 - 10000) // _count
    _low = 10000 + int(_worker[2:]) * _width
    os.environ[LOCAL_PORTS_ENV] = f"{_low}-{_low + _width - 1}"

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before the fixtures start servers for a test that cannot run
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        from tests.helpers import require_tools  # only where a test needs a tool

        require_tools(mark.args)


_AT_START = pytest.StashKey[str]()


def _machine() -> str:
    free_gib = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{free_gib:.1f} GiB free under {tempfile.gettempdir()}, load average {load}"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_AT_START] = _machine()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    terminalreporter.write_line(f"machine at the start: {config.stash[_AT_START]}")
    terminalreporter.write_line(f"machine at the end:   {_machine()}")
