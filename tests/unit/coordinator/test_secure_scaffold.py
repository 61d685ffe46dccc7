"""SCAFFOLD under secure aggregation: agents mask their control delta beside their delta in one vector, and the
unmasked sum gives the new x and c a plain round of the same survivors gives (coordinator/strategies/scaffold.py),
within the quantisation step. The engine and the agents' real secure side, as in test_secure_rounds.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.aggregation.aggregator import build_aggregator
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.base import FamilyState
from coordinator.strategies.scaffold import Scaffold
from edge_agent.secure import SecureParticipant
from edge_agent.state import AgentStateDir
from protocol.messages import GlobalState, TrainMetrics, Update
from protocol.secagg.vector import decode_sum, encode_input, quantiser, vector_length
from protocol.secagg.wire import SecureFamily, SecureSetup
from tests.unit.coordinator.test_engine import DIGITS, TOPICS, update, weights
from tests.unit.coordinator.test_secure_rounds import AGENTS, SAMPLES, SECURE, Fleet, deltas

CLIP, CONTROL_CLIP = 2.0, 0.5
SCAFFOLD = {"algorithm": "scaffold", "momentum": 0.0, "secagg_control_clip": CONTROL_CLIP}
START_CONTROL = 0.25
"""The control delta every agent proposes in the bootstrap round: c starts there (all four answer of four)."""


def scaffold_fleet(tmp_path: Path, **overrides: object) -> Fleet:
    return Fleet(tmp_path, bootstrap={"control_delta": weights(START_CONTROL)}, **SCAFFOLD, **overrides)


def control_deltas(seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {a: {"w": rng.normal(0, 0.3, (2, 3)).astype(np.float32), "b": rng.normal(0, 0.3, 3).astype(np.float32)}
            for a in AGENTS}


def plain_round(base: GlobalState, sent: dict[str, dict[str, np.ndarray]],
                controls: dict[str, dict[str, np.ndarray]], settings: CoordinatorSettings) -> FamilyState:
    """What plain SCAFFOLD makes of the survivors' values, clipped as the agents clip them, 4 agents known."""
    strategy = Scaffold(build_aggregator(settings))
    strategy.states = {"f": FamilyState(round=2, weights=dict(base.weights), control=dict(base.control))}
    strategy.begin_round(len(sent))
    updates = [strategy.accumulate(Update(
        run_id="r", agent_id=a, round=2, task="train", task_ref=DIGITS, family="f", base_digest=base.digest,
        num_samples=SAMPLES[a], metrics=TrainMetrics(),
        delta={n: np.clip(v, -CLIP, CLIP) for n, v in sent[a].items()},
        control_delta={n: np.clip(v, -CONTROL_CLIP, CONTROL_CLIP) for n, v in controls[a].items()}))
        for a in sorted(sent)]
    strategy.aggregate(2, updates, {"f": len(AGENTS)})
    return strategy.states["f"]


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_a_secure_scaffold_round_with_a_dropout_gives_the_plain_rounds_x_and_c(tmp_path: Path,
                                                                              compression: str) -> None:
    fleet = scaffold_fleet(tmp_path, compression=compression)
    ann, base = fleet.announcement(), fleet.state(2)
    assert ann.algorithm == "scaffold" and ann.secure is not None and ann.secure.control_clip == CONTROL_CLIP
    session = ann.secure.families["f"]
    assert session.n_params == 2 * 9 + 1  # the delta's 9 values, the control delta's 9, the weight
    np.testing.assert_array_equal(base.control["w"], np.full((2, 3), START_CONTROL, np.float32))
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()  # keys and shares: the inboxes are out
    sent, controls = deltas(6), control_deltas(7)
    controls["a"]["w"][0, 0] = 3.0  # beyond the control clip: clipped to 0.5 on the device
    del sent["c"], controls["c"]  # c shared, then vanished before masking
    fleet.train(sent, controls=controls)
    fleet.pump(gone=frozenset({"c"}))
    fleet.clock.now += 31  # the masking deadline: c is dropped
    fleet.pump(gone=frozenset({"c"}))
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (2, "completed", 3), summary
    assert summary.secure["families"]["f"]["survivors"] == ["a", "b", "d"]
    fleet.engine.tick()
    new = fleet.state(3)
    plain = plain_round(base, sent, controls, fleet.engine.engine.settings)
    step = quantiser(ann.secure, session).step
    # Each value is off by at most a step per agent, the weight by as much (a few steps in all), and the states
    # are float32 around 1 (one ulp, 2^-23); a control value's step is control_clip / clip times the delta's.
    for name in ("w", "b"):
        np.testing.assert_allclose(new.weights[name], plain.weights[name], atol=8 * step + 2**-23, rtol=0)
        np.testing.assert_allclose(new.control[name], plain.control[name],
                                   atol=8 * step * CONTROL_CLIP / CLIP + 2**-24, rtol=0)
    # c moved by |S|/N = 3/4 of the survivors' sample-weighted mean control delta, a's clipped value included.
    total = sum(SAMPLES[a] for a in sent)
    moved = sum(np.clip(controls[a]["w"][0, 0], -CONTROL_CLIP, CONTROL_CLIP) * SAMPLES[a] for a in sent) / total
    assert new.control["w"][0, 0] == pytest.approx(START_CONTROL + 0.75 * moved, abs=8 * step)


def test_a_control_delta_beyond_its_clip_is_clipped_on_the_device(tmp_path: Path) -> None:
    fleet = scaffold_fleet(tmp_path)
    ann = fleet.announcement()
    assert ann.secure is not None
    audit = AgentStateDir(tmp_path / "agent-a")
    fleet.agents["a"] = SecureParticipant("a", "f", TOPICS, lambda t, p: fleet.up.append((t, p)), lambda b: b,
                                          audit=audit)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    control = {"w": np.full((2, 3), 0.1, np.float32), "b": np.array([3.0, -7.0, 0.2], np.float32)}
    fleet.train({"a": weights(0.5)}, controls={"a": control})
    stored = audit.read_arrays("secagg-input-2")
    assert stored is not None
    w = SAMPLES["a"] / 40  # min(samples, weight_cap) / weight_cap: the cap is the largest claim, 40
    scale = CLIP / CONTROL_CLIP  # a control value shares the delta's grid: [-0.5, 0.5] onto [-2, 2]
    # Layout: the delta's b (3) and w (6), then the control delta's b and w, then the weight.
    np.testing.assert_allclose(stored["plain"][9:12], np.array([0.5, -0.5, 0.2]) * scale * w, rtol=1e-6)
    np.testing.assert_allclose(stored["plain"][12:18], 0.1 * scale * w, rtol=1e-6)
    assert stored["plain"][-1] == pytest.approx(CLIP * w)


def test_the_vector_reads_back_the_delta_and_control_delta_sums() -> None:
    like = {"w": np.zeros((2, 3), np.float32), "n": np.zeros((), np.int64)}
    control_like = {"w": np.zeros((2, 3), np.float32)}
    family = SecureFamily(roster=["a", "b"], graph_seed=bytes(32), degree=1, threshold=1,
                          n_params=vector_length(like, control_like), weight_cap=10)
    setup = SecureSetup(clip=1.0, advertise_s=1, share_s=1, unmask_s=1, families={"f": family}, control_clip=0.01)
    assert family.n_params == 13
    inputs = [({"w": np.full((2, 3), v, np.float32), "n": np.array(3)}, {"w": np.full((2, 3), c, np.float32)}, n)
              for v, c, n in ((0.5, 0.004, 10), (-0.25, -0.02, 5))]
    rings = [encode_input(d, setup, family, n, c)[1] for d, c, n in inputs]
    total = (rings[0].astype(np.uint64) + rings[1]).astype(np.uint32)
    sums, weight = decode_sum(total, 2, like, setup, family, control_like)
    step = quantiser(setup, family).step
    assert weight == pytest.approx(1.5, abs=2 * step)
    np.testing.assert_allclose(sums["delta"]["w"], 0.5 - 0.25 * 0.5, atol=2 * step)
    expected = float(np.float32(0.004)) - 0.01 * 0.5  # a's float32 value; b's -0.02 clipped to -control_clip
    np.testing.assert_allclose(sums["control_delta"]["w"], expected, atol=2 * step * 0.01)
    assert set(sums) == {"delta", "control_delta"} and set(sums["delta"]) == {"w"}  # counters are not summed
    with pytest.raises(ValueError, match="masks a control delta"):
        encode_input(inputs[0][0], setup, family, 10)
    plain_setup = setup.model_copy(update={"control_clip": None})
    with pytest.raises(ValueError, match="declares no control_clip"):
        encode_input(inputs[0][0], plain_setup, family, 10, inputs[0][1])


def test_a_scaffold_agent_without_a_control_delta_sends_nothing(tmp_path: Path) -> None:
    fleet = scaffold_fleet(tmp_path)
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    fleet.up.clear()
    plain = update(fleet.engine, "a", 2, samples=SAMPLES["a"], delta=weights(0.5))
    assert fleet.agents["a"].takes(plain)  # taken (never sent in the clear), but it cannot be masked
    assert fleet.agents["a"].client is None and not fleet.up


def test_fedavg_rounds_mask_no_control_and_every_algorithm_starts_securely_on_the_mean(tmp_path: Path) -> None:
    ann = Fleet(tmp_path).announcement()
    assert ann.secure is not None and ann.secure.control_clip is None
    assert ann.secure.families["f"].n_params == 9 + 1
    assert CoordinatorSettings(**{**SECURE, "enrollment": "open", **SCAFFOLD}).algorithm == "scaffold"
    assert CoordinatorSettings(**{**SECURE, "enrollment": "open", "algorithm": "fedproto"}).algorithm == "fedproto"
    with pytest.raises(ValidationError, match="aggregator median needs every individual update"):
        CoordinatorSettings(**{**SECURE, "enrollment": "open", "algorithm": "fedproto", "aggregator": "median"})


def settling(fleet: Fleet, states: Path | None = None,
             calls: list[tuple[str, int, bool]] | None = None) -> list[tuple[str, int, bool]]:
    """Participants that record ``settled`` calls, as (agent, round, counted); with ``states``, each keeps what it
    must settle in its own state dir there (built again on the same dirs: a restart)."""
    calls = [] if calls is None else calls
    for agent in AGENTS:
        fleet.agents[agent] = SecureParticipant(
            agent, "f", TOPICS, lambda t, p: fleet.up.append((t, p)), lambda b: b,
            settled=lambda run, number, counted, agent=agent: calls.append((agent, number, counted)),
            state=AgentStateDir(states / agent) if states is not None else None)
    return calls


def run_with_a_late_agent(fleet: Fleet) -> None:
    """A secure round that completes without c, whose masked input comes after its stage closed (refused)."""
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent, controls = deltas(8), control_deltas(9)
    late, late_control = {"c": sent.pop("c")}, {"c": controls.pop("c")}
    fleet.train(sent, controls=controls)
    fleet.pump(gone=frozenset({"c"}))
    fleet.clock.now += 31  # masking closes without c
    fleet.pump(gone=frozenset({"c"}))
    assert fleet.engine.last_summary.outcome == "completed"
    fleet.train(late, controls=late_control)  # c's masked input after its stage closed: refused
    fleet.pump()


def test_the_next_announcement_settles_whose_masked_input_was_counted(tmp_path: Path) -> None:
    """The worker commits a SCAFFOLD variate before masking: a late agent must learn its input was not counted."""
    fleet = scaffold_fleet(tmp_path)
    calls = settling(fleet)
    run_with_a_late_agent(fleet)
    assert not calls  # nothing is settled before the next announcement
    fleet.engine.tick()
    following = fleet.announcement()
    assert following.round == 3 and following.states["f"].round == 3
    for participant in fleet.agents.values():
        participant.begin(following)
    assert sorted(calls) == [("a", 2, True), ("b", 2, True), ("c", 2, False), ("d", 2, True)]


def test_a_round_that_fails_after_the_unmasking_request_counts_nobody(tmp_path: Path) -> None:
    fleet = scaffold_fleet(tmp_path)
    calls = settling(fleet)
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    fleet.train(deltas(10), controls=control_deltas(11))
    fleet.pump(gone=frozenset({"c", "d"}))  # a and b are named survivors and reveal; c and d never do
    fleet.clock.now += 5.0
    fleet.pump()
    assert fleet.engine.last_summary.outcome == "failed"
    fleet.engine.tick()
    following = fleet.announcement()
    assert following.round == 3 and following.states["f"].round == 2  # the state did not advance
    for participant in fleet.agents.values():
        participant.begin(following)
        participant.begin(following)  # settled once
    assert sorted(calls) == [(a, 2, False) for a in AGENTS]


def test_a_restart_after_revealing_still_settles_the_round(tmp_path: Path) -> None:
    """What an agent must settle is kept in its state dir: restarted before the next announcement, it still learns
    whether its input was counted (and a late one, that it was not)."""
    fleet = scaffold_fleet(tmp_path)
    calls = settling(fleet, tmp_path / "agents")
    run_with_a_late_agent(fleet)
    settling(fleet, tmp_path / "agents", calls)  # every agent restarts: new participants, the same state dirs
    fleet.engine.tick()
    following = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(following)
    assert sorted(calls) == [("a", 2, True), ("b", 2, True), ("c", 2, False), ("d", 2, True)]
    assert not any((tmp_path / "agents" / a / "secagg-pending.json").exists() for a in AGENTS)  # settled once


def test_an_agent_restarted_between_uploading_and_the_unmasking_request_learns_it_was_counted(tmp_path: Path) -> None:
    """Its session died with the process, so it cannot reveal; its neighbours' shares rebuild its self-mask, and the
    request its broker session delivers after the restart names it: its variate step stands."""
    fleet = scaffold_fleet(tmp_path)
    calls = settling(fleet, tmp_path / "agents")
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    fleet.train(deltas(12), controls=control_deltas(13))
    fleet.agents["a"] = SecureParticipant(  # a restarts with its masked input uploaded, before the request
        "a", "f", TOPICS, lambda t, p: fleet.up.append((t, p)), lambda b: b,
        settled=lambda run, number, counted: calls.append(("a", number, counted)),
        state=AgentStateDir(tmp_path / "agents" / "a"))
    fleet.pump()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome) == (2, "completed"), summary
    assert summary.secure["families"]["f"]["recovered"]["self_masks"] == ["a"]
    fleet.engine.tick()
    following = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(following)
    assert sorted(calls) == [(a, 2, True) for a in AGENTS]
