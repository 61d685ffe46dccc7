"""The agent's loop under faults, driven message by message: no broker, a worker that answers at once."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edge_agent.agent import EdgeAgent
from edge_agent.data.datasets import Dataset
from edge_agent.profiles import get_profile
from edge_agent.state import AgentStateDir
from edge_agent.stragglers import OFF, PROFILE_DELAYS, DelayModel, parse_delay
from protocol.messages import CoordinatorStatus, GlobalState, LocalTraining, RoundAnnouncement, TrainMetrics, Update
from protocol.tasks import BUILTIN_CARDS
from protocol.topics import Topics
from protocol.transport.mqtt import BrokerAddress
from protocol.wire import encode_message
from tests.task_refs import DIGITS, layout
from tests.unit.edge_agent.links import FakeLink

TOPICS = Topics("t")
RUN = "run1"


class FakeWorker:
    family = "f"
    data = SimpleNamespace(train=Dataset(np.zeros((10, 1), np.float32), np.arange(10, dtype=np.int64) % 3, 3, "fake"),
                           held_out=[0] * 2)
    privacy = None
    task = SimpleNamespace(card=BUILTIN_CARDS["digits"])
    layout = layout({"w": np.ones(3, np.float32)})
    label_counts = np.bincount(data.train.y, minlength=10)

    def refusal(self, announcement: RoundAnnouncement) -> str | None:
        return None

    def __init__(self) -> None:
        self.answered: list[int] = []

    def privacy_spent(self) -> None:
        return None

    def answer(self, announcement: RoundAnnouncement, global_state: GlobalState | None) -> Update:
        self.answered.append(announcement.round)
        return Update(run_id=announcement.run_id, agent_id="me", round=announcement.round, task=announcement.task,
                      task_ref=DIGITS, family="f", base_digest=None, num_samples=10, weights={"w": np.ones(3, np.float32)},
                      metrics=TrainMetrics())


def make_agent(tmp_path: Path, straggler: DelayModel = OFF) -> tuple[EdgeAgent, FakeWorker, FakeLink]:
    worker = FakeWorker()
    agent = EdgeAgent("me", "t", BrokerAddress("localhost", 1883), get_profile("phone"), worker,  # type: ignore[arg-type]
                      AgentStateDir(tmp_path / "state"), straggler=straggler)
    link = FakeLink()
    agent._link = link  # type: ignore[assignment]
    return agent, worker, link


def announce(agent: EdgeAgent, number: int, *, retained: bool = False, selected: tuple[str, ...] = ("me", "x")) -> None:
    ann = RoundAnnouncement(run_id=RUN, round=number, task="train", task_ref=DIGITS,
                            layouts={FakeWorker.family: FakeWorker.layout}, algorithm="fedavg",
                            training=LocalTraining(epochs=1, learning_rate=0.1), selected=list(selected),
                            init_seed=0, issued_at=time.time(), deadline_s=10.0, last_round=5)
    agent._on_message(TOPICS.rounds_current, encode_message(ann), retained)


def coordinator(agent: EdgeAgent, session: str, state: str = "online") -> None:
    status = CoordinatorStatus(federation="t", run_id=RUN, session=session, state=state, round=1,  # type: ignore[arg-type]
                               algorithm="fedavg", version="t", timestamp=0.0)
    agent._on_message(TOPICS.coordinator_status, encode_message(status), True)


def test_a_process_started_mid_round_joins_from_the_next_round(tmp_path: Path) -> None:
    agent, worker, link = make_agent(tmp_path)
    coordinator(agent, "c1")
    announce(agent, 3, retained=True)  # selected before this process existed: its last life died in round 3
    assert worker.answered == [] and link.updates() == []
    announce(agent, 3)  # re-announced live (e.g. by a restarted coordinator): still the round it missed
    announce(agent, 4)
    assert worker.answered == [4] and link.updates() == [TOPICS.update("me", 4)]


def test_a_reconnecting_process_answers_a_round_it_missed(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    announce(agent, 1)
    announce(agent, 2, retained=True)  # announced while the connection was down: found retained
    assert worker.answered == [1, 2]


def test_a_round_already_answered_is_not_trained_again_after_a_restart(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    announce(agent, 1)
    again, worker_again, _ = make_agent(tmp_path)  # same state dir: the progress file says round 1 is done
    announce(again, 1)
    assert worker.answered == [1] and worker_again.answered == []


def test_a_new_coordinator_session_re_announcing_the_round_gets_the_update_again(tmp_path: Path) -> None:
    agent, worker, link = make_agent(tmp_path)
    coordinator(agent, "c1")
    announce(agent, 1)
    announce(agent, 1)  # a broker reconnect republishes it: same session, nothing to resend
    coordinator(agent, "c1", "offline")  # its last will
    coordinator(agent, "c2")  # restarted
    announce(agent, 1)
    announce(agent, 1)
    assert worker.answered == [1]
    assert link.updates() == [TOPICS.update("me", 1)] * 2
    first, second = [payload for topic, payload in link.published if "/updates/" in topic]
    assert first == second  # the very same bytes: the coordinator drops whichever copy comes second
    coordinator(agent, "c3")
    announce(agent, 2)  # a new round: nothing old is resent
    assert link.updates() == [TOPICS.update("me", 1)] * 2 + [TOPICS.update("me", 2)]


def test_a_straggler_holds_its_update_and_takes_no_new_round_meanwhile(tmp_path: Path) -> None:
    agent, worker, link = make_agent(tmp_path, DelayModel("constant", 30.0))
    announce(agent, 1)
    assert worker.answered == [1] and link.updates() == [] and agent._held is not None
    announce(agent, 2)  # still "computing" round 1
    assert worker.answered == [1]
    agent._release_held()
    assert link.updates() == [TOPICS.update("me", 1)]  # late for round 1, sent anyway
    assert worker.answered == [1, 2] and agent._held is not None  # round 2, held in turn


def test_not_selected_means_no_work(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    announce(agent, 1, retained=True, selected=("x", "y"))
    announce(agent, 2, selected=("x", "y"))
    assert worker.answered == []


@pytest.mark.parametrize(("text", "expected"), [
    ("off", DelayModel()), ("constant:2.5", DelayModel("constant", 2.5)), ("uniform:1,4", DelayModel("uniform", 1, 4)),
    ("lognormal:3,0.5", DelayModel("lognormal", 3, 0.5)), ("exponential:2", DelayModel("exponential", 2)),
    ("profile", PROFILE_DELAYS["phone"]),
])
def test_delay_specs_parse(text: str, expected: DelayModel) -> None:
    assert parse_delay(text, "phone") == expected


@pytest.mark.parametrize("text", ["sometimes", "constant", "constant:-1", "uniform:3", "uniform:4,1",
                                  "lognormal:0,1", "exponential:nan", "constant:x"])
def test_bad_delay_specs_name_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match="straggler_delay"):
        parse_delay(text, "phone")


def test_delays_are_reproducible_and_bounded() -> None:
    model = DelayModel("lognormal", 3.0, 1.0)
    draws = [model.sample("agent", r) for r in range(200)]
    assert draws == [model.sample("agent", r) for r in range(200)]
    assert all(0.0 <= d <= 3600.0 for d in draws) and len(set(draws)) > 150
    assert 1.5 < float(np.median(draws)) < 6.0
    assert all(1.0 <= DelayModel("uniform", 1, 4).sample("a", r) <= 4.0 for r in range(50))
    assert DelayModel().sample("a", 1) == 0.0
