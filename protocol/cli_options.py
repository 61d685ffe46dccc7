"""Turn a settings class into typer options, one ``--flag`` per field.

Values are passed on as given and validated by the settings class, so a bad flag fails
exactly like a bad environment variable or YAML entry: naming the field.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer
from pydantic_settings import BaseSettings

from protocol.settings import ConfigError, load_settings

S = TypeVar("S", bound=BaseSettings)


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return bool in typing.get_args(annotation)
    return False


def _choices(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " (one of " + ", ".join(str(a) for a in typing.get_args(annotation)) + ")"
    return ""


def settings_command(cls: type[S], run: Callable[[S], int]) -> Callable[..., None]:
    """A typer command whose options are ``cls``'s fields, plus ``--config FILE``."""
    prefix = cls.model_config.get("env_prefix", "")
    params = [inspect.Parameter(
        "config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],  # noqa: UP045 (typer needs it)
        default=typer.Option(None, "--config", help="YAML file of settings (lowest precedence after defaults)"),
    )]
    for name, field in cls.model_fields.items():
        flag = "--" + name.replace("_", "-")
        # Parentheses, not brackets: typer renders help through rich, which takes [..] for markup.
        help_text = f"{field.description or ''}{_choices(field.annotation)} (env {prefix}{name.upper()})".strip()
        if _is_bool(field.annotation):
            option = typer.Option(None, f"{flag}/--no-{name.replace('_', '-')}", help=help_text, show_default=False)
            annotation: Any = Optional[bool]  # noqa: UP045
        else:
            option = typer.Option(None, flag, help=help_text, show_default=False)
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
