"""tpunb's fold-in of BatchNorm's running statistics (for TorchTPU, which leaves them out) gives
exactly PyTorch's own update, here checked against PyTorch's CPU batch_norm; on a device that
updates them itself, the hook leaves them alone."""

from __future__ import annotations

import pytest
import torch
from torch.nn.parameter import is_lazy

from tpunb.runtimes.torchtpu_batchnorm import (
    RunningStatistics,
    fold_in_batch_statistics,
    leaves_running_statistics,
)

pytestmark = pytest.mark.unit

MODULES = {
    "1d, 2-D input": (lambda momentum: torch.nn.BatchNorm1d(5, momentum=momentum), (8, 5)),
    "1d, 3-D input": (lambda momentum: torch.nn.BatchNorm1d(5, momentum=momentum), (8, 5, 7)),
    "2d": (lambda momentum: torch.nn.BatchNorm2d(5, momentum=momentum), (8, 5, 6, 4)),
    "3d": (lambda momentum: torch.nn.BatchNorm3d(5, momentum=momentum), (4, 5, 3, 4, 2)),
    "lazy 2d": (lambda momentum: torch.nn.LazyBatchNorm2d(momentum=momentum), (8, 5, 6, 4)),
}


@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
@pytest.mark.parametrize("kind", list(MODULES))
def test_folding_in_a_batch_gives_pytorchs_own_update(kind: str, momentum: float | None) -> None:
    make, shape = MODULES[kind]
    module = make(momentum).train()
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        batch = torch.randn(shape, generator=generator) * (step + 2) + step
        lazy = is_lazy(module.running_mean)
        before = None if lazy else (module.running_mean.clone(), module.running_var.clone())
        module(batch)  # PyTorch's update, and num_batches_tracked counted
        expected = (module.running_mean.clone(), module.running_var.clone())
        if before is None:  # a lazy module made its buffers in this call: PyTorch's start values
            before = (torch.zeros_like(expected[0]), torch.ones_like(expected[1]))
        module.running_mean.copy_(before[0])
        module.running_var.copy_(before[1])
        fold_in_batch_statistics(module, batch)
        torch.testing.assert_close(module.running_mean, expected[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(module.running_var, expected[1], rtol=1e-5, atol=1e-6)


def test_the_call_that_was_folded_in_still_runs_its_backward() -> None:
    """Autograd saved the statistics for batch_norm's backward: the fold-in must not look like an
    in-place change of them (on the chip it failed every BatchNorm model's backward)."""
    module = torch.nn.BatchNorm2d(4).train()
    batch = torch.randn(6, 4, 3, 3, generator=torch.Generator().manual_seed(3), requires_grad=True)
    output = module(batch)
    fold_in_batch_statistics(module, batch)
    output.square().sum().backward()
    assert batch.grad is not None and module.weight.grad is not None


def test_a_bfloat16_batch_folds_in_at_float32() -> None:
    module = torch.nn.BatchNorm2d(3).train()
    batch = (torch.randn(6, 3, 5, 5, generator=torch.Generator().manual_seed(1)) * 4 + 2).bfloat16()
    reference = torch.nn.BatchNorm2d(3).train()
    reference(batch.float())
    module.num_batches_tracked += 1
    fold_in_batch_statistics(module, batch)
    assert module.running_mean.dtype == torch.float32
    torch.testing.assert_close(module.running_mean, reference.running_mean)
    torch.testing.assert_close(module.running_var, reference.running_var)


def test_the_cpu_updates_them_itself_so_the_hook_leaves_them_alone() -> None:
    assert leaves_running_statistics("cpu") is False
    hook = RunningStatistics("cpu", eager_mode=lambda: "plain")
    module = torch.nn.BatchNorm1d(4).train()
    batch = torch.randn(10, 4, generator=torch.Generator().manual_seed(2)) + 3
    output = module(batch)
    updated = (module.running_mean.clone(), module.running_var.clone())
    hook._after_forward(module, (batch,), output)
    assert torch.equal(module.running_mean, updated[0]) and torch.equal(module.running_var, updated[1])
