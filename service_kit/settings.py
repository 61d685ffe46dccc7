"""Loading a pydantic-settings class from defaults < YAML file < environment < CLI flags.

Both services use this, so a bad value fails the same way everywhere: at start-up, with a
message that names the field and where to set it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import SecretBytes, SecretStr, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

S = TypeVar("S", bound=BaseSettings)


class ConfigError(ValueError):
    """Configuration that cannot start a service; the message names every bad field."""


def load_settings(cls: type[S], yaml_path: Path | None = None, overrides: dict[str, Any] | None = None) -> S:
    file_values = _read_yaml(yaml_path) if yaml_path is not None else {}
    cli_values = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(file_values) - set(cls.model_fields)
    if unknown:
        raise ConfigError(f"{yaml_path}: unknown setting(s) {', '.join(sorted(unknown))}")
    blank = _blank_paths(cls, file_values, cli_values)
    if blank:  # pydantic reads "" as Path("."): the working directory, silently
        raise ConfigError("invalid configuration:\n" + "\n".join(
            f"  {name}: an empty path (unset the setting, or name a path)" for name in blank))
    misspelt = unknown_environment(cls)
    if misspelt:  # else a typo leaves the default in force, silently
        raise ConfigError(f"unknown setting(s) in the environment: {', '.join(misspelt)}")

    class _Layered(cls):  # type: ignore[valid-type, misc]
        @classmethod
        def settings_customise_sources(
            cls_, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, _DictSource(settings_cls, file_values), file_secret_settings)

    _Layered.__name__ = cls.__name__
    try:
        return _Layered(**cli_values)
    except ValidationError as exc:
        raise ConfigError(_describe(cls, exc)) from None


class _DictSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self.values = values

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def unknown_environment(cls: type[BaseSettings]) -> list[str]:
    """Variables with the settings' prefix that name no setting (matched as pydantic-settings matches: any case)."""
    prefix = str(cls.model_config.get("env_prefix", "")).lower()
    if not prefix:
        return []
    return sorted(name for name in os.environ
                  if name.lower().startswith(prefix) and name.lower()[len(prefix):] not in cls.model_fields)


def _blank_paths(cls: type[BaseSettings], *sources: dict[str, Any]) -> list[str]:
    """Path settings given as an empty string, in a YAML file, a flag or the environment."""
    prefix = str(cls.model_config.get("env_prefix", "")).lower()
    environment = {name.lower(): value for name, value in os.environ.items()}
    blank = []
    for name, info in cls.model_fields.items():
        if info.annotation is not Path and Path not in get_args(info.annotation):
            continue
        given = [source.get(name) for source in sources] + [environment.get(prefix + name)]
        if any(isinstance(value, str) and not value.strip() for value in given):
            blank.append(name)
    return blank


def _secret(cls: type[BaseSettings], field: str) -> bool:
    """A field whose value an error must not show: a secret type (``SecretStr | None`` too) or a secret's name."""
    info = cls.model_fields.get(field)
    if info is None:
        return False
    kinds = {info.annotation, *get_args(info.annotation)}
    return bool(kinds & {SecretStr, SecretBytes}) or "password" in field or "secret" in field


def _describe(cls: type[BaseSettings], exc: ValidationError) -> str:
    prefix = cls.model_config.get("env_prefix", "")
    lines = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(p) for p in error["loc"])
        if not field:  # a check across fields: its input is every setting, passwords included; the message names them
            lines.append(f"  {error['msg']}")
            continue
        where = f"--{field.replace('_', '-')} / {prefix}{field.upper()}"
        shown = "" if _secret(cls, str(error["loc"][0])) or isinstance(error.get("input"), dict) \
            else f" (got {error.get('input')!r})"
        lines.append(f"  {field} ({where}): {error['msg']}{shown}")
    return "invalid configuration:\n" + "\n".join(lines)
