"""One loader for the `key=value` configs of the name server, the broker and DLedger.

Each config is a table of `Key`s: the name an operator writes (RocketMQ's or DLedger's),
the attribute it sets and how its text is read. `KeyTable.read` turns the given keys
into attribute values, so every config refuses a mistake the same way — naming where
the key came from (the file, or a command-line flag), the key and the value — and a key
RocketMQ knows but raftmq does not use is accepted with a warning instead of failing a
production config.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping

import attrs

from raftmq.config.properties import parse_properties

__all__ = [
    "Key",
    "KeyTable",
    "boolean",
    "choice",
    "file_path",
    "integer",
    "ip_address",
    "number",
    "read_config_file",
    "text",
]


@attrs.frozen
class Key:
    """A config key: its name in the file, the attribute it sets, and the reader of its
    text (which raises ValueError with the reason, e.g. "not an integer")."""

    name: str
    field: str
    parse: Callable[[str], object]


@attrs.frozen
class KeyTable:
    """The keys of one config. `unused` keys are accepted with a warning; `aliases` maps
    an old spelling to the key it now is."""

    keys: tuple[Key, ...] = attrs.field(converter=tuple)
    unused: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = attrs.Factory(dict)
    _by_name: dict[str, Key] = attrs.field(init=False)

    @_by_name.default
    def _index(self) -> dict[str, Key]:
        by_name = {key.name: key for key in self.keys}
        assert len(by_name) == len(self.keys), "a key appears twice in the table"
        assert not by_name.keys() & self.unused, "a key is both used and unused"
        return by_name

    def field(self, name: str) -> str:
        """The attribute that key `name` sets."""
        return self._by_name[name].field

    def read(self, given: Mapping[str, tuple[str, str]]) -> tuple[dict[str, object], list[str]]:
        """{attribute: value} for `given` ({key: (source, text)}), and warnings for the
        unused keys among them. Texts are trimmed first, as RocketMQ trims them.

        Raises ValueError "<source>: <key>=<text>: <reason>"; the reason for an unknown key
        suggests the nearest known one.
        """
        values: dict[str, object] = {}
        warnings: list[str] = []
        for given_name, (source, raw) in given.items():
            name = self.aliases.get(given_name, given_name)
            value = raw.strip()
            try:
                if name in self._by_name:
                    key = self._by_name[name]
                    values[key.field] = key.parse(value)
                elif name in self.unused:
                    warnings.append(f"{source}: {given_name}: accepted, not used by raftmq")
                else:
                    raise ValueError(f"unknown key{self._nearest(given_name)}")
            except ValueError as exc:
                raise ValueError(f"{source}: {given_name}={value!r}: {exc}") from None
        return values, warnings

    def read_text(
        self, values: Mapping[str, str], source: str
    ) -> tuple[dict[str, object], list[str]]:
        """`read` for keys that all come from one source."""
        return self.read({name: (source, raw) for name, raw in values.items()})

    def updated(self, config, changes: Mapping[str, str], source: str, runtime: frozenset[str],
                conf_file: str):  # fmt: skip
        """`config` (an attrs instance) with `changes` ({key: text}) applied, for a
        process that changes some keys while it runs; ValueError naming the key when it
        is unknown, its value does not parse, or it is not among `runtime`."""
        fields, _warnings = self.read_text(changes, source)
        for name in changes:
            if name not in runtime:
                raise ValueError(
                    f"{source}: {name}: cannot change at run time (set it in {conf_file} and "
                    f"restart); these can: {', '.join(sorted(runtime))}"
                )
        return attrs.evolve(config, **fields)

    def _nearest(self, name: str) -> str:
        by_lower = {known.lower(): known for known in (*self._by_name, *self.unused, *self.aliases)}
        close = difflib.get_close_matches(name.lower(), by_lower, n=1, cutoff=0.6)
        return f" (did you mean {by_lower[close[0]]}?)" if close else ""


def read_config_file(config_path: str) -> dict[str, str]:
    """The keys of a properties file; ValueError naming the file if it cannot be read."""
    try:
        with open(config_path, encoding="utf-8") as f:
            content = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read config {config_path}: {exc.strerror or exc}") from None
    return parse_properties(content, config_path)


# Readers of a key's text, for the tables.


def text(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


def file_path(value: str) -> str:
    """A file system path; `~` is expanded."""
    return os.path.expanduser(text(value))


def boolean(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError("expected true or false")
    return lowered == "true"


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """A reader of whole numbers in `low..high` (either end may be open)."""

    def convert(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError("not an integer") from None
        if low is not None and high is not None and not low <= number <= high:
            raise ValueError(f"out of range {low}..{high}")
        if low is not None and number < low:
            raise ValueError(f"must be at least {low}")
        if high is not None and number > high:
            raise ValueError(f"must be at most {high}")
        return number

    return convert


def number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError("not a number") from None


def choice(options: Iterable[str]) -> Callable[[str], str]:
    """A reader that accepts one of `options`, spelled exactly."""
    allowed = tuple(options)

    def convert(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value

    return convert


def ip_address(value: str) -> str:
    """An IP address (v4 or v6), not a host name."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError("expected an IP address, like 0.0.0.0 or 127.0.0.2") from None
