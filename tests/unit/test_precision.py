"""Mixed precision (tpunb/mixed_precision.py, session.py): one switch per runtime, with every
mode, refused by name where the runtime cannot run it, restored after a block even on error."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import tpunb
from tpunb.mixed_precision import PrecisionError

WIDTH = 256


def test_a_bf16_block_runs_matmuls_in_bfloat16_and_restores_fp32_after_an_error():
    a = torch.randn(WIDTH, WIDTH)
    with pytest.raises(ZeroDivisionError), tpunb.precision("bf16"):
        assert (a @ a).dtype == torch.bfloat16 and tpunb.stats()["precision"] == "bf16"
        assert (a + 1).dtype == torch.float32  # autocast leaves what it does not list alone
        raise ZeroDivisionError
    assert (a @ a).dtype == torch.float32 and tpunb.stats()["precision"] == "fp32"


def test_precisions_the_cpu_cannot_run_and_unknown_ones_are_refused_by_name():
    with pytest.raises(PrecisionError, match=r"fp16 is not available on the native runtime \(cpu\): the CPU"):
        tpunb.set_precision("fp16")
    with pytest.raises(PrecisionError, match="unknown precision 'fp8'; accepted: fp32, bf16, fp16"):
        tpunb.set_precision("fp8")
    with pytest.raises(PrecisionError, match="accepted here: fp32, bf16"), tpunb.precision("fp16"):
        pass
    assert tpunb.stats()["precision"] == "fp32" and tpunb.stats()["precisions_available"] == ["fp32", "bf16"]


def make_mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train(model, optimizer, steps: int = 4) -> list[float]:
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(64, WIDTH), torch.randint(0, 10, (64,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        tpunb.grad_scaler().scale(loss).backward()  # a pass-through off CUDA fp16
        tpunb.grad_scaler().step(optimizer)
        tpunb.grad_scaler().update()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("hot_training", [True, False], ids=["compiled whole", "recorded"])
def test_fused_bf16_training_equals_strict_bf16_within_bfloat16_tolerance(hot_training: bool):
    strict_model, strict_opt = make_mlp()
    fused_model = copy.deepcopy(strict_model)
    fused_opt = torch.optim.SGD(fused_model.parameters(), lr=0.05)
    steps = 6
    with tpunb.precision("bf16"):
        expected = train(strict_model, strict_opt, steps)
        tpunb.adopt(fused_model, fused_opt)
        with tpunb.mode("fused", sync_compile=True, hot_training=hot_training):
            got = train(fused_model, fused_opt, steps)
    assert got == pytest.approx(expected, rel=2e-2)  # bfloat16 keeps 8 bits of mantissa
    groups = tpunb.stats()["groups"]
    if hot_training:  # hot after the 3rd step: its later calls ran compiled, autocast in the graph
        calls = [g["status"] for g in groups if g["key"].endswith("-training")]
        assert calls[-3:] == ["miss", "hit", "hit"], calls
    else:  # the casts were recorded with the ops, into the step's group
        assert all(g["top_ops"].get("_to_copy", 0) >= 4 for g in groups[-4:])
    for a, b in zip(strict_model.parameters(), fused_model.parameters(), strict=True):
        assert torch.allclose(a.detach(), torch.as_tensor(b.detach()), atol=2e-2)
    assert not tpunb.grad_scaler().is_enabled()


def _steps(model, optimizer, recipe: bool, steps: int = 5) -> list[float]:
    """SGD steps on one batch; ``recipe``: PyTorch's per-forward autocast around each forward."""
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, WIDTH, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", torch.bfloat16) if recipe else contextlib.nullcontext():
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("mode", ["strict", "fused", "compile", "debug"])
def test_steps_in_one_bf16_block_train_like_the_per_forward_autocast_recipe(mode):
    """A loop of optimizer steps inside one bf16 block (a cell) must use each step's weights:
    autocast's weight cache, kept while the block is open, froze them at the first step's."""
    expected = _steps(*make_mlp(), recipe=True)
    model, optimizer = make_mlp()
    with tpunb.precision("bf16"), tpunb.mode(mode):
        got = _steps(model, optimizer, recipe=False)
    assert got == pytest.approx(expected, rel=2e-2)
    assert got[-1] < got[0] - 0.05 and len(set(got)) == len(got), got  # it learns, step by step


def test_a_reduced_precision_overflow_is_named_in_debug_mode():
    big = torch.full((4, 4), 1e30)
    with (
        pytest.raises(Exception, match=r"aten\.mm produced Inf from finite inputs: a bfloat16 overflow"),
        tpunb.precision("bf16"),
        tpunb.mode("debug"),
    ):
        big @ big
