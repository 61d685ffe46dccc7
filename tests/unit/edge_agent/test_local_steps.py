"""The plan's mini-batches: ``epochs`` passes, or exactly ``steps`` batches whatever the data size."""

from __future__ import annotations

import torch

from edge_agent.privacy.dp_training import RoundShape
from edge_agent.training import batch_indices
from protocol.messages import LocalTraining


def batches(num_samples: int, batch_size: int, **plan: int) -> list[torch.Tensor]:
    training = LocalTraining(learning_rate=0.1, **plan)  # type: ignore[arg-type]
    return list(batch_indices(num_samples, batch_size, training, torch.Generator().manual_seed(3)))


def test_epochs_are_whole_reshuffled_passes() -> None:
    out = batches(10, 4, epochs=2)
    assert [len(b) for b in out] == [4, 4, 2, 4, 4, 2]
    first, second = torch.cat(out[:3]), torch.cat(out[3:])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(10))
    assert first.tolist() != second.tolist()  # reshuffled, not repeated


def test_steps_take_exactly_that_many_batches_for_every_data_size() -> None:
    for num_samples in (3, 10, 50, 1000):
        out = batches(num_samples, 4, epochs=7, steps=5)
        assert len(out) == 5  # epochs ignored
        seen = torch.cat(out).tolist()
        assert all(0 <= i < num_samples for i in seen)
    small = torch.cat(batches(3, 4, epochs=1, steps=4)).tolist()
    assert sorted(small) == sorted(list(range(3)) * 4)  # a small agent cycles through its data


def test_steps_cut_the_last_pass_short() -> None:
    out = batches(10, 4, epochs=1, steps=4)
    assert [len(b) for b in out] == [4, 4, 2, 4]
    assert sorted(torch.cat(out[:3]).tolist()) == list(range(10))


def test_no_data_no_batches() -> None:
    assert batches(0, 4, epochs=3) == []
    assert batches(0, 4, epochs=1, steps=3) == []


def test_dp_round_shape_follows_steps() -> None:
    assert RoundShape.of(num_samples=120, batch_size=32, epochs=3, steps=7).steps == 7
    assert RoundShape.of(num_samples=120, batch_size=32, epochs=3).steps == round(3 / (32 / 120))
