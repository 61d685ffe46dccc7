"""SCAFFOLD (Karimireddy et al., 2020), option II, on the agent.

Every local step is the optimizer's step on the raw gradient, then the correction:

    y <- step(y, g(y)) - lr * (c - c_i)

With momentum 0 that is the paper's ``y <- y - lr * (g(y) + c - c_i)``. With momentum the
correction stays outside the momentum buffer (as NIID-Bench's SCAFFOLD runs it): ``c_i`` then
learns the agent's mean momentum step, ``c`` the fleet's, and the correction swaps one for the
other at the same scale. After ``K`` steps the agent's variate becomes

    c_i+ = c_i - c + (x - y) / (K * lr)

and it sends ``y - x`` (its weights in a bootstrap round) with ``control_delta = c_i+ - c_i``.
Variates cover the trainable parameters only, named like them.

``c_i`` persists in the state directory under a name keyed by run and family, so a rebooted
device continues with its variate and a new run starts from zero. The file also keeps the
round it was computed for and the variate before that round: a device that dies after saving
but before its update was recorded answers that round again from the same starting variate,
instead of advancing it twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from pydantic import Field

from edge_agent.algorithms.base import AlgorithmParams, ClientAlgorithm, model_fields, parameter_names
from edge_agent.algorithms.registry import register_client
from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.state import AgentStateDir
from edge_agent.training import TrainResult
from edge_agent.weights import get_arrays, subtract
from protocol.arrays import all_finite, check_layout, layout_of
from protocol.errors import ProtocolError
from protocol.messages import GlobalState, LocalTraining

log = logging.getLogger(__name__)

FILE_PREFIX = "scaffold-"
HEAD = "head."
"""The classifier head's parameters (``FedModel.head``)."""
_BEFORE, _AFTER, _ROUND = "before/", "after/", "round"


class ScaffoldParams(AlgorithmParams):
    correct_head: bool = True
    """False (outside the paper): the classifier head (``head.*``) takes plain SGD steps; only the feature layers'
    are corrected. Its variates are still kept and sent, so the server's arithmetic is unchanged."""
    absent_class_scale: float = Field(default=1.0, gt=0.0, le=1.0)
    """Below 1 (outside the paper): the training loss scales the logits of the classes this agent holds no sample
    of by it (``edge_agent.training.absent_class_factors``); under strong label skew it keeps one-class agents from
    swinging the model (bench/scaffold_reference.py)."""


class ScaffoldClient(ClientAlgorithm):
    name = "scaffold"
    dp_compatible = True  # the correction is data-independent; the variates derive from the private weights
    params_model = ScaffoldParams
    params: ScaffoldParams

    @property
    def state_name(self) -> str:
        return f"{FILE_PREFIX}{self.context.run_id}-{self.context.family}"

    @property
    def absent_class_scale(self) -> float:
        return self.params.absent_class_scale

    def check_plan(self, plan: LocalTraining) -> None:
        self._learning_rate = plan.learning_rate  # every step moves the weights by lr * (c - c_i)

    def begin(self, model: FedModel, global_state: GlobalState | None) -> None:
        self.start = get_arrays(model)
        self.base = None if global_state is None else self.start
        params = {name: self.start[name] for name in parameter_names(model)}
        self.server_control = self._server_control(global_state, params)
        self.control = self.load_control(params)
        corrected = [n for n in params if self.params.correct_head or not n.startswith(HEAD)]
        self._step = {name: torch.from_numpy(self._learning_rate * (self.server_control[name] - self.control[name]))
                      .to(self.context.device) for name in corrected}

    @torch.no_grad()
    def after_step(self, model: FedModel) -> None:
        for name, p in model.named_parameters():
            if name in self._step:
                p.sub_(self._step[name])

    def payload(self, model: FedModel, train: Dataset, result: TrainResult, plan: LocalTraining) -> dict[str, Any]:
        trained = get_arrays(model)
        updated = {}
        for name, c_i in self.control.items():
            if result.steps == 0:  # nothing trained: the variate stays
                updated[name] = c_i.copy()
                continue
            drift = (self.start[name].astype(np.float64) - trained[name]) / (result.steps * plan.learning_rate)
            updated[name] = (c_i.astype(np.float64) - self.server_control[name] + drift).astype(c_i.dtype)
        self._pending = (self.control, updated)
        return {**model_fields(trained, self.base), "control_delta": subtract(updated, self.control)}

    def commit(self) -> None:
        self.save_control(*self._pending)

    # -- the variates ---------------------------------------------------------------------
    @staticmethod
    def _server_control(global_state: GlobalState | None, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if global_state is None:
            return {name: np.zeros_like(a) for name, a in params.items()}
        check_layout(global_state.control, layout_of(params), "server control variate")
        return dict(global_state.control)

    def load_control(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This agent's ``c_i`` at the start of the round (zeros in a new run)."""
        self.state.remove_matching(FILE_PREFIX, keep=self.state_name)  # variates of earlier runs
        zeros = {name: np.zeros_like(a) for name, a in params.items()}
        try:
            stored = self.state.read_arrays(self.state_name)
            if stored is None:
                return zeros
            prefix = _BEFORE if stored_round(stored) == self.context.round else _AFTER
            control = {k[len(prefix):]: v for k, v in stored.items() if k.startswith(prefix)}
            check_layout(control, layout_of(params), "stored control variate")
            if not all(all_finite(a) for a in control.values() if a.dtype.kind == "f" and a.size):
                raise ValueError("it holds NaN or Inf")  # each DP round would be charged, then fail on its loss
            return control
        except (ProtocolError, ValueError, KeyError, TypeError, OverflowError) as exc:
            # Zero is where every variate starts: SCAFFOLD recovers from it, a crash loop would not.
            log.warning("control variate %s unusable (%s); starting again from zero", self.state_name, exc)
            return zeros

    def save_control(self, before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
        write_control(self.state, self.state_name, self.context.round, before, after)


def write_control(state: AgentStateDir, name: str, round_number: int, before: dict[str, np.ndarray],
                  after: dict[str, np.ndarray]) -> None:
    arrays = {_ROUND: np.array(round_number, dtype=np.int64)}
    arrays |= {_BEFORE + k: v for k, v in before.items()} | {_AFTER + k: v for k, v in after.items()}
    state.write_arrays(name, arrays)


def stored_round(stored: dict[str, np.ndarray]) -> int:
    """The round a stored variate was written in; ValueError unless the file says it as one integer."""
    value = np.asarray(stored[_ROUND])
    if value.shape != () or value.dtype.kind not in "iu":
        raise ValueError(f"its round is {value.dtype}{list(value.shape)}, not an integer")
    return int(value)


def revert_control(state: AgentStateDir, run_id: str, family: str, round_number: int) -> bool:
    """Undo ``round_number``'s step of this agent's variate (True when there was one to undo).

    For a round whose control delta the server never added (a secure round that left this agent's masked
    input out of the sum, or failed): ``c`` stays the mean of the variates only if ``c_i`` stays too."""
    name = f"{FILE_PREFIX}{run_id}-{family}"
    stored = state.read_arrays(name)
    if stored is None or stored_round(stored) != round_number:
        return False
    before = {k[len(_BEFORE):]: v for k, v in stored.items() if k.startswith(_BEFORE)}
    write_control(state, name, round_number, before, before)
    return True



def undo_if_left_out(state: AgentStateDir, family: str) -> Callable[[str, int, bool], None]:
    """The agent's hook for a secure round's fate (``edge_agent.secure``): a masked input left out of the sum has
    its variate step undone, since the server never added it."""
    def settled(run_id: str, round_number: int, counted: bool) -> None:
        if counted:
            return
        try:
            undone = revert_control(state, run_id, family, round_number)
        except (ProtocolError, ValueError, KeyError, TypeError, OverflowError) as exc:  # the next round starts from 0
            log.warning("round %d: control variate unreadable (%s): its step is not undone", round_number, exc)
            return
        if undone:
            log.warning("round %d: control variate step undone (the round's sum did not include it)", round_number)
    return settled


register_client(ScaffoldClient, summary="plain SGD steps corrected by c - c_i; sends the delta and its control delta", payloads=("weights", "delta", "control"))
