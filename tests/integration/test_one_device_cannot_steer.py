"""One enrolled device among four cannot steer, blind or poison the federation (issue 22, items 3-5).

Real Mosquitto, a real coordinator and four real agent processes (three honest phones, one Byzantine,
all enrolled), the default settings (the weighted mean), digits:

- ``steer``: claims 1,000,000 samples, sends its label-flipped delta boosted 9x, and reports an
  accuracy of 0.99 on 1,000,000 samples in the evaluation round;
- ``flip``: its true sample count, but minus 9x its delta every round;
- ``noise``: Gaussian noise 1,000x the scale of an honest delta, from the bootstrap round on (there: 1,000x the
  RMS of the initial weights, the issue's bootstrap poisoning).

In the bootstrap round honest agents propose the untrained seeded model, byte for byte alike, and the
coordinator takes what a strict majority sent: each attacker's bootstrap proposal is counted as
``bootstrap_disagrees`` in rounds.jsonl (``rejected`` of round 1), never averaged in.

Each run is compared with a clean run of the same fleet: every round completes, the honest agents'
accuracy on their held-out data stays near the clean run's, and the coordinator's reported accuracy
near what the honest agents measure. Run with ``-s`` to see the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import Update
from protocol.topics import Topics
from tests.integration.wire import WireRecorder, assert_all_completed, decode_wire, wait_for_rounds

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

FEDERATION = "steer"
ROUNDS = 6
HONEST = [AgentSpec(f"phone-{i}", "phone", i) for i in range(3)]
SCENARIOS: dict[str, dict[str, Any]] = {
    "clean": {},
    "steer": {"attack": "scaling", "attack_scale": 9.0, "attack_claim_samples": 1_000_000,
              "attack_report_accuracy": 0.99},
    "flip": {"attack": "sign_flip", "attack_scale": 9.0},
    "noise": {"attack": "gaussian_noise", "attack_scale": 1000.0},
}
COORDINATOR: dict[str, Any] = {}
"""Settings beyond the defaults (none: the defaults are what is tested)."""
MARGIN = 0.10
"""The honest agents' accuracy against the clean run's (measured: within 5 points; before the bounds one such
attacker took them to 0.14 and 0.02): a guard against the behaviour coming back, not a benchmark."""
REPORT_MARGIN = 0.05
"""The coordinator's reported accuracy against what the honest agents measure (measured: within 2.5 points)."""


@dataclass(frozen=True)
class Outcome:
    outcomes: list[str]
    honest_accuracy: float
    """The honest agents' mean held-out accuracy of the final model (their own evaluation answers)."""
    reported_accuracy: float
    """What the coordinator's final evaluation summary says (its bounded-weight mean)."""
    reported_median: float
    clipped_claims: int
    clipped_norms: int
    bootstrap_rejected: int
    """Round 1's rejected count in rounds.jsonl: the proposals outvoted by the majority."""


def run(tmp_path: Path, name: str) -> Outcome:
    attacker = AgentSpec("phone-3", "phone", 3, settings=SCENARIOS[name])
    with MosquittoBroker(workdir=tmp_path / name / "broker") as broker, \
            WireRecorder(broker.url, f"fl/{FEDERATION}/updates/#") as wire:
        fleet = Fleet(tmp_path / name / "run", broker.url, FleetSpec(agents=[*HONEST, attacker], partition="iid"), {
            "rounds": ROUNDS, "min_available_agents": 4, "min_fit_agents": 4, "round_deadline_s": 60.0,
            **COORDINATOR,
        }, federation=FEDERATION)
        with fleet:
            rounds = wait_for_rounds(fleet, ROUNDS + 1, 400)
        updates = [decode_wire(m.payload, Update) for m in wire.snapshot()
                   if Topics(FEDERATION).parse(m.topic).kind == "update"]
    final = [u for u in updates if u.task == "evaluate" and u.agent_id in {a.name for a in HONEST}]
    assert len(final) == len(HONEST), [u.agent_id for u in updates if u.task == "evaluate"]
    evaluation = rounds[-1]
    return Outcome(
        outcomes=[r["outcome"] for r in rounds],
        honest_accuracy=sum(u.metrics.eval_accuracy for u in final) / len(final),  # type: ignore[misc]
        reported_accuracy=evaluation["accuracy"], reported_median=evaluation["accuracy_median"],
        clipped_claims=sum(len(r.get("clipped_claims", [])) for r in rounds),
        clipped_norms=sum(len(r.get("clipped_norms", [])) for r in rounds),
        bootstrap_rejected=rounds[0]["rejected"],
    )


def test_one_enrolled_attacker_among_four(tmp_path: Path) -> None:
    results = {name: run(tmp_path, name) for name in SCENARIOS}
    clean = results["clean"]
    for name, outcome in results.items():
        print(f"{name:6} honest {outcome.honest_accuracy:.3f}  reported {outcome.reported_accuracy:.3f} "
              f"(median {outcome.reported_median:.3f})  clipped claims {outcome.clipped_claims}, "
              f"norms {outcome.clipped_norms}  bootstrap rejected {outcome.bootstrap_rejected}  "
              f"rounds {outcome.outcomes}")
    for name, outcome in results.items():
        assert_all_completed([{"outcome": o} for o in outcome.outcomes], ROUNDS + 1)
        assert outcome.honest_accuracy >= clean.honest_accuracy - MARGIN, (name, outcome, clean)
        assert abs(outcome.reported_accuracy - outcome.honest_accuracy) <= REPORT_MARGIN, (name, outcome)
    assert results["clean"].bootstrap_rejected == 0
    for name in ("steer", "flip", "noise"):  # every attacker's first-state proposal was outvoted and counted
        assert results[name].bootstrap_rejected == 1, (name, results[name])
    assert results["steer"].clipped_claims >= ROUNDS  # its claim was cut every training round
    assert results["flip"].clipped_norms >= ROUNDS - 1 and results["noise"].clipped_norms >= ROUNDS - 1
