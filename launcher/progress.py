"""Live progress of a run, read from the coordinator's ``rounds.jsonl`` (one RoundSummary per closed round).

On a terminal: a rich live view (round k/N, outcome, answered/selected, accuracy, bytes,
elapsed). Otherwise (CI logs, pipes): one plain line per closed round.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from coordinator.state.rounds import RoundSummary

OUTCOME_STYLE = {"completed": "green", "quorum_missed": "yellow", "failed": "red", "interrupted": "magenta"}


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(count) < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GB"


def fmt_accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


class RoundsTail:
    """Reads the complete lines appended to ``rounds.jsonl`` since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[RoundSummary]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unterminated last line is still being written
        return [RoundSummary.from_dict(json.loads(line)) for line in lines if line.strip()]


def read_rounds(path: Path) -> list[RoundSummary]:
    return RoundsTail(path).read_new()


class ProgressView:
    """Call :meth:`poll` periodically; it reads new rounds and refreshes the display."""

    def __init__(self, rounds_path: Path, total_rounds: int, *, console: Console | None = None,
                 status: Callable[[], str] | None = None, live: bool | None = None, recent: int = 8) -> None:
        self.console = console or Console()
        self.tail = RoundsTail(rounds_path)
        self.total_rounds = total_rounds
        self.status = status or (lambda: "")
        self.live_mode = self.console.is_terminal if live is None else live
        self.recent = recent
        self.rounds: list[RoundSummary] = []
        self.started = time.monotonic()
        self._bar = Progress(TextColumn("[bold]rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             console=self.console, auto_refresh=False)
        self._task = self._bar.add_task("rounds", total=total_rounds)
        self._live: Live | None = None
        self._last_status = ""

    def __enter__(self) -> ProgressView:
        if self.live_mode:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.__exit__(kind, exc, tb)
            self._live = None

    def poll(self) -> list[RoundSummary]:
        new = self.tail.read_new()
        self.rounds += new
        trained = sum(1 for r in self.rounds if r.task == "train")
        self._bar.update(self._task, completed=min(trained, self.total_rounds))
        if self._live is not None:
            self._live.update(self._render())
        else:
            self._print_plain(new)
        return new

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # -- plain -----------------------------------------------------------------------------
    def _print_plain(self, new: list[RoundSummary]) -> None:
        status = self.status()
        if status and status != self._last_status and not new:
            self.console.print(f"[{self.elapsed:6.1f}s] {status}", markup=False, highlight=False)
        self._last_status = status
        for r in new:
            self.console.print(self.plain_line(r), markup=False, highlight=False)

    def plain_line(self, r: RoundSummary) -> str:
        label = f"round {r.round}/{self.total_rounds}" if r.task == "train" else "final evaluation"
        families = " ".join(f"{f}={fmt_accuracy(s.accuracy)}" for f, s in r.families.items())
        privacy = "" if r.epsilon_max is None else f", epsilon max {r.epsilon_max:.4g}"
        return (f"[{self.elapsed:6.1f}s] {label}: {r.outcome}, {r.answered}/{r.selected} answered, "
                f"accuracy {fmt_accuracy(r.accuracy)} ({families}), in {human_bytes(r.bytes_in)}, "
                f"out {human_bytes(r.bytes_out)}, {r.duration_s:.1f}s{privacy}")

    # -- live ------------------------------------------------------------------------------
    def _render(self) -> RenderableType:
        table = Table(expand=False, box=None, header_style="bold", pad_edge=False)
        for column, justify in (("round", "right"), ("outcome", "left"), ("answered", "right"),
                                ("accuracy", "right"), ("families", "left"), ("bytes in", "right"),
                                ("bytes out", "right"), ("time", "right")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for r in self.rounds[-self.recent:]:
            label = f"{r.round}/{self.total_rounds}" if r.task == "train" else "eval"
            table.add_row(
                label, Text(r.outcome, style=OUTCOME_STYLE.get(r.outcome, "")), f"{r.answered}/{r.selected}",
                fmt_accuracy(r.accuracy), " ".join(f"{f} {fmt_accuracy(s.accuracy)}" for f, s in r.families.items()),
                human_bytes(r.bytes_in), human_bytes(r.bytes_out), f"{r.duration_s:.1f}s",
            )
        self._bar.refresh()
        header = Text.assemble(("status: ", "bold"), self.status() or "running",
                               ("   elapsed: ", "bold"), f"{self.elapsed:.0f}s")
        return Group(header, self._bar.get_renderable(), table)
