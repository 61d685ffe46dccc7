"""Device-side DP-SGD under secure aggregation, over a real Mosquitto: three DP agents (a fixed noise multiplier)
run the same two rounds twice, once plain and once secure. The secure round completes with every DP agent
among its survivors, no plain update of it crosses the broker, and each agent's accountant is charged for it
exactly as for the plain round (the same history of noise multiplier, sample rate and steps, so the same
epsilon), which is also the epsilon its statuses report. Masking changes nothing about a DP agent's spending."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_agent.privacy.ledger import STATE_NAME
from edge_agent.state import AgentStateDir
from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import AgentStatus, RoundAnnouncement, Update
from protocol.secagg.wire import SecureMasked
from protocol.topics import Topics
from tests.integration.wire import WireRecorder, decode_wire, wait_for_rounds, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AGENTS = ("phone-0", "phone-1", "phone-2")
"""Phones: the digits task's smallest family (mlp_tiny), so Opacus's per-sample gradients cost little."""
NOISE = 1.1
DP = {"dp": True, "dp_noise_multiplier": NOISE, "heartbeat_s": 1}
COMMON = {"rounds": 2, "evaluate_final": False, "min_available_agents": 3, "min_fit_agents": 3, "local_epochs": 1,
          "max_norm_ratio": 0, "claim_cap_multiple": 0, "round_deadline_s": 30}
SECURE = {"secure_aggregation": True, "secagg_clip": 0.5, "secagg_stage_s": 5}


def run(run_dir: Path, url: str, federation: str, settings: dict[str, Any]) -> tuple[list[dict], dict[str, dict]]:
    """Two rounds of a fresh fleet (round 1 bootstraps in the clear and spends nothing; round 2 trains): the
    rounds log and each agent's saved ledger (``privacy.json``)."""
    spec = FleetSpec(agents=[AgentSpec(name, "phone", i) for i, name in enumerate(AGENTS)], alpha=1.0,
                     agent_settings=DP)
    fleet = Fleet(run_dir, url, spec, {**COMMON, **settings}, federation=federation)
    with fleet:
        rounds = wait_for_rounds(fleet, 2, 180)
        for name in AGENTS:
            assert fleet.agents[name].wait(60) == 0, fleet.agents[name].log_tail()
    ledgers = {name: AgentStateDir(fleet.agent_dir(name)).read_json(STATE_NAME) for name in AGENTS}
    assert all(ledger is not None for ledger in ledgers.values()), ledgers
    return rounds, ledgers  # type: ignore[return-value]


def last_reported(recorder: WireRecorder, topics: Topics) -> dict[str, float]:
    """The epsilon in each agent's last status (its retained 'offline' one, sent as it exits)."""
    out: dict[str, float] = {}
    for seen in recorder.snapshot(lambda s: bool(s.payload) and s.topic.startswith(topics.root + "/")):
        parsed = topics.parse(seen.topic)
        if parsed.kind == "agent_status":
            status = decode_wire(seen.payload, AgentStatus)
            assert status.privacy is not None
            out[status.agent_id] = status.privacy.epsilon
    return out


def test_dp_agents_spend_the_same_budget_in_a_secure_round_as_in_a_plain_one(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    plain_topics, secure_topics = Topics("dp-plain"), Topics("dp-secure")
    plain_rounds, plain = run(tmp_path / "plain", mosquitto.url, "dp-plain", {})
    secure_rounds, secure = run(tmp_path / "secure", mosquitto.url, "dp-secure", SECURE)
    seen = recorder.snapshot()

    # The secure round completed with every DP agent's masked input in the sum, and nothing plain of it was sent.
    secure_round = secure_rounds[1]
    assert (secure_round["round"], secure_round["outcome"], secure_round["answered"]) == (2, "completed", 3), \
        secure_round
    (account,) = secure_round["secure"]["families"].values()
    assert account["survivors"] == sorted(AGENTS)
    assert not [m for m in seen if m.topic.startswith("fl/dp-secure/updates/") and m.topic.endswith("/2")]
    masked = [decode_wire(m.payload, SecureMasked) for m in seen
              if m.topic.startswith("fl/dp-secure/") and secure_topics.parse(m.topic).stage == "masked"]
    assert sorted(m.agent_id for m in masked) == sorted(AGENTS)
    assert all(m.round == 2 and m.train_loss is None for m in masked)  # DP sends no loss on training records
    assert (plain_rounds[1]["round"], plain_rounds[1]["outcome"], plain_rounds[1]["answered"]) == (2, "completed", 3)
    assert plain_rounds[1].get("secure") is None

    # Each accountant was charged once (the bootstrap spends nothing), for the same steps, either way.
    for name in AGENTS:
        (entry,) = plain[name]["history"]
        sigma, rate, steps = entry
        assert sigma == NOISE and 0 < rate <= 1 and steps >= 1
        assert secure[name]["history"] == plain[name]["history"], name
        assert secure[name]["rounds"] == plain[name]["rounds"] == 1
        assert secure[name]["epsilon"] == plain[name]["epsilon"] > 0

    # What the agents report is what they were charged: in their updates (plain) and their statuses (both).
    plain_updates = [decode_wire(m.payload, Update) for m in seen
                     if m.topic.startswith("fl/dp-plain/updates/") and m.topic.endswith("/2")]
    assert sorted(u.agent_id for u in plain_updates) == sorted(AGENTS)
    for update in plain_updates:
        assert update.privacy is not None and update.privacy.epsilon == plain[update.agent_id]["epsilon"]
    for topics, ledgers in ((plain_topics, plain), (secure_topics, secure)):
        assert last_reported(recorder, topics) == {name: ledgers[name]["epsilon"] for name in AGENTS}


def test_an_agent_whose_secure_round_spent_its_budget_is_not_selected_again(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    spent = "phone-3"
    # Calibrated to spend its whole budget in one round; no heartbeat in the run, so only an immediate status counts.
    agents = [AgentSpec(name, "phone", i) for i, name in enumerate(AGENTS)] + [AgentSpec(spent, "phone", 3, settings={
        "dp_noise_multiplier": None, "dp_target_epsilon": 4.0, "dp_planned_rounds": 1})]
    spec = FleetSpec(agents=agents, alpha=1.0, agent_settings={**DP, "heartbeat_s": 600})
    fleet = Fleet(tmp_path / "run", mosquitto.url, spec, {**COMMON, **SECURE, "rounds": 3, "round_deadline_s": 15},
                  federation="dp-spent")
    topics = Topics("dp-spent")
    try:
        # It goes first and is online before round 1 opens (its noise calibration makes it the slowest to start:
        # a clean-clone CI run opened rounds 1 and 2 with the other three, 3 being enough), so round 2 selects it.
        fleet.start_coordinator()
        fleet.agents[spent].start()
        wait_until(lambda: any(m.topic == topics.agent_status(spent) and m.payload for m in recorder.snapshot()), 120,
                   f"{spent}'s first status")
        for name in AGENTS:
            fleet.agents[name].start()
        rounds = wait_for_rounds(fleet, 3, 180)
    finally:
        fleet.stop()
    assert [r["outcome"] for r in rounds] == ["completed"] * 3, rounds
    assert spent in rounds[1]["secure"]["families"]["mlp_tiny"]["survivors"]  # it trained in round 2 and spent
    ledger = AgentStateDir(fleet.agent_dir(spent)).read_json(STATE_NAME)
    assert ledger is not None and ledger["rounds"] == 1
    announced = {a.round: a for a in (decode_wire(m.payload, RoundAnnouncement) for m in recorder.snapshot()
                                      if m.topic == topics.rounds_current and m.payload)}
    assert spent not in announced[3].selected  # as in a plain round, where its update says it is spent
