"""The task contract: declarations are validated when a task is defined, models when they are built."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.tasks import DataContext, Task
from edge_agent.tasks.checks import check_model, model_fingerprint
from edge_agent.weights import get_arrays

CLASSES = ("a", "b", "c")


def features() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU())


def fed() -> FedModel:
    return FedModel.with_linear_head(features(), 8, len(CLASSES))


def plain() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(12, len(CLASSES)))


def data(n: int = 6, classes: int = len(CLASSES)) -> Dataset:
    rng = np.random.default_rng(0)
    return Dataset(rng.random((n, 3, 4), dtype=np.float32), np.arange(n, dtype=np.int64) % classes, classes, "d")


def make(**overrides: object) -> Task:
    fields: dict[str, object] = {"name": "t", "version": "1", "classes": CLASSES, "families": {"fed": fed},
                                 "embedding_dim": 8, "load_data": lambda source, context: data()}
    return Task(**{**fields, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"classes": ("only",)}, "at least two classes"),
    ({"classes": ("a", "a")}, "class names repeat"),
    ({"name": "no spaces"}, "name"),
    ({"version": ""}, "version"),
    ({"families": {}}, "families"),
    ({"device_families": {"rpi": "missing"}}, "device_families['rpi'] = 'missing' is not one of its families"),
    ({"kind": "regression"}, "a regression task declares no classes"),
])
def test_bad_declarations_fail_when_the_task_is_defined(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="task") as error:
        make(**overrides)
    assert message in str(error.value)


def test_the_card_is_what_the_coordinator_sees() -> None:
    card = make(device_families={"rpi": "fed"}).card
    assert (card.name, card.version, card.classes, card.families, card.embedding_dim) == ("t", "1", CLASSES, ("fed",), 8)
    assert card.prototype_problem() is None
    no_embedding = make(families={"plain": plain}, embedding_dim=None).card
    assert "declares no embedding" in (no_embedding.prototype_problem() or "")


def test_equal_seeds_build_equal_models_and_families_are_checked() -> None:
    task = make(families={"fed": fed, "other": fed}, device_families={"rpi": "other"})
    one, two, three = task.build_model("fed", 3), task.build_model("fed", 3), task.build_model("fed", 4)
    assert all(np.array_equal(a, b) for a, b in zip(get_arrays(one).values(), get_arrays(two).values(), strict=True))
    assert not np.array_equal(get_arrays(one)["head.weight"], get_arrays(three)["head.weight"])
    assert (task.family_for("rpi"), task.family_for("phone")) == ("other", "fed")
    with pytest.raises(ValueError, match="has no model family 'nope'"):
        task.build_model("nope", 0)


def test_a_plain_module_runs_whole_and_cannot_claim_an_embedding() -> None:
    model = make(families={"plain": plain}, embedding_dim=None).build_model("plain", 0)
    assert isinstance(model.head, nn.Identity) and model.embedding_dim is None and model.num_outputs == 3
    assert model(torch.zeros(2, 3, 4)).shape == (2, 3)
    with pytest.raises(ValueError, match="build it with FedModel.with_linear_head"):
        make(families={"plain": plain}).build_model("plain", 0)
    with pytest.raises(ValueError, match="embeds into 8 dimensions, the task declares embedding_dim=16"):
        make(embedding_dim=16).build_model("fed", 0)
    with pytest.raises(ValueError, match="built a str, not a torch.nn.Module"):
        make(families={"odd": lambda: "model"}, embedding_dim=None).build_model("odd", 0)


def test_loaded_data_must_be_in_the_declared_label_space() -> None:
    task = make(load_data=lambda source, context: data(classes=5))
    with pytest.raises(ValueError, match="has 5 classes, the task declares 3"):
        task.load("anything", DataContext(CLASSES, 0))
    with pytest.raises(ValueError, match="returned a list"):
        make(load_data=lambda source, context: []).load("x", DataContext(CLASSES, 0))


def test_check_model_names_what_does_not_fit() -> None:
    task = make()
    check_model(task, "fed", task.build_model("fed", 0), data())  # fits
    wrong_input = Dataset(np.zeros((4, 5, 5), np.float32), np.zeros(4, np.int64), 3, "d")
    with pytest.raises(ValueError, match=r"fails on inputs of shape \[5, 5\]"):
        check_model(task, "fed", task.build_model("fed", 0), wrong_input)
    wide = make(families={"fed": lambda: FedModel.with_linear_head(features(), 8, 4)})
    with pytest.raises(ValueError, match="outputs are \\[4\\] per sample, the task declares 3 classes"):
        check_model(wide, "fed", wide.build_model("fed", 0), data())
    per_sample = make(loss=lambda out, y: nn.functional.cross_entropy(out, y, reduction="none"))
    with pytest.raises(ValueError, match="the loss must be a finite scalar"):
        check_model(per_sample, "fed", per_sample.build_model("fed", 0), data())
    with pytest.raises(ValueError, match="no samples"):
        check_model(task, "fed", task.build_model("fed", 0), data(n=0))


def test_fingerprints_tell_layouts_apart() -> None:
    task = make(families={"fed": fed, "wider": lambda: FedModel.with_linear_head(
        nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 8)), 8, 3)})
    assert model_fingerprint(task.build_model("fed", 0)) == model_fingerprint(task.build_model("fed", 9))
    assert model_fingerprint(task.build_model("fed", 0)) != model_fingerprint(task.build_model("wider", 0))
