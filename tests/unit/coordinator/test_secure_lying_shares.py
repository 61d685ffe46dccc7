"""Secure rounds against agents that lie with their shares: a survivor revealing a wrong share, and an agent sealing a
bad bundle to a neighbour. Either used to fail the whole round (the unmasking aborted on the wrong share; the
neighbour aborted on the bundle); now the wrong share is outvoted by the others (protocol/secagg/recovery.py), the
bundle's recipient holds its shares back and stays in, the sum is exact and the round's record names them.
Driven as test_secure_lying_agents.py drives a round: the engine and the agents' real secure side, no broker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from protocol.secagg.vector import quantiser
from protocol.secagg.wire import SecureReveal, SecureShares
from tests.unit.coordinator.test_secure_lying_agents import forge, until_closed
from tests.unit.coordinator.test_secure_rounds import AGENTS, Fleet, deltas, plain_mean


def run_round_with(fleet: Fleet, forged: object) -> dict:
    """Round 2 with every agent honest but for what ``forged`` rewrites: the sum holds every input; its secure record."""
    ann, base = fleet.announcement(), fleet.state(2)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = deltas(3)
    fleet.train(sent)
    summary = until_closed(fleet, 2)
    assert (summary.round, summary.outcome) == (2, "completed"), (summary.outcome, summary.detail)
    assert forged.hits == 1  # type: ignore[attr-defined]
    fleet.engine.tick()
    new = fleet.state(3)
    step = quantiser(ann.secure, ann.secure.families["f"]).step
    for name, mean in plain_mean(sent, 2.0).items():  # every agent's input, exactly as if no one lied
        np.testing.assert_allclose(new.weights[name] - base.weights[name], mean, atol=8 * step + 2**-23, rtol=0)
    return summary.secure["families"]["f"]


def test_a_survivor_revealing_a_wrong_share_is_outvoted(tmp_path: Path) -> None:
    """d reveals a wrong share of a's self-mask seed. a's two other holders open the seed a committed to, and the sum
    holds all four inputs. Three shares at threshold 2 correct no error, so whose share was wrong is not certain: a is
    recorded with an unnamed wrong share and no holder is named (with more holders d would be:
    tests/unit/protocol/secagg/test_recovery_attacks.py)."""
    fleet = Fleet(tmp_path)

    def lie(message: SecureReveal) -> SecureReveal:
        shares = dict(message.self_mask_shares)
        shares["a"] = (np.asarray(shares["a"], dtype=np.uint32) + np.uint32(1)) % np.uint32((1 << 31) - 1)
        return message.model_copy(update={"self_mask_shares": shares})
    forged = forge(fleet, "d", "reveal", SecureReveal, lie)
    record = run_round_with(fleet, forged)
    assert record["survivors"] == list(AGENTS)
    assert record["misfit_shares"] == {} and record["unattributed_shares"] == ["a"]
    assert record["withheld_shares"] == {}


def test_a_bad_bundle_costs_its_recipient_nothing_but_the_senders_shares(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """d seals a corrupt bundle to a. a refused it and aborted, so the round lost a (and, with every neighbour given
    one, everyone); now a adds its pairwise mask with d as d shared, holds d's shares back at the unmasking, and the
    sum holds all four inputs."""
    fleet = Fleet(tmp_path)

    def corrupt(message: SecureShares) -> SecureShares:
        bundles = dict(message.bundles)
        bundles["a"] = bundles["a"][:-1] + bytes([bundles["a"][-1] ^ 1])
        return message.model_copy(update={"bundles": bundles})
    forged = forge(fleet, "d", "shares", SecureShares, corrupt)
    record = run_round_with(fleet, forged)
    assert record["survivors"] == list(AGENTS)
    assert record["withheld_shares"] == {"a": ["d"]}
    assert record["misfit_shares"] == {} and record["unattributed_shares"] == []
    refusals = [r.getMessage() for r in caplog.records if "share bundle was refused" in r.getMessage()]
    assert refusals == ["round 2: d's share bundle was refused: a share bundle does not open with the pair's key "
                        "(tampered, or for another round)"]
