"""Turn a settings class into typer options, one ``--flag`` per field, and the shared ``--version``.

Values are passed on as given and validated by the settings class, so a bad flag fails
exactly like a bad environment variable or YAML entry: naming the field.

Each option's help shows the field's type (as the metavar), its allowed values or range, its
default and its environment variable. The typer options themselves default to ``None`` (so
an unset flag leaves the environment and the YAML file in charge); the field's default is
written into the help text instead. Secrets never show a default.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

import annotated_types
import typer
from pydantic import SecretBytes, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from protocol.version import SCHEMA_VERSION, SOFTWARE_VERSION
from service_kit.settings import ConfigError, load_settings

S = TypeVar("S", bound=BaseSettings)

DISTRIBUTION = "edgefl"
"""The distribution name in pyproject.toml, whose installed version ``--version`` prints."""

_METAVARS: dict[type, str] = {int: "<int>", float: "<float>", str: "<str>", Path: "<path>",
                              SecretStr: "<secret>", SecretBytes: "<secret>"}


def _unwrap_optional(annotation: Any) -> Any:
    """``X | None`` -> ``X``; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return bool in typing.get_args(annotation)
    return False


def _is_secret(annotation: Any) -> bool:
    return _unwrap_optional(annotation) in (SecretStr, SecretBytes)


def _metavar(annotation: Any) -> str:
    inner = _unwrap_optional(annotation)
    if typing.get_origin(inner) is typing.Literal:
        return "<choice>"  # the values are listed in the help: a long list would widen the metavar column
    return _METAVARS.get(inner, f"<{getattr(inner, '__name__', 'value').lower()}>")


def _choices(annotation: Any) -> str | None:
    inner = _unwrap_optional(annotation)
    if typing.get_origin(inner) is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(inner))
    return None


def _bounds(field: FieldInfo) -> str | None:
    """The field's numeric constraints: ``0 < x <= 1``, ``x >= 1``, ``x < 5``; ``None`` without any."""
    low: tuple[str, Any] | None = None
    high: tuple[str, Any] | None = None
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            low = (">=", item.ge)
        elif isinstance(item, annotated_types.Gt):
            low = (">", item.gt)
        elif isinstance(item, annotated_types.Le):
            high = ("<=", item.le)
        elif isinstance(item, annotated_types.Lt):
            high = ("<", item.lt)
    if low and high:
        return f"{low[1]} {low[0].replace('>', '<')} x {high[0]} {high[1]}"
    if low or high:
        op, value = low or high  # type: ignore[misc]
        return f"x {op} {value}"
    return None


def default_text(field: FieldInfo) -> str:
    """How the help shows a field's default: the value, ``unset`` for ``None``, never a secret's value."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if _is_secret(field.annotation):
        return "hidden"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def option_help(field: FieldInfo, env_name: str) -> str:
    """The one-line help of a settings flag: description, then (choices; range; default; env)."""
    facts = [_choices(field.annotation), _bounds(field), f"default: {default_text(field)}", f"env {env_name}"]
    # Parentheses, not brackets: typer renders help through rich, which takes [..] for markup.
    return f"{field.description or ''} ({'; '.join(f for f in facts if f)})".strip()


def settings_command(cls: type[S], run: Callable[[S], int]) -> Callable[..., None]:
    """A typer command whose options are ``cls``'s fields, plus ``--config FILE``."""
    prefix = cls.model_config.get("env_prefix", "")
    params = [inspect.Parameter(
        "config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],  # noqa: UP045 (typer needs it)
        default=typer.Option(None, "--config", metavar="<path>", show_default=False,
                             help="YAML file of settings, overridden by the environment and by flags (default: unset)"),
    )]
    for name, field in cls.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = option_help(field, prefix + name.upper())
        if _is_bool(field.annotation):
            option = typer.Option(None, f"{flag}/--no-{name.replace('_', '-')}", help=help_text, show_default=False)
            annotation: Any = Optional[bool]  # noqa: UP045
        else:
            option = typer.Option(None, flag, help=help_text, show_default=False, metavar=_metavar(field.annotation))
            annotation = Optional[str]  # noqa: UP045
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))

    def command(**kwargs: Any) -> None:
        config = kwargs.pop("config")
        try:
            settings = load_settings(cls, config, kwargs)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        code = run(settings)
        if code:
            raise typer.Exit(code)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = run.__doc__
    return command


def version_text(program: str) -> str:
    """``PROGRAM VERSION (edgefl, wire schema vN)``, the version as installed (pyproject.toml's)."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = f"{SOFTWARE_VERSION} (not installed)"
    return f"{program} {version} ({DISTRIBUTION}, wire schema v{SCHEMA_VERSION})"


def version_option(program: str) -> Any:
    """A root ``--version`` flag that prints :func:`version_text` and exits 0 before any command runs."""

    def show(value: bool) -> None:
        if value:
            typer.echo(version_text(program))
            raise typer.Exit()

    return typer.Option(False, "--version", is_eager=True, callback=show,
                        help="Print the version (package and wire schema) and exit.")
