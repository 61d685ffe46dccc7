"""The secure-aggregation stage messages among the golden vectors (called by make_golden_vectors.py).

Fixed bytes stand in for keys, commitments, bundles and shares (a vector fixes the encoding, not the
cryptography, which tests/unit/protocol/secagg checks): running the script again writes the same files.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

import numpy as np

from protocol.messages import LocalTraining, Message, RoundAnnouncement, StateRef, TaskRef
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.secagg.accounting import skellam_levels
from protocol.secagg.messages import BUNDLE_BYTES
from protocol.secagg.ring import ring_bits
from protocol.secagg.wire import (
    AdvertisedKeys,
    SecureAdvertise,
    SecureFamily,
    SecureInbox,
    SecureKeys,
    SecureMasked,
    SecureNoise,
    SecureReveal,
    SecureSetup,
    SecureShares,
    SecureUnmask,
    SiteSessions,
)
from protocol.topics import Topics

PEER = "agent-2"


class Adds(Protocol):
    def message(self, name: str, message: Message, topic: str, retain: bool, description: str,
                **extra: Any) -> bytes: ...


def fixed(label: str, size: int = 32) -> bytes:
    """Deterministic stand-in bytes."""
    out = b""
    while len(out) < size:
        out += hashlib.sha256(f"edgefl golden secagg {label} {len(out)}".encode()).digest()
    return out[:size]


def secure_vectors(v: Adds, topics: Topics, run_id: str, agent: str, family: str) -> None:
    """One message of each stage of round 3, unsigned (they travel signed as every message does), and the
    announcement of a secure SCAFFOLD round."""
    _secure_round(v, topics, run_id, agent, family)
    keys = AdvertisedKeys(agent_id=agent, encryption_key=fixed("enc"), mask_key=fixed("mask"),
                          commitment=fixed("commit"))
    peer = AdvertisedKeys(agent_id=PEER, encryption_key=fixed("enc2"), mask_key=fixed("mask2"),
                          commitment=fixed("commit2"))
    v.message("secagg_advertise", SecureAdvertise(run_id=run_id, round=3, family=family, keys=keys),
              topics.secagg(agent, 3, "advertise"), False, "Stage 1: an agent's two X25519 public keys and the "
              "commitment to its self-mask seed.")
    v.message("secagg_keys", SecureKeys(run_id=run_id, round=3, family=family, advertised=[keys, peer]),
              topics.secagg_relay(family, 3, "keys"), False, "Stage 1 closed: every advertisement the coordinator "
              "took, relayed to the family's roster.")
    v.message("secagg_shares", SecureShares(run_id=run_id, round=3, agent_id=agent,
                                            bundles={PEER: fixed("bundle", BUNDLE_BYTES)}),
              topics.secagg(agent, 3, "shares"), False, "Stage 2: one sealed share bundle per neighbour, by recipient.")
    v.message("secagg_inbox", SecureInbox(run_id=run_id, round=3, agent_id=agent,
                                          bundles={PEER: fixed("bundle2", BUNDLE_BYTES)}),
              topics.secagg_inbox(agent, 3), False, "Stage 2 closed: the bundles sealed for one agent, by sender.")
    masked = np.frombuffer(fixed("masked", 4 * 6), dtype="<u4").copy()
    v.message("secagg_masked", SecureMasked(run_id=run_id, round=3, agent_id=agent, masked=masked, eval_loss=0.5,
                                            eval_accuracy=0.875, num_eval_samples=16, train_loss=0.25),
              topics.secagg(agent, 3, "masked"), False, "Stage 3: the masked input, uint32 ring elements (the "
              "family's floating values, under SCAFFOLD its control delta's, then the weight), with the metrics in the clear.")
    v.message("secagg_unmask", SecureUnmask(run_id=run_id, round=3, family=family, survivors=[agent, PEER]),
              topics.secagg_relay(family, 3, "unmask"), False, "Stage 3 closed: whose masked input is in the sum.")
    share = np.frombuffer(fixed("share", 32), dtype="<u4") % np.uint32(2**31 - 1)
    v.message("secagg_reveal", SecureReveal(run_id=run_id, round=3, agent_id=agent,
                                            self_mask_shares={PEER: share.astype(np.uint32)}, key_shares={}),
              topics.secagg(agent, 3, "reveal"), False, "Stage 4: Shamir shares of surviving neighbours' self-mask "
              "seeds (here one) and of dropped neighbours' mask keys (here none).")


def _secure_round(v: Adds, topics: Topics, run_id: str, agent: str, family: str) -> None:
    """Round 3 of a SCAFFOLD run announced secure: its agents mask the delta, then the control delta."""
    digest = hashlib.sha256(b"edgefl golden secagg state").hexdigest()[:32]
    session = SecureFamily(roster=[agent, PEER], graph_seed=fixed("graph"), degree=1, threshold=1, n_params=11,
                           weight_cap=120)
    setup = SecureSetup(clip=0.5, advertise_s=15.0, share_s=15.0, unmask_s=15.0, families={family: session},
                        control_clip=1.0)
    announcement = RoundAnnouncement(
        run_id=run_id, round=3, task="train", task_ref=TaskRef(name="golden", version="1"), algorithm="scaffold",
        training=LocalTraining(epochs=1, learning_rate=0.05, batch_size=32), selected=[agent, PEER],
        states={family: StateRef(family=family, round=2, digest=digest)}, init_seed=42, issued_at=1767225600.25,
        deadline_s=60.0, last_round=10, epoch=1767225600250, secure=setup)
    v.message("secagg_round", announcement, topics.rounds_current, True, "Round 3 of a SCAFFOLD run announced "
              "secure: one session of two agents, 11 ring elements each (5 delta values, 5 control-delta values "
              "clipped to control_clip, the weight).")
    noisy = SecureSetup(clip=1.0 + 7 * 4.0 / 2**0.5, advertise_s=15.0, share_s=15.0, unmask_s=15.0,
                        families={family: session.model_copy(update={"n_params": 6})},
                        noise=SecureNoise(noise_multiplier=4.0, clip_norm=1.0, shares=2))
    v.message("secagg_round_noisy", announcement.model_copy(update={"algorithm": "fedavg", "secure": noisy}),
              topics.rounds_current, True, "The same round of a FedAvg run with distributed DP: each agent bounds its "
              "delta's L2 norm by clip_norm and adds Gaussian noise of std noise_multiplier x clip_norm / sqrt(shares) "
              "before masking; 6 ring elements (5 delta values, the weight).")
    sites = SecureSetup(clip=0.5, advertise_s=15.0, share_s=15.0, unmask_s=15.0, families={}, sites={
        "farm-1": SiteSessions(key=fixed("farm-1 site key"), families={family: session.model_copy(
            update={"n_params": 6})})})
    v.message("secagg_round_sites", announcement.model_copy(update={"algorithm": "fedavg", "secure": sites}),
              topics.rounds_current, True, "The round of a FedAvg run whose two agents sit behind site farm-1: the "
              "site aggregator serves their session (relays signed with the key given here, which the root vouches "
              "for by signing the announcement) and sends up the unmasked sum (partial_secure).")
    ring = np.array([7, 4294967291, 12, 0, 3, 2147483648], dtype="<u4")
    v.message("partial_secure", PartialAggregate(
        run_id=run_id, epoch=1767225600250, site_id="farm-1", round=3, family=family, base_digest=digest,
        ring_sum=ring, total_weight=160.0, count=2, bytes_in=4096,
        outcomes={agent: AgentOutcome(outcome="accepted", samples=120, eval_accuracy=0.75, eval_loss=0.5,
                                      num_eval_samples=40), PEER: AgentOutcome(outcome="accepted", samples=40)}),
              topics.partial("farm-1", 3), False, "farm-1's secure partial of that round: the unmasked ring sum of "
              "its session (6 uint32, read back by the root with the round's grid), both agents accepted without a "
              "weight (the site knows only the total).")
    skellam = SecureNoise(noise_multiplier=4.0, clip_norm=1.0, shares=2, mechanism="skellam")
    levels = skellam_levels(skellam.agent_std, noisy.clip, 2)
    v.message("secagg_round_skellam", announcement.model_copy(update={"algorithm": "fedavg", "secure": noisy.model_copy(
        update={"noise": skellam, "levels": levels, "families": {family: session.model_copy(
            update={"n_params": 6, "ring_bits": ring_bits(levels, 2)})}})}),
              topics.rounds_current, True, f"The noisy round with Skellam noise: the grid has levels {levels} (each "
              f"agent's Poisson mean stays within 2^39) and a ring of {ring_bits(levels, 2)} bits; each agent rounds "
              "its weighted values stochastically to the grid, then adds Poisson(mu/2) - Poisson(mu/2) steps with "
              "mu = (noise_multiplier x clip_norm / sqrt(shares) x levels / clip)^2 to every one but the weight.")
