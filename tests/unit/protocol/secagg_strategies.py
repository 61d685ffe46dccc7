"""Hypothesis strategies for the secure-aggregation wire models (protocol/secagg/wire.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from protocol.messages import Message
from protocol.secagg.ring import ring_bits
from protocol.secagg.wire import (
    AdvertisedKeys,
    SecureAdvertise,
    SecureFamily,
    SecureInbox,
    SecureKeys,
    SecureMasked,
    SecureReveal,
    SecureSetup,
    SecureShares,
    SecureUnmask,
)

from .wire_strategies import identifiers, rounds

keys32 = st.binary(min_size=32, max_size=32)
bundles = st.dictionaries(identifiers, st.binary(min_size=1, max_size=256), max_size=3)
shares = st.lists(st.integers(0, 2**31 - 2), min_size=8, max_size=8).map(lambda v: np.array(v, dtype=np.uint32))
probabilities = st.none() | st.floats(0.0, 1.0)
losses = st.none() | st.floats(0.0, 1e6)


@st.composite
def secure_families(draw: st.DrawFn, levels: int = 0) -> SecureFamily:
    degree = draw(st.integers(1, 1024))
    roster = sorted(draw(st.lists(identifiers, min_size=2, max_size=5, unique=True)))
    bits = min(ring_bits(levels, len(roster)) + draw(st.integers(0, 2)), 32) if levels else 32
    return SecureFamily(roster=roster, graph_seed=draw(keys32), degree=degree, threshold=draw(st.integers(1, degree)),
                        n_params=draw(st.integers(2, 1 << 31)), weight_cap=draw(st.integers(1, 2**40)), ring_bits=bits)


@st.composite
def _secure_setups(draw: st.DrawFn) -> SecureSetup:
    levels = draw(st.sampled_from([0, 127, 2047]))  # the finest grid, int8's, fp16's
    return SecureSetup(
        prg=draw(st.sampled_from(["chacha20", "aes-ctr"])), clip=draw(st.floats(1e-6, 1e6)),
        advertise_s=draw(st.floats(1e-3, 1e4)), share_s=draw(st.floats(1e-3, 1e4)),
        unmask_s=draw(st.floats(1e-3, 1e4)), levels=levels,
        families=draw(st.dictionaries(identifiers, secure_families(levels), max_size=2)))


secure_setups = _secure_setups()
advertised = st.builds(AdvertisedKeys, agent_id=identifiers, encryption_key=keys32, mask_key=keys32, commitment=keys32)


@st.composite
def reveals(draw: st.DrawFn) -> SecureReveal:
    names = draw(st.lists(identifiers, unique=True, max_size=4))
    cut = draw(st.integers(0, len(names)))
    return SecureReveal(run_id=draw(identifiers), round=draw(rounds), agent_id=draw(identifiers),
                        self_mask_shares={n: draw(shares) for n in names[:cut]},
                        key_shares={n: draw(shares) for n in names[cut:]})


SECAGG_STRATEGIES: dict[type[Message], st.SearchStrategy[Message]] = {
    SecureAdvertise: st.builds(SecureAdvertise, run_id=identifiers, round=rounds, family=identifiers, keys=advertised),
    SecureKeys: st.builds(SecureKeys, run_id=identifiers, round=rounds, family=identifiers,
                          advertised=st.lists(advertised, max_size=3)),
    SecureShares: st.builds(SecureShares, run_id=identifiers, round=rounds, agent_id=identifiers, bundles=bundles),
    SecureInbox: st.builds(SecureInbox, run_id=identifiers, round=rounds, agent_id=identifiers, bundles=bundles),
    SecureMasked: st.builds(
        SecureMasked, run_id=identifiers, round=rounds, agent_id=identifiers,
        masked=st.lists(st.integers(0, 2**32 - 1), max_size=16).map(lambda v: np.array(v, dtype=np.uint32)),
        eval_loss=losses, eval_accuracy=probabilities, num_eval_samples=st.integers(0, 10**6), train_loss=losses),
    SecureUnmask: st.builds(SecureUnmask, run_id=identifiers, round=rounds, family=identifiers,
                            survivors=st.lists(identifiers, max_size=4)),
    SecureReveal: reveals(),
}
