"""Finding tasks like plugins: by import path (``package.module:attr``) or by name in the
``edgefl.tasks`` entry-point group, where installed packages (this one included) register theirs."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from edge_agent.tasks.base import Task

ENTRY_POINT_GROUP = "edgefl.tasks"

log = logging.getLogger(__name__)


class TaskNotFound(ValueError):
    """No task by that name or path, or it failed to load: the message says which and why."""


@dataclass(frozen=True)
class InstalledTask:
    name: str
    target: str
    """``module:attr`` the entry point names."""
    distribution: str
    """The installed package that registered it."""


def installed_tasks() -> list[InstalledTask]:
    """Tasks registered in the entry-point group, by name (without importing them)."""
    found = [InstalledTask(ep.name, ep.value, ep.dist.name if ep.dist is not None else "?")
             for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return sorted(found, key=lambda t: t.name)


def resolve_task(spec: str) -> Task:
    """``package.module:attr`` (a Task, or a function of no arguments returning one) or an installed name."""
    if ":" in spec:
        return _from_target(spec, spec)
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
    if not matches:
        known = ", ".join(t.name for t in installed_tasks()) or "none"
        raise TaskNotFound(f"no task named {spec!r} is installed (installed: {known}); install its package, or "
                           f"give its import path as package.module:attr")
    if len({ep.value for ep in matches}) > 1:
        raise TaskNotFound(f"task {spec!r} is registered by several packages: "
                           f"{', '.join(_describe(ep) for ep in matches)}; uninstall one or use an import path")
    return _from_target(matches[0].value, spec)


def _describe(ep: EntryPoint) -> str:
    return f"{ep.value} ({ep.dist.name if ep.dist is not None else '?'})"


def _from_target(target: str, spec: str) -> Task:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise TaskNotFound(f"task {spec!r}: an import path is package.module:attr")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's code: any error in it is a failure to load the task
        raise TaskNotFound(f"task {spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TaskNotFound(f"task {spec!r}: module {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, Task) and callable(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise TaskNotFound(f"task {spec!r}: {target}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Task):
        raise TaskNotFound(f"task {spec!r}: {target} is a {type(obj).__name__}, not an edge_agent.tasks.Task")
    if ":" not in spec and obj.name != spec:
        raise TaskNotFound(f"task {spec!r}: the entry point loads a task named {obj.name!r}; the names must agree")
    return obj
