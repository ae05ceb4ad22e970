"""A test that needs a tool from outside Python is skipped where the tool is missing, and
fails under CI, which installs every tool: there a skip would hide a defect."""

import pytest

from tests import helpers


@pytest.fixture
def absent_tool(monkeypatch):
    monkeypatch.setitem(helpers.TOOLS, "absent", (lambda: False, "absent is not installed"))
    return "absent"


def test_a_missing_tool_skips_the_test_locally(monkeypatch, absent_tool):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^absent is not installed$"):
        helpers.require_tools([absent_tool])
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        helpers.require_tools([absent_tool])


def test_a_missing_tool_fails_the_test_under_ci(monkeypatch, absent_tool):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"^CI: absent is not installed$"):
        helpers.require_tools([absent_tool])


def test_an_installed_tool_lets_the_test_run(monkeypatch):
    monkeypatch.setitem(helpers.TOOLS, "present", (lambda: True, "never said"))
    monkeypatch.setenv("CI", "true")
    helpers.require_tools(["present"])


def test_every_tool_named_by_a_test_is_known():
    with pytest.raises(AssertionError, match="unknown tool 'nodejs'"):
        helpers.require_tools(["nodejs"])
