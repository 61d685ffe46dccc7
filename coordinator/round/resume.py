"""Starting up: a new run, or the one the state directory holds, with its open round if it had one.

The driver reads the state files (``Saved``); resuming only interprets them, and a checkpoint
of another algorithm or task stops start-up rather than mixing two runs.
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator.admission.task_agreement import fingerprint_of
from coordinator.round import epochs
from coordinator.round.actions import Resumed
from coordinator.round.closing import begin_close, checkpoint, loop_state
from coordinator.round.norm_clip import NormGate, RoundNorms
from coordinator.round.opening import begin
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState
from coordinator.state.checkpoint import CheckpointError
from coordinator.state.rounds import OpenRound, RoundSummary
from protocol.messages import RoundAnnouncement
from protocol.secagg.accounting import round_rdp
from protocol.wire import decode_message, encode_message

log = logging.getLogger("coordinator.round.engine")


@dataclass(frozen=True)
class Saved:
    """The state files as the driver found them (None: absent)."""

    checkpoint: dict[str, Any] | None = None
    open_round: dict[str, Any] | None = None
    retained: dict[str, Any] | None = None
    where: str = "the state directory"
    freshness: dict[str, Any] | None = None
    """The newest epoch and the agents' freshness marks (``coordinator.round.epochs``)."""


def restore(parts: EngineParts, run: RunState, saved: Saved) -> None:
    """Resume from the checkpoint if there is one, else start a new run; a round that was open and is
    past its deadline (without a grace period) is closed at once."""
    parts.retained.load(saved.retained)
    if saved.checkpoint is None:
        run.run_id = secrets.token_hex(6)
        epochs.restore(parts, run, saved.freshness, None)
        parts.actions.add(checkpoint(parts, run.run_id, run.next_round, run.finished, None, epoch=run.epoch,
                                     loop=loop_state(parts, run)))
        log.info("new run %s (epoch %d): %s with %s, %d rounds", run.run_id, run.epoch, parts.strategy.algorithm,
                 parts.strategy.aggregator.describe(), parts.settings.rounds)
        return
    data = saved.checkpoint
    check_fields(data, saved.where)
    if data["algorithm"] != parts.strategy.algorithm:
        raise ValueError(f"checkpoint in {saved.where} is a {data['algorithm']} run, not "
                         f"{parts.strategy.algorithm}; use another state_dir to start a new run")
    run.run_id = data["run_id"]
    epochs.restore(parts, run, saved.freshness, data)
    run.next_round, run.finished = data["next_round"], data["finished"]  # typed by check_fields
    last = data.get("last_summary") or (data["history"][-1] if data.get("history") else None)  # format of 2026-11
    try:
        run.last_summary = None if last is None else RoundSummary.from_dict(last)
    except (TypeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{saved.where}: last_summary is not a round summary ({exc}); move it away to start "
                              f"a new run") from None
    parts.strategy.load_state_dict(data["strategy"])
    parts.task.load_state_dict(data.get("task") or {"name": "digits", "version": "1", "layouts": {}},  # format of 2026-11
                               saved.where)
    check_states(parts, saved.where)
    parts.versions.load_state_dict(data.get("versions") or {})
    parts.applied.load_state_dict(data.get("applied") or {})  # since 2026-12
    parts.privacy.load_state_dict(data.get("privacy") or {})  # since 2026-12-03: a ledger's rollback outlives restarts
    norms = data.get("norms") or {}  # since 2026-12-03: a lone delta after a restart is clipped as before it
    run.norm_gate = NormGate(RoundNorms(0.0, trusted_norms(norms.get("updates") or {}, saved.where)))
    run.site_gate = NormGate(RoundNorms(0.0, trusted_norms(norms.get("sites") or {}, saved.where)))
    _resume_ledger(parts, data.get("central_dp"), saved.where)
    parts.versions.record(parts.strategy.states, run.next_round)
    log.info("resumed run %s (epoch %d) at round %d from %s", run.run_id, run.epoch, run.next_round, saved.where)
    parts.actions.add(Resumed(run.last_summary))
    _resume_open_round(parts, run, saved.open_round)


def trusted_norms(saved: dict[str, Any], where: object) -> dict[str, float]:
    """A checkpoint's carried medians (family key -> norm), checked."""
    if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               and v >= 0 for k, v in saved.items()):
        raise ValueError(f"checkpoint in {where}: carried norms must map family keys to finite norms")
    return {k: float(v) for k, v in saved.items()}


FIELD_TYPES: dict[str, tuple[type, ...]] = {"run_id": (str,), "algorithm": (str,), "next_round": (int,),
                                           "finished": (bool,), "epoch": (int,), "strategy": (dict,)}


def check_fields(data: dict[str, Any], where: object) -> None:
    """The checkpoint's own fields, typed and in range (a bool is not a round number, "false" is not a flag)."""
    for name, types in FIELD_TYPES.items():
        value = data.get(name, 0 if name == "epoch" else None)
        if not isinstance(value, types) or (types == (int,) and isinstance(value, bool)) or \
                (name == "next_round" and value < 1) or (name == "epoch" and value < 0):
            raise CheckpointError(f"{where}: field {name} is {value!r}, not a valid {types[0].__name__}; move it "
                                  f"away to start a new run")


def check_states(parts: EngineParts, where: object) -> None:
    """Every family's state is finite floating arrays, laid out as the task pinned the family."""
    for family, state in parts.strategy.states.items():
        arrays = {**state.weights, **{f"control/{n}": a for n, a in state.control.items()}}
        for name, array in arrays.items():
            if not isinstance(array, np.ndarray) or array.dtype.kind not in "fiub" or \
                    (array.dtype.kind == "f" and not np.isfinite(array).all()):
                raise CheckpointError(f"{where}: {family}'s {name} is not a finite array; move it away to start a new run")
        pinned = parts.task.layouts.get(family)
        if state.weights and pinned is not None and fingerprint_of(state.weights) != pinned:
            raise CheckpointError(f"{where}: {family}'s weights are not laid out as the task pinned ({pinned}); move "
                                  f"it away to start a new run")


def _resume_ledger(parts: EngineParts, state: dict[str, Any] | None, where: object) -> None:
    """Distributed DP's spending survives restarts; a run that spent without noise on cannot turn it off unnoticed."""
    ledger = parts.central_ledger
    if ledger is None:
        if state is not None and state.get("rounds"):
            log.warning("checkpoint in %s records %d noisy sums (distributed DP) but secagg_noise_multiplier is 0 now: "
                        "later rounds' sums carry no noise", where, state["rounds"])
        return
    if state is not None:
        ledger.load_state_dict(state)
        parts.metrics.secagg_dp_epsilon.set(ledger.epsilon)


def _charge_interrupted_release(parts: EngineParts, announcement: RoundAnnouncement) -> None:
    """A noisy secure round that had asked for the reveals when the coordinator stopped may have unmasked its sums:
    the ledger reaches disk only with the round's checkpoint, so it was never charged, and the round runs again with
    fresh noise (a coordinator killed after each unmasking would collect independent noisy sums for free). Charged
    here as if every session's sum was released: too much if the crash came before, never too little."""
    secure, ledger = announcement.secure, parts.central_ledger
    if secure is None or secure.noise is None or ledger is None:
        return
    ledger.spend(round_rdp(secure, [session for _, _, session in secure.sessions()]))
    parts.metrics.secagg_dp_epsilon.set(ledger.epsilon)
    log.warning("round %d (distributed DP) was open at the restart: charged as released, epsilon now %.4g",
                announcement.round, ledger.epsilon)


def _resume_open_round(parts: EngineParts, run: RunState, saved: dict[str, Any] | None) -> None:
    if saved is None or saved["run_id"] != run.run_id or saved["round"] != run.next_round:
        return
    announcement = decode_message(saved["announcement"], RoundAnnouncement)
    if announcement.epoch != run.epoch:  # saved before epochs: agents would drop it as an older epoch's
        announcement = announcement.model_copy(update={"epoch": run.epoch})
        saved = {**saved, "announcement": encode_message(announcement)}
    if saved.get("unmasking"):
        _charge_interrupted_release(parts, announcement)
    now = parts.clock()
    age = max(0.0, parts.wall_clock() - announcement.issued_at)
    remaining = announcement.deadline_s - age
    wanted = int(saved.get("wanted", len(announcement.selected)))
    payload = parts.publisher.sealed(saved["announcement"])
    grace = parts.settings.resume_grace_s
    if remaining <= 0 and grace <= 0:
        run.open = OpenRound(announcement, payload, now, now - age, wanted)
        begin(parts, run)
        parts.actions.add(begin_close(parts, run, now, ("interrupted", "coordinator restarted after the deadline")))
        return
    # Past its deadline, the round still waits a grace period for the updates the broker queued
    # for us and those agents resend to the new session, rather than throw finished work away.
    remaining = max(remaining, grace)
    median_claim = saved.get("median_claim")
    if median_claim is not None and (isinstance(median_claim, bool) or not isinstance(median_claim, (int, float))
                                     or not math.isfinite(median_claim) or median_claim < 0):
        raise CheckpointError(f"the open round's median_claim is {median_claim!r}, not a claim; move open_round away")
    run.open = OpenRound(announcement, payload, now + remaining, now - age, wanted, median_claim=median_claim)
    begin(parts, run)
    log.info("round %d was open at the restart: collecting for %.1fs more", announcement.round, remaining)
