"""Mixed precision: one switch (fp32, bf16, fp16) mapped onto each runtime's autocast.

Every TPU tutorial turns autocast on by hand, each its own way: ``torch.autocast("xla",
torch.bfloat16)`` on PyTorch/XLA, the device type on TorchTPU, ``"cuda"`` with a GradScaler
for float16 on a GPU, ``"cpu"`` on a laptop. A notebook that moves between them breaks. Here
a precision is chosen once; the session enters the runtime's autocast with the mode's scope
(session.py), so every mode runs under it: strict as PyTorch does, debug with its checks
(an overflow names its dtype), fused recording the casts with the ops (a group's key holds
its dtypes, so bf16 and fp32 groups never mix), compile tracing them.

What each device accepts, and why not the rest:

* CPU: fp32, bf16 (faster only with bf16 instructions: AVX512-BF16, AMX). Not fp16: the
  CPU's fp16 kernels are emulated, slower and less exact than bf16, and fp16 needs loss
  scaling that PyTorch gives CPUs no reason to use.
* CUDA: fp32, fp16 (with a loss scaler tpunb owns: ``grad_scaler``), bf16 where the GPU has
  bf16 units (Ampere and later).
* PyTorch/XLA and TorchTPU: fp32, bf16. Not fp16: TPUs compute in bf16, not fp16.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from typing import Any

import torch

from tpunb.modes import member_named


class Precision(enum.Enum):
    """The precisions, named as users type them."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"

    def __str__(self) -> str:
        return self.value


#: Autocast's dtype for each reduced precision.
DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}
DEFAULT_PRECISION = Precision.FP32


class PrecisionError(ValueError):
    """A precision that is not one, or that the runtime cannot run."""


def parse_precision(value: str | Precision) -> Precision:
    """Turn user input (any case, surrounding spaces) into a Precision, or say what is accepted."""
    found = member_named(Precision, value)
    if found is not None:
        return found
    accepted = ", ".join(p.value for p in Precision)
    raise PrecisionError(f"unknown precision {value!r}; accepted: {accepted}")


def refusal(precision: Precision, device_type: str, bf16_supported: Callable[[], bool]) -> str | None:
    """Why ``precision`` cannot run on ``device_type`` (autocast's device type), or None."""
    if precision is Precision.FP32:
        return None
    if precision is Precision.FP16 and device_type == "cpu":
        return "the CPU has no float16 units (its fp16 kernels are emulated, slower than bf16)"
    if precision is Precision.FP16 and device_type in ("xla", "tpu"):
        return "TPUs compute in bfloat16, not float16"
    if precision is Precision.BF16 and device_type == "cuda" and not bf16_supported():
        return "this GPU has no bfloat16 units (they came with Ampere)"
    return None


def accepted(device_type: str, bf16_supported: Callable[[], bool]) -> list[str]:
    """The precisions ``device_type`` runs, in the order users meet them."""
    return [p.value for p in Precision if refusal(p, device_type, bf16_supported) is None]


def autocast(precision: Precision, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The block under ``precision``: torch's autocast for bf16 and fp16, nothing for fp32.

    Without autocast's weight cache. The cache keeps each parameter's low-precision copy for
    as long as the outermost autocast block is open, which PyTorch's recipe opens around one
    forward; tpunb opens it around whole cells, so a training loop in one cell would run
    every step on its first step's weights (measured: the same loss five steps running, where
    the recipe's falls). Uncached, each forward casts the weights as they are now: the
    recipe's numbers, at the cost of casting a weight again where a forward reuses it."""
    if precision is Precision.FP32:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=DTYPES[precision], cache_enabled=False)


def needs_loss_scaling(precision: Precision, device_type: str) -> bool:
    """float16 gradients underflow without a scaled loss; bf16 has fp32's range."""
    return precision is Precision.FP16 and device_type == "cuda"
