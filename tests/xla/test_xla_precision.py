"""``%tpu_precision`` on real torch_xla (CPU PJRT device): autocast on the ``xla`` device."""

from __future__ import annotations

import pytest
from kernels import Kernel

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
