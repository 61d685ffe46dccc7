"""Liars against the unmasking's naming and its cost (found in review of the first recovery, a search over t-subsets
that named every share off the first subset that passed its check): a key share changed only in the bits X25519
clamping ignores opened a key with the same public key, and colluding liars' errors cancelled in the first subset, so
in both the honest holders were named and the liars not; three liars among 28 holders failed the round; every new
response searched every agent again."""

from __future__ import annotations

import numpy as np

from protocol.secagg import recovery, shamir
from protocol.secagg.messages import UnmaskResponse
from tests.unit.protocol.secagg.test_recovery import wrong
from tests.unit.protocol.secagg.test_round import Stepper, make_round, ring_sum

P = shamir.P


def lagrange(xs: list[int]) -> list[int]:
    return [int(c) for c in shamir.lagrange_at_zero(np.array([xs], dtype=np.uint64))[0]]


def shifted(share: np.ndarray, error: list[int]) -> np.ndarray:
    return ((share.astype(np.uint64) + np.array(error, dtype=np.uint64)) % np.uint64(P)).astype(np.uint32)


def answered(step: Stepper, request: object, lie: dict[str, dict[str, dict[str, list[int]]]]) -> None:
    """Every client answers; ``lie``: agent -> {"seeds"|"keys": {owner: error}} added to its revealed shares."""
    for agent, client in step.clients.items():
        if agent not in step.server.survivors:
            continue
        response = client.unmask(request)
        seeds, keys = dict(response.self_mask_shares), dict(response.key_shares)
        for owner, error in lie.get(agent, {}).get("seeds", {}).items():
            seeds[owner] = shifted(seeds[owner], error)
        for owner, error in lie.get(agent, {}).get("keys", {}).items():
            keys[owner] = shifted(keys[owner], error)
        step.server.receive_unmask_response(UnmaskResponse(agent, seeds, keys))


def test_a_key_share_changed_only_where_clamping_looks_away_is_named() -> None:
    config = make_round(8)  # complete graph: threshold 4, 6 surviving holders of the dropped agent's key
    step = Stepper(config)
    dropped, liar = config.roster[7], config.roster[0]
    step.up_to_masking(skip_upload=frozenset({dropped}))
    request = step.server.close_masking()
    error = [0] * shamir.CHUNKS
    error[0] = 5 * pow(lagrange([1, 2, 3, 4])[0], P - 2, P) % P  # the first subset's key gains 5 in byte 0's low bits
    answered(step, request, {liar: {"keys": {dropped: error}}})
    assert np.array_equal(step.server.finish(), ring_sum([step.quantised[a] for a in config.roster if a != dropped]))
    assert step.server.misfits == {liar: frozenset({dropped})}


def test_colluding_liars_whose_errors_cancel_in_the_first_subset_are_named_and_no_one_else() -> None:
    config = make_round(12, degree=11)  # threshold 6, 11 holders of each seed: radius 2
    step = Stepper(config)
    step.up_to_masking()
    request = step.server.close_masking()
    victim, liars = config.roster[11], config.roster[:2]  # at x = 1, 2: in the first subset x = 1..6
    lam = lagrange(list(range(1, 7)))
    e1 = [int(v) for v in np.random.default_rng(1).integers(1, P, shamir.CHUNKS)]
    e2 = [(-lam[0] * e * pow(lam[1], P - 2, P)) % P for e in e1]  # lam0 e1 + lam1 e2 = 0: the subset opens right
    answered(step, request, {liars[0]: {"seeds": {victim: e1}}, liars[1]: {"seeds": {victim: e2}}})
    assert np.array_equal(step.server.finish(), ring_sum(list(step.quantised.values())))
    assert step.server.misfits == {liar: frozenset({victim}) for liar in liars}


def test_three_liars_among_28_holders_are_outvoted_and_named() -> None:
    config = make_round(29, degree=28)  # complete graph, threshold 15: radius 6
    assert config.threshold == 15
    step = Stepper(config)
    step.up_to_masking()
    request = step.server.close_masking()
    liars = config.roster[:3]
    owners = [a for a in config.roster if a not in liars]
    rng = np.random.default_rng(3)
    answered(step, request, {liar: {"seeds": {o: [int(v) for v in rng.integers(1, P, shamir.CHUNKS)] for o in owners}}
                             for liar in liars})
    assert step.server.ready()
    assert np.array_equal(step.server.finish(), ring_sum(list(step.quantised.values())))
    assert set(step.server.misfits) == set(liars) and step.server.unattributed == frozenset()


def test_a_secret_is_searched_for_once_not_on_every_later_response(monkeypatch) -> None:
    """Past the radius a secret is found by a search over t-subsets; as more responses come, the server asks
    ``ready`` on every tick: an opened secret is not searched for again (only decoded, milliseconds)."""
    config = make_round(12)  # complete graph, threshold 6
    step = Stepper(config)
    step.up_to_masking()
    request = step.server.close_masking()
    searches: list[int] = []
    real = recovery.subsets

    def counting(n: int, t: int, limit: int):  # type: ignore[no-untyped-def]
        searches.append(n)
        return real(n, t, limit)
    monkeypatch.setattr(recovery, "subsets", counting)
    victim, liars = config.roster[11], config.roster[:4]  # 4 wrong shares of 11: past the radius (2)
    responses = {a: c.unmask(request) for a, c in step.clients.items()}
    searched_when_ready = None
    for agent in config.roster:
        response = responses[agent]
        if agent in liars:
            seeds = dict(response.self_mask_shares)
            seeds[victim] = wrong(seeds[victim], config.position(agent))
            response = UnmaskResponse(agent, seeds, dict(response.key_shares))
        step.server.receive_unmask_response(response)
        ready = [step.server.ready() for _ in range(3)][-1]  # the engine asks on every tick
        if ready and searched_when_ready is None:
            searched_when_ready = len(searches)
    assert searched_when_ready is not None and len(searches) == searched_when_ready  # none once opened
    assert len(searches) == len(set(searches))  # at most one search per number of shares, not one per tick
    assert np.array_equal(step.server.finish(), ring_sum(list(step.quantised.values())))
    assert step.server.unattributed == {victim}
