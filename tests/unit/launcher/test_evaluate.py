"""score_weights: a family's weights, put into a fresh model of that family, score what the model scored."""

from __future__ import annotations

import torch

from edge_agent.data.datasets import load_dataset
from edge_agent.models import build_model
from edge_agent.training import evaluate
from edge_agent.weights import get_arrays
from launcher.evaluate import score_weights


def test_score_weights_matches_the_model_they_came_from() -> None:
    _, test = load_dataset("digits", seed=0)
    model = build_model("mlp_tiny", test.in_shape, test.num_classes, seed=7)  # not score_weights' seed 0
    expected = evaluate(model, test, torch.device("cpu"))
    scored = score_weights("mlp_tiny", get_arrays(model), test)
    assert scored.samples == expected.samples == len(test)
    assert scored.accuracy == expected.accuracy
    assert abs(scored.loss - expected.loss) < 1e-9
