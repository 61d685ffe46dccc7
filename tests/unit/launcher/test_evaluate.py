"""score_weights: a family's weights, put into a fresh model of that family, score what the model scored."""

from __future__ import annotations

import torch

from edge_agent.tasks.registry import resolve_task
from edge_agent.tasks.splits import pool_and_test
from edge_agent.training import evaluate
from edge_agent.weights import get_arrays
from launcher.evaluate import score_weights


def test_score_weights_matches_the_model_they_came_from() -> None:
    task = resolve_task("digits")
    _, test = pool_and_test(task, seed=0)
    model = task.build_model("mlp_tiny", seed=7)  # not score_weights' seed 0
    expected = evaluate(model, test, torch.device("cpu"), task.objective)
    scored = score_weights("mlp_tiny", get_arrays(model), test, task)
    assert scored.samples == expected.samples == len(test)
    assert scored.accuracy == expected.accuracy
    assert abs(scored.loss - expected.loss) < 1e-9
