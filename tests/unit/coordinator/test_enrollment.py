"""Only enrolled agents, by their signatures; bounded weights and update sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator.fleet.enrollment import enroll
from coordinator.state.rounds import RoundSummary
from protocol.messages import AgentStatus
from protocol.security.signing import SigningKey
from protocol.wire import encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, make_engine, update, weights

KEYS = {name: SigningKey.generate() for name in ("a", "b", "c", "mallory")}


def signed_status(agent_id: str, key: SigningKey) -> bytes:
    status = AgentStatus(agent_id=agent_id, state="online", device="rpi", family="f", num_samples=10,
                         num_eval_samples=2, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT)
    return encode_message(key.seal(encode_message(status)))


def rejected(metrics: object, kind: str, reason: str) -> float:
    return metrics.registry.get_sample_value("fl_messages_rejected_total",  # type: ignore[attr-defined]
                                             {"kind": kind, "reason": reason})


def test_only_enrolled_agents_by_their_own_keys_enter_the_registry(tmp_path: Path) -> None:
    clock = Clock()
    enrolled = tmp_path / "state" / "enrolled.json"
    enroll(enrolled, "a", KEYS["a"].public_key)
    engine, _, metrics = make_engine(tmp_path, clock, enrollment="required")
    engine.on_message(TOPICS.agent_status("a"), signed_status("a", KEYS["a"]))
    engine.on_message(TOPICS.agent_status("b"), signed_status("b", KEYS["b"]))  # not enrolled yet
    engine.on_message(TOPICS.agent_status("a"), signed_status("a", KEYS["mallory"]))
    engine.on_message(TOPICS.agent_status("x"), encode_message(AgentStatus(
        agent_id="x", state="online", device="rpi", family="f", num_samples=1, num_eval_samples=1, version="t",
        timestamp=0.0, task_ref=DIGITS, layout=LAYOUT)))
    engine.on_message(TOPICS.agent_status("b"), signed_status("a", KEYS["a"]))  # a's status replayed as b's
    assert engine.parts.registry.get("a") is not None and engine.parts.registry.get("b") is None
    assert rejected(metrics, "agent_status", "unknown_signer") == 2
    assert rejected(metrics, "agent_status", "unsigned") == 1
    assert rejected(metrics, "agent_status", "topic_mismatch") == 1

    enroll(enrolled, "b", KEYS["b"].public_key)  # enrolled while the coordinator runs: no restart
    clock.now += 2
    engine.on_message(TOPICS.agent_status("b"), signed_status("b", KEYS["b"]))
    assert engine.parts.registry.get("b") is not None


def test_claimed_weights_are_capped_and_outsized_deltas_clipped(tmp_path: Path) -> None:
    """No update counts for more than the coordinator allows, nor moves the model by more than max_norm_ratio x
    the round's median delta: both are cut, counted, and named in the round's summary, none is rejected."""
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, max_samples_per_update=100, max_norm_ratio=2.0, claim_cap_multiple=2.0,
                                     min_available_agents=3, min_fit_agents=3)
    closed: list[RoundSummary] = []
    engine.on_round_closed = closed.append
    from tests.unit.coordinator.test_engine import hello, send

    for agent_id in ("a", "b", "c"):
        hello(engine, agent_id)
    engine.tick()
    for agent_id in ("a", "b", "c"):
        send(engine, update(engine, agent_id, 1))
    engine.tick()
    before = engine.strategy.states["f"].weights["w"].copy()
    engine.tick()
    send(engine, update(engine, "a", 2, samples=10**9))  # statuses said 10: counts for 2 x 10
    send(engine, update(engine, "b", 2, delta={k: v * 1e6 for k, v in weights(0.5).items()}))
    send(engine, update(engine, "c", 2))
    engine.tick()
    summary = closed[-1]
    assert summary.outcome == "completed" and summary.answered == 3 and rejected(metrics, "update", "schema") == 0
    assert summary.clipped_claims == ["a"] and summary.clipped_norms == ["b"]
    counted = {w: metrics.registry.get_sample_value("fl_updates_clipped_total", {"what": w}) for w in ("claim", "norm")}
    assert counted == {"claim": 1.0, "norm": 1.0}
    # a: 0.5 weighing 20, b: clipped to 2 x the median norm (c's, 0.5 per entry) weighing 10, c: 0.5 weighing 10
    step = engine.strategy.states["f"].weights["w"] - before
    np.testing.assert_allclose(step, (20 * 0.5 + 10 * 1.0 + 10 * 0.5) / 40, rtol=1e-5)
