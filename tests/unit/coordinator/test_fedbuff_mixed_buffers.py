"""FedBuff buffers mix families, while a family's norm median and its first state's majority were counted within the
buffer (found in review): a family's lone delta in a buffer, with no carried median yet, was clipped against its own
norm (one agent moved it by 1000 where honest deltas are 0.5, or to the float32 limit, after which every buffer it
entered first failed and took the honest updates in it along); and one agent alone among its family's proposals in
a buffer chose the family's first state. Now a family without a trusted median is clipped against the buffer's
median step relative to each family's weights, and a first state needs a strict majority of at least three of the
family's selected agents (or all of them, if fewer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.round.norm_clip import RoundNorms, control_key
from protocol.messages import GlobalState
from protocol.wire import decode_message
from tests.unit.coordinator.test_engine import TOPICS, send, update, weights
from tests.unit.coordinator.test_fedbuff import announced, start

FAMILIES = {"a": "f", "b": "f", "g1": "g", "g2": "g", "m": "g"}
"""Family f: a, b (c where added); family g: honest g1, g2 and the attacker m."""


def of(engine, outbox, agent: str, family: str, version: int, **payload):  # type: ignore[no-untyped-def]
    """An update of ``agent`` in ``family`` trained from ``version``, with the base the open version announced."""
    ref = announced(outbox).states.get(family)
    fields = payload or ({"weights": weights(1.0)} if ref is None else {"delta": weights(0.5)})
    return update(engine, agent, version, **fields).model_copy(
        update={"family": family, "base_digest": ref.digest if ref else None})


def family_state(outbox, family: str, version: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    topic = TOPICS.global_state(family, version)
    return decode_message([p for t, p, _ in outbox.sent if t == topic and p][-1], GlobalState).weights["w"]


AGENTS = {"a": "f", "b": "f", "c": "f", **FAMILIES}


def _bootstrapped(tmp_path: Path):  # type: ignore[no-untyped-def]
    """buffer_size 4 (accepted at start-up as enough for a median) and max_norm_ratio 1; both families bootstrap
    2-of-2 in version 1."""
    engine, outbox, _, _ = start(tmp_path, AGENTS, buffer_size=4, min_available_agents=6, max_norm_ratio=1.0)
    for agent, family in (("a", "f"), ("b", "f"), ("g1", "g"), ("g2", "g")):
        send(engine, of(engine, outbox, agent, family, 1))
    engine.tick(), engine.tick()
    assert announced(outbox).round == 2 and "g" in announced(outbox).states
    return engine, outbox


def test_a_lone_delta_of_a_family_in_a_mixed_buffer_is_not_clipped(tmp_path: Path) -> None:
    engine, outbox = _bootstrapped(tmp_path)
    before = family_state(outbox, "g", 2)
    send(engine, of(engine, outbox, "m", "g", 2, delta={"w": np.full((2, 3), 1000.0, np.float32),
                                                          "b": np.full(3, 1000.0, np.float32)}))
    for agent in "abc":  # honest f work fills the buffer
        send(engine, of(engine, outbox, agent, "f", 2))
    engine.tick(), engine.tick()
    assert announced(outbox).round == 3
    moved = float(np.max(np.abs(family_state(outbox, "g", 3) - before)))
    assert moved <= 10.0, f"one agent moved family g by {moved} (honest deltas are 0.5, max_norm_ratio 1)"


def test_the_unclipped_lone_delta_fails_every_buffer_and_discards_honest_work(tmp_path: Path) -> None:
    """The same hole as a denial of service: m, first into each buffer, pushes g to the float32 limit, then past it;
    every later buffer fails as non_finite_result and the honest f updates in it are thrown away (and marked applied)."""
    engine, outbox = _bootstrapped(tmp_path)
    huge = {"w": np.full((2, 3), -3.4e38, np.float32), "b": np.full(3, -3.4e38, np.float32)}
    outcomes = []
    for _ in range(3):
        version = engine.open.number
        send(engine, of(engine, outbox, "m", "g", version, delta=huge))
        for agent in "abc":
            send(engine, of(engine, outbox, agent, "f", version))
        engine.tick(), engine.tick()
        outcomes.append(engine.last_summary.outcome)
    assert outcomes == ["completed"] * 3, outcomes


def test_one_agent_alone_chooses_its_familys_first_state_in_a_mixed_buffer(tmp_path: Path) -> None:
    """buffer_size 3, families f (a, b) and g (g1, g2 honest, m the attacker). m proposes first, a and b fill the
    buffer, version 1 closes: 1 of 1 is a 'strict majority' of g's proposals in the buffer, so g's first state is
    m's weights although g has three agents (the known 2-of-3 gap becomes 1-of-N). g1's and g2's proposals, sent a
    moment later, are deferred and then refused as stale_base."""
    engine, outbox, _, _ = start(tmp_path, FAMILIES, buffer_size=3, min_available_agents=5, max_norm_ratio=0)
    assert sorted(announced(outbox).selected) == sorted(FAMILIES)
    send(engine, of(engine, outbox, "m", "g", 1, weights=weights(666.0)))
    send(engine, of(engine, outbox, "a", "f", 1))
    send(engine, of(engine, outbox, "b", "f", 1))
    engine.tick(), engine.tick()
    assert announced(outbox).round == 2
    assert "g" not in announced(outbox).states or not np.allclose(family_state(outbox, "g", 2), 666.0), \
        "family g's first state was chosen by one of its three agents alone"


def test_a_familys_votes_carry_over_buffers_so_honest_fleets_still_bootstrap(tmp_path: Path) -> None:
    """Three families of three agents, buffer_size 3, every buffer one proposal of each family (they propose at one
    pace): no buffer holds two of a family's proposals, so with votes counted per buffer no family ever got a first
    state (found in review of the rule above). Votes now carry over until a proposal has its majority."""
    fleet = {f"{fam}{i}": fam for fam in "fgh" for i in range(3)}
    engine, outbox, _, _ = start(tmp_path, fleet, buffer_size=3, min_available_agents=9, max_norm_ratio=1.0,
                                 max_staleness=3, rounds=12)
    for i in range(2):
        version = engine.open.number
        for fam in "fgh":
            send(engine, of(engine, outbox, f"{fam}{i}", fam, version, weights=weights(1.0)))
        engine.tick(), engine.tick()
    assert set(announced(outbox).states) == {"f", "g", "h"}  # each: 2 of its 3 agents, over two buffers
    assert all(np.allclose(family_state(outbox, fam, engine.open.number), 1.0) for fam in "fgh")


def test_an_attacker_cannot_win_a_carried_over_vote_alone(tmp_path: Path) -> None:
    engine, outbox, _, _ = start(tmp_path, FAMILIES, buffer_size=3, min_available_agents=5, max_norm_ratio=0)
    for _ in range(3):  # m proposes in every buffer; the honest g agents stay away
        version = engine.open.number
        send(engine, of(engine, outbox, "m", "g", version, weights=weights(666.0), delta={}))
        send(engine, of(engine, outbox, "a", "f", version))
        send(engine, of(engine, outbox, "b", "f", version))
        engine.tick(), engine.tick()
    assert "g" not in announced(outbox).states
    version = engine.open.number
    send(engine, of(engine, outbox, "g1", "g", version, weights=weights(1.0), delta={}))
    send(engine, of(engine, outbox, "a", "f", version))
    send(engine, of(engine, outbox, "b", "f", version))
    engine.tick(), engine.tick()
    assert "g" not in announced(outbox).states  # one vote each for 1.0 and 666: no majority of three
    version = engine.open.number
    send(engine, of(engine, outbox, "g2", "g", version, weights=weights(1.0), delta={}))
    send(engine, of(engine, outbox, "a", "f", version))
    send(engine, of(engine, outbox, "b", "f", version))
    engine.tick(), engine.tick()
    assert np.allclose(family_state(outbox, "g", engine.open.number), 1.0)  # g1 and g2: 2 of 3


def _bootstrapped_at(tmp_path: Path, g_init: float, f_init: float = 1.0):  # type: ignore[no-untyped-def]
    """As test_fedbuff_mixed_buffers._bootstrapped, but family g's agreed first weights are ``g_init`` everywhere."""
    engine, outbox, _, _ = start(tmp_path, AGENTS, buffer_size=4, min_available_agents=6, max_norm_ratio=1.0)
    for agent, family, value in (("a", "f", f_init), ("b", "f", f_init), ("g1", "g", g_init), ("g2", "g", g_init)):
        send(engine, of(engine, outbox, agent, family, 1, weights=weights(value)))
    engine.tick(), engine.tick()
    assert announced(outbox).round == 2 and "g" in announced(outbox).states
    return engine, outbox


def test_a_family_whose_first_weights_are_zero_is_not_bounded(tmp_path: Path) -> None:
    """A zero-initialised family (a linear model, a zero-init head) has no relative step to scale: its lone delta was
    not clipped at all (found in review). The other families' median norm bounds it."""
    engine, outbox = _bootstrapped_at(tmp_path, g_init=0.0)
    before = family_state(outbox, "g", 2)
    send(engine, of(engine, outbox, "m", "g", 2, delta={"w": np.full((2, 3), 1000.0, np.float32),
                                                          "b": np.full(3, 1000.0, np.float32)}))
    for agent in "abc":
        send(engine, of(engine, outbox, agent, "f", 2))
    engine.tick(), engine.tick()
    assert announced(outbox).round == 3
    moved = float(np.max(np.abs(family_state(outbox, "g", 3) - before)))
    assert moved <= 10.0, f"one agent moved zero-initialised family g by {moved} (honest deltas are 0.5)"


def test_a_zero_scale_is_bounded_by_the_other_families_step_per_value() -> None:
    """The same at unit level; and a family of a hundred times the values is not bounded by the small one's step per
    parameter times its own root (a large family's honest norms do not lend a small one a large bound: found in
    review of an absolute floor)."""
    norms = RoundNorms(1.0, scales={"f": 3.0, "g": 0.0, "h": 1.0}, sizes={"f": 9, "g": 9, "h": 9})
    for _ in range(3):
        norms.observe("f", 1.5)
    norms.observe("g", 1e30)
    assert norms.bound("g") == pytest.approx(1.5)  # f's step per value (0.5) times sqrt(9)
    norms.observe("h", 1e30)
    assert norms.bound("h") == pytest.approx(0.5)  # f's relative step (0.5) times h's weights' norm (1.0)


def test_a_lone_control_delta_is_bounded_by_the_other_families_control_deltas() -> None:
    """SCAFFOLD: a lone agent's control delta steers the server variate every agent's correction uses; it was clipped
    against its own norm (found in review). The server variates start at zero: the other families' control steps per
    value bound it."""
    keys = ("f", "g", control_key("f"), control_key("g"))
    norms = RoundNorms(1.0, scales={"f": 3.0, "g": 3.0, control_key("f"): 0.0, control_key("g"): 0.0},
                       sizes=dict.fromkeys(keys, 9))
    for _ in range(3):
        norms.observe("f", 1.5)
        norms.observe(control_key("f"), 1.0)
    norms.observe("g", 1.5)
    norms.observe(control_key("g"), 1e30)
    assert norms.bound(control_key("g")) == pytest.approx(1.0)
    assert norms.fallback(control_key("g")) == pytest.approx(1.0)  # what a site's control mean of g is held to
