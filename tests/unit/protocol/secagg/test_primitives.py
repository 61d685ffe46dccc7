"""Keys, PRG, graph: the building blocks of secure aggregation, checked against what they promise."""

from __future__ import annotations

import os

import numpy as np
import pytest

from protocol.secagg.graph import default_degree, default_threshold, neighbours
from protocol.secagg.keys import KeyPair, mask_seed, share_key
from protocol.secagg.prg import add_mask, expand


def test_chacha20_keystream_matches_rfc_7539_block_zero() -> None:
    # RFC 7539 appendix A.1, test vector 1: all-zero key, nonce and counter.
    stream = expand(bytes(32), 4)
    assert stream.tobytes().hex() == "76b8e0ada0f13d90405d6ae55386bd28"


def test_prg_is_deterministic_full_length_and_seed_sensitive() -> None:
    seed = os.urandom(32)
    flipped = bytes([seed[0] ^ 1]) + seed[1:]
    for prg in ("chacha20", "aes-ctr"):
        a = expand(seed, 1001, prg)
        assert a.dtype == np.uint32 and a.shape == (1001,)
        assert np.array_equal(a, expand(seed, 1001, prg))
        assert np.mean(a == expand(flipped, 1001, prg)) < 0.01
    assert not np.array_equal(expand(seed, 64, "chacha20"), expand(seed, 64, "aes-ctr"))
    with pytest.raises(ValueError):
        expand(seed[:4], 10)  # a folded seed is refused


def test_masks_added_and_subtracted_cancel_in_the_ring() -> None:
    values = np.arange(5000, dtype=np.uint32) * np.uint32(977)
    acc = values.copy()
    seed = os.urandom(32)
    add_mask(acc, seed, +1)
    assert np.mean(acc == values) < 0.01
    add_mask(acc, seed, -1)
    assert np.array_equal(acc, values)


def test_pairwise_seed_is_the_same_from_both_sides_and_bound_to_round_and_pair() -> None:
    a, b, c = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    context = os.urandom(32)
    seed = mask_seed(a.private, b.public, context, 3, 7)
    assert len(seed) == 32
    assert seed == mask_seed(b.private, a.public, context, 7, 3)
    assert seed != mask_seed(a.private, b.public, os.urandom(32), 3, 7)  # another round
    assert seed != mask_seed(a.private, c.public, context, 3, 7)
    assert share_key(a.private, b.public, context, 3, 7) != share_key(a.private, b.public, context, 7, 3)
    assert KeyPair.from_private_bytes(a.private_bytes()).public == a.public


@pytest.mark.parametrize("n", [2, 3, 10, 11, 57, 100, 500])
def test_graph_is_symmetric_regular_and_the_same_for_everyone(n: int) -> None:
    seed = os.urandom(32)
    k = default_degree(n)
    graph = neighbours(n, k, seed)
    assert graph == neighbours(n, k, seed)
    for i, near in enumerate(graph):
        assert len(near) == k and i not in near
        assert all(i in graph[j] for j in near)
    assert 1 <= default_threshold(k) <= k
    if n > 20:
        assert k < n - 1 and graph != neighbours(n, k, os.urandom(32))


def test_graph_is_connected_and_grows_logarithmically() -> None:
    graph = neighbours(500, default_degree(500), os.urandom(32))
    reached, frontier = {0}, {0}
    while frontier:
        frontier = {j for i in frontier for j in graph[i]} - reached
        reached |= frontier
    assert len(reached) == 500
    assert default_degree(100) == 22 and default_degree(500) == 28 and default_degree(10) == 9
    with pytest.raises(ValueError):
        neighbours(10, 3, os.urandom(32))  # odd degree below n - 1
