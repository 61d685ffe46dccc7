"""``digits``: scikit-learn's 8x8 handwritten digits (1,797 images, no download), the fast default.

Sources: ``digits`` / ``digits:test`` (the seeded 80/20 split), ``synthetic`` / ``synthetic:test``
(learnable class templates plus noise, for load tests), an .npz, or an image folder (resized to 8x8).
"""

from __future__ import annotations

from functools import partial

from edge_agent.data.datasets import Dataset, load_digits, make_synthetic
from edge_agent.models import EMBED_DIM, FAMILIES, FedModel
from edge_agent.tasks.base import DataContext, Task
from edge_agent.tasks.builtin.sources import load_image_source
from protocol.tasks import BUILTIN_CARDS

CARD = BUILTIN_CARDS["digits"]
IN_SHAPE = (1, 8, 8)

_BUILTIN = {
    "digits": lambda c: load_digits(seed=c.seed)[0],
    "digits:test": lambda c: load_digits(seed=c.seed)[1],
    "synthetic": lambda c: make_synthetic(seed=c.seed)[0],
    "synthetic:test": lambda c: make_synthetic(seed=c.seed)[1],
}


def _family(name: str) -> FedModel:
    return FedModel.with_linear_head(FAMILIES[name](IN_SHAPE), EMBED_DIM, CARD.num_classes)


def _load(source: str, context: DataContext) -> Dataset:
    return load_image_source(source, context, builtin=_BUILTIN, size=IN_SHAPE[1:], channels=1)


task = Task(
    name=CARD.name, version=CARD.version, classes=CARD.classes, embedding_dim=CARD.embedding_dim,
    families={name: partial(_family, name) for name in CARD.families},
    device_families={"jetson": "cnn_large", "rpi": "cnn_small", "phone": "mlp_tiny", "cpu": "cnn_large"},
    load_data=_load, default_data="digits", description=CARD.description,
)
