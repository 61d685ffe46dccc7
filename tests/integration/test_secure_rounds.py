"""Secure aggregation over a real Mosquitto: a coordinator and five agent processes, one killed after it
uploaded its masked input and one after it shared its keys but before it masked. The unmasked global equals
the plain weighted mean of what the survivors masked (kept in their own state dirs with ``secagg_audit``,
never sent) within the quantisation step, and the rounds log says whose masks were recovered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.state import AgentStateDir
from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import GlobalState, RoundAnnouncement
from protocol.secagg.quantise import Quantiser
from protocol.secagg.vector import float_names
from protocol.secagg.wire import SecureMasked
from protocol.topics import Topics
from tests.integration.wire import WireRecorder, decode_wire, fleet_keys, signer_of, wait_for_rounds, wait_until

pytestmark = pytest.mark.integration

FEDERATION = "secure"
VICTIM = "rpi-0"
"""Killed after uploading its masked input: its self-mask is rebuilt from its neighbours' shares."""
SHARER = "rpi-1"
"""Killed after sharing its keys, holding its update back: its pairwise masks are removed from its key's shares."""
OTHERS = ("rpi-2", "rpi-3", "rpi-4")
CLIP = 0.5


def test_a_secure_round_unmasks_the_plain_mean_and_survives_a_kill_after_masking(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    # The others hold their update back a few seconds: the victim uploads first and is killed (with the
    # sharer, which shared before the victim could mask) before the masking stage closes.
    agents = [AgentSpec(VICTIM, "rpi", 0)] + [
        AgentSpec(name, "rpi", i + 1, settings={"straggler_delay": "constant:8"})
        for i, name in enumerate((SHARER, *OTHERS))]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=1.0,
                                                             agent_settings={"secagg_audit": True}), {
        "rounds": 2, "evaluate_final": False, "min_available_agents": 5, "min_fit_agents": 5, "local_epochs": 1,
        "secure_aggregation": True, "max_norm_ratio": 0, "claim_cap_multiple": 0, "secagg_clip": CLIP,
        "secagg_stage_s": 5, "secagg_threshold": 2, "round_deadline_s": 18,  # masking waits for the sharer
    }, federation=FEDERATION)
    topics = Topics(FEDERATION)
    with fleet:
        wait_until(lambda: any(m.topic == topics.secagg(VICTIM, 2, "masked") for m in recorder.snapshot()),
                   150, f"{VICTIM}'s masked input of round 2")
        assert any(m.topic == topics.secagg(SHARER, 2, "shares") for m in recorder.snapshot())
        fleet.kill_agent(VICTIM)
        fleet.kill_agent(SHARER)
        rounds = wait_for_rounds(fleet, 2, 120)
    seen = recorder.snapshot()

    secure_round = rounds[1]
    assert (secure_round["round"], secure_round["outcome"], secure_round["answered"]) == (2, "completed", 4), secure_round
    family, account = next(iter(secure_round["secure"]["families"].items()))
    assert account["survivors"] == sorted([VICTIM, *OTHERS])
    assert account["recovered"] == {"self_masks": [VICTIM], "pairwise_masks": [SHARER]}
    assert account["dropped"]["mask"] == [SHARER] and account["dropped"]["unmask"] == [VICTIM]
    assert set(secure_round["secure"]["stages"]) == {"advertise", "share", "mask", "unmask"}

    # No plain update of round 2 crossed the broker; every stage message is signed by its sender.
    assert not [m for m in seen if m.topic.startswith(f"fl/{FEDERATION}/updates/") and m.topic.endswith("/2")]
    keys = fleet_keys(fleet)
    for message in seen:
        parsed = topics.parse(message.topic)
        if parsed.kind == "secagg":
            assert signer_of(message.payload, keys) == parsed.agent_id
        elif parsed.kind in ("secagg_relay", "secagg_inbox"):
            assert signer_of(message.payload, keys) == "coordinator"
    masked = [decode_wire(m.payload, SecureMasked) for m in seen if topics.parse(m.topic).stage == "masked"]
    assert len(masked) == 4 and all(m.masked.dtype == np.uint32 for m in masked)

    # The new global state is the old one plus the weighted mean of what the agents masked.
    states = {(s.family, s.round): s for s in (decode_wire(m.payload, GlobalState) for m in seen
              if topics.parse(m.topic).kind == "global_state" and m.payload)}
    before, after = states[(family, 2)], states[(family, 3)]
    announcement = next(a for a in (decode_wire(m.payload, RoundAnnouncement) for m in seen
                                    if m.topic == topics.rounds_current and m.payload) if a.round == 2)
    assert announcement.secure is not None and announcement.secure.clip == CLIP
    inputs = [AgentStateDir(fleet.agent_dir(a)).read_arrays("secagg-input-2") for a in (VICTIM, *OTHERS)]
    assert all(i is not None for i in inputs)
    assert AgentStateDir(fleet.agent_dir(SHARER)).read_arrays("secagg-input-2") is None  # it never masked
    total = sum(i["plain"] for i in inputs)  # type: ignore[index]
    mean = total[:-1] / (total[-1] / CLIP)
    step = Quantiser(CLIP, len(announcement.secure.families[family].roster)).step
    offset = 0
    for name in float_names(before.weights):
        size = before.weights[name].size
        change = after.weights[name].astype(np.float64) - before.weights[name].astype(np.float64)
        scale = np.abs(before.weights[name]).max() + 1.0  # float32 states: one ulp of the larger value
        np.testing.assert_allclose(change.reshape(-1), mean[offset:offset + size], rtol=0,
                                   atol=16 * step / (total[-1] / CLIP) + 2 * scale * 2**-23)
        offset += size
