"""Whole SecAgg+ rounds in one process: exact sums, dropouts at every stage, late agents, thresholds."""

from __future__ import annotations

import os

import numpy as np
import pytest

from protocol.secagg.client import SecAggClient
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted, SecAggRefused
from protocol.secagg.messages import UnmaskRequest, UnmaskResponse
from protocol.secagg.quantise import Quantiser
from protocol.secagg.server import SecAggServer
from protocol.secagg.simulate import Dropouts, run_round

N_PARAMS = 3000


def make_round(n: int, round_id: int = 1, **kwargs: object) -> RoundConfig:
    roster = tuple(f"agent-{i:03d}" for i in range(n))
    return RoundConfig(round_id, roster, N_PARAMS, os.urandom(32), **kwargs)  # type: ignore[arg-type]


def inputs_for(config: RoundConfig, seed: int = 0) -> tuple[Quantiser, dict[str, np.ndarray], dict[str, np.ndarray]]:
    q = Quantiser(clip=0.5, max_summands=len(config.roster))
    rng = np.random.default_rng(seed)
    floats = {a: rng.normal(0.0, 0.1, N_PARAMS).astype(np.float32) for a in config.roster}
    return q, floats, {a: q.quantise(x) for a, x in floats.items()}


def ring_sum(vectors: list[np.ndarray]) -> np.ndarray:
    total = np.zeros(N_PARAMS, dtype=np.uint32)
    for v in vectors:
        total += v
    return total


def check(config: RoundConfig, dropouts: Dropouts, expect_survivors: int) -> None:
    q, floats, quantised = inputs_for(config)
    result = run_round(config, quantised.__getitem__, dropouts)
    assert len(result.survivors) == expect_survivors and not result.client_aborts
    assert np.array_equal(result.total, ring_sum([quantised[a] for a in result.survivors]))
    plain = np.mean([floats[a].astype(np.float64) for a in result.survivors], axis=0)
    assert np.max(np.abs(q.dequantise_mean(result.total, len(result.survivors)) - np.clip(plain, -0.5, 0.5))) <= q.step
    assert result.recovered == (dropouts.after_sharing & {a for s in result.survivors for a in config.neighbours_of(s)})


@pytest.mark.parametrize("n", [2, 5, 12, 40])
def test_the_unmasked_sum_is_the_sum_of_the_quantised_inputs(n: int) -> None:
    check(make_round(n), Dropouts(), n)


def test_dropouts_at_every_stage_are_recovered() -> None:
    config = make_round(40)
    a = config.roster
    dropouts = Dropouts(before_advertise=frozenset({a[0]}), after_advertise=frozenset({a[1], a[7]}),
                        after_sharing=frozenset({a[2], a[3], a[20]}), after_masking=frozenset({a[4], a[30]}))
    check(config, dropouts, 40 - 6)  # after_masking agents are in the sum: their self-masks are rebuilt


@pytest.mark.parametrize("stage", ["after_advertise", "after_sharing", "after_masking"])
def test_a_dropout_at_one_stage_is_recovered(stage: str) -> None:
    config = make_round(12)
    gone = frozenset(config.roster[3:5])
    check(config, Dropouts(**{stage: gone}), 12 if stage == "after_masking" else 10)


def test_masks_hide_the_input_and_differ_per_round() -> None:
    masked_by_round = []
    for round_id in (1, 2):
        config = make_round(6, round_id)
        _, _, quantised = inputs_for(config)
        server = SecAggServer(config)
        clients = {a: SecAggClient(a, config) for a in config.roster}
        for c in clients.values():
            server.receive_advertisement(c.advertise())
        keys = server.close_advertising()
        for a, c in clients.items():
            server.receive_shares(a, c.share_keys(keys[a]))
        inbox = server.close_sharing()
        masked = {a: c.masked_input(quantised[a], inbox[a]) for a, c in clients.items()}
        a0 = config.roster[0]
        assert np.mean(masked[a0] == quantised[a0]) < 0.01
        masked_by_round.append(masked[a0])
    assert np.mean(masked_by_round[0] == masked_by_round[1]) < 0.01  # same input, fresh keys and seeds


class Stepper:
    """Drives the stages by hand, so a test can act between them."""

    def __init__(self, config: RoundConfig) -> None:
        self.config = config
        self.server = SecAggServer(config)
        self.clients = {a: SecAggClient(a, config) for a in config.roster}
        _, _, self.quantised = inputs_for(config)

    def up_to_masking(self, skip_upload: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
        for c in self.clients.values():
            self.server.receive_advertisement(c.advertise())
        keys = self.server.close_advertising()
        for a, c in self.clients.items():
            self.server.receive_shares(a, c.share_keys(keys[a]))
        inbox = self.server.close_sharing()
        masked = {a: c.masked_input(self.quantised[a], inbox[a]) for a, c in self.clients.items()}
        for a, m in masked.items():
            if a not in skip_upload:
                self.server.receive_masked_input(a, m)
        return masked


def test_a_late_agent_is_refused_and_never_gets_both_shares_revealed() -> None:
    config = make_round(12)
    late = config.roster[5]
    step = Stepper(config)
    masked = step.up_to_masking(skip_upload=frozenset({late}))
    request = step.server.close_masking()
    assert late not in request.survivors
    with pytest.raises(SecAggRefused, match="too late"):
        step.server.receive_masked_input(late, masked[late])  # its mask key shares are about to be revealed
    responses = {a: c.unmask(request) for a, c in step.clients.items() if a != late}
    for response in responses.values():
        assert not set(response.self_mask_shares) & set(response.key_shares)
        if late in config.neighbours_of(response.agent):
            assert late in response.key_shares and late not in response.self_mask_shares
    # A second request, now counting the late agent as a survivor (to get its self-mask too), is refused.
    neighbour = next(a for a in config.neighbours_of(late))
    with pytest.raises(SecAggAborted, match="stage"):
        step.clients[neighbour].unmask(UnmaskRequest(request.survivors | {late}))
    with pytest.raises(SecAggAborted, match="not in the sum"):
        step.clients[late].unmask(request)
    with pytest.raises(SecAggRefused, match="not a survivor"):
        step.server.receive_unmask_response(UnmaskResponse(late, {}, {}))
    for response in responses.values():
        step.server.receive_unmask_response(response)
    total = step.server.finish()
    assert np.array_equal(total, ring_sum([step.quantised[a] for a in config.roster if a != late]))


def test_below_threshold_the_round_fails_before_revealing_anything() -> None:
    config = make_round(12)  # complete graph: degree 11, threshold 6
    assert config.threshold == 6
    gone = frozenset(config.roster[:7])  # 5 survivors < 6
    with pytest.raises(SecAggAborted, match="fewer than the threshold 6") as caught:
        run_round(config, inputs_for(config)[2].__getitem__, Dropouts(after_sharing=gone))
    assert caught.value.stage == "mask"
    with pytest.raises(SecAggAborted, match="advertise"):
        run_round(config, inputs_for(config)[2].__getitem__, Dropouts(before_advertise=gone))


def test_too_few_unmasking_answers_fail_with_a_clear_reason() -> None:
    config = make_round(12)
    step = Stepper(config)
    step.up_to_masking()
    request = step.server.close_masking()
    for a in config.roster[:5]:
        step.server.receive_unmask_response(step.clients[a].unmask(request))
    with pytest.raises(SecAggAborted, match="5 survivors answered.*threshold 6"):
        step.server.finish()


def test_a_wrong_share_is_caught_not_summed() -> None:
    config = make_round(8)
    step = Stepper(config)
    step.up_to_masking()
    request = step.server.close_masking()
    responses = [step.clients[a].unmask(request) for a in config.roster]
    victim = next(iter(responses[0].self_mask_shares))
    for response in responses:  # every holder lies, so whichever shares are used, one is wrong
        if victim in response.self_mask_shares:
            response.self_mask_shares[victim] = (response.self_mask_shares[victim] + 1) % 1000
        step.server.receive_unmask_response(response)
    with pytest.raises(SecAggAborted, match="open"):
        step.server.finish()


def test_the_server_refuses_bad_messages_and_keeps_going() -> None:
    config = make_round(6)
    step = Stepper(config)
    first = step.clients[config.roster[0]]
    ad = first.advertise()
    step.server.receive_advertisement(ad)
    for bad in (ad, type(ad)("stranger", ad.encryption_key, ad.mask_key, ad.self_mask_commitment)):
        with pytest.raises(SecAggRefused):
            step.server.receive_advertisement(bad)
    with pytest.raises(SecAggRefused, match="too early"):
        step.server.receive_masked_input(config.roster[0], np.zeros(N_PARAMS, np.uint32))
    for c in list(step.clients.values())[1:]:
        step.server.receive_advertisement(c.advertise())
    keys = step.server.close_advertising()
    bundles = first.share_keys(keys[config.roster[0]])
    with pytest.raises(SecAggRefused, match="exactly"):
        step.server.receive_shares(config.roster[0], dict(list(bundles.items())[:-1]))
    step.server.receive_shares(config.roster[0], bundles)
    for a, c in list(step.clients.items())[1:]:
        step.server.receive_shares(a, c.share_keys(keys[a]))
    inbox = step.server.close_sharing()
    second = config.roster[1]
    tampered = dict(inbox[second])
    sender = next(iter(tampered))
    tampered[sender] = tampered[sender][:-1] + bytes([tampered[sender][-1] ^ 1])
    for bad in (np.zeros(N_PARAMS, np.int64), np.zeros(N_PARAMS - 1, np.uint32)):
        with pytest.raises(SecAggRefused, match="uint32"):
            step.server.receive_masked_input(config.roster[0], bad)
    # A tampered bundle is refused by its recipient, which stays in the round without the sender's shares.
    masked = {a: c.masked_input(step.quantised[a], tampered if a == second else inbox[a])
              for a, c in step.clients.items()}
    assert list(step.clients[second].refused) == [sender]
    assert "does not open" in step.clients[second].refused[sender]
    for a, m in masked.items():
        step.server.receive_masked_input(a, m)
    request = step.server.close_masking()
    responses = {a: c.unmask(request) for a, c in step.clients.items()}
    assert sender not in responses[second].self_mask_shares
    for response in responses.values():
        step.server.receive_unmask_response(response)
    assert step.server.withheld == {second: frozenset({sender})}
    assert np.array_equal(step.server.finish(), ring_sum(list(step.quantised.values())))


def test_malformed_advertisements_and_shares_are_refused_without_a_crash() -> None:
    config = make_round(6)
    step = Stepper(config)
    ads = {a: c.advertise() for a, c in step.clients.items()}
    first = config.roster[0]
    for bad in (type(ads[first])(first, "x" * 32, ads[first].mask_key, ads[first].self_mask_commitment),  # type: ignore[arg-type]
                type(ads[first])(first, ads[first].encryption_key, ads[first].mask_key, b"short")):
        with pytest.raises(SecAggRefused):
            step.server.receive_advertisement(bad)
    for ad in ads.values():
        step.server.receive_advertisement(ad)
    keys = step.server.close_advertising()
    low_order = dict(keys[first])
    second = config.roster[1]
    low_order[second] = type(ads[second])(second, bytes(32), ads[second].mask_key, ads[second].self_mask_commitment)
    with pytest.raises(SecAggAborted, match="encryption key"):
        step.clients[first].share_keys(low_order)  # the all-zero point: a shared secret of zeros, refused
    for a, c in list(step.clients.items())[1:]:
        step.server.receive_shares(a, c.share_keys(keys[a]))
    with pytest.raises(SecAggRefused, match="bytes"):
        step.server.receive_shares(first, dict.fromkeys(config.neighbours_of(first), "not bytes"))


@pytest.mark.parametrize("field", ["encryption_key", "mask_key", "both alike", "another agent's"])
def test_an_advertisement_no_neighbour_can_agree_with_is_refused(field: str) -> None:
    """A low-order key (every exchange gives the all-zero secret), one key used twice, or another agent's key: relayed,
    every honest neighbour aborted on it; refused, the round goes on without the agent."""
    from dataclasses import replace

    config = make_round(6)
    server = SecAggServer(config)
    clients = {a: SecAggClient(a, config) for a in config.roster}
    first, liar = config.roster[0], config.roster[1]
    theirs = clients[first].advertise()  # a client advertises once
    server.receive_advertisement(theirs)
    ad = clients[liar].advertise()
    forged = {"encryption_key": replace(ad, encryption_key=bytes(32)), "mask_key": replace(ad, mask_key=bytes(32)),
              "both alike": replace(ad, mask_key=ad.encryption_key),
              "another agent's": replace(ad, mask_key=theirs.mask_key)}[field]
    with pytest.raises(SecAggRefused, match="key"):
        server.receive_advertisement(forged)
    server.receive_advertisement(ad)  # its genuine keys are still taken
    assert set(server.advertised) == {first, liar}
