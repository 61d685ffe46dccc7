"""Registries: one per extension point (aggregation rule, algorithm, round policy, compressor, data source).

Names that travel on the wire (an algorithm, a compressor) or that a user writes in a setting are
looked up here, never in a list written by hand: settings, ``--help``, the chart's values schema
and the docs all read ``Registry.names()``. An entry declares its name, a one-line summary, the
settings it reads and what it is compatible with (modes, payload kinds, DP, ...), so that a
combination that cannot work fails at start-up with a reason.

Third parties register through an entry-point group (``edgefl.<kind>``), as tasks do: the entry
point names an :class:`Entry`, and it is loaded the first time the registry is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, Literal, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    """A name no entry of the registry has; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class Incompatible(ValueError):
    """An entry asked to work with something it does not declare itself compatible with."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    value: T
    """What the extension point builds from: a class, a factory or a pure function."""
    summary: str
    """One line, for ``--help`` and the docs."""
    settings: tuple[str, ...] = ()
    """The settings fields it reads (documented beside it)."""
    compatible: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Per aspect (e.g. ``modes``, ``payloads``), the values it works with; an aspect not named: any."""

    def supports(self, aspect: str, value: str) -> bool:
        allowed = self.compatible.get(aspect)
        return allowed is None or value in allowed

    def require(self, aspect: str, value: str, kind: str = "entry") -> None:
        """Raise :class:`Incompatible`, naming both sides, unless it supports ``value``."""
        if not self.supports(aspect, value):
            allowed = ", ".join(sorted(self.compatible[aspect]))
            raise Incompatible(f"{kind} {self.name!r} does not support {aspect} {value!r} (it supports: {allowed})")


class Registry(Generic[T]):
    """Named entries of one extension point, in registration order."""

    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, Entry[T]] = {}
        self._plugins_loaded = entry_point_group is None

    def register(self, name: str, value: T, *, summary: str, settings: tuple[str, ...] = (),
                 **compatible: frozenset[str] | set[str] | tuple[str, ...]) -> Entry[T]:
        """Add an entry; a second entry of the same name is refused (plugins cannot shadow built-ins)."""
        entry = Entry(name, value, summary, tuple(settings), {k: frozenset(v) for k, v in compatible.items()})
        self.add(entry)
        return entry

    def add(self, entry: Entry[T]) -> None:
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self._entries[entry.name] = entry

    def entry(self, name: str) -> Entry[T]:
        self._load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(f"unknown {self.kind} {name!r} (known: {', '.join(self._entries)})") from None

    def get(self, name: str) -> T:
        return self.entry(name).value

    def names(self) -> tuple[str, ...]:
        self._load_plugins()
        return tuple(self._entries)

    def literal(self) -> Any:
        """``Literal[...]`` of the names, for a settings field: pydantic validates and documents it."""
        return Literal.__getitem__(self.names())  # type: ignore[attr-defined]

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        self._load_plugins()
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._entries)

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True  # first, so a plugin that reads the registry does not recurse
        assert self.entry_point_group is not None
        for point in entry_points(group=self.entry_point_group):
            loaded = point.load()
            if not isinstance(loaded, Entry):
                raise TypeError(f"entry point {point.name!r} of {self.entry_point_group} must name an "
                                f"protocol.registry.Entry, not {type(loaded).__name__}")
            if loaded.name in self._entries:
                raise ValueError(f"entry point {point.name!r} of {self.entry_point_group}: {self.kind} "
                                 f"{loaded.name!r} is already registered")
            self._entries[loaded.name] = loaded


def summaries(registry: Registry[Any], render: Callable[[Entry[Any]], str] | None = None) -> str:
    """``name: summary`` per entry, one a line: for help texts and generated docs."""
    line = render or (lambda e: f"{e.name}: {e.summary}")
    return "\n".join(line(e) for e in registry)
