"""``%tpu_precision`` on real torch_xla (CPU PJRT device): autocast on the ``xla`` device."""

from __future__ import annotations

import pytest
from tpunb_kernels import Kernel

MATMUL = """z = torch.randn(16, 16, device='xla') @ torch.randn(16, 16, device='xla')
z_info = [str(z.dtype), str(z.device)]"""


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_bf16_cell_runs_in_bfloat16_on_the_xla_device(xla_kernel: Kernel, mode: str) -> None:
    result = xla_kernel.run(f"%%tpu_precision bf16\n%%tpu_mode {mode}\n{MATMUL}")
    assert result.error is None, result.error
    assert xla_kernel.value("z_info") == ["torch.bfloat16", "xla:0"]
    assert xla_kernel.value("tpunb.stats()['precision']") == "fp32"  # one cell only


def test_fp16_is_refused_on_a_tpu_runtime(xla_kernel: Kernel) -> None:
    refused = xla_kernel.run("%tpu_precision fp16")
    assert refused.error is not None and "TPUs compute in bfloat16, not float16" in refused.error["evalue"]
    assert xla_kernel.value("tpunb.stats()['precisions_available']") == ["fp32", "bf16"]


SETUP = """torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to('xla')
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 32).to('xla'), torch.randint(0, 4, (64,)).to('xla')
losses = []"""
STEP = """logits = model(x)
loss = torch.nn.functional.cross_entropy(logits.float(), y)
optimizer.zero_grad()
loss.backward()
optimizer.step()
losses.append(loss.item())"""


@pytest.mark.parametrize("mode", ["strict", "fused", "compile"])
def test_steps_in_one_bf16_cell_train_like_the_per_forward_recipe(xla_kernel: Kernel, mode: str) -> None:
    """Model and precision set in earlier cells, then a loop of steps in one cell: each step
    uses its own weights (autocast's weight cache, open for the whole cell, froze them)."""
    assert xla_kernel.run(SETUP).error is None
    per_forward = "with torch.autocast('xla', torch.bfloat16):\n    logits = model(x)"
    recipe = STEP.replace("logits = model(x)", per_forward)
    assert xla_kernel.run("for _ in range(5):\n" + _indent(recipe)).error is None
    expected = xla_kernel.value("losses")
    assert xla_kernel.run(SETUP).error is None
    assert xla_kernel.run("%tpu_precision bf16").error is None
    try:
        result = xla_kernel.run(f"%%tpu_mode {mode}\nfor _ in range(5):\n" + _indent(STEP))
        assert result.error is None, result.error
    finally:
        assert xla_kernel.run("%tpu_precision fp32").error is None
    got = xla_kernel.value("losses")
    assert got == pytest.approx(expected, rel=2e-2), (got, expected)
    assert got[-1] < got[0] - 0.05 and len(set(got)) == len(got), got


def _indent(code: str) -> str:
    return "".join(f"    {line}\n" for line in code.splitlines())
