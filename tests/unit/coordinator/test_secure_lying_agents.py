"""Secure rounds against lying agents and sites (found in review): keys no neighbour can agree with, a masked input
that claims more weight than its agent's samples, control sums and FedProto counts past their clip, and an upload
refused before it is unpacked. Driven as test_secure_rounds.py drives a secure round (the engine and the agents'
real secure side, no broker); a lying agent rewrites its own outgoing stage message before the engine sees it
(trust is open here: what is forged is only what the agent itself may sign)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from protocol.secagg.keys import KeyPair
from protocol.secagg.vector import quantiser
from protocol.secagg.wire import SecureAdvertise, SecureMasked
from protocol.wire import decode_message, encode_message
from tests.unit.coordinator.test_engine import TOPICS, rejected
from tests.unit.coordinator.test_secure_fedproto import CLASSES, DIM, local_prototypes, proto_fleet
from tests.unit.coordinator.test_secure_fedproto import train as proto_train
from tests.unit.coordinator.test_secure_rounds import AGENTS, Fleet
from tests.unit.coordinator.test_secure_scaffold import scaffold_fleet


class Forging(list):
    """fleet.up that rewrites ``agent``'s ``stage`` message as the agent publishes it (``change(message) -> message``)."""

    def __init__(self, agent: str, stage: str, kind: type, change: Callable) -> None:
        super().__init__()
        self.agent, self.stage, self.kind, self.change, self.hits = agent, stage, kind, change, 0

    def append(self, item: tuple[str, bytes]) -> None:
        topic, payload = item
        parsed = TOPICS.parse(topic)
        if parsed.agent_id == self.agent and parsed.stage == self.stage:
            payload = encode_message(self.change(decode_message(payload, self.kind)))
            self.hits += 1
        super().append((topic, payload))


def forge(fleet: Fleet, agent: str, stage: str, kind: type, change: Callable) -> Forging:
    """From now on, ``agent``'s ``stage`` message is rewritten as it is published."""
    assert not fleet.up
    fleet.up = Forging(agent, stage, kind, change)
    return fleet.up


def masked_by_d(fleet: Fleet, change: Callable[[np.ndarray], None]) -> Forging:
    """From now on, d's masked input is changed in place by ``change`` as d publishes it."""
    def edit(message: SecureMasked) -> SecureMasked:
        masked = np.array(message.masked, dtype=np.uint32, copy=True)
        change(masked)
        return message.model_copy(update={"masked": masked})
    return forge(fleet, "d", "masked", SecureMasked, edit)


def assert_refused(fleet: Fleet, forged: Forging, round_number: int, why: str) -> None:
    """The forged input went up once, and the round's unmasked sum was refused saying ``why``: the round failed."""
    assert forged.hits == 1
    fleet.pump()
    summary = fleet.engine.last_summary
    assert summary.round == round_number
    assert (summary.outcome, summary.reason) == ("failed", "secure_aggregation"), summary
    assert f"unmasked sum is refused: {why}" in summary.detail


def until_closed(fleet: Fleet, round_number: int, gone: frozenset[str] = frozenset()):
    """Pump and step the clock until ``round_number`` has a summary; that summary."""
    for _ in range(40):
        fleet.pump(gone=gone)
        summary = fleet.engine.last_summary
        if summary is not None and summary.round >= round_number:
            assert summary.round == round_number
            return summary
        fleet.clock.now += 2.0
    raise AssertionError(f"round {round_number} never closed")


def zeros() -> dict[str, np.ndarray]:
    return {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def full(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value, np.float32), "b": np.full(3, value, np.float32)}


# -- 1. An advertisement no neighbour can agree with is refused, not relayed ---------------------------------------

LOW_ORDER = bytes(32)  # u = 0: a small-order X25519 point, every exchange with it gives the all-zero secret


@pytest.mark.parametrize("keys", [
    "low-order encryption_key",          # keys.agree raises in every neighbour's share_keys: they abort at sharing
    "low-order mask_key",                # keys.mask_seed raises in every neighbour's masked_input: they abort at masking
])
def test_one_agents_bad_advertisement_does_not_fail_the_honest_agents_round(tmp_path: Path, keys: str) -> None:
    """d advertises a low-order key, which every exchange turns into the all-zero secret. Relayed (as before), the
    honest agents a, b, c, enough for the threshold among themselves, all aborted and the round failed; the
    coordinator now refuses the advertisement and the round completes without d."""
    fleet = Fleet(tmp_path)
    ann = fleet.announcement()

    def bad(message: SecureAdvertise) -> SecureAdvertise:
        k = message.keys
        fields = {"low-order encryption_key": {"encryption_key": LOW_ORDER},
                  "low-order mask_key": {"mask_key": LOW_ORDER}}[keys]
        return message.model_copy(update={"keys": k.model_copy(update=fields)})
    forged = forge(fleet, "d", "advertise", SecureAdvertise, bad)
    for participant in fleet.agents.values():
        participant.begin(ann)
    assert forged.hits == 1
    # d's own (modified) client stands by what it advertised, so it goes on to share valid bundles.
    client = fleet.agents["d"].client
    if keys == "low-order mask_key":
        client._masking = KeyPair(client._masking.private, LOW_ORDER)
    else:
        client._encryption = KeyPair(client._encryption.private, LOW_ORDER)
    fleet.pump()
    fleet.train({a: full(0.1) for a in ("a", "b", "c")})  # the honest agents' updates, masked if still in the round
    summary = until_closed(fleet, 2)
    assert summary.outcome == "completed", (summary.outcome, summary.detail)
    assert rejected(fleet.metrics, "secagg_refused", "secagg") >= 1  # d's advertisement (and what followed it)
    assert sorted(summary.secure["families"]["f"]["survivors"]) == ["a", "b", "c"]


# -- 2. The unmasked weight is bounded from above by the survivors' samples -----------------------------------------

@pytest.mark.parametrize("dropout", [True, False])
def test_a_survivor_cannot_claim_more_weight_than_its_cap_at_the_root(tmp_path: Path, dropout: bool) -> None:
    """Each survivor masks w = min(samples, cap) / cap <= 1. d adds ``extra`` weight units (and extra x clip to every
    value, which the value bound, growing with the weight, let through) to its own masked input: it moved the model
    further than any plain round in which d claims its cap. With c dropped 3 survivors weigh 3.75 > 3; without, 4
    weigh 3.9 <= 4, so "weight <= count" alone does not stop it: the sum is refused against sum(min(samples, cap))
    / cap of the survivors' statuses."""
    fleet = Fleet(tmp_path)
    ann = fleet.announcement()
    session = ann.secure.families["f"]
    grid = quantiser(ann.secure, session)
    assert session.weight_cap == 40 and session.ring_bits == 32
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    extra = 2.0 if dropout else 1.4  # weight units, each grid.bound ring elements (the weight element is w x clip)

    def inflate(message: SecureMasked) -> SecureMasked:
        masked = np.array(message.masked, dtype=np.uint32, copy=True)
        masked += np.uint32(int(extra * grid.bound))  # every value by extra x clip (on the grid), and the weight by extra
        return message.model_copy(update={"masked": masked})
    forged = forge(fleet, "d", "masked", SecureMasked, inflate)
    honest = ("a", "b") if dropout else ("a", "b", "c")  # with dropout, c shared, then vanished before masking
    fleet.train({**{a: zeros() for a in honest}, "d": full(2.0)})
    assert forged.hits == 1
    gone = frozenset({"c"}) if dropout else frozenset()
    summary = until_closed(fleet, 2, gone)
    # refused, not folded: the survivors' statuses allow at most sum(min(samples, cap)) / cap of weight
    assert (summary.outcome, summary.reason) == ("failed", "secure_aggregation"), summary
    assert "unmasked sum is refused: its sum weighs" in summary.detail


# -- 3. SCAFFOLD's control sums are bounded by control_clip ---------------------------------------------------------

def test_a_survivor_cannot_push_the_control_variate_past_its_clip(tmp_path: Path) -> None:
    """d adds 3.5 x control_clip (on the grid) to each control element. The control sums were taken whatever they held
    (the server variate moved further than when every agent sends +control_clip); now they are bounded as the delta's
    are, against control_clip, and the sum is refused."""
    fleet = scaffold_fleet(tmp_path)
    ann = fleet.announcement()
    session = ann.secure.families["f"]
    grid = quantiser(ann.secure, session)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    delta_values = 9  # "b" (3) then "w" (6), then the 9 control values, then the weight

    def push(masked: np.ndarray) -> None:
        masked[delta_values:2 * delta_values] += np.uint32(int(3.5 * grid.bound))
    forged = masked_by_d(fleet, push)
    fleet.train({a: zeros() for a in AGENTS}, controls={a: zeros() for a in AGENTS})
    assert_refused(fleet, forged, 2, "its control_delta sum")


# -- 4. FedProto's unmasked counts and sums are bounded by the survivors' samples -----------------------------------

def test_a_fedproto_survivor_cannot_count_for_more_samples_than_it_has(tmp_path: Path) -> None:
    """A plain FedProto update whose counts exceed its samples is refused (``bad_counts``). d adds 3 weight units
    (3 x cap samples) to class 0's count: the unmasked counts were taken as they came and the published ones exceeded
    every survivor's samples together; now the sum is refused (``plausible_prototypes``)."""
    fleet = proto_fleet(tmp_path)
    ann = fleet.announcement()
    session = next(iter(ann.secure.families.values()))
    grid = quantiser(ann.secure, session)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()

    def own_class(masked: np.ndarray) -> None:
        masked[CLASSES * DIM + 0] = (int(masked[CLASSES * DIM + 0]) + 3 * grid.bound) % 2**32  # its weight: +3 units
    forged = masked_by_d(fleet, own_class)
    proto_train(fleet, local_prototypes(0))
    assert_refused(fleet, forged, 1, "its classes count")


# -- 5. ... and a site's secure partial's control sums too ------------------------------------------------------------

def test_a_sites_secure_partial_cannot_push_the_control_variate_past_its_clip(tmp_path: Path) -> None:
    """Each site sets the control part of its unmasked ring sum near the ring's limit: the root's server control
    variate moved twice as far as control_clip allows any mean to. Now each partial is refused (``bad_partial``)."""
    from protocol.messages import TrainMetrics, Update
    from protocol.partials import PartialAggregate
    from tests.task_refs import DIGITS
    from tests.unit.coordinator import test_site_secure as secure
    from tests.unit.coordinator.test_engine import weights as engine_weights
    fed = secure.Federation(tmp_path, **{**secure.SECURE, "algorithm": "scaffold"})
    ann = fed.announce()
    zero = {name: np.zeros_like(a) for name, a in engine_weights(0.0).items()}
    for site_id, agents in secure.SITES.items():
        for agent_id in agents:
            update = Update(run_id=ann.run_id, agent_id=agent_id, round=1, task="train", task_ref=DIGITS, family="f",
                            base_digest=None, num_samples=secure.SAMPLES[agent_id], metrics=TrainMetrics(),
                            weights=engine_weights(1.0), control_delta=zero)
            fed.sites[site_id].on_message(TOPICS.update(agent_id, 1), encode_message(update))
    fed.pump()
    fed.root.tick()
    ann = fed.announce()
    for participant in fed.agents.values():
        participant.begin(ann)
    held: dict[str, tuple[str, bytes]] = {}
    fed.run_sites(held)
    for agent_id in secure.SAMPLES:
        update = Update(run_id=ann.run_id, agent_id=agent_id, round=2, task="train", task_ref=DIGITS, family="f",
                        base_digest=ann.states["f"].digest, num_samples=secure.SAMPLES[agent_id],
                        metrics=TrainMetrics(), delta=zero, control_delta=zero)
        assert fed.agents[agent_id].takes(update)
    fed.run_sites(held)
    assert set(held) == set(secure.SITES)
    for site_id, (topic, payload) in held.items():
        partial = decode_message(payload, PartialAggregate)
        session = ann.secure.sites[site_id].families["f"]
        bound = quantiser(ann.secure, session).bound
        ring = partial.ring_sum.copy()
        ring[9:18] = np.uint32(int((len(session.roster) - 0.1) * bound))  # the control values, near the ring's limit
        fed.root.on_message(topic, encode_message(partial.model_copy(update={"ring_sum": ring})))
    fed.pump()
    fed.clock.now += 40.0
    fed.pump()
    summary = fed.root.last_summary
    assert summary.round == 2
    assert summary.outcome == "quorum_missed", summary  # every site's partial refused: none of its agents counts
    assert rejected(fed.metrics, "bad_partial", "partial") == len(secure.SITES)


# -- 6. A masked input refused before it is unpacked ------------------------------------------------------------------

def test_a_masked_input_refused_at_the_wrong_stage_costs_no_more_than_its_size() -> None:
    """A masked input was unpacked (one uint8 per bit, then a (count, 32) uint8 matrix: ~35x its wire size for 12-bit
    elements) before the stage, the sender's shares and a second upload were checked: 5 GB a message for a
    100M-parameter model under int8. Now the checks come first, and unpacking reads blocks of elements by shifts."""
    import tracemalloc

    from coordinator.round.secure_session import take_stage
    from protocol.secagg import ring
    from protocol.secagg.config import RoundConfig
    from protocol.secagg.errors import SecAggRefused
    from protocol.secagg.server import SecAggServer
    from protocol.secagg.wire import SecureFamily
    n, bits = 1_000_000, 12
    family = SecureFamily(roster=["a", "b"], graph_seed=bytes(32), degree=1, threshold=1, n_params=n, weight_cap=1,
                          ring_bits=bits)
    server = SecAggServer(RoundConfig(2, ("a", "b"), n, bytes(32), 1, 1))  # at stage "advertise"
    packed = np.zeros(ring.words(n, bits), np.uint32)
    message = SecureMasked(run_id="r", round=2, agent_id="a", masked=packed)
    tracemalloc.start()
    try:
        with pytest.raises(SecAggRefused, match="too early"):
            take_stage(server, family, ("f",), "a", "mask", message, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 4 * packed.nbytes, f"a refused {packed.nbytes / 1e6:.1f} MB upload allocated {peak / 1e6:.1f} MB"
