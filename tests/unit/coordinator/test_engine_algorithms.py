"""SCAFFOLD and FedProto through the round engine: what is announced, counted and published."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator.app.driver import EngineDriver
from protocol.messages import AgentStatus, GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.tasks import BUILTIN_CARDS
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, make_engine, rejected, weights


def hello(engine: EngineDriver, agent_id: str, family: str) -> None:
    status = AgentStatus(agent_id=agent_id, state="online", device="rpi", family=family, num_samples=10,
                         num_eval_samples=2, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT)
    engine.on_message(TOPICS.agent_status(agent_id), encode_message(status))


def current(engine: EngineDriver) -> RoundAnnouncement:
    return decode_message(engine.outbox.last(TOPICS.rounds_current), RoundAnnouncement)  # type: ignore[attr-defined]


def send(engine: EngineDriver, agent_id: str, family: str, **payload: object) -> None:
    announcement = current(engine)
    ref = announcement.states.get(family)
    update = Update(run_id=engine.run.run_id, agent_id=agent_id, round=announcement.round, task="train", task_ref=DIGITS,
                    family=family, base_digest=ref.digest if ref else None, num_samples=10, metrics=TrainMetrics(),
                    **payload)  # type: ignore[arg-type]
    engine.on_message(TOPICS.update(agent_id, announcement.round), encode_message(update))


def test_scaffold_scales_the_server_variate_by_the_agents_the_coordinator_knows(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock, algorithm="scaffold", fraction_fit=0.5, min_fit_agents=2)
    for agent_id in "abcd":
        hello(engine, agent_id, "f")
    engine.tick()
    announcement = current(engine)
    assert announcement.training.momentum == 0.0 and len(announcement.selected) == 2
    assert announcement.training.steps is None  # epochs, unless the operator sets local_steps
    for agent_id in announcement.selected:
        send(engine, agent_id, "f", weights=weights(1.0), control_delta={"w": np.full((2, 3), 4.0, np.float32)})
    engine.tick()
    engine.tick()
    state = decode_message(outbox.last(TOPICS.global_state("f", 2)), GlobalState)
    np.testing.assert_allclose(state.control["w"], 2 / 4 * 4.0)  # 2 answered of the 4 known
    assert engine.last_summary.outcome == "completed"


def test_fedproto_announces_its_parameters_and_publishes_prototypes_to_every_family(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock, algorithm="fedproto", proto_lambda=0.5,
                                          proto_normalize=True, min_available_agents=3, min_fit_agents=3)
    for agent_id, family in (("a", "cnn_large"), ("b", "mlp_tiny"), ("c", "cnn_small")):
        hello(engine, agent_id, family)
    engine.tick()
    assert current(engine).params == {"lambda": 0.5, "normalize": True}
    card = BUILTIN_CARDS["digits"]
    protos = np.eye(card.num_classes, card.embedding_dim, dtype=np.float32)  # type: ignore[arg-type]

    def counts(*first: int) -> np.ndarray:  # samples of the first classes; none of the others
        return np.array([*first] + [0] * (card.num_classes - len(first)))

    send(engine, "a", "cnn_large", prototypes=protos, prototype_counts=counts(2, 0, 1))
    send(engine, "b", "mlp_tiny", delta=weights(0.5))  # not what fedproto asks for
    send(engine, "b", "mlp_tiny", prototypes=protos, prototype_counts=counts(0, 3, 0))
    send(engine, "c", "cnn_small", prototypes=protos[:, :2].copy(), prototype_counts=counts(1, 1, 1))
    assert rejected(metrics, "missing_payload") == 1 and rejected(metrics, "bad_shape") == 0
    # c's [10, 2] is not the task's [classes, embedding_dim]: refused on arrival, never in the bootstrap
    # vote (the strategy's own vote is tested in test_fedproto_strategy).
    assert rejected(metrics, "task_mismatch") == 1
    clock.now += 11  # c's answer never counted: the round closes at its deadline, with quorum
    engine.tick()
    assert engine.last_summary.outcome == "completed" and rejected(metrics, "bad_shape") == 0
    engine.tick()
    states = [decode_message(outbox.last(TOPICS.global_state(f, 2)), GlobalState)
              for f in ("cnn_large", "cnn_small", "mlp_tiny")]
    assert len({s.digest for s in states}) == 1 and not any(s.weights for s in states)
    assert states[0].prototype_counts.tolist() == counts(2, 3, 1).tolist()  # type: ignore[union-attr]
    assert sorted(current(engine).states) == ["cnn_large", "cnn_small", "mlp_tiny"]


def test_scaffold_control_deltas_travel_compressed_and_aggregate_like_plain_ones(tmp_path: Path) -> None:
    from protocol.compression import pack_arrays

    finals = {}
    for compression in ("none", "fp16"):
        engine, outbox, metrics = make_engine(tmp_path / compression, Clock(), algorithm="scaffold",
                                              compression=compression)
        hello(engine, "a", "f"), hello(engine, "b", "f")
        engine.tick()
        for agent_id in "ab":
            send(engine, agent_id, "f", weights=weights(1.0), control_delta={"w": np.full((2, 3), 4.0, np.float32)})
        engine.tick(), engine.tick()
        for agent_id, value in (("a", 0.5), ("b", 1.5)):
            delta, control = weights(value), {"w": np.full((2, 3), value, np.float32)}
            if compression == "none":
                send(engine, agent_id, "f", delta=delta, control_delta=control)
            else:
                send(engine, agent_id, "f", packed_delta=pack_arrays(delta, compression),
                     packed_control_delta=pack_arrays(control, compression))
        engine.tick(), engine.tick()
        assert engine.last_summary.round == 2 and engine.last_summary.outcome == "completed", engine.last_summary
        assert rejected(metrics, "bad_shape") == rejected(metrics, "compression_mismatch") == 0
        finals[compression] = decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState)
    np.testing.assert_array_equal(finals["fp16"].control["w"], finals["none"].control["w"])  # 0.5, 1.5 exact in fp16
    np.testing.assert_array_equal(finals["fp16"].weights["w"], finals["none"].weights["w"])


def test_local_steps_are_announced_to_every_agent(tmp_path: Path) -> None:
    engine, _, _ = make_engine(tmp_path, Clock(), algorithm="scaffold", local_steps=25, min_fit_agents=2)
    for agent_id in "ab":
        hello(engine, agent_id, "f")
    engine.tick()
    assert current(engine).training.steps == 25


def test_the_local_learning_rate_decays_once_a_round(tmp_path: Path) -> None:
    engine, _, metrics = make_engine(tmp_path, Clock(), learning_rate=0.08, learning_rate_decay=0.5)
    hello(engine, "a", "f"), hello(engine, "b", "f")
    announced = []
    for round_number in (1, 2, 3):
        engine.tick()
        announcement = current(engine)
        assert announcement.round == round_number
        announced.append(announcement.training.learning_rate)
        assert metrics.registry.get_sample_value("fl_round_learning_rate") == announced[-1]  # on the dashboard
        for agent_id in announcement.selected:
            payload = {"weights": weights(1.0)} if round_number == 1 else {"delta": weights(0.1)}
            send(engine, agent_id, "f", **payload)
        engine.tick()
        assert engine.last_summary.outcome == "completed", engine.last_summary
    assert announced == [0.08, 0.04, 0.02]
