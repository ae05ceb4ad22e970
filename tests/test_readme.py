"""The docs hold together and name things that exist.

README.md, ARCHITECTURE.md and docs/*.md link only to files and headings that exist,
every docs page is reachable from the README or ARCHITECTURE.md, the README stays a
first read (under 300 lines), and what the pages tell a user to type names things that
exist: every `python -m` module, every import in their examples, and every directory
and file of ARCHITECTURE.md's layout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import DOC_PAGES, REPO

pytestmark = pytest.mark.untimed

README_MAX_LINES = 300
PAGES = {path: path.read_text() for path in DOC_PAGES}
LINK = re.compile(r"\]\(([^)\s]+)\)")


def outside_code_blocks(text: str) -> str:
    """`text` without its fenced code blocks, where `#` starts a comment, not a heading."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def prose(text: str) -> str:
    """`text` without code blocks and inline code, where `](` is not a link."""
    return re.sub(r"`[^`\n]*`", "", outside_code_blocks(text))


def anchors(text: str) -> set[str]:
    """The `#anchor` of every heading, as GitHub makes them: lower case, punctuation
    dropped, each space a hyphen, `-1`, `-2` ... after a repeated one."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", outside_code_blocks(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def links(page: Path) -> list[tuple[str, Path, str]]:
    """(link as written, the file it names, its anchor or "") for every relative link."""
    found = []
    for target in LINK.findall(prose(PAGES[page])):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check
        path, _, anchor = target.partition("#")
        found.append((target, (page.parent / path).resolve() if path else page, anchor))
    return found


def test_anchors_follow_githubs_rules():
    text = "# A `b` c\n```sh\n# not a heading\n```\n## Where a send's time goes\n## A `b` c\n"
    assert anchors(text) == {"a-b-c", "where-a-sends-time-goes", "a-b-c-1"}


def test_every_relative_link_names_a_file_and_heading_that_exist():
    """A page moved or a heading renamed leaves links that lead nowhere."""
    broken = []
    for page in PAGES:
        for target, path, anchor in links(page):
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}: no such file")
            elif anchor and anchor not in anchors(path.read_text()):
                broken.append(f"{page.relative_to(REPO)}: {target}: no such heading")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme_or_the_architecture():
    entry_points = (REPO / "README.md", REPO / "ARCHITECTURE.md")
    linked = {path for page in entry_points for _, path, _ in links(page)}
    assert [p.name for p in PAGES if p.parent == REPO / "docs" and p not in linked] == []


def test_the_readme_is_a_first_read():
    lines = len(PAGES[REPO / "README.md"].splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move a section to docs/"


def _layout() -> list[str]:
    """The paths ARCHITECTURE.md's layout names: each entry's name under the entries it
    is indented below (two spaces a level; deeper text continues a description)."""
    section = PAGES[REPO / "ARCHITECTURE.md"].split("## The packages", 1)[1]
    tree = section.split("```", 2)[1]
    paths, parents = [], []
    for line in tree.splitlines():
        entry = re.match(r"((?:  ){0,3})([\w.]+/?)\s", line)
        if entry:
            depth = len(entry.group(1)) // 2
            parents = [*parents[:depth], entry.group(2)]
            paths.append("".join(parents))
    return paths


def test_the_layout_names_directories_and_files_that_exist():
    """It put `spark/` under `raftmq/console/`; the data source is `raftmq/client/spark`.
    The top-level packages setup.py maps into `raftmq` are there too."""
    paths = _layout()
    expected = {"dledger/", "broker/", "namesrv/", "raftmq/client/spark/", "dledger/server.py"}
    assert expected <= set(paths)
    assert [p for p in paths if not (REPO / p).exists()] == []


@pytest.mark.processes
def test_every_module_and_import_the_docs_give_exists():
    """The Spark example imported `client.spark`, the client example `client`; neither is
    a package a user has (they are `raftmq.client...`). One Python process, as a user's,
    imports every example's imports and finds every `python -m` module."""
    text = "\n".join(PAGES.values())
    imports = sorted(set(re.findall(r"^(?:from [\w.]+ import .+|import [\w.]+)$", text, re.M)))
    modules = sorted(set(re.findall(r"python -m ([\w.]+)", text)))
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
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
