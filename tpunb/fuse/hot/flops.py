"""What one run of a captured training graph computes, in FLOPs: its forward and the backward
autograd runs through it, counted by ``torch.utils.flop_counter`` (matrix products,
convolutions, attention: the work a chip's peak FLOP/s is quoted for) on fake tensors.

Counted once per graph, on the compile worker before the graph is compiled: a fake run costs
about one trace of the graph and touches no real tensor (the notebook thread meanwhile sets
``p.grad = None``: only shapes, strides and dtypes are read here, never ``.grad``) and no random
generator. Backward is counted as it runs: a frozen weight (a LoRA base) gets no weight
gradient, so its matrix products count once for the input's gradient, not twice.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves


def training_flops(graph: torch.fx.GraphModule, examples: list[Any]) -> float:
    """FLOPs of one forward and backward run of ``graph`` with inputs like ``examples``; raises
    ``FlopsUnknown`` (with the fake run's error) where the graph cannot run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
            inputs = [like(example, fake_mode) for example in examples]
            with FlopCounterMode(display=False) as counter:
                outputs = graph(*inputs)
                trained = [
                    out for out in tree_leaves(outputs) if isinstance(out, torch.Tensor) and out.requires_grad
                ]
                if trained:
                    torch.autograd.backward(trained, [torch.ones_like(out) for out in trained])
        return float(counter.get_total_flops())
    except Exception as error:  # an op without a fake kernel, a graph fake tensors cannot run
        first_line = (str(error).splitlines() or [""])[0][:200]
        raise FlopsUnknown(f"{type(error).__name__}: {first_line}") from error


class FlopsUnknown(RuntimeError):
    """A graph whose FLOPs could not be counted (its fake run failed): no MFU for its calls."""


def like(example: Any, fake_mode: Any) -> Any:
    """A fresh fake tensor shaped as ``example`` (its grad flag too), or ``example`` itself."""
    if not isinstance(example, torch.Tensor):
        return example
    with fake_mode:
        made = torch.empty_strided(
            example.shape, example.stride(), dtype=example.dtype, device=example.device
        )
    return made.requires_grad_(example.requires_grad) if example.is_floating_point() else made
