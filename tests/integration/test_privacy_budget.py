"""A DP agent's budget over a real Mosquitto, with real processes: it survives restarts and new runs,
and once spent the agent says so and the coordinator stops selecting it for training."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import AgentStatus, CoordinatorStatus, RoundAnnouncement, Update
from protocol.topics import Topics
from tests.integration.wire import (
    WireRecorder,
    assert_all_completed,
    decode_wire,
    metric,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FEDERATION = "privacy"
TOPICS = Topics(FEDERATION)
DP_ENV = {"FL_AGENT_DP": "true", "FL_AGENT_DP_TARGET_EPSILON": "4", "FL_AGENT_DP_PLANNED_ROUNDS": "2",
          "FL_AGENT_HEARTBEAT_S": "1"}
COMMON = {"local_epochs": 1, "learning_rate": 0.1, "min_available_agents": 1, "min_fit_agents": 1,
          "round_deadline_s": 90, "agent_timeout_s": 120}


def since(recorder: WireRecorder, started: float, kind: str, agent_id: str | None = None) -> list:
    """Decoded messages of ``kind`` seen after ``started`` (monotonic), optionally from one agent."""
    model = {"agent_status": AgentStatus, "update": Update, "round": RoundAnnouncement,
             "coordinator_status": CoordinatorStatus}[kind]
    out = []
    for seen in recorder.snapshot(lambda s: s.at >= started and bool(s.payload)):
        parsed = TOPICS.parse(seen.topic)
        if parsed.kind == kind and (agent_id is None or parsed.agent_id == agent_id):
            out.append(decode_wire(seen.payload, model))
    return out


def test_budget_survives_restarts_and_runs_and_a_spent_agent_is_not_selected(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    run_dir = tmp_path / "run"
    spec = FleetSpec(agents=[AgentSpec("dp-0", "phone", 0), AgentSpec("plain-1", "phone", 1)], partition="iid")

    # Run A: two rounds, the DP agent alone. Round 1 bootstraps: its proposal is the seeded model, untrained,
    # which spends nothing; round 2 trains under DP-SGD and spends.
    run_a = Fleet(run_dir, mosquitto.url, spec, {**COMMON, "rounds": 2, "evaluate_final": False},
                  federation=FEDERATION)
    run_a.agents["dp-0"].env.update(DP_ENV)
    try:
        run_a.enroll()
        run_a.coordinator.start()
        run_a.agents["dp-0"].start()
        assert run_a.coordinator.wait(240) == 0, run_a.coordinator.log_tail()
        assert run_a.agents["dp-0"].wait(60) == 0, run_a.agents["dp-0"].log_tail()
    finally:
        run_a.stop()
    proposal, first = since(recorder, 0.0, "update", "dp-0")
    assert proposal.weights and proposal.privacy is not None and proposal.privacy.epsilon == 0
    assert first.privacy is not None and first.privacy.epsilon > 0 and not first.privacy.exhausted
    run_a_id = first.run_id

    # Run B: a new coordinator state dir, so a new run; the agent's state dir is the same.
    http_port = free_port()
    run_b = Fleet(run_dir, mosquitto.url, spec, {
        **COMMON, "rounds": 4, "state_dir": run_dir / "coordinator-b", "http_port": http_port,
        "exit_when_finished": False}, federation=FEDERATION)
    run_b.agents["dp-0"].env.update(DP_ENV)
    phase_b = time.monotonic()
    try:
        run_b.enroll()  # the new coordinator's key: the agents' copies are replaced, their own keys kept
        run_b.coordinator.start()
        # Start the agent only once run B is online: run A's retained 'finished' would make it exit.
        wait_until(lambda: any(s.run_id != run_a_id and s.state == "online"
                               for s in since(recorder, phase_b, "coordinator_status")), 120, "run B online")
        run_b.agents["dp-0"].start()
        wait_until(lambda: since(recorder, phase_b, "agent_status", "dp-0"), 120, "the rebooted agent's status")
        rebooted = since(recorder, phase_b, "agent_status", "dp-0")[0]
        assert rebooted.privacy is not None
        assert rebooted.privacy.epsilon == first.privacy.epsilon  # restored, not reset by the reboot or the run

        wait_until(lambda: len(since(recorder, phase_b, "update", "dp-0")) == 2, 180, "the DP agent's run B updates")
        bootstrap, second = since(recorder, phase_b, "update", "dp-0")
        assert bootstrap.weights and bootstrap.privacy == rebooted.privacy  # run B bootstraps too: nothing spent
        assert second.run_id != run_a_id and second.round == 2
        assert second.privacy is not None and second.privacy.epsilon > first.privacy.epsilon
        assert second.privacy.exhausted and second.privacy.epsilon <= 4.0  # the two planned rounds are spent
        wait_until(lambda: any(s.state == "budget_exhausted" for s in since(recorder, phase_b, "agent_status", "dp-0")),
                   60, "the DP agent to say its budget is spent")

        exhausted_at = time.monotonic()
        run_b.agents["plain-1"].start()
        rounds = wait_for_rounds(run_b, 5, 300, path=run_dir / "coordinator-b" / "rounds.jsonl")  # 4 and the evaluation
        samples = scrape(http_port)
        assert run_b.agents["plain-1"].wait(60) == 0, run_b.agents["plain-1"].log_tail()
        assert run_b.agents["dp-0"].wait(60) == 0, run_b.agents["dp-0"].log_tail()

        # After the run: one more reboot of the spent agent; it still says so, with the same epsilon.
        phase_c = time.monotonic()
        run_b.agents["dp-0"].start()
        assert run_b.agents["dp-0"].wait(120) == 0, run_b.agents["dp-0"].log_tail()
    finally:
        run_b.stop()

    # The coordinator did not select the spent agent to train again, though it stayed connected and said so;
    # it still scored the final model on its held-out data, which spends no budget.
    announcements = {a.round: a for a in since(recorder, phase_b, "round") if a.run_id == second.run_id}
    assert announcements[1].selected == announcements[2].selected == ["dp-0"]
    assert [(announcements[r].task, announcements[r].selected) for r in (3, 4)] == [("train", ["plain-1"])] * 2
    assert (announcements[5].task, announcements[5].selected) == ("evaluate", ["dp-0", "plain-1"])
    heard = since(recorder, exhausted_at, "agent_status", "dp-0")
    assert heard and all(s.state == "budget_exhausted" and s.privacy is not None and s.privacy.exhausted
                         and s.privacy.epsilon == second.privacy.epsilon for s in heard)
    answers = since(recorder, phase_b, "update", "dp-0")
    assert [(u.round, u.task) for u in answers] == [(1, "train"), (2, "train"), (5, "evaluate")]
    assert answers[2].privacy == second.privacy and not answers[2].delta and not answers[2].weights
    assert "this agent stops training" in run_b.agents["dp-0"].log_path.read_text()

    # Exported by device class and over the fleet, and written in the round summaries.
    assert metric(samples, "fl_privacy_epsilon", device="phone") == pytest.approx(second.privacy.epsilon)
    assert metric(samples, "fl_privacy_epsilon_max") == pytest.approx(second.privacy.epsilon)
    assert metric(samples, "fl_privacy_budget_exhausted_agents", device="phone") == 1.0
    assert_all_completed(rounds, 5)
    assert rounds[0]["epsilon_max"] == pytest.approx(first.privacy.epsilon)  # the bootstrap round spent nothing
    assert all(r["epsilon_max"] == pytest.approx(second.privacy.epsilon) and r["budget_exhausted"] == 1
               for r in rounds[1:])

    (last,) = [s for s in since(recorder, phase_c, "agent_status", "dp-0") if s.state != "offline"][:1]
    assert last.state == "budget_exhausted" and last.privacy is not None
    assert last.privacy.epsilon == second.privacy.epsilon
