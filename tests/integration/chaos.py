"""Helpers for the chaos tests: a small fleet, what the wire says about rounds, and the figures.

Each chaos test writes its figures (rounds completed, quorum misses, the longest round
against its deadline, recovery times) to ``figures.json`` in its tmp dir and prints them;
set ``FL_CHAOS_FIGURES=DIR`` to also collect them as ``DIR/<test>.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.broker import free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import AgentStatus, CoordinatorStatus, RoundAnnouncement
from protocol.topics import Topics
from tests.integration.wire import WireRecorder, decode_wire

DEADLINE_MARGIN_S = 5.0
"""How far past its deadline a round may close: the loop ticks at least every 0.5 s, the rest is a loaded CI box."""

FAST_RECONNECT = {"reconnect_min_s": 0.2, "reconnect_max_s": 2.0}


CHEAP_DEVICES = ("phone", "rpi")
"""The two cheapest model families: fleets of them cycle through these (launcher.fleet.default_fleet)."""


def small_fleet(run_dir: Path, broker_url: str, federation: str, agents: list[AgentSpec],
                coordinator: Mapping[str, Any], agent_settings: Mapping[str, Any] | None = None) -> Fleet:
    """Phones and Pis on the digits data, one local epoch, fast reconnects; the coordinator keeps /metrics
    up on a free port of its own (``fleet.http_port``)."""
    settings = {"local_epochs": 1, "exit_when_finished": False, "min_available_agents": len(agents),
                "min_fit_agents": len(agents), "quorum_fraction": 0.5, "http_port": free_port(), **FAST_RECONNECT,
                **coordinator}
    spec = FleetSpec(agents=agents, alpha=1.0, agent_settings={**FAST_RECONNECT, **(agent_settings or {})})
    return Fleet(run_dir, broker_url, spec, settings, federation=federation)


@dataclass(frozen=True)
class Announced:
    at: float
    """Monotonic time the recorder saw it."""
    announcement: RoundAnnouncement
    payload: bytes


class WireView:
    """Decoded views of what a recorder saw on one federation's topics."""

    def __init__(self, recorder: WireRecorder, federation: str) -> None:
        self.recorder = recorder
        self.topics = Topics(federation)

    def announcements(self) -> list[Announced]:
        topic = self.topics.rounds_current
        return [Announced(m.at, decode_wire(m.payload, RoundAnnouncement), m.payload)
                for m in self.recorder.snapshot(lambda m: m.topic == topic and bool(m.payload))]

    def wait_announced(self, number: int, timeout_s: float) -> Announced:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for seen in self.announcements():
                if seen.announcement.round == number:
                    return seen
            time.sleep(0.05)
        raise AssertionError(f"round {number} was not announced within {timeout_s:.0f}s")

    def updates(self) -> list[tuple[str, int, float]]:
        """(agent, round, seen at) of every update message, duplicates included."""
        found = []
        for m in self.recorder.snapshot(lambda m: "/updates/" in m.topic):
            parsed = self.topics.parse(m.topic)
            assert parsed.agent_id is not None and parsed.round is not None
            found.append((parsed.agent_id, parsed.round, m.at))
        return found

    def coordinator_statuses(self) -> list[tuple[float, CoordinatorStatus]]:
        topic = self.topics.coordinator_status
        return [(m.at, decode_wire(m.payload, CoordinatorStatus))
                for m in self.recorder.snapshot(lambda m: m.topic == topic and bool(m.payload))]

    def agent_statuses(self) -> list[tuple[float, AgentStatus]]:
        return [(m.at, decode_wire(m.payload, AgentStatus))
                for m in self.recorder.snapshot(lambda m: m.topic.endswith("/status") and "/agents/" in m.topic
                                                and bool(m.payload))]


def round_figures(rounds: list[dict]) -> dict[str, Any]:
    longest = max(rounds, key=lambda r: r["duration_s"])
    return {
        "rounds_closed": len(rounds),
        "rounds_completed": sum(r["outcome"] == "completed" for r in rounds),
        "rounds_quorum_missed": sum(r["outcome"] == "quorum_missed" for r in rounds),
        "longest_round": {"round": longest["round"], "duration_s": longest["duration_s"],
                          "deadline_s": longest["deadline_s"]},
        "per_round": [{k: r[k] for k in ("round", "task", "outcome", "selected", "answered", "stragglers",
                                         "dropouts", "duration_s", "deadline_s")} for r in rounds],
    }


def write_figures(tmp_path: Path, name: str, figures: dict[str, Any]) -> None:
    text = json.dumps(figures, indent=1)
    (tmp_path / "figures.json").write_text(text)
    collect = os.environ.get("FL_CHAOS_FIGURES")
    if collect:
        Path(collect).mkdir(parents=True, exist_ok=True)
        (Path(collect) / f"{name}.json").write_text(text)
    lines = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in figures.items())
    print(f"\n{name} figures:\n{lines}")
