"""Dependencies point one way (ARCHITECTURE.md's arrows), per subpackage: every import in raftmq/,
dledger/, broker/, namesrv/, jepsen/, bench/ and pyspark_rocketmq/ is checked against the
arrows of `ALLOWED`, read from the source with `ast`, so an import inside a function or
under TYPE_CHECKING counts too; and the table itself has no cycle, so no two units can
ever lean on each other.

The units: every subpackage is one (`raftmq.dledger.core`, `raftmq.broker.store`,
`raftmq.client.spark`, ...), and a package without subpackages is one (`raftmq.remoting`).
The loose modules at the top of a package that has subpackages:

- dledger's are each a unit of their own, since they sit at different heights: `codes`
  and `config` are the vocabulary below `core` and `store`; `tuning` stands alone;
  `metrics` reads a member's state (core, store) at a scrape; `server` is the driver
  above core, store, net and metrics; `client` speaks to a group over `net`; and `cli`,
  the process, is above them all. `core` imports nothing of `server`, `net` or `sim`,
  and of `store` only its interface (`INTERFACES`).
- broker's (the controller, the request processors, its config, role and managers) are
  one unit, above `raftmq.broker.store` and `raftmq.broker.acl`; the ACL package is the
  document and its check, below the broker's modules (the broker-side service that needs
  the broker's config, role and metadata writer is `raftmq.broker.access_control`).
- client's (producer, consumers, admin, routes) are one unit, below `mqadmin` and `spark`.

The module a name is imported from counts: `from raftmq.dledger import server` is an
import of `raftmq.dledger.server`.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = ("raftmq", "pyspark_rocketmq", "jepsen", "bench")

BASE = frozenset({"raftmq.config", "raftmq.process", "raftmq.transport"})  # below all else
DLEDGER_VOCABULARY = frozenset({"raftmq.dledger.codes", "raftmq.dledger.config"})
# What a broker may use of dledger: the log as a library (a server, its store, codes,
# config, metrics, tuning), not its core, peer network, simulator, client or process.
DLEDGER_LIBRARY = DLEDGER_VOCABULARY | {
    "raftmq.dledger.metrics",
    "raftmq.dledger.server",
    "raftmq.dledger.store",
    "raftmq.dledger.tuning",
}
WIRE = frozenset({"raftmq.protocol", "raftmq.remoting"})

# unit -> the other units it may import; a unit may always import itself.
# raftmq.console (mqconsole) sits on the client like an application: nothing imports it.
# raftmq.hotpath (the compiled inner loops) imports nothing of ours; the data path's
# layers import it for the compiled twins of their own functions. raftmq.disk (durable
# writes, the file layer, segment files, the fsync thread) is below both CommitLogs.
ALLOWED: dict[str, frozenset[str]] = {
    "raftmq": frozenset(),
    "raftmq.config": frozenset(),
    "raftmq.process": frozenset({"raftmq.config"}),
    "raftmq.transport": frozenset({"raftmq.config", "raftmq.process"}),
    "raftmq.hotpath": frozenset(),
    "raftmq.disk": frozenset({"raftmq.hotpath"}),
    "raftmq.remoting": BASE | {"raftmq.hotpath"},
    "raftmq.protocol": BASE | {"raftmq.hotpath"},
    "raftmq.dledger": frozenset(),
    # the leader plan, pure: a broker's automatic balancing and mqadmin's verb share it
    "raftmq.placement": frozenset(),
    "raftmq.dledger.codes": frozenset(),
    "raftmq.dledger.config": BASE,
    "raftmq.dledger.tuning": frozenset(),
    "raftmq.dledger.store": BASE | {"raftmq.dledger.codes", "raftmq.disk", "raftmq.hotpath"},
    "raftmq.dledger.core": DLEDGER_VOCABULARY
    | {"raftmq.config", "raftmq.dledger.store", "raftmq.disk"},
    "raftmq.dledger.net": BASE | {"raftmq.dledger.codes", "raftmq.dledger.core"},
    "raftmq.dledger.metrics": DLEDGER_VOCABULARY | {"raftmq.dledger.core", "raftmq.dledger.store"},
    "raftmq.dledger.sim": DLEDGER_VOCABULARY
    | {"raftmq.dledger.core", "raftmq.dledger.store", "raftmq.disk"},
    "raftmq.dledger.server": BASE
    | DLEDGER_VOCABULARY
    | {
        "raftmq.dledger.core",
        "raftmq.dledger.store",
        "raftmq.dledger.net",
        "raftmq.dledger.metrics",
        "raftmq.disk",
        "raftmq.hotpath",
    },
    "raftmq.dledger.client": BASE | {"raftmq.dledger.codes", "raftmq.dledger.net"},
    "raftmq.dledger.cli": BASE | DLEDGER_LIBRARY | {"raftmq.dledger.client", "raftmq.disk"},
    # the controller (RIP-44) is a second state machine on a DLedger server
    "raftmq.controller": BASE | WIRE | DLEDGER_LIBRARY,
    # `enableControllerInNamesrv=true` runs a controller in the name server's process
    "raftmq.namesrv": BASE | {"raftmq.remoting", "raftmq.controller"},
    "raftmq.broker.store": BASE
    | WIRE
    | {
        "raftmq.dledger.codes",
        "raftmq.dledger.server",  # the DLedger CommitLog is a DLedgerServer's client
        "raftmq.dledger.store",
        "raftmq.disk",
        "raftmq.hotpath",
    },
    "raftmq.broker.acl": {"raftmq.broker.store", "raftmq.remoting"},
    "raftmq.broker": BASE
    | WIRE
    | DLEDGER_LIBRARY
    | {"raftmq.broker.store", "raftmq.broker.acl", "raftmq.disk", "raftmq.hotpath"}
    | {"raftmq.placement"}
    # `mqbroker --enable-proxy` (local mode) hosts the proxy in the broker's process
    | {"raftmq.proxy"},
    "raftmq.client": BASE | WIRE,
    "raftmq.client.mqadmin": BASE | WIRE | {"raftmq.client", "raftmq.placement"},
    "raftmq.client.spark": BASE | WIRE | {"raftmq.client"},
    "raftmq.console": BASE | WIRE | {"raftmq.client", "raftmq.client.mqadmin"},
    # mqproxy reaches the brokers as a client does, and checks gRPC signatures against
    # the brokers' ACL accounts with their own code.
    "raftmq.proxy": BASE | WIRE | {"raftmq.client", "raftmq.broker.acl"},
    "pyspark_rocketmq": frozenset({"raftmq.client.spark"}),
}
ALLOWED = {name: frozenset(arrows) for name, arrows in ALLOWED.items()}
# Above the package: the tools use any of it but the console; jepsen uses the tools too;
# bench may use jepsen's clusters and faults, jepsen nothing of bench.
_LIBRARY = frozenset(ALLOWED) - {"raftmq.console", "pyspark_rocketmq"}
ALLOWED["raftmq.tools"] = _LIBRARY
ALLOWED["jepsen"] = _LIBRARY | {"raftmq.tools"}
ALLOWED["bench"] = _LIBRARY | {"raftmq.tools", "jepsen"}

# importer -> (unit, the only modules of it the importer may import): the core sees the
# store through its interface (the LogStore protocol and the entry codec) alone.
INTERFACES: dict[str, tuple[str, tuple[str, ...]]] = {
    "raftmq.dledger.core": (
        "raftmq.dledger.store",
        ("raftmq.dledger.store.base", "raftmq.dledger.store.entry"),
    ),
}


def unit(module: str) -> str | None:
    """The unit of the contract a dotted module name belongs to (the longest unit it is
    in); None if not ours."""
    parts = module.split(".")
    if parts[0] not in TOP_LEVEL:
        return None
    for length in range(len(parts), 0, -1):
        name = ".".join(parts[:length])
        if name in ALLOWED:
            return name
    return None


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute dotted name) for every import in `source`, relative ones resolved;
    `from m import x` gives `m.x`, which may be a module or a name in `m`."""
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
            found += [
                (node.lineno, name if alias.name == "*" else f"{name}.{alias.name}")
                for alias in node.names
            ]
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Every import of `module` (given its source) that the contract does not allow."""
    importer = unit(module)
    assert importer in ALLOWED, f"{module} belongs to no unit of the contract"
    wrong = []
    for line, name in imported_modules(module, source, is_package):
        target = unit(name)
        if target is None or target == importer:
            continue
        if target not in ALLOWED[importer]:
            wrong.append(f"{module}:{line} imports {name} ({importer} -> {target} is not allowed)")
            continue
        through, interface = INTERFACES.get(importer, (None, ()))
        if target == through and not any(name == i or name.startswith(f"{i}.") for i in interface):
            wrong.append(
                f"{module}:{line} imports {name} (of {target}, {importer} may import"
                f" only {', '.join(interface)})"
            )
    return wrong


MAPPED = ("dledger", "broker", "namesrv", "controller")  # top-level, under raftmq (setup.py)


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
        ("raftmq.dledger.core.replica", "from raftmq.dledger import server\n", False),
        ("raftmq.dledger.core.replica", "from raftmq.dledger.net.codec import RpcCode\n", False),
        ("raftmq.dledger.core.follower", "from ..store.file import FileLogStore\n", False),
        (
            "raftmq.dledger.metrics",
            "if TYPE_CHECKING:\n    from raftmq.dledger.server import DLedgerServer\n",
            False,
        ),
        ("raftmq.dledger.store.file", "from raftmq.dledger.core import replica\n", False),
        ("raftmq.disk.filesystem", "from raftmq.dledger.store.base import LogStore\n", False),
        ("raftmq.broker.acl.plain", "from raftmq.broker.config import BrokerConfig\n", False),
        ("raftmq.broker.controller", "from raftmq.dledger.core.replica import Replica\n", False),
        ("raftmq.broker.store.messagestore", "from raftmq.broker import role\n", False),
        ("raftmq.client", "from raftmq.client.spark import source\n", True),
        ("jepsen.runner", "from bench import cpu\n", False),
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
    assert violations("raftmq.dledger.core.follower", "from ..store import entry\n") == []
    assert violations("bench.broker_bench", "from jepsen import cluster\n") == []


def test_the_table_has_no_cycle():
    """Arrows that are each allowed must not close a loop: then two units could lean on
    each other through others, and neither could be understood or tested alone."""
    order = list(graphlib.TopologicalSorter(ALLOWED).static_order())
    assert set(order) == set(ALLOWED), "every arrow points at a unit of the table"


def test_every_unit_of_the_table_exists():
    """A unit misspelt or gone would leave its modules to a coarser unit unnoticed."""
    found = {unit(dotted.removesuffix(".__init__")) for dotted, _ in our_modules()}
    assert set(ALLOWED) - found == set()
