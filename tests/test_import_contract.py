"""Dependencies point one way (ARCHITECTURE.md's arrows): every import in raftmq/, jepsen/, bench/
and pyspark_rocketmq/ is checked against the arrows below, read from the source with
`ast`, so an import inside a function or under TYPE_CHECKING counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = ("raftmq", "pyspark_rocketmq", "jepsen", "bench")
_RAFTMQ = frozenset(
    f"raftmq.{name}"
    for name in (
        "config",
        "process",
        "transport",
        "hotpath",
        "remoting",
        "protocol",
        "dledger",
        "namesrv",
        "broker",
        "client",
    )
)

BASE = ("raftmq.config", "raftmq.process", "raftmq.transport")  # below everything of ours

# unit -> the other units of ours it may import; a unit may always import itself.
# raftmq.console (mqconsole) sits on the client like an application: nothing imports it.
# raftmq.hotpath (the compiled inner loops) imports nothing of ours; the data path's
# layers import it for the compiled twins of their own functions.
ALLOWED: dict[str, frozenset[str]] = {
    "raftmq": frozenset(),
    "raftmq.config": frozenset(),
    "raftmq.process": frozenset({"raftmq.config"}),
    "raftmq.transport": frozenset({"raftmq.config", "raftmq.process"}),
    "raftmq.hotpath": frozenset(),
    "raftmq.remoting": frozenset({*BASE, "raftmq.hotpath"}),
    "raftmq.protocol": frozenset({*BASE, "raftmq.hotpath"}),
    "raftmq.dledger": frozenset({*BASE, "raftmq.hotpath"}),
    "raftmq.namesrv": frozenset({"raftmq.remoting", *BASE}),
    "raftmq.broker": frozenset(
        {"raftmq.dledger", "raftmq.protocol", "raftmq.remoting", *BASE, "raftmq.hotpath"}
    ),
    "raftmq.client": frozenset({"raftmq.protocol", "raftmq.remoting", *BASE}),
    "raftmq.console": frozenset({"raftmq.client", "raftmq.protocol", "raftmq.remoting", *BASE}),
    "raftmq.tools": _RAFTMQ | {"raftmq"},
    "pyspark_rocketmq": frozenset({"raftmq.client"}),
    "jepsen": _RAFTMQ | {"raftmq", "raftmq.tools", "bench"},
    "bench": _RAFTMQ | {"raftmq", "raftmq.tools", "jepsen"},
}


def unit(module: str) -> str | None:
    """The unit of the contract a dotted module name belongs to; None if not ours."""
    parts = module.split(".")
    if parts[0] not in TOP_LEVEL:
        return None
    if parts[0] == "raftmq" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in `source`, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Every import of `module` (given its source) that the contract does not allow."""
    importer = unit(module)
    assert importer in ALLOWED, f"{module} belongs to no unit of the contract"
    wrong = []
    for line, name in imported_modules(module, source, is_package):
        target = unit(name)
        if target is None or target == importer or target in ALLOWED[importer]:
            continue
        wrong.append(f"{module}:{line} imports {name} ({importer} -> {target} is not allowed)")
    return wrong


MAPPED = ("dledger", "broker", "namesrv")  # top-level directories installed under raftmq (setup.py)


def our_modules() -> list[tuple[str, Path]]:
    modules = []
    for top in (*TOP_LEVEL, *MAPPED):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if top in MAPPED:
                parts = ("raftmq", *parts)
            modules.append((".".join(parts), path))
    return modules


def test_every_import_follows_the_contract():
    modules = our_modules()
    assert len(modules) > 100, "the walk found our packages"
    wrong = []
    for dotted, path in modules:
        is_package = path.name == "__init__.py"
        name = dotted.removesuffix(".__init__")
        wrong += violations(name, path.read_text(encoding="utf-8"), is_package)
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize(
    ("module", "source", "is_package"),
    [
        ("raftmq.client.admin", "from raftmq.dledger.config import parse_peers\n", False),
        ("raftmq.broker.config", "import raftmq.namesrv.config\n", False),
        ("raftmq.dledger.store.file", "from ...remoting import codes\n", False),
        ("raftmq.broker", "from .. import tools\n", True),
        ("raftmq.config.address", "def f():\n    from raftmq.protocol import message\n", False),
        ("raftmq.tools.broker_local", "from jepsen import runner\n", False),
        ("pyspark_rocketmq", "from raftmq.broker import config\n", True),
        ("raftmq.console.views", "from raftmq.broker.store import metadata\n", False),
        ("raftmq.client.admin", "from raftmq.console import views\n", False),
    ],
)
def test_the_checker_catches_a_wrong_arrow(module, source, is_package):
    assert len(violations(module, source, is_package)) == 1


def test_the_checker_lets_allowed_arrows_through():
    source = (
        "import os, trio\n"
        "from . import headers\n"
        "from ..dledger.server import DLedgerServer\n"
        "from raftmq.protocol import message\n"
        "from raftmq.config.address import parse_address\n"
    )
    assert violations("raftmq.broker.send", source) == []
    assert violations("jepsen.runner", "from raftmq.tools import broker_local\n") == []
