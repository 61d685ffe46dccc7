"""SCAFFOLD under secure aggregation over a real Mosquitto: a coordinator and three agent processes. Each agent
masks its control delta beside its delta; the new x and c are the old ones plus what a plain round of the same
agents gives (x + the delta mean, c + |S|/N times the control mean), read from what they masked (kept in their
state dirs with ``secagg_audit``, never sent) within the quantisation step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.state import AgentStateDir
from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import GlobalState, RoundAnnouncement
from protocol.secagg.vector import float_names, quantiser
from protocol.topics import Topics
from tests.integration.wire import WireRecorder, decode_wire, wait_for_rounds

pytestmark = pytest.mark.integration

FEDERATION = "secure-scaffold"
AGENTS = ("rpi-0", "rpi-1", "rpi-2")
CLIP, CONTROL_CLIP = 0.5, 1.0


def test_a_secure_scaffold_round_moves_x_and_c_by_the_masked_means(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    agents = [AgentSpec(name, "rpi", i) for i, name in enumerate(AGENTS)]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=1.0,
                                                             agent_settings={"secagg_audit": True}), {
        "algorithm": "scaffold", "rounds": 2, "evaluate_final": False, "min_available_agents": 3,
        "min_fit_agents": 3, "local_epochs": 1, "secure_aggregation": True, "max_norm_ratio": 0,
        "claim_cap_multiple": 0, "secagg_clip": CLIP, "secagg_control_clip": CONTROL_CLIP, "secagg_stage_s": 5,
        "round_deadline_s": 30,
    }, federation=FEDERATION)
    topics = Topics(FEDERATION)
    with fleet:
        rounds = wait_for_rounds(fleet, 2, 150)
    seen = recorder.snapshot()
    assert (rounds[1]["round"], rounds[1]["outcome"], rounds[1]["answered"]) == (2, "completed", 3), rounds[1]
    assert not [m for m in seen if m.topic.startswith(f"fl/{FEDERATION}/updates/") and m.topic.endswith("/2")]

    family = next(iter(rounds[1]["secure"]["families"]))
    states = {(s.family, s.round): s for s in (decode_wire(m.payload, GlobalState) for m in seen
              if topics.parse(m.topic).kind == "global_state" and m.payload)}
    before, after = states[(family, 2)], states[(family, 3)]
    announcement = next(a for a in (decode_wire(m.payload, RoundAnnouncement) for m in seen
                                    if m.topic == topics.rounds_current and m.payload) if a.round == 2)
    setup = announcement.secure
    assert setup is not None and setup.control_clip == CONTROL_CLIP and announcement.algorithm == "scaffold"
    inputs = [AgentStateDir(fleet.agent_dir(a)).read_arrays("secagg-input-2") for a in AGENTS]
    assert all(i is not None for i in inputs)
    total = sum(i["plain"] for i in inputs)  # type: ignore[index]
    weight = total[-1] / CLIP
    step = quantiser(setup, setup.families[family]).step
    offset = 0
    # x moves by the delta mean (server_learning_rate 1); c by |S|/N = 3/3 times the control mean, whose values
    # the agents masked at clip / control_clip times their size.
    for fields, scale in (("weights", 1.0), ("control", CLIP / CONTROL_CLIP)):
        old, new = getattr(before, fields), getattr(after, fields)
        assert old  # SCAFFOLD's state has a control variate for every parameter
        for name in float_names(old):
            size = old[name].size
            change = new[name].astype(np.float64) - old[name].astype(np.float64)
            ulp = 2 * (np.abs(old[name]).max() + 1.0) * 2**-23  # float32 states
            np.testing.assert_allclose(change.reshape(-1), total[offset:offset + size] / weight / scale, rtol=0,
                                       atol=16 * step / weight / scale + ulp)
            offset += size
    assert offset + 1 == total.size
    assert any(np.abs(a).max() > 0 for a in after.control.values())  # c moved
