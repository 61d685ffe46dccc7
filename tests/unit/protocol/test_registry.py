"""The registry every extension point uses: names, entries, compatibility, plugins through entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from pydantic import BaseModel, ValidationError

import protocol.registry as registry_module
from protocol.registry import Entry, Incompatible, Registry, UnknownName


def test_entries_keep_their_order_and_lookup_names_the_known_ones() -> None:
    rules: Registry[int] = Registry("rule")
    rules.register("b", 2, summary="second")
    rules.register("a", 1, summary="first", settings=("x",), modes={"sync"})
    assert rules.names() == ("b", "a")
    assert rules.get("a") == 1 and rules.entry("a").settings == ("x",)
    with pytest.raises(UnknownName, match=r"unknown rule 'c' \(known: b, a\)"):
        rules.get("c")
    with pytest.raises(ValueError, match="registered twice"):
        rules.register("a", 3, summary="again")


def test_compatibility_is_declared_and_checked() -> None:
    rules: Registry[int] = Registry("rule")
    entry = rules.register("r", 0, summary="s", modes=("sync",))
    assert entry.supports("modes", "sync") and not entry.supports("modes", "async")
    assert entry.supports("payloads", "anything")  # an aspect not declared: any value
    with pytest.raises(Incompatible, match="rule 'r' does not support modes 'async' \\(it supports: sync\\)"):
        entry.require("modes", "async", "rule")


def test_a_settings_field_typed_by_the_registry_validates_its_names() -> None:
    rules: Registry[int] = Registry("rule")
    rules.register("mean", 0, summary="s")
    rules.register("median", 1, summary="s")

    class Settings(BaseModel):
        rule: rules.literal()  # type: ignore[valid-type]

    assert Settings(rule="median").rule == "median"
    with pytest.raises(ValidationError, match="'mean' or 'median'"):
        Settings(rule="mode")
    assert Settings.model_json_schema()["properties"]["rule"]["enum"] == ["mean", "median"]


def test_plugins_register_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = Entry("plugged", 7, "from a third party")
    points = [EntryPoint("plugged", "tests.unit.protocol.test_registry:PLUGIN", "edgefl.rules")]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: points if group == "edgefl.rules" else [])
    monkeypatch.setitem(globals(), "PLUGIN", plugin)
    rules: Registry[int] = Registry("rule", "edgefl.rules")
    rules.register("builtin", 1, summary="s")
    assert rules.names() == ("builtin", "plugged") and rules.get("plugged") == 7


def test_a_plugin_cannot_shadow_a_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "SHADOW", Entry("builtin", 9, "impostor"))
    points = [EntryPoint("x", "tests.unit.protocol.test_registry:SHADOW", "edgefl.rules")]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: points)
    rules: Registry[int] = Registry("rule", "edgefl.rules")
    rules.register("builtin", 1, summary="s")
    with pytest.raises(ValueError, match="already registered"):
        rules.names()
