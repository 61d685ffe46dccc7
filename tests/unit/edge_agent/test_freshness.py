"""Freshness on the agent: what an older run's coordinator signed is dropped, a newer run is followed, the run
survives a reboot, and the agent's own statuses are ordered. Driven message by message, no broker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from edge_agent.agent import EdgeAgent
from edge_agent.freshness import FILE, Freshness
from edge_agent.profiles import get_profile
from edge_agent.state import AgentStateDir
from protocol.messages import CoordinatorStatus, GlobalState, LocalTraining, Message, RoundAnnouncement, StateRef
from protocol.security.signing import SigningKey
from protocol.transport.chunking import split_payload
from protocol.transport.mqtt import BrokerAddress
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.edge_agent.links import FakeLink
from tests.unit.edge_agent.test_agent_faults import TOPICS, FakeWorker

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "freshness"
KEY = SigningKey.generate()
"""The coordinator's key: the same for both runs, so every replayed message verifies."""
A, B = ("run-a", 1_700_000_000_000), ("run-b", 1_700_000_900_000)
"""Two runs of that coordinator: (run id, epoch)."""


def make_agent(tmp_path: Path, *, pinned: bool = True) -> tuple[EdgeAgent, FakeWorker, FakeLink]:
    worker = FakeWorker()
    agent = EdgeAgent("me", "t", BrokerAddress("localhost", 1883), get_profile("phone"), worker,  # type: ignore[arg-type]
                      AgentStateDir(tmp_path / "state"), exit_when_finished=True,
                      coordinator_key=KEY.public_key if pinned else None)
    link = FakeLink()
    agent._link = link  # type: ignore[assignment]
    return agent, worker, link


def signed(message: Message) -> bytes:
    return encode_message(KEY.seal(encode_message(message)))


def signed_chunks(state: GlobalState, max_message_bytes: int) -> list[bytes]:
    """A state's signed envelope in chunks, each signed by the coordinator for the state's topic, as it publishes."""
    return split_payload(signed(state), max_message_bytes, KEY, TOPICS.global_state(state.family, state.round))


def coordinator(agent: EdgeAgent, run: tuple[str, int], state: str = "online") -> None:
    status = CoordinatorStatus(federation="t", run_id=run[0], session=f"s-{run[0]}", state=state, round=1,  # type: ignore[arg-type]
                               algorithm="fedavg", version="t", timestamp=0.0, epoch=run[1])
    agent._on_message(TOPICS.coordinator_status, signed(status), True)


def global_state(run: tuple[str, int], number: int, value: float = 1.0) -> GlobalState:
    arrays = {"w": np.full(3, value, np.float32)}
    return GlobalState(run_id=run[0], family=FakeWorker.family, round=number, weights=arrays, epoch=run[1],
                       digest=GlobalState.compute_digest(arrays, {}, None, None))


def publish_state(agent: EdgeAgent, state: GlobalState) -> None:
    agent._on_message(TOPICS.global_state(state.family, state.round), signed(state), True)


def announce(agent: EdgeAgent, run: tuple[str, int], number: int, state: GlobalState | None = None) -> None:
    states = {} if state is None else {state.family: StateRef(family=state.family, round=state.round,
                                                             digest=state.digest)}
    ann = RoundAnnouncement(run_id=run[0], round=number, task="train", task_ref=DIGITS,
                            layouts={FakeWorker.family: FakeWorker.layout}, algorithm="fedavg",
                            training=LocalTraining(epochs=1, learning_rate=0.1), selected=["me"], states=states,
                            init_seed=0, issued_at=time.time(), deadline_s=30.0, last_round=5, epoch=run[1])
    agent._on_message(TOPICS.rounds_current, signed(ann), False)


def test_an_older_runs_finished_status_and_last_round_replayed_change_nothing(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    coordinator(agent, B)
    announce(agent, B, 3)
    assert worker.answered == [3]
    announce(agent, A, 5)  # run A's last round, genuine and still within its deadline
    coordinator(agent, A, "finished")  # and its "finished" status
    assert not agent._finished() and agent.announcement is not None and agent.announcement.run_id == B[0]
    assert agent.rejected["stale_epoch"] == 2 and agent.status().rejected == 2
    announce(agent, B, 4)
    assert worker.answered == [3, 4]
    coordinator(agent, B, "finished")  # its own run's end stops it
    assert agent._finished()


def test_an_older_runs_global_states_do_not_push_out_this_runs(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    coordinator(agent, A)
    publish_state(agent, global_state(A, 3)), publish_state(agent, global_state(A, 4))  # run A's, before B started
    coordinator(agent, B)  # run B: what run A said is forgotten
    assert agent.global_states == {}
    publish_state(agent, global_state(A, 3)), publish_state(agent, global_state(A, 4))  # replayed, retained
    state = global_state(B, 2, value=0.5)
    publish_state(agent, state)
    announce(agent, B, 2, state)
    assert worker.answered == [2] and agent.rejected["stale_epoch"] == 2
    assert set(agent.global_states) == {2} and agent.global_states[2].epoch == B[1]


def test_a_rebooted_agent_keeps_following_its_run(tmp_path: Path) -> None:
    first, _, _ = make_agent(tmp_path)
    coordinator(first, B)
    announce(first, B, 1)
    again, worker, _ = make_agent(tmp_path)  # the same state directory: rebooted
    assert (again.freshness.epoch, again.freshness.run_id) == (B[1], B[0])
    coordinator(again, A, "finished")
    announce(again, A, 5)
    assert again.rejected["stale_epoch"] == 2 and not again._finished()
    announce(again, B, 2)
    assert worker.answered == [2]


def test_a_newer_run_is_followed_and_its_end_stops_the_agent(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    coordinator(agent, A)
    announce(agent, A, 5)
    coordinator(agent, B, "finished")  # run B started and finished while this agent was away
    assert agent.announcement is None and agent._finished()
    assert json.loads((tmp_path / "state" / f"{FILE}.json").read_text())["coordinator_epoch"] == B[1]


def test_the_end_of_another_run_of_the_same_epoch_is_inconsistent(tmp_path: Path) -> None:
    """Epoch 0: a coordinator that predates epochs, whose runs all share it (the check agents made before)."""
    agent, _, _ = make_agent(tmp_path)
    announce(agent, ("run-x", 0), 1)
    coordinator(agent, ("run-y", 0), "finished")
    assert agent.rejected["inconsistent"] == 1 and not agent._finished()
    coordinator(agent, ("run-x", 0), "finished")
    assert agent._finished()


def test_statuses_carry_the_process_epoch_and_a_rising_seq(tmp_path: Path) -> None:
    agent, _, _ = make_agent(tmp_path)
    first, second, will = agent.status(), agent.status(), agent.status("offline", will=True)
    assert (first.seq, second.seq, will.seq) == (1, 2, 0)
    assert first.epoch == second.epoch == will.epoch == agent.freshness.process_epoch > 0
    again, _, _ = make_agent(tmp_path)  # a restart: a higher epoch, counted from 1 again
    assert again.freshness.process_epoch > agent.freshness.process_epoch and again.status().seq == 1
    state = AgentStateDir(tmp_path / "state")
    set_back = Freshness(state, wall_clock=lambda: 1.0)  # a device whose clock went back: still higher
    assert set_back.process_epoch == again.freshness.process_epoch + 1


def test_an_agent_without_a_pinned_key_keeps_no_coordinator_epoch(tmp_path: Path) -> None:
    """Unverified messages could plant an epoch no genuine run reaches: it is not written down."""
    agent, _, _ = make_agent(tmp_path, pinned=False)
    coordinator(agent, B)
    assert agent.freshness.epoch == B[1]
    assert set(json.loads((tmp_path / "state" / f"{FILE}.json").read_text())) == {"process_epoch"}
    again, _, _ = make_agent(tmp_path, pinned=False)
    assert again.freshness.epoch == 0


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("*.json")
                                        if json.loads(p.read_text())["receiver"] == "agent"))
def test_the_golden_freshness_vectors_for_agents(tmp_path: Path, name: str) -> None:
    side = json.loads((GOLDEN / f"{name}.json").read_text())
    envelope = decode_message((GOLDEN / f"{name}.msgpack").read_bytes())
    message = decode_message(envelope.payload)  # type: ignore[attr-defined]
    for i, case in enumerate(side["cases"]):
        state = AgentStateDir(tmp_path / str(i))
        state.write_json(FILE, {"coordinator_epoch": case["state"]["epoch"], "run_id": case["state"]["run_id"],
                                "process_epoch": 1})
        verdict = Freshness(state).judge(message.epoch, message.run_id,  # type: ignore[attr-defined]
                                         ends_run=getattr(message, "state", "online") != "online")
        outcome = "drop" if verdict.reason else "follow" if verdict.advanced else "accept"
        assert (outcome, verdict.reason) == (case["outcome"], case["reason"]), case


def test_an_emptied_state_topic_or_another_familys_state_does_not_replace_the_one_kept(tmp_path: Path) -> None:
    """Anyone may empty a retained topic, and a genuine state of another family may be republished on ours: neither
    takes the verified state the next announcement names away (the round would wait for it forever)."""
    agent, worker, _ = make_agent(tmp_path)
    coordinator(agent, B)
    state = global_state(B, 2)
    publish_state(agent, state)
    agent._on_message(TOPICS.global_state(state.family, 2), b"", True)  # unsigned, as an emptied retained topic is
    other = global_state(B, 2, value=9.0).model_copy(update={"family": "other"})
    agent._on_message(TOPICS.global_state(state.family, 2), signed(other), True)  # genuine, on our family's topic
    assert agent.rejected["topic_mismatch"] == 1
    announce(agent, B, 2, state)
    assert worker.answered == [2] and agent.global_states[2].family == state.family
