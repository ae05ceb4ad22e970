"""Java `.properties` text, read as `java.util.Properties.load` reads it.

RocketMQ reads `broker.conf` and `namesrv.conf` with `Properties.load`, and DLedger
writes its `currterm` and `checkpoint` files with `Properties.store`, so one reader
serves all of them and an operator's file means here what it means to the Java
servers:

- a line whose first non-blank character is `#` or `!` is a comment; blank lines are skipped;
- the key ends at the first unescaped `=`, `:` or blank; blanks around the separator are
  skipped, so `key=value`, `key: value` and `key value` are the same; a key alone has
  the empty value;
- a line ending in an odd number of backslashes continues on the next line, whose
  leading blanks are dropped;
- `\\t`, `\\n`, `\\r`, `\\f` and `\\uXXXX` are escapes, and a backslash before any other
  character stands for that character (`\\=`, `\\:`, `\\#`, `\\ `).

One departure: lines from one starting `<!--` to one ending `-->` are skipped. RocketMQ
5 ships `namesrv-n*.conf` (controller samples) with its licence in such an XML comment,
which Java reads as a dozen junk keys (`Licensed`, `http`, ...) that its config loader
ignores; our loaders refuse unknown keys, so the comment is dropped here instead.

Trailing blanks belong to the value, as in Java; the config loaders trim values as
RocketMQ's `MixAll.properties2Object` does.
"""

from __future__ import annotations

import re

__all__ = ["format_properties", "parse_properties"]

_BLANKS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
# What Properties.store escapes with a backslash; values we write never hold line breaks.
_STORE_ESCAPES = {"\\": "\\\\", ":": "\\:", "=": "\\=", "#": "\\#", "!": "\\!"}
_NATURAL_LINE = re.compile(r"\r\n|\r|\n")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(number of the first natural line, logical line) for every line that is not blank
    or a comment, continuation lines joined."""
    lines: list[tuple[int, str]] = []
    pending: str | None = None  # a logical line continued on the next natural line
    start = 0
    in_xml_comment = False
    for lineno, natural in enumerate(_NATURAL_LINE.split(text), 1):
        if pending is None:
            line = natural.lstrip(_BLANKS)
            if in_xml_comment or line.startswith("<!--"):
                in_xml_comment = not line.rstrip().endswith("-->")
                continue
            if not line or line[0] in "#!":
                continue
            start = lineno
        else:
            line = pending + natural.lstrip(_BLANKS)
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = line[:-1]
        else:
            pending = None
            lines.append((start, line))
    if pending is not None:  # Java keeps a continuation that runs into the end of the text
        lines.append((start, pending))
    return lines


def _unescape(text: str, where: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        i += 1
        if c != "\\" or i == len(text):
            out.append(c)
            continue
        c = text[i]
        i += 1
        if c == "u":
            digits = text[i : i + 4]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"{where}: malformed \\uxxxx escape {text[i - 2 : i + 4]!r}")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_ESCAPES.get(c, c))
    return "".join(out)


def _split_key(line: str) -> tuple[str, str]:
    """A logical line's raw (still escaped) key and value, split as Properties.load splits:
    the key ends at an unescaped `=`, `:` or blank; then blanks, and one `=` or `:` if
    the key did not end at one, are skipped."""
    key_end = value_start = len(line)
    separated = escaped = False
    for i, c in enumerate(line):
        if not escaped and (c in "=:" or c in _BLANKS):
            key_end, value_start, separated = i, i + 1, c in "=:"
            break
        escaped = c == "\\" and not escaped
    while value_start < len(line):
        c = line[value_start]
        if c not in _BLANKS:
            if separated or c not in "=:":
                break
            separated = True
        value_start += 1
    return line[:key_end], line[value_start:]


def parse_properties(text: str, source: str = "<properties>") -> dict[str, str]:
    """Every key and value of a properties text (later lines win, as in Java).

    Only a malformed `\\uXXXX` escape is an error (Java's IllegalArgumentException);
    it names `source` and the line.
    """
    pairs: dict[str, str] = {}
    for lineno, line in _logical_lines(text):
        key, value = _split_key(line)
        where = f"{source}:{lineno}"
        pairs[_unescape(key, where)] = _unescape(value, where)
    return pairs


def format_properties(pairs: dict[str, str]) -> str:
    """`key=value` lines that `parse_properties` (and Java) read back to `pairs`.

    Values are escaped as Properties.store escapes them (a leading blank too, which the
    reader would skip); keys are our own names and need no escapes."""
    lines = []
    for key, value in pairs.items():
        if any(c in value for c in "\r\n"):
            raise ValueError(f"a property value cannot hold a line break: {value!r}")
        escaped = "".join(_STORE_ESCAPES.get(c, c) for c in value)
        if escaped[:1] in (" ", "\t", "\f"):
            escaped = "\\" + escaped
        lines.append(f"{key}={escaped}\n")
    return "".join(lines)
