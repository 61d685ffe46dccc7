"""Both CLIs' help, read as a person reads it: every option shows a type, a default (or that it
is required) and a line of help; ``--version`` prints the installed version and the wire schema.

The help is rendered for an 80-column terminal through typer's CliRunner and parsed entry by
entry (wrapped lines joined); the parsed option names are checked against the commands' own
parameters, so that no entry is missed.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from typer.testing import CliRunner

from coordinator.app import cli as coordinator_cli
from coordinator.settings import CoordinatorSettings
from edge_agent import cli as agent_cli
from edge_agent.config import AgentSettings
from protocol.version import SCHEMA_VERSION
from service_kit.cli_options import settings_command

REPO = Path(__file__).resolve().parents[2]
NARROW = {"COLUMNS": "80"}  # a common terminal: the help wraps, and nothing may be cut off
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # in case CI forces colours (FORCE_COLOR, GITHUB_ACTIONS)
ACTIONS = {"--help", "--version"}  # they do something instead of setting something: no default to show

COMMANDS = [
    pytest.param(coordinator_cli.app, ("run",), id="coordinator run"),
    pytest.param(coordinator_cli.app, ("enroll",), id="coordinator enroll"),
    pytest.param(coordinator_cli.app, (), id="coordinator"),
    pytest.param(agent_cli.app, ("run",), id="edge-agent run"),
    pytest.param(agent_cli.app, ("tasks",), id="edge-agent tasks"),
    pytest.param(agent_cli.app, (), id="edge-agent"),
]


def render_help(app: typer.Typer, args: tuple[str, ...], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={**NARROW, **(env or {})})
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.output)


def help_entries(text: str, section: str) -> list[tuple[str, str]]:
    """A section's entries (``Options:``, ``Arguments:``, ``Commands:``) as (what, help), wrapped lines joined."""
    entries: list[tuple[str, str]] = []
    lines = text.splitlines()
    start = lines.index(section + ":") + 1
    for line in lines[start:]:
        if not line.strip() or not line.startswith(" "):
            break  # the section ends at a blank line or the next heading
        if re.match(r"  \S", line):  # a new entry; its help follows after two spaces, or on the next line
            head, _, rest = line.strip().partition("  ")
            entries.append((head, rest.strip()))
        else:
            head, previous = entries[-1]
            entries[-1] = (head, f"{previous} {line.strip()}".strip())
    return entries


def help_rows(text: str) -> dict[str, dict[str, str]]:
    """Each option and argument: name -> its type (a metavar, or a --x / --no-x pair) and its help."""
    rows: dict[str, dict[str, str]] = {}
    sections = [s for s in ("Arguments", "Options") if f"\n{s}:\n" in text]
    for head, help_text in (e for s in sections for e in help_entries(text, s)):
        match = re.fullmatch(r"(?P<name>[\w.-]+)(?: / (?P<negative>--no-[\w-]+))?(?: (?P<type><[^<>]+>))?", head)
        assert match, f"an option line that did not parse: {head!r}"
        flag_pair = f"{match['name']} / {match['negative']}" if match["negative"] else ""
        rows[match["name"]] = {"type": match["type"] or flag_pair, "help": help_text}
    return rows


def declared_options(app: typer.Typer, args: tuple[str, ...]) -> set[str]:
    command = typer.main.get_command(app)
    for name in args:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {"--help"} | {opt for p in command.params for opt in p.opts if opt.startswith("--")}


@pytest.mark.parametrize(("app", "args"), COMMANDS)
def test_every_option_shows_type_default_and_help(app: typer.Typer, args: tuple[str, ...]) -> None:
    rows = help_rows(render_help(app, args))
    assert {n for n in rows if n.startswith("--")} == declared_options(app, args)
    for name, row in rows.items():
        assert row["type"] or name in ACTIONS, f"{name}: no type shown"
        assert row["help"][:1].isalnum(), f"{name}: help text missing: {row['help']!r}"
        if name not in ACTIONS:
            assert "default: " in row["help"] or "[required]" in row["help"], f"{name}: no default: {row['help']!r}"
            assert "..." not in row["help"] and "\u2026" not in row["help"], f"{name}: help cut off: {row['help']!r}"


@pytest.mark.parametrize(("app", "cls"), [(coordinator_cli.app, CoordinatorSettings), (agent_cli.app, AgentSettings)])
def test_every_setting_is_a_flag_with_its_description_and_env(app: typer.Typer, cls: type[BaseSettings]) -> None:
    rows = help_rows(render_help(app, ("run",)))
    prefix = cls.model_config["env_prefix"]
    for name, field in cls.model_fields.items():
        assert field.description, f"{cls.__name__}.{name} has no description"
        row = rows["--" + name.replace("_", "-")]
        assert row["help"].startswith(field.description.split(";")[0][:40]), name
        assert f"env {prefix}{name.upper()})" in row["help"], name


def test_values_types_and_choices_as_shown() -> None:
    coordinator = help_rows(render_help(coordinator_cli.app, ("run",)))
    assert coordinator["--rounds"]["type"] == "<int>"
    assert "(1 <= x <= 1000000; default: 20; env FL_COORDINATOR_ROUNDS)" in coordinator["--rounds"]["help"]
    assert coordinator["--state-dir"]["type"] == "<path>"
    assert "default: coordinator-state;" in coordinator["--state-dir"]["help"]
    assert coordinator["--evaluate-final"]["type"] == "--evaluate-final / --no-evaluate-final"
    assert "default: on;" in coordinator["--evaluate-final"]["help"]
    assert "(0.0 <= x < 1.0; default: unset;" in coordinator["--momentum"]["help"]
    assert "(x >= 0.0; default: 1.0;" in coordinator["--max-norm-ratio"]["help"]
    agent = help_rows(render_help(agent_cli.app, ("run",)))
    assert agent["--device"]["type"] == "<choice>"
    assert "(one of jetson, rpi, phone, cpu; default: cpu;" in agent["--device"]["help"]
    assert "default: off;" in agent["--dp"]["help"]
    assert agent["--dp-delta"]["type"] == "<float>"
    assert "default: 1e-05;" in agent["--dp-delta"]["help"]


@pytest.mark.parametrize(("app", "variable"), [(coordinator_cli.app, "FL_COORDINATOR_BROKER_PASSWORD"),
                                              (agent_cli.app, "FL_AGENT_BROKER_PASSWORD")])
def test_broker_password_shows_no_value(app: typer.Typer, variable: str) -> None:
    text = render_help(app, ("run",), env={variable: "hunter2-in-the-environment"})
    row = help_rows(text)["--broker-password"]
    assert row["type"] == "<secret>"
    assert "default: unset;" in row["help"]
    assert "hunter2" not in text


def test_a_secret_default_is_hidden() -> None:
    class WithSecret(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="T_")
        token: SecretStr = Field(default=SecretStr("hunter2-default"), description="an API token")

    app = typer.Typer(rich_markup_mode=None)
    app.command("run")(settings_command(WithSecret, lambda settings: 0))
    app.command("other")(lambda: None)  # two commands, so that "run" stays a subcommand
    text = render_help(app, ("run",))
    assert "default: hidden;" in help_rows(text)["--token"]["help"]
    assert "hunter2" not in text


@pytest.mark.parametrize("app", [coordinator_cli.app, agent_cli.app])
def test_every_command_has_a_whole_line_of_help(app: typer.Typer) -> None:
    commands = dict(help_entries(render_help(app, ()), "Commands"))
    assert set(commands) == set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    for name, line in commands.items():
        assert line[:1].isalnum() and not line.endswith("..."), f"{name}: {line!r}"


VERSION_PROBE = textwrap.dedent(
    """
    import contextlib, importlib, io, json, sys

    HEAVY = ("torch", "opacus", "sklearn", "torchvision", "coordinator.app.service", "edge_agent.bootstrap")
    results = []
    for module, program, args in json.loads(sys.argv[1]):
        sys.argv = [program, *args]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                importlib.import_module(module).main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        results.append({"args": args, "code": code, "stdout": out.getvalue()})
    print(json.dumps({"results": results, "loaded": sorted(m for m in HEAVY if m in sys.modules)}))
    """
)


def test_version_and_help_answer_without_heavy_imports() -> None:
    """``--version`` (and every ``--help``) in a fresh interpreter: exit 0, and nothing heavy imported."""
    calls = [("coordinator.app.cli", "coordinator", ["--version"]), ("edge_agent.cli", "edge-agent", ["--version"]),
             ("coordinator.app.cli", "coordinator", ["run", "--help"]),
             ("coordinator.app.cli", "coordinator", ["enroll", "--help"]),
             ("edge_agent.cli", "edge-agent", ["run", "--help"]), ("edge_agent.cli", "edge-agent", ["tasks", "--help"])]
    result = subprocess.run([sys.executable, "-c", VERSION_PROBE, json.dumps(calls)], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == [], "imported by --version/--help: " + ", ".join(report["loaded"])
    assert [r["code"] for r in report["results"]] == [0] * len(calls)
    version = importlib.metadata.version("edgefl")
    coordinator_line, agent_line = (report["results"][i]["stdout"] for i in (0, 1))
    assert coordinator_line == f"coordinator {version} (edgefl, wire schema v{SCHEMA_VERSION})\n"
    assert agent_line == f"edge-agent {version} (edgefl, wire schema v{SCHEMA_VERSION})\n"
