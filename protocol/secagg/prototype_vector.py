"""FedProto's masked input: per-class prototype sums and counts, so the coordinator learns only their totals.

An agent's prototypes ``[classes, dim]`` (its mean embedding per class) and the count behind each row
become one vector: row c, every value clipped to [-clip, clip], times the class's weight
w_c = min(count_c, weight_cap) / weight_cap (in [0, 1]), rows back to back; then the ``classes`` weights,
each times ``clip`` so that one grid holds them. Quantised on the round's grid (``vector.quantiser``) the
ring sum of the survivors reads back as sum_i(w_ic p_ic) and sum_i(w_ic) per class: multiplied by the
family's ``weight_cap`` they are count units, and the global prototype of class c is their ratio, the
count-weighted mean a plain FedProto round takes (``coordinator/strategies/fedproto.py``), with each agent's
count capped as plain rounds cap claims. A class an agent does not hold has w_c = 0 and adds nothing.
"""

from __future__ import annotations

import numpy as np

from protocol.secagg.vector import quantiser
from protocol.secagg.wire import SecureFamily, SecureSetup


def prototype_length(classes: int, dim: int) -> int:
    """Ring elements of one masked FedProto input: every prototype value, then one weight per class."""
    return classes * (dim + 1)


def encode_prototypes(prototypes: np.ndarray, counts: np.ndarray | None, setup: SecureSetup,
                      family: SecureFamily) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 vector before quantising, its uint32 ring form) of one agent's prototypes and counts;
    ValueError when they do not fit the round's declared length."""
    rows = np.asarray(prototypes, dtype=np.float64)
    held = np.asarray(counts)
    if rows.ndim != 2 or held.shape != rows.shape[:1]:
        raise ValueError(f"prototypes {list(rows.shape)} with counts {list(held.shape)}: one count per row")
    if prototype_length(*rows.shape) != family.n_params:
        raise ValueError(f"prototypes {list(rows.shape)} make {prototype_length(*rows.shape)} values, the round "
                         f"declares {family.n_params}")
    weights = np.clip(held.astype(np.float64), 0, family.weight_cap) / family.weight_cap
    weighted = np.clip(rows, -setup.clip, setup.clip) * weights[:, None]
    plain = np.concatenate([weighted.reshape(-1), weights * setup.clip])
    return plain, quantiser(setup, family).quantise(plain)


def decode_prototype_sums(total: np.ndarray, count: int, classes: int, setup: SecureSetup,
                          family: SecureFamily) -> tuple[np.ndarray, np.ndarray]:
    """(sum of count-weighted prototypes [classes, dim], summed counts [classes]), both float64 in count units
    (capped counts), from the unmasked ring sum of ``count`` agents' inputs."""
    values = quantiser(setup, family).dequantise_sum(total, count)
    if classes < 1 or values.size % classes or values.size // classes < 2:
        raise ValueError(f"a sum of {values.size} elements is no [classes, dim] layout of {classes} classes")
    dim = values.size // classes - 1
    sums = values[:classes * dim].reshape(classes, dim) * family.weight_cap
    counts = values[classes * dim:] / setup.clip * family.weight_cap
    return sums, counts
