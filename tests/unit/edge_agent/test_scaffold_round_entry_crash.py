"""A SCAFFOLD variate file whose ``round`` entry is not one integer made ``load_control`` raise TypeError or
OverflowError out of the agent loop (the process died at every round it was selected for), and ``revert_control`` on
a secure round's settling raised on the loop thread. Both now treat the file as unusable. Found in review."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge_agent.agent import EdgeAgent
from edge_agent.profiles import get_profile
from edge_agent.state import AgentStateDir
from protocol.topics import Topics
from protocol.transport.mqtt import BrokerAddress
from protocol.wire import encode_message
from tests.unit.edge_agent.links import FakeLink
from tests.unit.edge_agent.rounds import AGENT, global_weights
from tests.unit.edge_agent.state_files import FAMILY, RUN, param_names, plain_worker, scaffold_round

TOPICS = Topics("t")


@pytest.mark.parametrize("bad_round", [np.array([3, 3]), np.array(np.inf)], ids=["two-elements", "infinite"])
def test_a_malformed_variate_file_does_not_kill_the_agent_loop(tmp_path: Path, bad_round: np.ndarray) -> None:
    weights = global_weights(FAMILY)
    zeros = {n: np.zeros_like(weights[n]) for n in param_names()}
    AgentStateDir(tmp_path).write_arrays(
        f"scaffold-{RUN}-{FAMILY}",
        {"round": bad_round, **{"before/" + k: v for k, v in zeros.items()}, **{"after/" + k: v for k, v in zeros.items()}})
    worker = plain_worker(tmp_path)
    agent = EdgeAgent(AGENT, "t", BrokerAddress("localhost", 1883), get_profile("cpu"), worker, AgentStateDir(tmp_path))
    agent._link = FakeLink()  # type: ignore[assignment]  # no broker; training runs inline (no training thread)
    ann, state = scaffold_round(3)
    agent._on_message(TOPICS.global_state(FAMILY, state.round), encode_message(state), True)
    # Expected: the variate is dropped with a warning (as for a wrong layout) and the round is answered, or the
    # round is refused and logged; today TypeError / OverflowError escapes the loop.
    agent._on_message(TOPICS.rounds_current, encode_message(ann), False)
    assert agent._answered == (RUN, 3)


@pytest.mark.parametrize("damage", ["garbage-bytes", "two-element-round"])
def test_a_damaged_variate_file_does_not_break_the_secure_round_settlement(tmp_path: Path, damage: str) -> None:
    """revert_control (scaffold.py:137-148) runs on the loop thread, from SecureParticipant.settle via
    the settled hook (then EdgeAgent._on_secure_settled, now scaffold.undo_if_left_out), with no guard. A file that does not decode raises ProtocolError
    inside _on_message's handling of the coordinator's announcement, which is then counted as a *malformed
    announcement* (the file's fault blamed on the coordinator) and its handling cut short (_check_agreement,
    secure.begin skipped); the pending mark was already removed (secure.py:237-238), so the step is never undone.
    A decodable file with a malformed ``round`` raises TypeError out of the loop."""
    state = AgentStateDir(tmp_path)
    (tmp_path / "secagg-pending.json").write_text(json.dumps({"run_id": RUN, "round": 3, "named": False}))
    name = f"scaffold-{RUN}-{FAMILY}"
    if damage == "garbage-bytes":
        (tmp_path / f"{name}.msgpack").write_bytes(b"\x00garbage")
    else:
        zeros = {n: np.zeros_like(a) for n, a in global_weights(FAMILY).items() if n in param_names()}
        state.write_arrays(name, {"round": np.array([3, 3]), **{"before/" + k: v for k, v in zeros.items()},
                                  **{"after/" + k: v for k, v in zeros.items()}})
    agent = EdgeAgent(AGENT, "t", BrokerAddress("localhost", 1883), get_profile("cpu"), plain_worker(tmp_path), state)
    agent._link = FakeLink()  # type: ignore[assignment]
    ann, _ = scaffold_round(4)
    ann = ann.model_copy(update={"selected": ["another-agent"]})  # settles round 3 (not counted): revert its step
    agent._on_message(TOPICS.rounds_current, encode_message(ann), False)
    assert not agent.rejected, f"the coordinator's announcement was counted as rejected: {dict(agent.rejected)}"
