"""Finding tasks: by import path, or by name among installed packages' entry points."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from edge_agent.tasks import ENTRY_POINT_GROUP, TaskNotFound, installed_tasks, resolve_task
from protocol.tasks import BUILTIN_CARDS

TASK_MODULE = textwrap.dedent('''
    from torch import nn
    from edge_agent.tasks import Task

    def _model():
        return nn.Linear(4, 2)

    def _load(source, context):
        raise ValueError("not needed")

    task = Task(name="plug", version="0.3", classes=("no", "yes"), families={"lin": _model}, load_data=_load)

    def make_task():
        return task

    not_a_task = 42
''')


def install_fake_package(root: Path, module: str, entry_points: dict[str, str], body: str = TASK_MODULE) -> None:
    """A module and a .dist-info with entry points, as pip would leave them in site-packages."""
    (root / f"{module}.py").write_text(body)
    info = root / f"{module.replace('_', '-')}_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}-pkg\nVersion: 1.0\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}\n")


def test_builtin_tasks_are_found_like_any_installed_task() -> None:
    names = {t.name: t for t in installed_tasks()}
    assert set(BUILTIN_CARDS) <= set(names) and names["digits"].distribution == "edgefl"
    for name, card in BUILTIN_CARDS.items():
        assert resolve_task(name).card == card  # the agent's task and the coordinator's card agree


def test_import_paths_name_a_task_or_a_function_returning_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plug_mod.py").write_text(TASK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_task("plug_mod:task").card.ref.version == "0.3"
    assert resolve_task("plug_mod:make_task").name == "plug"
    with pytest.raises(TaskNotFound, match="plug_mod:not_a_task is a int, not an edge_agent.tasks.Task"):
        resolve_task("plug_mod:not_a_task")
    with pytest.raises(TaskNotFound, match="module plug_mod has no attribute 'missing'"):
        resolve_task("plug_mod:missing")
    with pytest.raises(TaskNotFound, match="importing no_such_module failed: ModuleNotFoundError"):
        resolve_task("no_such_module:task")


def test_a_task_that_fails_to_import_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_mod.py").write_text("import torch\nraise RuntimeError('cuda driver too old')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskNotFound, match="importing broken_mod failed: RuntimeError: cuda driver too old"):
        resolve_task("broken_mod:task")


def test_installed_packages_register_tasks_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_package(tmp_path, "plug_pkg_mod", {"plug": "plug_pkg_mod:task", "misnamed": "plug_pkg_mod:task"})
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {t.name: t for t in installed_tasks()}
    assert found["plug"].target == "plug_pkg_mod:task" and found["plug"].distribution == "plug_pkg_mod-pkg"
    assert resolve_task("plug").card.ref.version == "0.3"
    with pytest.raises(TaskNotFound, match="loads a task named 'plug'; the names must agree"):
        resolve_task("misnamed")
    with pytest.raises(TaskNotFound, match="no task named 'acme' is installed .*plug"):
        resolve_task("acme")
