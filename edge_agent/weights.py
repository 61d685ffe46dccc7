"""Model state as named numpy arrays, the form that crosses the wire."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from protocol.arrays import check_layout
from protocol.compression import widen_half


def get_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """A copy of every parameter and buffer, in state-dict order."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def set_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Load named arrays into ``model``; raises ProtocolError(BAD_SHAPE) if they do not fit it.

    float16 arrays (a state published in half precision) widen to the model's float dtype."""
    layout = layout_of_model(model)
    arrays = widen_half(arrays, layout)
    check_layout(arrays, layout, "global weights")
    state = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in arrays.items()}
    model.load_state_dict(state, strict=True)


def layout_of_model(model: nn.Module) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names, shapes and wire dtypes of ``model``'s state, without copying it off the device."""
    return {name: (tuple(t.shape), np.dtype(str(t.dtype).removeprefix("torch.")).str)
            for name, t in model.state_dict().items()}


def subtract(local: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``local - base`` per name, in ``local``'s dtypes; 0-d arrays (counters) stay arrays, not scalars."""
    return {name: np.asarray(local[name] - base[name]).astype(local[name].dtype, copy=False) for name in local}
