"""The edge agent as a receiver on a hostile network (found in review): a replayed older round after a restart is
not trained (nor charged) again, a chunk that disagrees with a genuine transfer's header does not void it, a
redelivered keys relay does not end the agent's secure round, and a secure session no round can run is declined
instead of raising out of the loop."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edge_agent.bootstrap import build_agent
from edge_agent.secure import SecureParticipant
from edge_agent.state import AgentStateDir
from protocol.messages import Chunk, GlobalState, LocalTraining, RoundAnnouncement, StateRef
from protocol.secagg.client import SecAggClient
from protocol.secagg.config import RoundConfig
from protocol.secagg.wire import AdvertisedKeys, SecureAdvertise, SecureFamily, SecureKeys, SecureSetup
from protocol.security.signing import single_key
from protocol.security.trust import Trust
from protocol.transport.chunking import CHUNK_OVERHEAD_BYTES
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.edge_agent.links import FakeLink
from tests.unit.edge_agent.test_agent_faults import TOPICS, FakeWorker
from tests.unit.edge_agent.test_dp_agent import announce, settings, start
from tests.unit.edge_agent.test_freshness import KEY, B, coordinator, make_agent, signed, signed_chunks


def big_state(run: tuple[str, int], number: int) -> GlobalState:
    arrays = {"w": np.arange(400, dtype=np.float32)}
    return GlobalState(run_id=run[0], family=FakeWorker.family, round=number, weights=arrays, epoch=run[1],
                       digest=GlobalState.compute_digest(arrays, {}, None, None))


def round_bytes(run: tuple[str, int], number: int, state: GlobalState | None = None, **extra: object) -> bytes:
    states = {} if state is None else {state.family: StateRef(family=state.family, round=state.round,
                                                             digest=state.digest)}
    ann = RoundAnnouncement(run_id=run[0], round=number, task="train", task_ref=DIGITS,
                            layouts={FakeWorker.family: FakeWorker.layout}, algorithm="fedavg",
                            training=LocalTraining(epochs=1, learning_rate=0.1), selected=["me"], states=states,
                            init_seed=0, issued_at=time.time(), deadline_s=30.0, last_round=5, epoch=run[1],
                            **extra)
    return signed(ann)


# -- 1: a replayed, genuinely signed announcement of an already answered round, after a restart ------------
def test_a_replayed_older_round_is_not_trained_again_after_a_restart(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    coordinator(agent, B)
    round3, round4 = round_bytes(B, 3), round_bytes(B, 4)  # what an eavesdropper on the broker records
    agent._on_message(TOPICS.rounds_current, round3, False)
    agent._on_message(TOPICS.rounds_current, round4, False)
    assert worker.answered == [3, 4]
    # The device restarts. The attacker empties the retained rounds/current (anyone may) and replays round 3.
    again, worker_again, _ = make_agent(tmp_path)
    again._on_message(TOPICS.rounds_current, b"", True)
    again._on_message(TOPICS.rounds_current, round3, False)
    assert worker_again.answered == [], "round 3 (already answered before the restart) was trained again"


# -- 2: a chunk reusing a genuine transfer's id ------------------------------------------------------
def test_a_chunk_reusing_the_genuine_transfer_id_does_not_kill_the_transfer(tmp_path: Path) -> None:
    """Retained chunk topics are readable by anyone, so the genuine transfer id is public."""
    agent, _, _ = make_agent(tmp_path)
    coordinator(agent, B)
    state = big_state(B, 2)
    pieces = signed_chunks(state, CHUNK_OVERHEAD_BYTES + 512)
    agent._on_message(TOPICS.global_state_chunk("f", 2, 0), pieces[0], True)
    first = decode_message(pieces[0], Chunk)
    poison = Chunk(transfer_id=first.transfer_id, index=1, count=first.count + 1, total_bytes=first.total_bytes,
                   digest=first.digest, data=b"y")
    agent._on_message(TOPICS.global_state_chunk("f", 2, 1), encode_message(poison), False)
    for i, piece in enumerate(pieces[1:], start=1):
        agent._on_message(TOPICS.global_state_chunk("f", 2, i), piece, True)
    assert 2 in agent.global_states, f"genuine state dropped: {dict(agent.rejected)}"


# -- 3: a duplicated (QoS 1 redelivery, or replayed) keys relay ----
def test_a_redelivered_keys_relay_does_not_abort_the_secure_round(tmp_path: Path) -> None:
    roster = ["a", "b", "me"]
    session = SecureFamily(roster=roster, graph_seed=b"\x01" * 32, degree=2, threshold=2, n_params=4, weight_cap=10)
    setup = SecureSetup(clip=1.0, advertise_s=5, share_s=5, unmask_s=5, families={"f": session})
    sent: list[tuple[str, bytes]] = []
    participant = SecureParticipant("me", "f", TOPICS, lambda t, p: sent.append((t, p)), lambda b: b,
                                    state=AgentStateDir(tmp_path))
    ann = RoundAnnouncement(run_id="r", round=2, task="train", task_ref=DIGITS, layouts={"f": FakeWorker.layout},
                            algorithm="fedavg", training=LocalTraining(epochs=1, learning_rate=0.1), selected=roster,
                            init_seed=0, issued_at=time.time(), deadline_s=30.0, last_round=5, secure=setup)
    participant.begin(ann)
    assert participant.client is not None
    mine = decode_message(sent[0][1], SecureAdvertise).keys
    config = RoundConfig(2, tuple(roster), 4, b"\x01" * 32, 2, 2)
    ads = [mine]
    for other in ("a", "b"):
        ad = SecAggClient(other, config).advertise()
        ads.append(AdvertisedKeys(agent_id=other, encryption_key=ad.encryption_key, mask_key=ad.mask_key,
                                  commitment=ad.self_mask_commitment))
    relay = signed(SecureKeys(run_id="r", round=2, family="f", advertised=sorted(ads, key=lambda k: k.agent_id)))
    trust = Trust(single_key("coordinator", KEY.public_key), required=True)
    topic = TOPICS.secagg_relay("f", 2, "keys")
    parsed = TOPICS.parse(topic)
    participant.on_message(parsed, relay, trust)
    assert participant.client is not None and participant.client.stage == "mask"
    participant.on_message(parsed, relay, trust)  # the same signed relay again (QoS 1 duplicate, or anyone's replay)
    assert participant.client is not None, "a duplicate keys relay ended this agent's part in the round"


# -- 4: a signed announcement whose secure session cannot be built ------------------------
def test_an_inconsistent_secure_session_is_dropped_not_raised(tmp_path: Path) -> None:
    agent, worker, _ = make_agent(tmp_path)
    coordinator(agent, B)
    session = SecureFamily(roster=["a", "me"], graph_seed=b"\x01" * 32, degree=3, threshold=2, n_params=4,
                           weight_cap=10)  # degree 3 for 2 agents: schema-valid, RoundConfig refuses it
    setup = SecureSetup(clip=1.0, advertise_s=5, share_s=5, unmask_s=5, families={"f": session})
    agent._on_message(TOPICS.rounds_current, round_bytes(B, 2, secure=setup), False)  # raised out of the loop
    assert agent.announcement is not None and agent.announcement.round == 2
    assert agent.secure.client is None  # declined: it sends nothing for the round, masked or plain


# -- 1 again, with the real DP worker and its ledger ---------------------------------------------------
def pinned(tmp_path: Path):
    agent = build_agent(settings(tmp_path), set_threads=False)
    agent._trust = Trust(single_key("coordinator", KEY.public_key), required=True)
    agent._link = FakeLink()
    return agent


def test_a_replayed_round_after_a_reboot_is_not_charged_again(tmp_path: Path) -> None:
    agent = pinned(tmp_path)
    topics = agent.topics
    state = signed(start())
    round1, round2 = signed(announce(1)), signed(announce(2))  # recorded off the broker by anyone
    agent._on_message(topics.global_state("mlp_tiny", 1), state, True)
    agent._on_message(topics.rounds_current, round1, False)
    agent._on_message(topics.rounds_current, round2, False)
    assert agent.worker.privacy.ledger.rounds == 2
    rebooted = pinned(tmp_path)
    rebooted._on_message(topics.rounds_current, b"", True)   # the attacker emptied the retained announcement
    rebooted._on_message(topics.global_state("mlp_tiny", 1), state, True)
    rebooted._on_message(topics.rounds_current, round1, False)  # and replays round 1
    assert rebooted.worker.privacy.ledger.rounds == 2, "round 1 was trained and charged a second time"
