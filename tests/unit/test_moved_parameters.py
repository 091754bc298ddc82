"""A module moved between tensor types PyTorch cannot move in place (CPU to meta here, as CPU
to TPU or XLA) keeps its parameter objects, and where Dynamo holds them weakly it still moves and
keeps its ties (tpunb/runtimes/moved_parameters.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tpunb.runtimes.moved_parameters import keep_parameters_when_moved


@pytest.fixture
def keeping_parameters() -> Iterator[None]:
    keep_parameters_when_moved(torch)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)


def tied_model() -> torch.nn.Module:
    embedding = torch.nn.Embedding(16, 8)
    head = torch.nn.Linear(8, 16, bias=False)
    head.weight = embedding.weight
    return torch.nn.ModuleDict({"embedding": embedding, "head": head})


def test_a_move_keeps_the_parameter_objects_an_optimizer_holds(keeping_parameters) -> None:
    model = tied_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("meta")
    held = optimizer.param_groups[0]["params"]
    assert [p.device.type for p in held] == ["meta"]
    assert model["head"].weight is model["embedding"].weight is held[0]


def test_a_move_inside_a_compiled_function_keeps_the_ties(keeping_parameters) -> None:
    model = tied_model()

    def count_then_move() -> int:
        count = sum(p.numel() for p in model.parameters())
        model.to("meta")  # Dynamo's guards hold the parameters weakly by now
        return count

    assert torch.compile(count_then_move, backend="eager")() == 128
    assert model["head"].weight.device.type == "meta"
    assert model["head"].weight is model["embedding"].weight


def test_without_the_remedy_pytorch_unties_as_before() -> None:
    model = tied_model()
    model.to("meta")
    assert model["head"].weight is not model["embedding"].weight
