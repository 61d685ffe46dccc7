"""The architecture's boundaries, read from the source with ast: every import counts, TYPE_CHECKING and
function-level ones included, so a cycle or a forbidden edge cannot hide behind either.

- ``protocol`` (the wire contract) imports neither side, nor ``service_kit``, typer or yaml;
- ``service_kit`` imports neither side; the coordinator never imports torch, Opacus or the agent;
  the agent never the coordinator;
- the coordinator's rooms sit on floors and import only rooms below them (``FLOORS``);
  admission never imports the engine's room;
- no import cycle between the modules of any package;
- no module of ``coordinator`` or ``protocol`` over 400 lines, and an engine of at most 250.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "service_kit", "coordinator", "edge_agent", "launcher")

FLOORS = {
    "app": 7,
    "sites": 6,
    "round": 5,
    "strategies": 4, "policies": 4,
    "admission": 3,
    "aggregation": 2,
    "fleet": 1, "state": 1, "telemetry": 1,
    "settings": 0, "reasons": 0, "schedule": 0,
}
"""The coordinator's rooms, top to bottom: a room imports only rooms on lower floors (on the lowest floors also
another room of its own floor). The settings read the names of the registries (``*.registry`` modules), so that
settings, ``--help`` and the chart's schema list what is registered: nothing those import may import the settings
back, which ``test_no_import_cycles`` checks."""

FORBIDDEN = {
    "protocol": {"coordinator", "edge_agent", "launcher", "service_kit", "torch", "opacus", "typer", "yaml"},
    "service_kit": {"coordinator", "edge_agent", "launcher", "torch", "opacus"},
    "coordinator": {"edge_agent", "launcher", "torch", "opacus"},
    "edge_agent": {"coordinator", "launcher"},
}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def imports(name: str) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement of module ``name``, relative ones resolved."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield (child if child in MODULES else base), node.lineno


def test_forbidden_imports() -> None:
    found = [f"{name}:{line} imports {target}" for name in MODULES for target, line in imports(name)
             if target.split(".")[0] in FORBIDDEN.get(name.split(".")[0], set())]
    assert found == []


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "coordinator" and len(parts) > 1 else None


def test_coordinator_rooms_import_only_rooms_below() -> None:
    assert {room(m) for m in MODULES if room(m) is not None} - {"cli", "__main__"} <= set(FLOORS), (
        "a new room of coordinator/ needs its floor in FLOORS")
    upward = []
    for name in MODULES:
        here = room(name)
        if here is None or here not in FLOORS:
            continue
        for target, line in imports(name):
            there = room(target)
            if there is None or there == here or there not in FLOORS:
                continue
            if here == "settings" and target.endswith(".registry"):
                continue  # the names of the registries (see FLOORS)
            if FLOORS[there] > FLOORS[here] or (FLOORS[there] == FLOORS[here] and FLOORS[here] >= 3):
                upward.append(f"{name}:{line} ({here}, floor {FLOORS[here]}) imports {target} "
                              f"({there}, floor {FLOORS[there]})")
    assert upward == []


def test_admission_never_imports_the_engine() -> None:
    found = [f"{name}:{line} imports {target}" for name in MODULES if room(name) == "admission"
             for target, line in imports(name) if room(target) in {"round", "app", "strategies", "policies"}]
    assert found == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module are import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles() -> None:
    graph = {name: {t for t, _ in imports(name) if t in MODULES and t != name} for name in MODULES}
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_hidden_cycle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_module_sizes() -> None:
    too_long = {name: n for name, path in MODULES.items() if name.split(".")[0] in {"coordinator", "protocol"}
                and (n := len(path.read_text().splitlines())) > 400}
    assert too_long == {}
    assert len(MODULES["coordinator.round.engine"].read_text().splitlines()) <= 250
