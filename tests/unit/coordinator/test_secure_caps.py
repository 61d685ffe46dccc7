"""What bounds a secure session's weights: the session's cap is the median of its agents' claims and never past the
round's ``claim_cap`` (a site reports its agents' claims: it must not set the cap its own sum is bounded by), and the
root's plausibility bounds follow what a device masks, min(samples, cap), not a cap the device never learns (an
enrolled ``max_samples``: found in review, an honest round was refused)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from coordinator.round import secure_plan
from coordinator.round.secure_sites import most_counted, plausible_prototypes, plausible_sum, weight_range
from coordinator.settings import CoordinatorSettings
from protocol.secagg.prototype_vector import decode_prototype_sums, encode_prototypes
from protocol.secagg.vector import decode_sum, encode_input
from protocol.secagg.wire import SecureFamily, SecureSetup

AGENTS = ["a", "b", "c"]
CLAIMS = {"a": 100, "b": 100, "c": 100}
ENROLLED = {"a": 10}  # `coordinator enroll a --max-samples 10`: plain rounds count it for 10; the device never knows


def parts() -> SimpleNamespace:
    records = {a: SimpleNamespace(status=SimpleNamespace(num_samples=n, family="f")) for a, n in CLAIMS.items()}
    return SimpleNamespace(registry=SimpleNamespace(get=records.get), enrollment=SimpleNamespace(
        max_samples_of=ENROLLED.get), settings=CoordinatorSettings(federation="t"))


def session(claim_cap: int | None, prototypes: tuple[int, int] | None = None) -> SecureFamily:
    records = {a: parts().registry.get(a) for a in AGENTS}
    states = {"f": SimpleNamespace(weights={"w": np.zeros(4, np.float32)})}
    found = secure_plan._session(CoordinatorSettings(federation="t", claim_cap_multiple=0), AGENTS, records, 0,
                                 prototypes, states, {"f": None}, "f", 1, [], claim_cap)
    assert found is not None
    return found


def ring_sum(rings: list[np.ndarray]) -> np.ndarray:
    return np.sum(np.stack(rings).astype(np.uint64), axis=0).astype(np.uint32)


def test_a_session_s_cap_never_passes_the_round_s_claim_cap() -> None:
    assert session(None).weight_cap == 100  # the claims' own
    assert session(40).weight_cap == 40


def test_an_honest_secure_mean_of_an_agent_enrolled_below_its_data_is_taken() -> None:
    fam, like = session(100), {"w": np.zeros(4, np.float32)}
    setup = SecureSetup(clip=1.0, advertise_s=1, share_s=1, unmask_s=1, families={"f": fam})
    rings = [encode_input({"w": np.full(4, 0.01)}, setup, fam, CLAIMS[a])[1] for a in AGENTS]  # the devices' code
    sums, weight = decode_sum(ring_sum(rings), 3, like, setup, fam)
    assert plausible_sum(sums, weight, weight_range(parts(), set(AGENTS), fam.weight_cap), 3, setup, fam) is None


def test_honest_secure_prototypes_of_an_agent_enrolled_below_its_data_are_taken() -> None:
    fam = session(100, prototypes=(2, 3))
    setup = SecureSetup(clip=1.0, advertise_s=1, share_s=1, unmask_s=1, families={"f": fam})
    rings = [encode_prototypes(np.full((2, 3), 0.1), np.array([50, 50]), setup, fam)[1] for _ in AGENTS]
    sums, counts = decode_prototype_sums(ring_sum(rings), 3, 2, setup, fam)
    most = most_counted(parts(), set(AGENTS), fam.weight_cap, 2)
    assert plausible_prototypes(sums, counts, most, 3, setup, fam) is None
