"""What fused cells on TorchTPU compile beside DEFER_AND_FUSE: a module trained again and again,
whole, by TorchTPU's ``"tpu"`` compiler (fuse/hot/trained_modules.py), with compile mode's rules
(torchtpu_compile.py: a graph with a tensor off the chip is not handed to TorchTPU, HF's
attention masks are made op by op), unless the module holds a BatchNorm (``without_batchnorm``).

Random draws need nothing more: TorchTPU lowers a compiled graph's random ops through its eager
kernels, the chip's generator state threaded through the graph in the order the graph draws,
so a compiled dropout draws strict's masks. Measured on a v5e (HF GPT-2, 2 layers, 128 wide,
its default dropout in the embeddings, the attention and the residuals; 3 AdamW steps after
``torch.manual_seed``): ``torch.compile(model, backend="tpu")`` gave strict's losses within
3.6e-6 (fp32) and 9.2e-5 (bf16) and left the generator where strict leaves it (the next
``torch.rand`` equal); a compiled ``x + torch.rand_like(x)`` equals eager's bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from tpunb.fuse.groups.compilers import Compile
from tpunb.fuse.workarounds import autograd_cache_off_on_worker
from tpunb.runtimes.torchtpu_compile import attention_mask_files, off_device, run_as_written

#: What capturing and compiling a trained model costs a fused cell on the chip, for the rent
#: or buy (``TrainedModules.pays_off_after_s``). Measured on a v5e (GPT-2, 6 layers, 384 wide,
#: 8 x 256, bf16): a 12-step fused cell took 54.5 s with the model turned hot at its second
#: step against 25.5 s under DEFER_AND_FUSE alone (strict: 8.6 s); once compiled, a step took 30
#: ms against DEFER_AND_FUSE's 70.
TPU_COMPILE_COST_S = 30.0


def on_the_chip_only(backend: Compile) -> Compile:
    """``backend`` for graphs whose every tensor is on the TPU: TorchTPU fails or aborts the
    process on one that takes or makes a CPU tensor (torchtpu_compile.py). On the compile
    worker it compiles without AOTAutograd's cache (``autograd_cache_off_on_worker``): its
    persistent tier-3 cache keeps the compiled programs for a later kernel."""

    def compile_training(graph: torch.fx.GraphModule, examples: list[Any]) -> Callable[..., Any]:
        stray = off_device(graph, examples, "tpu")
        if stray:
            raise OffTheChip(f"left as captured, op by op: tensors off the TPU ({', '.join(stray[:3])})")
        with autograd_cache_off_on_worker():
            return backend(graph, examples)

    return compile_training


class OffTheChip(RuntimeError):
    """A graph left uncompiled because it takes or makes a tensor off the TPU."""


def tpu_training_compiler() -> Compile:
    """TorchTPU's ``"tpu"`` Dynamo backend (it runs AOTAutograd itself), for graphs on the chip."""
    from torch._dynamo.backends.registry import lookup_backend

    return on_the_chip_only(lookup_backend("tpu"))


def hot_call_settings() -> contextlib.AbstractContextManager[None]:
    """Dynamo's settings for a trained module's compiled call: HF's masks made op by op."""
    return run_as_written(attention_mask_files())


def without_batchnorm(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds no BatchNorm layer. TorchTPU 0.2.0 leaves BatchNorm's running
    statistics out in eager modes, and tpunb folds them in from a global module hook
    (torchtpu_batchnorm.py) that a compiled call would trace into its graph; what TorchTPU's
    compiled BatchNorm does with them was not measured. Such a model stays under DEFER_AND_FUSE."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return not any(isinstance(layer, _BatchNorm) for layer in module.modules())
