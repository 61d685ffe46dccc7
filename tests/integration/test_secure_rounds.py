"""Secure aggregation over a real Mosquitto: a coordinator and six agent processes, one of which dies right after
it advertised its keys, one right after it shared them and one right after it uploaded its masked input (each
exits, as a device losing power, once the broker acknowledged that stage's message: ``secagg_vanish_after``, so
the order is the protocol's, not a race). The unmasked global equals the plain weighted mean of what the
survivors masked (kept in their own state dirs with ``secagg_audit``, never sent) within the quantisation step,
and the rounds log says who dropped at which stage and whose masks were recovered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.secure import VANISH_EXIT_CODE
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
"""Dies after uploading its masked input: its self-mask is rebuilt from its neighbours' shares."""
SHARER = "rpi-1"
"""Dies after sharing its keys, before masking: its pairwise masks are removed from its key's shares."""
ADVERTISER = "rpi-5"
"""Dies after advertising its keys, before sharing: no survivor masks with it, nothing of it is needed."""
OTHERS = ("rpi-2", "rpi-3", "rpi-4")
CLIP = 0.5


def test_a_secure_round_unmasks_the_plain_mean_and_survives_agents_dying_at_every_stage(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    vanishing = {VICTIM: "masked", SHARER: "shares", ADVERTISER: "advertise"}
    agents = [AgentSpec(name, "rpi", i, settings={"secagg_vanish_after": vanishing[name]} if name in vanishing else {})
              for i, name in enumerate((VICTIM, SHARER, *OTHERS, ADVERTISER))]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=1.0,
                                                             agent_settings={"secagg_audit": True}), {
        "rounds": 2, "evaluate_final": False, "min_available_agents": 6, "min_fit_agents": 6, "local_epochs": 1,
        "secure_aggregation": True, "max_norm_ratio": 0, "claim_cap_multiple": 0, "secagg_clip": CLIP,
        "secagg_stage_s": 5, "secagg_threshold": 2, "round_deadline_s": 18,  # stages wait for the vanished
    }, federation=FEDERATION)
    topics = Topics(FEDERATION)
    with fleet:
        rounds = wait_for_rounds(fleet, 2, 240)
        for name in vanishing:  # each exited by itself, at its stage
            wait_until(lambda name=name: not fleet.agents[name].running, 30, f"{name} gone")
    seen = recorder.snapshot()
    for name, stage in vanishing.items():
        sent = [topics.parse(m.topic).stage for m in seen if topics.parse(m.topic).kind == "secagg"
                and topics.parse(m.topic).agent_id == name and topics.parse(m.topic).round == 2]
        assert sent[-1] == stage and fleet.agents[name].returncode == VANISH_EXIT_CODE, (name, sent)

    secure_round = rounds[1]
    assert (secure_round["round"], secure_round["outcome"], secure_round["answered"]) == (2, "completed", 4), secure_round
    family, account = next(iter(secure_round["secure"]["families"].items()))
    assert account["survivors"] == sorted([VICTIM, *OTHERS])
    assert account["recovered"] == {"self_masks": [VICTIM], "pairwise_masks": [SHARER]}
    assert account["dropped"] == {"advertise": [], "share": [ADVERTISER], "mask": [SHARER], "unmask": [VICTIM]}
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
    assert AgentStateDir(fleet.agent_dir(ADVERTISER)).read_arrays("secagg-input-2") is None  # it never masked

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
