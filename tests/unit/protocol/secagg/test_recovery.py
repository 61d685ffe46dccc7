"""Unmasking when survivors reveal wrong shares (protocol/secagg/recovery.py, decoding.py): the secret each agent
committed to is decoded from its shares, the holders of wrong ones named when that is certain (within the
Reed-Solomon radius), never an honest one; past the radius a subset opening the committed secret still completes
the round, naming no one; a round fails only when no subset within the search bound opens it."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from protocol.secagg import decoding, recovery, shamir
from protocol.secagg.errors import SecAggAborted, SecAggRefused
from protocol.secagg.messages import UnmaskResponse
from tests.unit.protocol.secagg.test_round import Stepper, make_round, ring_sum


def wrong(share: np.ndarray, seed: int = 0) -> np.ndarray:
    """The share moved by a random error (errors alike on several shares could cancel in some subset: the secret
    that subset opens is then the right one, and passes its check)."""
    error = np.random.default_rng(seed).integers(1, shamir.P, shamir.CHUNKS, dtype=np.uint64)
    return ((share.astype(np.uint64) + error) % shamir.P).astype(np.uint32)


@pytest.mark.parametrize(("n", "t", "limit"), [(5, 3, 100), (7, 1, 100), (9, 4, 20)])
def test_subsets_take_the_first_shares_first_and_cover_every_subset(n: int, t: int, limit: int) -> None:
    found = list(recovery.subsets(n, t, limit))
    assert found[0] == tuple(range(t))
    assert len(found) == len(set(found)) == min(limit, len(list(combinations(range(n), t))))
    assert [max(s) for s in found] == sorted(max(s) for s in found)  # a later share only once the earlier run out


@pytest.mark.parametrize("liar_rank", [0, 2, 6])
def test_a_wrong_share_anywhere_is_outvoted_and_named(liar_rank: int) -> None:
    secret = bytes(range(32))
    xs = np.arange(1, 8)
    shares = shamir.split([secret], xs, 3)[0]
    holders = [f"h{i}" for i in range(7)]
    found = [(int(x), h, s) for x, h, s in zip(xs, holders, shares, strict=True)]
    x, holder, share = found[liar_rank]
    found[liar_rank] = (x, holder, wrong(share))
    opened = recovery.recover({"a": found}, 3, lambda agent, s: s == secret, "seed")
    assert opened.secrets == {"a": secret}
    assert opened.misfits == {holders[liar_rank]: {"a"}}


def test_too_many_wrong_shares_fail_with_a_reason_naming_the_agent() -> None:
    secret = bytes(32)
    xs = np.arange(1, 6)
    shares = shamir.split([secret], xs, 3)[0]
    found = [(int(x), f"h{x}", wrong(s, int(x)) if x <= 3 else s) for x, s in zip(xs, shares, strict=True)]  # 2 honest
    with pytest.raises(SecAggAborted, match="the 5 shares of 'a'.s seed do not open to the seed it committed to"):
        recovery.recover({"a": found}, 3, lambda agent, s: s == secret, "seed")
    with pytest.raises(SecAggAborted, match="2 shares of 'a'.s seed arrived, fewer than the threshold 3"):
        recovery.recover({"a": found[:2]}, 3, lambda agent, s: s == secret, "seed")


def test_a_round_with_a_lying_survivor_and_a_dropped_agent_gives_the_exact_sum() -> None:
    """One survivor reveals wrong shares of every secret it holds, self-mask seeds and a dropped agent's key alike."""
    config = make_round(12)  # complete graph, threshold 6: each secret has 10 or 11 surviving holders
    step = Stepper(config)
    dropped = config.roster[4]
    step.up_to_masking(skip_upload=frozenset({dropped}))
    request = step.server.close_masking()
    liar = config.roster[0]
    for agent, client in step.clients.items():
        if agent == dropped:
            continue
        response = client.unmask(request)
        if agent == liar:
            response = UnmaskResponse(agent, {a: wrong(s) for a, s in response.self_mask_shares.items()},
                                      {a: wrong(s) for a, s in response.key_shares.items()})
        step.server.receive_unmask_response(response)
    assert step.server.ready()
    total = step.server.finish()
    assert np.array_equal(total, ring_sum([step.quantised[a] for a in config.roster if a != dropped]))
    assert step.server.recovered == {dropped}
    assert step.server.misfits == {liar: frozenset(set(config.roster) - {liar})}


def test_ready_waits_for_a_response_that_outvotes_a_wrong_share() -> None:
    """With only threshold shares of a seed in and one of them wrong, the server is not ready; the next honest
    response makes it ready, and finish uses what was opened."""
    config = make_round(4)  # complete graph, threshold 2: three holders of each seed
    step = Stepper(config)
    step.up_to_masking()
    request = step.server.close_masking()
    responses = {a: c.unmask(request) for a, c in step.clients.items()}
    liar, honest, last = config.roster[1], config.roster[2], config.roster[3]
    victim = config.roster[0]
    lied = dict(responses[liar].self_mask_shares)
    lied[victim] = wrong(lied[victim])
    step.server.receive_unmask_response(UnmaskResponse(liar, lied, {}))
    step.server.receive_unmask_response(responses[honest])
    assert not step.server.ready()  # victim's seed: one right share and one wrong, nothing to outvote it with
    step.server.receive_unmask_response(responses[last])
    assert step.server.ready()
    assert np.array_equal(step.server.finish(), ring_sum(list(step.quantised.values())))
    # Three shares at threshold 2 correct no error: a subset that opens the committed seed is found, but whose share
    # was wrong is not certain, so no one is named.
    assert step.server.misfits == {} and step.server.unattributed == {victim}


def test_a_response_may_hold_shares_back_but_never_reveal_more() -> None:
    config = make_round(6)
    step = Stepper(config)
    step.up_to_masking(skip_upload=frozenset({config.roster[5]}))
    request = step.server.close_masking()
    first = config.roster[0]
    response = step.clients[first].unmask(request)
    swapped = UnmaskResponse(first, dict(response.key_shares), dict(response.self_mask_shares))
    with pytest.raises(SecAggRefused, match="does not match the request"):
        step.server.receive_unmask_response(swapped)  # a dropped agent's seed share, a survivor's key share
    held_back = UnmaskResponse(first, dict(list(response.self_mask_shares.items())[1:]), {})
    step.server.receive_unmask_response(held_back)
    assert step.server.withheld[first] == {next(iter(response.self_mask_shares)), config.roster[5]}


def test_decoding_corrects_up_to_its_radius_whichever_shares_are_wrong() -> None:
    rng = np.random.default_rng(7)
    for n, t in ((7, 3), (22, 12), (28, 15), (9, 1)):
        secret = rng.bytes(32)
        xs = np.arange(1, n + 1)
        shares = shamir.split([secret], xs, t)[0]
        radius = (n - t) // 2
        for _ in range(5):
            bad = rng.choice(n, size=radius, replace=False)
            ys = shares.copy()
            for i in bad:
                ys[i] = wrong(ys[i], int(rng.integers(1 << 30)))
            values, off = decoding.correct(xs, ys, t)
            assert shamir.decode_secrets(values[None, :]) == [secret]
            assert set(np.flatnonzero(off)) == set(bad)


def test_liars_past_the_radius_are_not_decoded_into_a_wrong_secret() -> None:
    secret = bytes(range(32))
    xs = np.arange(1, 8)
    shares = shamir.split([secret], xs, 4)[0]  # radius 1
    ys = shares.copy()
    ys[0], ys[1] = wrong(ys[0], 1), wrong(ys[1], 2)
    decoded = decoding.correct(xs, ys, 4)
    assert decoded is None or shamir.decode_secrets(decoded[0][None, :]) != [secret]  # the check then refuses it
    opened = recovery.recover({"a": [(int(x), f"h{x}", y) for x, y in zip(xs, ys, strict=True)]}, 4,
                              lambda agent, s: s == secret, "seed")
    assert opened.secrets == {"a": secret} and opened.misfits == {} and opened.unattributed == {"a"}
