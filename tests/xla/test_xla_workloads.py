"""Others' training loops on PyTorch/XLA's CPU device (benchmarks/workloads, the workloads with
``on_xla``): every mode logs strict's losses at every step and draws strict's random stream.

The packages' own XLA paths run: the HF Trainer and Accelerate choose the XLA device
themselves, ignite steps through ``xm.optimizer_step``, a PEFT model trains in a user's loop.
Strict is PyTorch/XLA's eager mode, fused its lazy tensors, compile ``torch.compile`` with the
openxla backend. Dropout is off on XLA (catalog.py says why). In the Colab image's venv, which
has the packages (Makefile: COLAB_TEST_PACKAGES, what Colab ships beside torch_xla).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from xla_kernels import start_xla_kernel

# appended: tpunb itself comes from the installed wheel, only benchmarks/ from the checkout
sys.path.append(str(Path(__file__).parents[2]))

from benchmarks.workloads.catalog import WORKLOADS, missing_packages
from benchmarks.workloads.harness import disagreements, run_workload

pytestmark = pytest.mark.workloads

#: Fused cold and warm; hot training calls are native-only (Inductor).
XLA_MODES = ("strict", "compile", "fused", "fused-warm", "debug")
BF16_MODES = ("strict", "fused")
ON_XLA = [name for name, workload in WORKLOADS.items() if workload.on_xla]


def test_the_xla_leg_covers_trainers_and_a_users_loop() -> None:
    assert {"hf_trainer", "accelerate", "peft_lora"} <= set(ON_XLA), ON_XLA


@pytest.mark.parametrize("name", ON_XLA)
def test_every_mode_logs_strict_losses_on_the_xla_device(name: str, tmp_path: Path) -> None:
    workload = WORKLOADS[name]
    assert not missing_packages(workload), f"install COLAB_TEST_PACKAGES: {missing_packages(workload)}"
    kernel = start_xla_kernel(tmp_path)
    try:
        runs = run_workload(kernel, workload, XLA_MODES, ["fp32"], device="xla")
        runs += run_workload(kernel, workload, BF16_MODES, ["bf16"], device="xla")
    finally:
        kernel.shutdown()
    failed = disagreements(runs, workload.steps)
    assert not failed, "\n".join(failed)
    fallbacks = [f"{r.mode}: {r.summary}" for r in runs if "ran on the CPU" in r.summary]
    assert not fallbacks, fallbacks  # none of these loops has an op without an XLA kernel
