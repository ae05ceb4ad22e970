"""What the README tells a user to type names things that exist: every `python -m`
module, every import in its examples, and every directory of its layout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _layout_dirs() -> list[str]:
    """The directories the Layout section's tree names, nested ones under their parent."""
    section = README.split("## Layout", 1)[1]
    tree = section.split("```", 2)[1]
    dirs, parent = [], ""
    for line in tree.splitlines():
        top = re.match(r"([\w/]+/)\s", line)
        nested = re.match(r"  (\w+/)\s", line)
        if top:
            parent = top.group(1)
            dirs.append(parent)
        elif nested:
            dirs.append(parent + nested.group(1))
    return dirs


def test_the_layout_names_directories_that_exist():
    """It put `spark/` under `raftmq/console/`; the data source is `raftmq/client/spark`."""
    dirs = _layout_dirs()
    assert "raftmq/client/spark/" in dirs
    assert [d for d in dirs if not (ROOT / d).is_dir()] == []


@pytest.mark.processes
def test_every_module_and_import_the_readme_gives_exists():
    """The Spark example imported `client.spark`, the client example `client`; neither is
    a package a user has (they are `raftmq.client...`). One Python process, as a user's,
    imports every example's imports and finds every `python -m` module."""
    imports = sorted(set(re.findall(r"^(?:from [\w.]+ import .+|import [\w.]+)$", README, re.M)))
    modules = sorted(set(re.findall(r"python -m ([\w.]+)", README)))
    assert imports and modules
    program = "\n".join(
        [
            "import importlib.util",
            *imports,
            f"missing = [m for m in {modules!r} if importlib.util.find_spec(m) is None]",
            "assert not missing, missing",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
