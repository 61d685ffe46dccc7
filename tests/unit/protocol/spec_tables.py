"""The field tables of docs/protocol.md, read as data: what the doc test and the conformance test check against.

Imports nothing of the project on purpose: test_conformance.py is a third party's view of the protocol,
with this page as its only source. The grammar of a table's "msgpack type" column is the one the page's
"How to read the field tables" states: ``int float str bin bool nil``, ``ext 1``, ``map: Model``,
``map str → T``, ``array of T``, ``(T)``, alternatives separated by ``|``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
ATOMS = frozenset({"int", "float", "str", "bin", "bool", "nil", "ext 1"})
_HEADING = re.compile(r"^(#{2,4}) (\S+) \(`(\w+)`\)\s*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
NO_DEFAULT = object()


@dataclass(frozen=True)
class Type:
    """One alternative: ``base`` is an atom, ``map`` (``of`` the value type, or ``model``), or ``array`` (``of``)."""

    base: str
    model: str | None = None
    of: tuple[Type, ...] | None = None


@dataclass(frozen=True)
class FieldSpec:
    name: str
    types: tuple[Type, ...]
    required: bool
    default: Any
    constraints: str
    meaning: str

    @property
    def nullable(self) -> bool:
        return any(t.base == "nil" for t in self.types)


@dataclass(frozen=True)
class Table:
    title: str
    """The heading's first word: the message kind for a message, the model's name for a nested map."""
    model: str
    fields: tuple[FieldSpec, ...]

    def field(self, name: str) -> FieldSpec:
        return next(f for f in self.fields if f.name == name)


def _split_alternatives(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "|" and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def parse_type(text: str) -> tuple[Type, ...]:
    """A type cell's alternatives; ValueError for text outside the grammar."""
    out = []
    for alt in _split_alternatives(text.strip()):
        if alt.startswith("(") and alt.endswith(")"):
            out.extend(parse_type(alt[1:-1]))
        elif alt in ATOMS:
            out.append(Type(alt))
        elif alt.startswith("map: "):
            out.append(Type("map", model=alt[len("map: "):].strip()))
        elif alt.startswith("map str → "):
            out.append(Type("map", of=parse_type(alt[len("map str → "):])))
        elif alt.startswith("array of "):
            out.append(Type("array", of=parse_type(alt[len("array of "):])))
        else:
            raise ValueError(f"not a type of the field tables: {alt!r}")
    return tuple(out)


def parse_default(text: str) -> tuple[bool, Any]:
    """(required, default) from the "required" column: ``required`` or ``default X``."""
    text = text.strip().replace("`", "")
    if text == "required":
        return True, NO_DEFAULT
    if not text.startswith("default "):
        raise ValueError(f"the required column says 'required' or 'default X', not {text!r}")
    value = text[len("default "):].strip()
    return False, None if value == "nil" else json.loads(value)


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in _CELL_SPLIT.split(line.strip())[1:-1]]


@cache
def tables(path: Path = DOC) -> dict[str, Table]:
    """Every field table of the page by model name (the backticked name in its heading)."""
    lines = path.read_text().splitlines()
    found: dict[str, Table] = {}
    i = 0
    while i < len(lines):
        heading = _HEADING.match(lines[i])
        i += 1
        if heading is None:
            continue
        while i < len(lines) and not lines[i].startswith("#") and not lines[i].startswith("| field |"):
            i += 1
        if i >= len(lines) or not lines[i].startswith("| field |"):
            continue
        assert _cells(lines[i]) == ["field", "msgpack type", "required", "constraints", "meaning"], lines[i]
        i += 2  # the header and its |---| line
        rows = []
        while i < len(lines) and lines[i].startswith("|"):
            name, type_text, required_text, constraints, meaning = _cells(lines[i])
            required, default = parse_default(required_text)
            rows.append(FieldSpec(name.strip("`"), parse_type(type_text), required, default, constraints, meaning))
            i += 1
        model = heading.group(3)
        assert model not in found, f"two tables for {model}"
        found[model] = Table(heading.group(2), model, tuple(rows))
    return found


def message_tables() -> dict[str, Table]:
    """The tables of top-level messages, by kind (their ``kind`` row's constant)."""
    out = {}
    for table in tables().values():
        names = [f.name for f in table.fields]
        if names[:2] == ["v", "kind"]:
            out[table.title] = table
    return out
